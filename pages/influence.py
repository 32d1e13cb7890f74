"""Influence: which training images push a test prediction up or down, for both nets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from engine.experiments.configs.influence import InfluenceConfig
from engine.experiments.influence import run_influence
from engine.experiments.recipes import READINGS
from engine.maths.specs import TrainSpec
from engine.reporting import plots
from engine.runtime.errors import EngineError
from ui import configs, render
from ui.common import plain, require, shared
from ui.retrain import section as retrain_section
from ui.runner import obtain_planned
from ui.text import verbatim

BOUND = configs.BOUND
WIDTHS = (64, 256, 1024, 4096)
QUICK = configs.QUICK["influence"]


def controls_ui() -> tuple[int, int, float, str]:
    c1, c2, c3, c4 = st.columns(4)
    width = c1.selectbox("Width m", WIDTHS, index=WIDTHS.index(QUICK.width), key="influence.width", **BOUND)
    epochs = configs.number(c2, "Training epochs", TrainSpec, "epochs", "influence.epochs",
                            value=QUICK.train.epochs, step=10, hi=1000)
    ridge = c3.select_slider("Ridge λ (relative)", [1e-6, 1e-4, 1e-3, 1e-2, 1e-1], value=QUICK.ridge,
                             key="influence.ridge", **BOUND, help=configs.help_of(InfluenceConfig, "ridge"))
    target = c4.radio("Influence on", configs.choices_of(InfluenceConfig, "target"), horizontal=True,
                      key="influence.target", **BOUND, help=configs.help_of(InfluenceConfig, "target"))
    return int(width), int(epochs), float(ridge), target


def readings_ui(width: int, epochs: int, ridge: float, target: str) -> tuple[tuple[str, ...], int]:
    """The readings besides ridge that this training supports (flow needs plain SGD on MSE), and
    how many of the top points they read."""
    others, refused = [], []
    for name in READINGS[1:]:
        try:
            configs.influence_config(s, width, epochs, ridge, target, readings=("ridge", name))
            others.append(name)
        except EngineError as exc:
            refused.append(plain(exc))
    c1, c2 = st.columns([3, 1])
    chosen = c1.multiselect("Also read by", others, default=[], key="influence.readings", **BOUND,
                            format_func=lambda r: plots.READING_LABELS[r],
                            help=configs.help_of(InfluenceConfig, "readings")
                            + (" Not offered here: " + " ".join(refused) if refused else ""))
    points = configs.number(c2, "Points read", InfluenceConfig, "read_points", "influence.read_points",
                            value=QUICK.read_points, step=5, hi=200)
    return ("ridge", *[r for r in others if r in chosen]), int(points)


def readings_section(res, cfg) -> None:
    """The top points read again by flow and by retraining, beside their ridge influence."""
    rows = res.frames["readings"]
    st.header("The same points read by the network")
    st.markdown(
        f"The {cfg.read_points} training points of largest |ridge influence| per architecture, read again: "
        + "; ".join(f"**{plots.READING_LABELS[r]}**: exact for {plain(rows[rows.reading == r].exact_for.iloc[0])}"
                    for r in cfg.readings if r != "ridge")
        + ". Ridge is the kernel's answer; retraining is the network's own leave-one-out (the head retrained from "
        "the same initialisation and batches without each point). Where they part, the images above show the "
        "kernel's view, not the network's.")
    data = plots.against_ridge_data(res.frames["aggregate"], int(res.meta["shown_seed"]))
    render.chart(plots.against_ridge_fig(data, cfg.attention), data, "readings against ridge", config=res.config,
                 how_to_read="Each marker is one training point: its influence averaged over the test points by ridge "
                 "(x) and by the other reading (y). On the dotted line the readings agree; across it they disagree "
                 "in sign.")
    st.dataframe(rows, hide_index=True, use_container_width=True,
                 column_config={"rho_vs_ridge": st.column_config.NumberColumn("ρ vs ridge", format="%.2f"),
                                "sign_agreement_vs_ridge": st.column_config.NumberColumn(
                                    "same sign as ridge", format="%.2f",
                                    help="share of (test point, training point) influences of the same sign"),
                                "reading_test_acc": st.column_config.NumberColumn("retrained test acc", format="%.3f")})


def pick_ui(n_test: int) -> tuple[int, int]:
    c1, c2 = st.columns(2)
    i = c1.number_input("Test image", 0, max(0, n_test - 1), 0, key="influence.test", **BOUND,
                        help=f"Index among the {n_test} test points.")
    k = c2.slider("Images per row", 4, 12, 8, key="influence.k", **BOUND)
    return int(i), int(k)


s = shared()
st.title("Influence of training images")
st.markdown(
    "The influence of training point i on a test point x is the exact leave-one-out change of NTK "
    "kernel ridge regression with the trained net's empirical kernel K_m: I = f(x) − f₋ᵢ(x) = "
    "[k(x, X) M]_i · α_i / M_ii with M = (K_m + λI)⁻¹ and α = M y, on the output chosen below "
    "(the test point's own class by default): the **ridge** reading; \"Also read by\" adds the kernel's "
    "gradient flow and the network's own retraining at the top points. **Positive** means the point pushes that output up "
    "(removing it would lower it), **negative** that it pushes it down. "
    f"Settings: {plain(s.describe())}, attention {verbatim(s.attention)}.")
require(bool(s.archs), "Pick at least one architecture in the sidebar.")
width, epochs, ridge, target = controls_ui()
readings, read_points = readings_ui(width, epochs, ridge, target)
cfg = configs.influence_config(s, width, epochs, ridge, target, readings, read_points)
res = obtain_planned(run_influence, cfg, f"Influence at m = {width}", button="Compute influences")
if res is None:
    st.stop()

X, y = res.arrays["X"], res.arrays["y"]
X_test, y_test = res.arrays["X_test"], res.arrays["y_test"]
names = list(res.meta.get("class_names") or [str(c) for c in range(int(y.max()) + 1)])
shape = res.meta.get("image_shape")
archs = [a for a in cfg.archs if f"{a}_I" in res.arrays]
i, k = pick_ui(X_test.shape[0])

c1, c2 = st.columns([1, 4])
with c1:
    st.plotly_chart(plots.image_grid_fig(X_test[[i]], shape, [f"test #{i}: {names[int(y_test[i])]}"], cols=1),
                    key="chart.test-image", config=render.PLOTLY_CONFIG)
with c2:
    st.markdown(f"**Test image #{i}**, true class **{names[int(y_test[i])]}**. Below, for each architecture, "
                f"the {k} training images with the most positive (top row) and most negative (bottom row) "
                "influence on its prediction.")

labels = [names[int(c)] for c in y]
bad = render.training_gate(res.frames["summary"], len(names), by=("arch",), what="influences")
render.accuracy_table(res.frames["summary"], bad)
for arch in archs:
    data = plots.influence_grid_data(res.arrays[f"{arch}_I"][i], labels, k, arch)
    st.subheader(plots.arch_label(arch, cfg.attention))
    if data.empty:
        st.info("No training point has a nonzero influence on this test image.")
        continue
    render.chart(plots.influence_grid_fig(X, shape, data), data, f"{arch} most positive and negative", wide=True,
                 title=f"{plots.arch_label(arch, cfg.attention)}: most positive and negative influence on test #{i}",
                 config=res.config,
                 how_to_read="Top row: training images with the largest positive influence (removing one would lower the "
                 "outputs most); bottom row: the most negative; the number under each index is its influence.")

if "readings" in res.frames:
    readings_section(res, cfg)

st.header("Distribution of influence")
c1, c2 = st.columns(2)
with c1:
    data = pd.concat([pd.DataFrame({"arch": a, "train_index": np.arange(len(labels)), "label": labels,
                                    "influence": res.arrays[f"{a}_I"][i]}) for a in archs], ignore_index=True)
    render.chart(plots.influence_hist_fig(data, title=f"Influence on test image #{i}", attention=cfg.attention), data,
                 f"influence on test {i}", config=res.config,
                 how_to_read="How many training points have each influence on this test image; a wider spread means a "
                 "few points decide the prediction.")
with c2:
    if "aggregate" in res.frames:
        agg = res.frames["aggregate"]
        data = plots.influence_hist_data(agg[agg["reading"] == "ridge"] if "reading" in agg else agg)
        render.chart(plots.influence_hist_fig(data, title="Influence averaged over all test points",
                                             attention=cfg.attention),
                     data, "aggregate influence", config=res.config,
                     how_to_read="Each training point's influence averaged over the test points; the points at either tail are "
                     "the top-τ by magnitude that the malleability attacks target.")
render.settings(res.config)
with st.expander("The same view from the command line"):
    render.command(cfg)
render.cached_note(res)

retrain_section(s, ridge=ridge, target=target)  # is this influence what the network does when a point goes?
