"""NTK convergence: distance of finite-width nets to their infinite-width kernel, per width."""

from __future__ import annotations

import streamlit as st

from engine import plots
from engine.experiments import run_kernels, run_ntk_sweep
from ui import configs, render
from ui.common import ARCH_LABELS, require, shared
from ui.runner import obtain

BOUND = dict(bind="query-params", persist_state="session")


def controls_ui() -> tuple[int, int, float]:
    c1, c2, c3 = st.columns(3)
    epochs = c1.number_input("Training epochs", 0, 1000, configs.NTK_EPOCHS, step=10, key="ntk.epochs", **BOUND,
                             help="Adam, lr 1e-3, batch 128, weight decay 1e-3 as in the paper (which trains 500).")
    seeds = c2.number_input("Network seeds per width", 1, 10, configs.NTK_SEEDS, key="ntk.seeds", **BOUND,
                            help="Shown as a band from the smallest to the largest value.")
    ridge = c3.select_slider("Ridge of the NTK regression (relative)", [1e-6, 1e-4, 1e-3, 1e-2, 1e-1],
                             value=1e-3, key="ntk.ridge", **BOUND)
    return int(epochs), int(seeds), float(ridge)


def heatmap_ui(widths: tuple[int, ...], archs: tuple[str, ...]) -> tuple[str, int]:
    c1, c2 = st.columns(2)
    arch = c1.selectbox("Architecture", archs, format_func=lambda a: ARCH_LABELS[a], key="ntk.arch",
                        **BOUND)
    width = c2.selectbox("Width m", widths, index=len(widths) - 1, key="ntk.width", **BOUND)
    return arch, int(width)


s = shared()
st.title("NTK convergence")
st.markdown(
    "A wide network trained by gradient descent behaves like kernel regression with its "
    "infinite-width NTK K∞ when its empirical kernel K_m stays close to K∞. For 2L-ReLU the "
    "distance should shrink as the width m grows; for MLP-Attn the paper finds it does not. "
    f"Settings: {s.describe()}, attention `{s.attention}`.")
require(bool(s.widths), "Pick at least one width in the sidebar.")
require(bool(s.archs), "Pick at least one architecture in the sidebar.")
epochs, n_seeds, ridge = controls_ui()
cfg = configs.sweep_config(s, epochs, n_seeds, ridge)
sec = configs.sweep_seconds(cfg, configs.input_dim(s))
res = obtain("ntk_sweep", run_ntk_sweep, cfg, f"NTK sweep, {len(cfg.widths) * len(cfg.archs) * n_seeds} nets",
             auto=sec < configs.AUTO_SECONDS, button="Run the sweep",
             note=f"These settings take about {sec:.0f} s here; they run in the background once started.")

if res is not None:
    rows = res.frames["rows"]
    c1, c2 = st.columns(2)
    with c1:
        data = plots.distance_data(rows, "kernel_dist_init")
        render.chart(plots.distance_fig(data, "kernel_dist_init"), data, "kernel distance at init",
                     "Relative Frobenius distance between the empirical NTK at initialisation and K∞ on the "
                     "training points; a falling line means the width is approaching the kernel limit.")
    with c2:
        data = plots.distance_data(rows, "kernel_dist_trained")
        render.chart(plots.distance_fig(data, "kernel_dist_trained"), data, "kernel distance after training",
                     "The same distance after training; if it is much larger than at init, training moved "
                     "the kernel (feature learning) instead of staying in the lazy regime.")
    data = plots.distance_data(rows, "function_dist")
    render.chart(plots.distance_fig(data, "function_dist"), data, "function distance",
                 "Distance between the trained network's test outputs and those of kernel regression with K∞ "
                 "(the paper's ‖f_m − f_NTK‖); bands span the seeds.")
    with st.expander("All measurements"):
        st.dataframe(rows, hide_index=True)
    if epochs > 0:
        data = plots.loss_data(res.frames["losses"])
        render.chart(plots.loss_fig(data), data, "training loss",
                     "Mean training loss per epoch for each width (darker = wider), averaged over seeds; "
                     "flat lines mean the nets barely train in these epochs.")
        if not res.frames["trajectory"].empty:
            data = plots.trajectory_data(res.frames["trajectory"])
            render.chart(plots.trajectory_fig(data), data, "kernel distance during training",
                         "The kernel's distance to K∞ at five points of training; a line that stays flat is "
                         "the lazy (kernel) regime, a rising one means training moves the kernel.")
    else:
        st.caption("Epochs = 0: the networks are not trained, so there are no loss curves and the trained "
                   "kernel equals the initial one.")
    render.settings(res.config, "Settings of the sweep")
    render.cached_note(res)

st.header("Kernels side by side")
st.markdown("Training points are sorted by label, so class blocks show along the diagonal. Matrices larger "
            f"than {plots.MAX_SIDE} x {plots.MAX_SIDE} are shown as block means; the full ones download as .npy.")
arch, width = heatmap_ui(cfg.widths, cfg.archs)
kcfg = configs.kernel_config(s, arch, width, epochs)
kres = obtain("kernels", run_kernels, kcfg, f"Kernels of {ARCH_LABELS[arch]} at m = {width}",
              auto=configs.sweep_seconds(configs.sweep_config(s, epochs, 1, ridge, (width,)),
                                         configs.input_dim(s)) < configs.AUTO_SECONDS,
              button="Compute the kernels")
if kres is not None:
    K = kres.arrays["K_trained"] if epochs > 0 else kres.arrays["K_init"]
    K_inf = kres.arrays["K_inf"]
    when = "after training" if epochs > 0 else "at initialisation"
    render.chart(plots.kernel_heatmaps_fig(K, K_inf, width, arch), plots.kernel_diff_data(K, K_inf),
                 "kernel heatmaps",
                 f"Left: the empirical NTK {when}; middle: K∞; right: their difference (red where K_m is "
                 "larger, blue where smaller); hover for values.", index=True)
    c = st.columns(3)
    with c[0]:
        render.npy_button("K_m (.npy)", K, f"K_{arch}_m{width}.npy")
    with c[1]:
        render.npy_button("K∞ (.npy)", K_inf, f"K_inf_{arch}.npy")
    with c[2]:
        render.npy_button("labels (.npy)", kres.arrays["y"], f"labels_{arch}.npy")
    render.cached_note(kres)
