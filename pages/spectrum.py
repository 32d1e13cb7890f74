"""Spectrum: how linearized attention cubes the eigenvalues of the data's Gram matrix."""

from __future__ import annotations

import streamlit as st

from engine.experiments.configs.spectrum import SpectrumConfig
from engine.experiments.spectrum import run_spectrum
from engine.reporting import plots
from ui import configs, render
from ui.common import plain, shared
from ui.runner import obtain_planned
from ui.text import verbatim

RTOLS = {"auto: n · machine epsilon": None, "1e-12": 1e-12, "1e-10": 1e-10, "1e-8": 1e-8, "1e-6": 1e-6}
BOUND = configs.BOUND


def controls_ui() -> tuple[float | None, float]:
    c1, c2 = st.columns(2)
    rtol = c1.selectbox("Numerical-rank tolerance (relative to λ_max)", list(RTOLS), key="spectrum.rtol",
                        **BOUND, help="Eigenvalues below tolerance · λ_max count as zero; κ uses the rest.")
    eps = c2.select_slider("ε of the v1 bound κ⁶/ε²", [0.01, 0.05, 0.1, 0.2, 0.5],
                           value=configs.QUICK["spectrum"].eps, key="spectrum.eps", **BOUND,
                           help=configs.help_of(SpectrumConfig, "eps"))
    return RTOLS[rtol], float(eps)


s = shared()
st.title("Spectrum of G and of the attention features")
st.markdown(
    "Rows of X (ℓ2-normalised) give the Gram matrix **G = X Xᵀ**. Linearized attention maps the "
    "training set to X Xᵀ X, whose Gram is **G³**: every eigenvalue is cubed, so the condition "
    "number κ = λ_max / λ_min becomes κ³. The paper's bound on the width needed for the NTK regime "
    "grows like κ(G̃)² = κ⁶ (v1: κ⁶/ε², v2: κ_d⁶ · n ln n). Everything is computed in float64 "
    f"from `eigvalsh`. Settings: {plain(s.describe())}, attention {verbatim(s.attention)}.")
rtol, eps = controls_ui()
cfg = configs.spectrum_config(s, rtol=rtol, eps=eps)
res = obtain_planned(run_spectrum, cfg, f"Spectrum at n = {s.n}", button="Compute the spectrum")
if res is None:
    st.stop()

summ = res.meta["summary"]
k3 = summ.get("kappa_attention_theory")
formula = plots.pretty_formula(summ.get("kappa_attention_formula"))
m = render.metric_slots(5)
m[0].metric("κ(G)", f"{summ['kappa']:.3g}", help="λ_max / λ_rank over the numerical rank")
m[1].metric(f"{formula or 'no closed form'} (theory, {summ['attention']})", "—" if k3 is None else f"{k3:.3g}")
m[2].metric(f"κ of attention Gram ({summ['attention']}, measured)", f"{summ['kappa_attention']:.3g}")
m[3].metric("numerical rank of G", f"{summ['numerical_rank']} / {summ['n']}",
            help=f"tolerance {summ['rank_tol']:.3g} (absolute); d = {summ['d']}")
m[4].metric("κ_d (used by v2)",
            "singular" if summ["kappa_d_singular"] else f"{summ['kappa_d']:.3g}",
            help="κ of the rank-min(n, d) truncation of G; undefined when rank < min(n, d), e.g. from "
                 "MNIST's all-zero border pixels.")

if summ.get("kappa_attention_saturated"):
    st.warning(f"The theory's κ of the attention Gram ({k3:.3g}) is beyond what float64 eigenvalues can resolve "
               f"(about {summ['kappa_resolvable']:.2g} at this n): the measured value ({summ['kappa_attention']:.3g}) "
               "is saturated, not a disagreement with the theory.")
left, right = st.columns(2)
with left:
    st.subheader("Eigenvalues")
    data = plots.spectrum_data(res.arrays["eig_G"], res.arrays["eig_attention"])
    render.chart(plots.spectrum_fig(data, summ["rank_tol"], summ["attention"]), data, "eigenvalue spectrum",
                 title="Eigenvalues of G and of the attention features' Gram", config=res.config, how_to_read=
                 "Each line lists a Gram matrix's eigenvalues from largest to smallest on a log scale; "
                 + (f"with {summ['attention']} attention the condition number becomes {formula}, so the attention "
                    "line falls more steeply." if formula else
                    f"{summ['attention']} attention has no closed form in G's eigenvalues: compare the two lines."))
with right:
    st.subheader("Width needed for the kernel regime")
    data = plots.width_needed_data(summ["width_threshold_log10"], summ["attention"])
    render.chart(plots.width_needed_fig(data, d=summ["d"]), data, "width needed",
                 title="Width the paper's bounds ask for (log10 hidden units)", config=res.config, how_to_read=
                 "Bars give log10 of the width each bound asks for; anything right of the green band "
                 "(1e3–1e5 units) is untrainable, and right of the dashed line wider than a net of this input "
                 "size with as many parameters as the largest models (1e12).")

st.subheader("How κ grows with n")
growth = res.frames["growth"]
data = plots.kappa_growth_data(growth)
render.chart(plots.kappa_growth_fig(data), data, "kappa against n", wide=True,
             title="Condition number κ against the number of training points n", config=res.config, how_to_read=
             f"κ(G) of the first n training points (log scale) and the measured κ of the {summ['attention']} attention "
             "features (open circles); " + (f"the dashed line is the theory's {formula}, which they should follow "
                                            "until float64 can no longer resolve them (~1e15)." if formula else
                                            "this variant has no closed-form theory, so no line is drawn."))
render.settings(res.config)
with st.expander("The same view from the command line"):
    render.command(cfg)
    render.command(cfg, figure="spectrum.png")
render.cached_note(res)
