"""Task alignment: does attention's data-dependent kernel put the labels in its top directions?"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from engine.experiments.alignment import run_alignment
from engine.experiments.along import DESIGN_RULE
from engine.experiments.configs.alignment import PRESETS, AlignmentConfig
from engine.maths import alignment as AL
from engine.maths.alignment import VERDICT_WORDS, parted
from engine.maths.specs import parse_attention
from engine.reporting import plots
from engine.reporting.alignment import (
    along_sentence,
    association_sentence,
    design_sentence,
    power_sentence,
    verdict_alignment,
)
from engine.reporting.plots import alignment as AP
from engine.reporting.plots.design import design_data, design_fig
from ui import configs, render
from ui.common import data_dir, plain, shared
from ui.runner import obtain_planned, peek
from ui.text import verbatim

BOUND = configs.BOUND
QUICK = PRESETS["alignment"]["quick"]


def controls_ui() -> tuple[int, int]:
    c1, c2 = st.columns(2)
    epochs = configs.number(c1, "Training epochs", type(QUICK.train), "epochs", "alignment.epochs",
                            value=QUICK.train.epochs, step=10, hi=1000)
    draws = c2.number_input("Data draws", 1, 5, len(QUICK.data_seeds), key="alignment.draws", **BOUND,
                            help=configs.help_of(AlignmentConfig, "data_seeds"))
    return int(epochs), int(draws)



s = shared()
st.title("Task alignment")
st.markdown(
    "The paper's title has two halves: attention's data-dependent kernel *can reduce approximation error by "
    "aligning with task structure*, and the same sensitivity makes its influence malleable. The Malleability "
    "page measures the second; this page the first. **Centred alignment** A(K, YYᵀ) = ⟨K_c, (YYᵀ)_c⟩ / "
    "(‖K_c‖ ‖(YYᵀ)_c‖) says how much the kernel looks like the labels' own kernel; the **cumulative power** "
    "C(k) says how much of the one-hot labels lies along the kernel's top k eigenvectors; the **learning "
    "curve** of kernel ridge regression is measured beside the spectral theory (Canatar et al. 2021) computed "
    f"from the same eigenvalues. Settings: {plain(s.describe())}, attention {verbatim(s.attention)}.")
if parse_attention(s.attention).variant.trainable:
    st.error(f"Attention '{parse_attention(s.attention).kind.value}' trains its own parameters: pick a "
             "parameter-free variant in the sidebar.")
    st.stop()
epochs, draws = controls_ui()
cfg = configs.alignment_config(s, epochs, draws)
design_cfg = replace(cfg, design=True)  # a finished causal design is the same run and more: read it where it exists
res = peek("alignment", design_cfg, data_dir()) or obtain_planned(run_alignment, cfg, f"Task alignment at n = {s.n}",
                                                                  button="Measure the alignment")
if res is None:
    st.stop()

verdict = res.frames["verdict"]
v = verdict_alignment(verdict, plain(s.label))  # the label comes from the URL
st.info(f"**{v.status}** — {v.words}  \n{power_sentence(verdict, plain(s.label))}")

st.subheader("Alignment against width")
data = AP.alignment_width_data(res.frames["summary"], res.frames["kinf"])
render.chart(AP.alignment_width_fig(data), data, "alignment against width",
             title="Centred kernel–target alignment against width", config=res.config, how_to_read=
             "Higher is better aligned with the labels. Dotted: K∞ (no width); dashed: K_m at init; solid: K_m "
             "after training. Bars: sd over network seeds and data draws.")
st.dataframe(verdict, hide_index=True)
st.caption(VERDICT_WORDS)

st.subheader("The power half by every metric it is claimed in")
metrics_table = res.frames.get("power_metrics")
if metrics_table is None:  # a result from before the frame existed
    metrics_table = AL.power_metrics(res.frames["rows"], res.frames["curves"])
st.markdown(f"**{AL.disagreement(metrics_table)}**")
st.dataframe(metrics_table, hide_index=True, column_config={
    "attn": st.column_config.NumberColumn("MLP-Attn", format="%.3g"),
    "relu": st.column_config.NumberColumn("2L-ReLU", format="%.3g"),
    "diff": st.column_config.NumberColumn("MLP-Attn − 2L-ReLU", format="%.3g"),
    "low": st.column_config.NumberColumn("95 % low", format="%.3g"),
    "high": st.column_config.NumberColumn("95 % high", format="%.3g")})
st.caption("Each net's trained K_m at the largest width; the difference is paired within each (draw, seed) and its "
           "interval is a t interval over the data draws' means (over the nets with one draw). favours: the net the "
           "interval points to (lower is better for k at C(k) = 0.9 and for the p at which the learning curve "
           f"reaches {AL.REACH_ERROR:g} of the zero predictor's error; higher for alignment and the area), "
           "neither where it reaches zero; a net that never reaches the error level leaves its pair out.")

left, right = st.columns(2)
with left:
    st.subheader("Where the labels lie in each kernel's spectrum")
    data = AP.power_data(res.frames["power"])
    render.chart(AP.power_fig(data), data, "cumulative power", title="Cumulative power C(k) and the spectrum",
                 config=res.config, how_to_read=
                 "A curve that rises early puts the labels in the kernel's top directions, which ridge regression "
                 "learns from few samples; the right panel gives the eigenvalues those directions carry.")
with right:
    st.subheader("Learning curves: measured and theory")
    data = AP.curve_data(res.frames["curves"])
    render.chart(AP.curve_fig(data), data, "learning curves", title="Kernel-ridge test error against p",
                 config=res.config, how_to_read=
                 "Markers: kernel ridge on p points drawn without replacement from the n pool points, tested on "
                 "the n − p it left out (mean ± sd over trials); lines: the theory at the same p, from the same "
                 "kernel's eigenvalues and the labels' weights on them.")
    apart = parted(data)
    if len(apart):
        st.warning("Theory and measurement part (by more than 20 % and two standard errors) at "
                   + ", ".join(f"{plots.arch_label(r.arch)} {r.kernel} p = {r.p} (p/n = {r.p_over_n:.2f})"
                               for r in apart.itertuples()) + ".")

st.subheader("Alignment along training")
data = AP.training_data(res.frames["training"])
render.chart(AP.training_fig(data), data, "alignment along training", title="Alignment and distance to K∞ by epoch",
             config=res.config, how_to_read=
             "Solid: alignment of K_m(t) with the labels; dashed grey: its distance to K∞, how far the net has left "
             "the kernel regime. The next chart puts the flip rates of the same nets beside it.")

st.subheader("Both halves along training: alignment and flip excess")
data = AP.both_halves_data(res.frames.get("flips_training_summary"))
if data.empty:
    st.caption(along_sentence(None))
else:
    render.chart(AP.both_halves_fig(data), data, "both halves along training",
                 title="Alignment and flip excess by epoch", config=res.config, how_to_read=
                 "At each snapshot of the largest width. Above: the alignment of K_m(t) with the labels (bars: sd "
                 "over seeds and draws). Below, on the same epochs: the share of top-τ points whose ridge influence on "
                 "K_m(t) flips under a PGD attack on that epoch's net, minus the larger null, in points (bars: 95 % "
                 "bootstrap interval over nets and points); dotted grey, that larger null's own flip rate (the next "
                 "seed's net, or random directions of the same norms).")
    st.caption(plain(along_sentence(res.frames["flips_training"])))
    st.caption(plain(association_sentence(res.frames.get("association"))))

st.subheader("What the flip excess follows: the kernel's movement or the attacker's training")
effects = res.frames.get("design_effects")
if effects is None or effects.empty:
    st.markdown("Along training two things change at once: the kernel that reads the influence (K_m(t) moves away "
                "from K_m(0)) and the net whose loss the attack climbs. The causal design separates them: at every "
                "snapshot, the influence read on K_m(0), K_m(t) or K∞ × the attack on the epoch-0 or the epoch-t net.")
    design = obtain_planned(run_alignment, replace(cfg, design=True), "the causal design along training",
                            button="Run the causal design")
    if design is not None:
        st.rerun()  # the page then reads the design's result (the same run with design on)
else:
    data = design_data(res.frames.get("flips_design_summary"))
    render.chart(design_fig(data, cfg.attention), data, "causal design along training", config=res.config,
                 title="Flip excess by epoch, per influence kernel and attacker", how_to_read=
                 "Colour: the kernel that reads the influence (K_m(0), K_m(t), K∞); dotted: the attack climbs the "
                 "epoch-0 net's loss, solid: the epoch-t net's. Lines of one colour that part with their dash follow "
                 "the attacker; lines of one dash that part with their colour follow the kernel. Bars: 95 % interval, "
                 "data draws the unit.")
    st.markdown(f"**{plain(design_sentence(effects, rule=False))}**")
    st.caption(DESIGN_RULE)
render.settings(res.config)
