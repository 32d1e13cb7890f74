"""Scaling law: how the width needed to stay near K∞ grows with the condition number κ."""

from __future__ import annotations

import streamlit as st

from engine import plots
from engine.scaling import run_scaling
from ui import configs, render
from ui.common import ATTENTION_CHOICES, shared
from ui.runner import obtain

BOUND = dict(bind="query-params", persist_state="session")
KAPPAS = (1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
MEASURES = {"movement": "‖K_t − K_0‖ / ‖K_0‖: how far training moves the kernel",
            "trained": "‖K_t − K∞‖ / ‖K∞‖: distance to the limit after training",
            "init": "‖K_0 − K∞‖ / ‖K∞‖: distance at initialisation (no training)"}


def controls_ui(attention: str):
    c1, c2, c3 = st.columns(3)
    kappas = c1.multiselect("κ values", KAPPAS, default=[2.0, 4.0, 8.0, 16.0], key="scaling.kappas", **BOUND,
                            help="Target condition numbers of the synthetic data's Gram matrix.")
    measure = c2.selectbox("Distance measured", list(MEASURES), format_func=lambda k: MEASURES[k],
                           key="scaling.measure", **BOUND)
    target = c3.select_slider("Target distance", [0.02, 0.05, 0.1, 0.2, 0.3], value=0.05,
                              key="scaling.target", **BOUND)
    c4, c5, c6 = st.columns(3)
    variants = c4.multiselect("Attention variants", ATTENTION_CHOICES, default=[attention] if attention in
                              ATTENTION_CHOICES else ["linear"], key="scaling.attentions", **BOUND,
                              help="Each variant gets its own curve; truncated:r keeps r directions.")
    epochs = c5.number_input("Training epochs", 1, 2000, 100, key="scaling.epochs", **BOUND)
    max_width = c6.select_slider("Largest width tried", [1024, 4096, 16384, 65536], value=4096,
                                 key="scaling.max_width", **BOUND)
    return kappas, measure, target, variants, epochs, max_width


s = shared()
st.title("The scaling law, measured")
st.markdown(
    "The paper's bound says the width needed for the kernel regime grows like **κ⁶** for linearised "
    "attention (κ^(2(2k+1)) for k stacked layers) against **κ²** for the same bound on the ReLU net's "
    "own Gram. Here κ is dialled: synthetic data (n = 64, d = 32) with a prescribed Gram spectrum, "
    "and for each κ a bisection over width (quarter-octave steps) finds the smallest width whose "
    "kernel stays within the target. The slope on log-log axes is the measured exponent p. "
    f"Architectures from the sidebar: {', '.join(plots.arch_label(a) for a in s.archs)}.")
kappas, measure, target, variants, epochs, max_width = controls_ui(s.attention)
if not kappas or not s.archs or ("attn" in s.archs and not variants):
    st.info("Pick at least one κ, one architecture and, for MLP-Attn, one attention variant.")
    st.stop()
cfg = configs.scaling_config(sorted(kappas), s.archs, variants, target, measure, epochs, lr=1e-2,
                             max_width=max_width, seed=s.seed)
sec = configs.scaling_seconds(cfg)
res = obtain("scaling", run_scaling, cfg, "Scaling law", auto=sec < configs.AUTO_SECONDS,
             button="Measure the scaling law", note=f"These settings take about {sec / 60:.1f} min on this machine.")
if res is None:
    st.stop()

data = plots.scaling_data(res.frames["widths"], res.frames["fit"])
render.chart(plots.scaling_fig(data, cfg.max_width), data, "width needed against kappa",
             "Filled points are the smallest widths that met the target, solid lines their power-law fit, "
             "dotted lines the theory's slope through the first point, open triangles κ values that needed "
             "more than the largest width tried.")
fit = res.frames["fit"].copy()
fit.insert(0, "model", [plots._model_label(a, t) for a, t in zip(fit["arch"], fit["attention"])])
st.dataframe(fit[["model", "exponent", "theory_exponent", "points"]], hide_index=True,
             column_config={"exponent": st.column_config.NumberColumn("fitted p", format="%.2f"),
                            "theory_exponent": st.column_config.NumberColumn("theory p", format="%g"),
                            "points": st.column_config.NumberColumn("κ values fitted")})
st.caption("Adam, lr 1e-2, batch 128, weight decay 1e-3; no row normalisation, so κ is the dialled one.")
with st.expander("Every width evaluated"):
    st.dataframe(res.frames["evaluations"], hide_index=True)
render.settings(res.config)
render.cached_note(res)
