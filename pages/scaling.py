"""Scaling law: how the width needed to stay near K∞ grows with the condition number κ."""

from __future__ import annotations

import streamlit as st

from engine.experiments.configs.scaling import ScalingConfig
from engine.experiments.scaling import run_scaling
from engine.maths.specs import TrainSpec
from engine.reporting import plots
from ui import configs, render
from ui.common import ATTENTION_CHOICES, shared
from ui.runner import obtain_planned

BOUND = configs.BOUND
QUICK = configs.QUICK["scaling"]
KAPPAS = (1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
MEASURES = {"movement": "‖K_t − K_0‖: how far training moves the kernel",
            "trained": "‖K_t − K∞‖: distance to the limit after training",
            "init": "‖K_0 − K∞‖: distance at initialisation (no training)"}


def controls_ui(attention: str):
    c1, c2, c3, c4 = st.columns(4)
    kappas = c1.multiselect("κ values", KAPPAS, default=list(QUICK.kappas), key="scaling.kappas", **BOUND,
                            help=configs.help_of(ScalingConfig, "kappas"), wrap=True)
    measure = c2.selectbox("Distance measured", list(MEASURES), format_func=lambda k: MEASURES[k],
                           index=list(MEASURES).index(QUICK.measure), key="scaling.measure", **BOUND,
                           help=configs.help_of(ScalingConfig, "measure"))
    metric = c3.selectbox("Kernel metric", configs.choices_of(ScalingConfig, "metric"), key="scaling.metric",
                          **BOUND, help=configs.help_of(ScalingConfig, "metric"))
    target = c4.select_slider("Target distance", [0.02, 0.05, 0.1, 0.2, 0.3], value=QUICK.target,
                              key="scaling.target", **BOUND, help=configs.help_of(ScalingConfig, "target"))
    c4, c5, c6, c7 = st.columns(4)
    variants = c4.multiselect("Attention variants", ATTENTION_CHOICES, default=[attention] if attention in
                              ATTENTION_CHOICES else ["linear"], key="scaling.attentions", **BOUND,
                              help="Each variant gets its own curve; truncated:r keeps r directions.", wrap=True)
    epochs = configs.number(c5, "Training epochs", TrainSpec, "epochs", "scaling.epochs",
                            value=QUICK.train.epochs, hi=2000)
    max_width = c6.select_slider("Largest width tried", [1024, 4096, 16384, 65536], value=QUICK.max_width,
                                 key="scaling.max_width", **BOUND, help=configs.help_of(ScalingConfig, "max_width"))
    n_seeds = c7.number_input("Network seeds", 1, 10, len(QUICK.seeds), key="scaling.seeds", **BOUND,
                              help=configs.help_of(ScalingConfig, "seeds"))
    return kappas, measure, metric, target, variants, epochs, max_width, n_seeds


s = shared()
st.title("The scaling law, measured")
st.markdown(
    "The paper's bound says the width needed for the kernel regime grows like **κ⁶** for linearised "
    "attention (κ^(2(2k+1)) for k stacked layers) against **κ²** for the same bound on the ReLU net's "
    f"own Gram. Here κ is dialled: synthetic data (n = {QUICK.n}, d = {QUICK.d}) with a prescribed Gram "
    "spectrum. For each κ the kernel distance is measured on a fixed grid of widths "
    f"({QUICK.per_octave} per doubling by default, `--per-octave`) and "
    "averaged over seeds; the width needed is the smallest grid width from which the distance stays within "
    "the target at every larger width, so a wider search range never changes a width it already found. "
    "The slope on log-log axes is the measured exponent p, with a 95 % interval from a bootstrap over seeds. "
    f"Architectures from the sidebar: {', '.join(plots.arch_label(a) for a in s.archs)}.")
kappas, measure, metric, target, variants, epochs, max_width, n_seeds = controls_ui(s.attention)
if not kappas or not s.archs or ("attn" in s.archs and not variants):
    st.info("Pick at least one κ, one architecture and, for MLP-Attn, one attention variant.")
    st.stop()
cfg = configs.scaling_config(kappas=sorted(kappas), archs=s.archs, attentions=variants, target=target,
                             measure=measure, metric=metric, epochs=epochs, max_width=max_width, seed=int(s.seed),
                             seeds=tuple(range(int(n_seeds))))
res = obtain_planned(run_scaling, cfg, "Scaling law", button="Measure the scaling law")
if res is None:
    st.stop()

data = plots.scaling_data(res.frames["widths"], res.frames["fit"])
render.chart(plots.scaling_fig(data, cfg.max_width), data, "width needed against kappa", wide=True, config=res.config,
             title="Width needed to stay near K∞ against the condition number κ", how_to_read=
             "Filled points are the widths needed (crosses: the criterion held at a smaller width and failed "
             "again above it), solid lines their power-law fit, dotted lines the theory's slope through the "
             "first point, open triangles κ values that needed more than the largest width tried.")
if not res.frames["widths"]["monotone"].all():
    st.warning("At some κ the distance met the target at a smaller width and missed it again at a larger one: "
               "the criterion is not monotone in width there (marked ×), so read those widths with care.")
fit = res.frames["fit"].copy()
fit.insert(0, "model", [plots.model_label(a, t) for a, t in zip(fit["arch"], fit["attention"], strict=True)])
if (fit["exponent"].dropna() < -0.005).any():  # below what the table shows as -0.00
    st.warning("A fitted exponent is negative: the width needed falls with κ over this range, against every "
               "bound; check the interval, the seeds and the non-monotone points before reading it.")
columns = ["model", "exponent", "exponent_low", "exponent_high", "resolution", "theory_exponent", "points"]
st.dataframe(fit[[c for c in columns if c in fit]],
             hide_index=True,
             column_config={"exponent": st.column_config.NumberColumn("fitted p", format="%.2f"),
                            "exponent_low": st.column_config.NumberColumn("95 % low", format="%.2f"),
                            "exponent_high": st.column_config.NumberColumn("95 % high", format="%.2f"),
                            "resolution": st.column_config.NumberColumn(
                                "grid step ±", format="%.2f",
                                help="The smallest change of p the width grid can show (one grid step at one end "
                                     "of the κ range); a 95 % interval narrower than this is the grid's artefact."),
                            "theory_exponent": st.column_config.NumberColumn("theory p", format="%g"),
                            "points": st.column_config.NumberColumn("κ values fitted")})
st.caption(f"{cfg.train.optimizer}, lr {cfg.train.lr:g}, batch {cfg.train.batch_size}, weight decay "
           f"{cfg.train.weight_decay:g}, {cfg.train.epochs} epochs; no row normalisation, so κ is the dialled one; "
           f"grid: {', '.join(str(w) for w in res.meta['grid'])}.")
with st.expander("Every width evaluated"):
    st.dataframe(res.frames["evaluations"], hide_index=True)
if "resolution" in fit and ((fit["exponent_high"] - fit["exponent_low"]) < fit["resolution"]).any():
    st.caption("An interval narrower than the grid step (e.g. [0.30, 0.30]) does not mean the exponent is exact: "
               "every bootstrap draw found the same grid widths, and the grid cannot show a change of p smaller "
               "than its step. Use more widths per doubling (`--per-octave`) or a wider κ range to resolve it.")
render.settings(res.config)
with st.expander("The same view from the command line"):
    render.command(cfg)
    render.command(cfg, figure="scaling.png")
render.cached_note(res)
