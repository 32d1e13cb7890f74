"""NTK convergence: distance of finite-width nets to their infinite-width kernel, per width."""

from __future__ import annotations

import streamlit as st

from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.kernels import run_kernels
from engine.experiments.sweep import run_ntk_sweep
from engine.maths.specs import TrainSpec
from engine.reporting import plots
from ui import configs, render
from ui.common import ARCH_LABELS, plain, require, shared
from ui.links import NTK_COLUMNS, NTK_METRIC_LABELS
from ui.runner import obtain_planned
from ui.text import verbatim

BOUND = configs.BOUND


def controls_ui() -> tuple[int, int, float, str, float, str]:
    c1, c2, c3 = st.columns(3)
    epochs = configs.number(c1, "Training epochs", TrainSpec, "epochs", "ntk.epochs",
                            value=configs.QUICK["ntk-sweep"].train.epochs, step=10, hi=1000)
    seeds = c2.number_input("Network seeds per width", 1, 10, 3, key="ntk.seeds", **BOUND,
                            help="Charts show the mean ± sd over these seeds (claims rest on at least 3).")
    ridge = c3.select_slider("Ridge λ (relative)", [1e-6, 1e-4, 1e-3, 1e-2, 1e-1],
                             value=configs.QUICK["ntk-sweep"].ridge, key="ntk.ridge", **BOUND,
                             help=configs.help_of(SweepConfig, "ridge"))
    c4, c5, c6 = st.columns(3)
    optimizer = configs.optimizer_ui(c4, key="ntk.optimizer", lr_key="ntk.lr")
    lr = configs.float_input(c5, "Learning rate", TrainSpec, "lr", key="ntk.lr",
                             value=configs.QUICK["ntk-sweep"].train.lr)
    metric = c6.selectbox("Kernel distance", list(NTK_METRIC_LABELS), format_func=lambda k: NTK_METRIC_LABELS[k],
                          key="ntk.metric", **BOUND,
                          help="The prediction gap (the default) and the whitened distance see the conditioning "
                               "the paper is about; the Frobenius distance is blind to it and can put MLP-Attn "
                               "closer to K∞ than 2L-ReLU.")
    return int(epochs), int(seeds), float(ridge), optimizer, float(lr), metric


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
    f"Settings: {plain(s.describe())}, attention {verbatim(s.attention)}.")
require(bool(s.widths), "Pick at least one width in the sidebar.")
require(bool(s.archs), "Pick at least one architecture in the sidebar.")
epochs, n_seeds, ridge, optimizer, lr, metric = controls_ui()
cfg = configs.sweep_config(s, epochs, n_seeds, ridge, optimizer=optimizer, lr=lr)
res = obtain_planned(run_ntk_sweep, cfg, f"NTK sweep, {len(cfg.widths) * len(cfg.archs) * n_seeds} nets",
                     button="Run the sweep")

if res is not None:
    rows = res.frames["rows"]
    bad = render.training_gate(rows, res.meta["n_classes"], what="kernel distances and prediction gaps")
    if metric == "kernel_dist":
        st.caption("Frobenius distance: blind to κ, so it can put MLP-Attn closer to K∞ than 2L-ReLU while the "
                   "prediction gap and the whitened distance put it farther; read it beside one of them.")
    at_init, trained = NTK_COLUMNS[metric]
    c1, c2 = st.columns(2)
    with c1:
        data = plots.distance_data(rows, at_init)
        render.chart(plots.distance_fig(data, at_init), data, f"{metric} at init", config=res.config,
                     how_to_read=f"{NTK_METRIC_LABELS[metric][0].upper() + NTK_METRIC_LABELS[metric][1:]} between the empirical NTK at initialisation and "
                     "K∞ on the training points, mean ± sd over seeds; a falling line means the width is "
                     "approaching the kernel limit.")
    with c2:
        data = plots.distance_data(rows, trained)
        render.chart(plots.distance_fig(data, trained, untrained=bad), data, f"{metric} after training",
                     config=res.config,
                     how_to_read="The same distance after training; if it is much larger than at init, training moved "
                     "the kernel (feature learning) instead of staying in the lazy regime.")
    c1, c2 = st.columns(2)
    with c1:
        data = plots.distance_data(rows, "train_acc")
        render.chart(plots.distance_fig(data, "train_acc", untrained=bad), data, "train accuracy", config=res.config,
                     how_to_read="Train accuracy of the nets, mean ± sd over seeds: a net near chance has not "
                                 "learned the task, and its distances to K∞ describe an untrained predictor.")
    with c2:
        data = plots.distance_data(rows, "test_acc")
        render.chart(plots.distance_fig(data, "test_acc", untrained=bad), data, "test accuracy", config=res.config,
                     how_to_read="Test accuracy of the trained nets; compare with the K∞ ridge baseline in the "
                                 "table below: a net far below it underfits, and its distances mean little.")
    c1, c2 = st.columns(2)
    with c1:
        data = plots.distance_data(rows, "function_dist_rel")
        render.chart(plots.distance_fig(data, "function_dist_rel", untrained=bad), data, "relative function distance",
                     config=res.config,
                     how_to_read="‖f_m − f_NTK‖_F / ‖f_NTK‖_F on the test points: the paper's function distance "
                                 "divided by the scale of what it compares (its absolute value mostly tracks the "
                                 "logits' size).")
    with c2:
        if epochs > 0:
            data = plots.loss_data(res.frames["losses"])
            render.chart(plots.loss_fig(data, cfg.attention), data, "training loss", config=res.config,
                         how_to_read="Mean training loss per epoch for each width (darker = wider), averaged over "
                                     "seeds; flat lines mean the nets barely train in these epochs.")
    summary = res.frames["summary"][["arch", "width", "n_seeds", "train_acc_mean", "test_acc_mean",
                                     "test_acc_ntk_mean", "f_norm_mean", "f_ntk_norm_mean",
                                     "function_dist_mean", "function_dist_sd"]].reset_index(drop=True)
    st.dataframe(render.greyed(summary, bad), hide_index=True)
    with st.expander("All measurements, one row per seed"):
        st.dataframe(rows, hide_index=True)
    if epochs > 0:
        if not res.frames["trajectory"].empty:
            data = plots.trajectory_data(res.frames["trajectory"])
            render.chart(plots.trajectory_fig(data, cfg.attention), data, "kernel distance during training",
                         config=res.config,
                         how_to_read="The kernel's Frobenius distance to K∞ at five points of training; a line that stays "
                         "flat is the lazy (kernel) regime, a rising one means training moves the kernel.")
    else:
        st.caption("Epochs = 0: the networks are not trained, so there are no loss curves and the trained "
                   "kernel equals the initial one.")
    render.settings(res.config, "Settings of the sweep")
    with st.expander("The same view from the command line"):
        st.caption("Computes (or reads from the same cache) this sweep, and draws its main chart for a slide:")
        render.command(cfg)
        render.command(cfg, figure="ntk.png")
    render.cached_note(res)

st.header("Kernels side by side")
st.markdown("Training points are sorted by label, so class blocks show along the diagonal. Matrices larger "
            f"than {plots.MAX_SIDE} x {plots.MAX_SIDE} are shown as block means; the full ones download as .npy.")
arch, width = heatmap_ui(cfg.widths, cfg.archs)
kcfg = configs.kernel_config(s, arch, width, epochs)
kres = obtain_planned(run_kernels, kcfg, f"Kernels of {ARCH_LABELS[arch]} at m = {width}",
                      button="Compute the kernels")
if kres is not None:
    K = kres.arrays["K_trained"] if epochs > 0 else kres.arrays["K_init"]
    K_inf = kres.arrays["K_inf"]
    when = "after training" if epochs > 0 else "at initialisation"
    render.chart(plots.kernel_heatmaps_fig(K, K_inf, width, arch, y=kres.arrays["y"], attention=kcfg.attention),
                 plots.kernel_diff_data(K, K_inf),
                 "kernel heatmaps", wide=True, config=kres.config,
                 how_to_read=f"Left: the empirical NTK {when}; middle: K∞; right: their difference (red where K_m is "
                 "larger, blue where smaller); hover for values.", index=True)
    c = st.columns(3)
    with c[0]:
        render.npy_button("K_m (.npy)", K, f"K_{arch}_m{width}.npy")
    with c[1]:
        render.npy_button("K∞ (.npy)", K_inf, f"K_inf_{arch}.npy")
    with c[2]:
        render.npy_button("labels (.npy)", kres.arrays["y"], f"labels_{arch}.npy")
    render.cached_note(kres)
