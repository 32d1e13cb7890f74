"""Kernel regime: does training stay near the linearised net, and how do μP and NTK scale?"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from engine.data import DataSpec
from engine.experiments import dynamics
from engine.experiments.configs.coord_check import CoordCheckConfig
from engine.experiments.configs.dynamics import DynamicsConfig
from engine.experiments.coord_check import run_coord_check
from engine.experiments.dynamics import run_dynamics
from engine.experiments.registry import preset
from engine.maths.specs import TrainSpec
from engine.reporting import plots
from engine.runtime.errors import EngineError
from ui import configs, render
from ui.common import ARCH_LABELS, available_names, plain, require, shared
from ui.retrain import section as retrain_section
from ui.runner import obtain_planned
from ui.text import verbatim

BOUND = configs.BOUND
QUICK = preset("dynamics")
BINARY = preset("dynamics", "binary-mse")  # 3 vs 8, MSE, plain SGD: the set-up that tells the two nets apart
CC_QUICK = preset("coord-check")
LR_CHOICES = (1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0)
PARAM_LABELS = {"ntk": "NTK (m^-½, the paper's)", "mup": "μP (m^-1, SGD lr × m)"}
OPTIMIZERS = configs.choices_of(TrainSpec, "optimizer")


def use_binary_preset(on: bool = True) -> None:
    """Button callback: this page's controls set to the ``binary-mse`` preset, and its data (MNIST 3 vs 8, or
    classes 3 and 8 of the sidebar's data set where MNIST is not here), n and widths used on this page only
    (``regime.binary_on``; the shared sidebar, and so every other page, stays as it was). False: back to the
    sidebar's."""
    st.session_state["regime.binary_on"] = on
    if not on:
        return
    t = BINARY.train
    st.session_state.update({
        "regime.epochs": t.epochs, "regime.seeds": len(BINARY.seeds), "regime.optimizer": t.optimizer,
        "regime.lr": t.lr, "regime.param": t.param, "regime.every": BINARY.record_every})


def binary_data(s) -> DataSpec:
    """The preset's data on this machine: its own where its data set is here, else the sidebar's data set
    with the preset's two classes."""
    base, _, pair = BINARY.data.dataset.partition(":")
    data = BINARY.data if base in available_names() else replace(BINARY.data, dataset=f"{s.base}:{pair}")
    return replace(data, seed=int(s.seed))


def preset_ui() -> None:
    c1, c2 = st.columns([1, 3], vertical_alignment="center")
    c1.button("3 vs 8 with MSE", key="regime.binary", on_click=use_binary_preset, icon=":material/tune:",
              help="Sets this page (not the sidebar) and the controls below to the `binary-mse` preset of `python -m engine "
                   "dynamics`: MNIST 3 vs 8, n = 200, MSE, plain SGD lr 1, 50 epochs, widths 64 … 4096, 3 seeds.")
    c2.caption("On 10 classes with cross-entropy both nets' gaps fall near the lazy rate. The binary task with "
               "MSE (where the closed-form K∞ gradient flow applies) is the set-up that separates them: 2L-ReLU's "
               "gap falls like m^-½, MLP-Attn's hardly moves.")


def controls_ui() -> tuple[int, int, str, float, str, int]:
    c1, c2, c3, c4, c5, c6 = st.columns(6)
    epochs = configs.number(c1, "Training epochs", TrainSpec, "epochs", "regime.epochs", value=QUICK.train.epochs,
                            step=10, hi=1000)
    seeds = c2.number_input("Network seeds", 1, 10, len(QUICK.seeds), key="regime.seeds", **BOUND,
                            help="Charts show the mean ± sd over these seeds.")
    optimizer = c3.selectbox("Optimiser", OPTIMIZERS, index=OPTIMIZERS.index(QUICK.train.optimizer),
                             key="regime.optimizer", **BOUND, help=configs.help_of(TrainSpec, "optimizer"))
    lr = c4.select_slider("Learning rate", LR_CHOICES, value=QUICK.train.lr, key="regime.lr", **BOUND,
                          help=configs.help_of(TrainSpec, "lr") + ". Plain SGD needs a large one (1.0 here); "
                               "Adam a small one (1e-3).")
    param = c5.selectbox("Parametrisation", list(PARAM_LABELS), format_func=lambda p: PARAM_LABELS[p],
                         key="regime.param", **BOUND, help=configs.help_of(TrainSpec, "param"))
    every = configs.number(c6, "Measure every", DynamicsConfig, "record_every", "regime.every",
                           value=QUICK.record_every, hi=100)
    return int(epochs), int(seeds), optimizer, float(lr), param, int(every)


def coord_ui(archs: tuple[str, ...]) -> tuple[str, str, float, int]:
    c1, c2, c3, c4 = st.columns(4)
    arch = c1.selectbox("Architecture", archs, format_func=lambda a: ARCH_LABELS[a], key="regime.cc_arch", **BOUND)
    optimizer = c2.selectbox("Optimiser", OPTIMIZERS, index=OPTIMIZERS.index(CC_QUICK.train.optimizer),
                             key="regime.cc_optimizer", **BOUND, help=configs.help_of(TrainSpec, "optimizer"))
    lr = c3.select_slider("Learning rate", LR_CHOICES, value=CC_QUICK.train.lr, key="regime.cc_lr", **BOUND,
                          help="The base learning rate η: μP uses η·m for SGD and η for Adam.")
    steps = configs.number(c4, "Steps t", CoordCheckConfig, "steps", "regime.cc_steps", value=CC_QUICK.steps)
    return arch, optimizer, float(lr), int(steps)


def dynamics_config(s, epochs, n_seeds, optimizer, lr, param, every) -> DynamicsConfig:
    train = replace(QUICK.train, epochs=epochs, optimizer=optimizer, lr=lr, param=param)
    preset_on = st.session_state.get("regime.binary_on")  # the preset's data, n and widths, on this page only
    return replace(QUICK, data=binary_data(s) if preset_on else s.data(),
                   widths=BINARY.widths if preset_on else tuple(sorted(s.widths)), archs=tuple(s.archs),
                   attention=s.attention, seeds=tuple(int(s.seed) + i for i in range(n_seeds)), train=train,
                   record_every=every)


def coord_config(s, arch, optimizer, lr, steps) -> CoordCheckConfig:
    train = replace(CC_QUICK.train, optimizer=optimizer, lr=lr)
    return replace(CC_QUICK, data=s.data(), arch=arch, attention=s.attention, train=train, steps=steps)


s = shared()
st.title("Kernel regime")
st.markdown(
    "A network is in the kernel (lazy) regime when it trains like its **linearisation** around the "
    "initialisation, f_lin(x) = f(x; W0) + J(W0)(W − W0). For this head that model freezes every unit's "
    "activation pattern at init. Here each net is trained side by side with its linearisation, from the same "
    "initial weights with the same optimiser, mini-batches and steps, and the two are compared on the test "
    "points. NTK theory says the gap and the share of flipped activation signs shrink like m^-½ under plain "
    "SGD, so curves for wider nets collapse towards zero; where they do not, training learns features. "
    f"Settings: {plain(s.describe())}, attention {verbatim(s.attention)}.")
require(bool(s.widths), "Pick at least one width in the sidebar.")
require(bool(s.archs), "Pick at least one architecture in the sidebar.")
preset_ui()
if st.session_state.get("regime.binary_on"):
    c1, c2 = st.columns([4, 1], vertical_alignment="center")
    c1.info(f"Preset 3 vs 8 with MSE on this page only: {binary_data(s).dataset}, n = {BINARY.data.n}, widths "
            f"{', '.join(str(w) for w in BINARY.widths)} (the sidebar and the other pages keep {plain(s.label)}, "
            f"n = {s.n}).")
    c2.button("Back to the sidebar's", key="regime.binary.off", on_click=use_binary_preset, args=(False,))
epochs, n_seeds, optimizer, lr, param, every = controls_ui()
try:
    cfg = dynamics_config(s, epochs, n_seeds, optimizer, lr, param, every)
except EngineError as exc:  # e.g. qkv attention, which has no fixed features to linearise around
    st.error(plain(exc))
    st.stop()
res = obtain_planned(run_dynamics, cfg,
                     f"Real vs linearised training, {len(cfg.widths) * len(cfg.archs) * n_seeds} pairs of nets",
                     button="Train the nets and their linearisations")

if res is not None:
    summary, final = res.frames["summary"], res.frames["final"]
    last = res.frames["rows"][res.frames["rows"]["epoch"] == res.frames["rows"]["epoch"].max()]
    bad = render.training_gate(last, res.meta["n_classes"], what="gaps and slopes")
    c1, c2 = st.columns(2)
    with c1:
        data = plots.regime_epoch_data(summary, "lin_gap")
        render.chart(plots.regime_epoch_fig(data, "lin_gap"), data, "gap to the linearised net",
                     config=res.config, how_to_read="‖f_t − f_lin,t‖ / ‖f_lin,t‖ on the test points during training, mean over seeds, one line "
                     "per width (darker = wider); lines that drop with width mean wider nets stay lazier.")
    with c2:
        data = plots.regime_epoch_data(summary, "pattern_change")
        render.chart(plots.regime_epoch_fig(data, "pattern_change"), data, "activation signs flipped",
                     config=res.config, how_to_read="Share of the training set's activation signs 1[w_r·φ(x_i) > 0] that differ from init; "
                     "the linearised net keeps every sign, so this is where the two part ways.")
    c1, c2 = st.columns(2)
    with c1:
        data = plots.regime_width_data(final, "lin_gap")
        render.chart(plots.regime_width_fig(data, "lin_gap"), data, "final gap against width",
                     config=res.config, how_to_read=f"The gap after {epochs} epochs against width, mean ± sd over seeds; the dotted lines fall "
                     "like m^-½ from the smallest width: the lazy regime's rate.")
    with c2:
        data = plots.regime_width_data(final, "pattern_change")
        render.chart(plots.regime_width_fig(data, "pattern_change"), data, "final sign flips against width",
                     config=res.config, how_to_read="The share of flipped activation signs after training against width, with the same "
                     "m^-½ reference.")
    slopes = dynamics.width_slopes(final)
    slopes.insert(0, "model", [ARCH_LABELS.get(a, a) for a in slopes["arch"]])
    lazy = param == "ntk" and optimizer == "sgd"
    st.dataframe(slopes[["model", "metric", "slope"]], hide_index=True, column_config={
        "slope": st.column_config.NumberColumn("log-log slope against width", format="%.2f",
                                               help="−0.5 is the lazy regime's rate (NTK parametrisation, SGD)")})
    st.caption("Lazy-regime theory: slope −½ (NTK parametrisation, plain SGD). " + (
        "These settings are that case." if lazy else
        "These settings are not (Adam normalises steps, μP keeps features moving): expect flatter curves."))
    if final["k_inf_gap_mean"].notna().any():
        data = plots.regime_epoch_data(summary, "k_inf_gap")
        eta, beta, per_epoch = res.meta["flow"]
        render.chart(plots.regime_epoch_fig(data, "k_inf_gap"), data, "gap to the K-infinity gradient flow",
                     config=res.config, how_to_read=f"‖f_t − f_K∞,t‖ / ‖f_K∞,t‖: the trained net against kernel regression with K∞ run for the "
                     f"same time in closed form (η' = 2η/(n·c) = {eta:.3g}, decay ηλ = {beta:.3g}, "
                     f"{per_epoch} steps per epoch).")
    else:
        st.caption(f"The distance to the K∞ gradient flow needs the MSE loss and plain SGD (here: "
                   f"{res.meta['loss']}, {optimizer}); pick two classes in the sidebar, e.g. `3-8`, and SGD.")
    table = final[[c for c in ("arch", "width", "n_seeds", "lin_gap_mean", "lin_gap_sd", "pattern_change_mean",
                               "train_loss_mean", "train_loss_lin_mean", "train_acc_mean", "test_acc_mean",
                               "test_acc_lin_mean", "k_inf_gap_mean", "weight_movement_mean") if c in final]]
    st.dataframe(render.greyed(table.reset_index(drop=True), bad), hide_index=True)
    with st.expander("All measurements, one row per seed and epoch"):
        st.dataframe(res.frames["rows"], hide_index=True)
    render.settings(res.config, "Settings of the comparison")
    with st.expander("The same view from the command line"):
        render.command(cfg)
        render.command(cfg, figure="regime.png")
    render.cached_note(res)

st.header("Coordinate check: NTK against μP")
st.markdown(
    "The check of μP's tooling (Yang et al. 2022): how much the outputs (Δf) and the hidden pre-activations "
    "(Δh = φ (W_t − W_0)ᵀ) move in the first t = 1 … T steps, against width. Under μP (m^-1 output "
    "multiplier, SGD learning rate η·m, Adam's η unchanged) both stay flat: features keep learning at every "
    "width. Under the NTK parametrisation with SGD, Δh shrinks like m^-½ (the lazy regime) while Δf stays "
    "flat; with Adam, Δh stays flat and Δf grows like m^+½. No weight decay here.")
cc_arch, cc_optimizer, cc_lr, cc_steps = coord_ui(tuple(s.archs))
try:
    ccfg = coord_config(s, cc_arch, cc_optimizer, cc_lr, cc_steps)
except EngineError as exc:
    st.error(plain(exc))
    st.stop()
cres = obtain_planned(run_coord_check, ccfg, "Coordinate check", button="Run the coordinate check")
if cres is not None:
    data = plots.coord_data(cres.frames["summary"])
    render.chart(plots.coord_fig(data), data, "coordinate check", wide=True,
                 config=cres.config, how_to_read="RMS change of the outputs (left) and pre-activations (right) after t steps against width, "
                 "mean over seeds, darker = later step; flat lines keep their size as the net widens.")
    fit = cres.frames["fit"].pivot_table(index=["param", "quantity", "theory"], columns="step",
                                         values="slope").reset_index()
    fit.columns = [f"t = {c}" if isinstance(c, (int, float)) and not isinstance(c, bool) else c for c in fit.columns]
    st.dataframe(fit, hide_index=True)
    st.caption("Fitted log-log slopes against width per step, beside the theory's. Widths "
               f"{', '.join(str(w) for w in ccfg.widths)}; {ccfg.train.optimizer}, η = {ccfg.train.lr:g}, "
               f"batch {ccfg.train.batch_size}.")
    render.cached_note(cres)

retrain_section(s)  # the same question asked of influence: does the kernel describe retraining?
