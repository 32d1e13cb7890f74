"""Malleability: how easily small perturbations of training images flip their influence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from engine import plots
from engine.malleability import run_malleability
from ui import configs, render
from ui.common import ARCH_LABELS, require, shared
from ui.runner import obtain

BOUND = dict(bind="query-params", persist_state="session")
ATTACKS = ("fgsm", "pgd", "mim")
EPS_CHOICES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
WIDTHS = (64, 256, 1024, 4096)


def controls_ui() -> dict:
    c1, c2, c3, c4 = st.columns(4)
    attacks = c1.multiselect("Attacks", ATTACKS, default=list(ATTACKS), key="mall.attacks", **BOUND,
                             format_func=str.upper, help="FGSM: one signed-gradient step; PGD: projected steps; "
                                                         "MIM: PGD with momentum.")
    eps = c2.multiselect("ε (ℓ∞ budget, pixel units)", EPS_CHOICES, default=list(configs.MALL_EPS),
                         key="mall.eps", **BOUND, help="The paper reports ε = 0.3; its prototype found 0.05 telling.")
    steps = c3.number_input("Attack steps (PGD, MIM)", 1, 200, configs.MALL_STEPS, key="mall.steps", **BOUND)
    epochs = c4.number_input("Training epochs", 0, 1000, configs.MALL_EPOCHS, step=10, key="mall.epochs", **BOUND)
    c1, c2, c3, c4 = st.columns(4)
    width = c1.selectbox("Width m", WIDTHS, index=WIDTHS.index(configs.INFL_WIDTH), key="mall.width", **BOUND)
    tau = c2.select_slider("τ (share of top points)", [0.02, 0.05, 0.1, 0.2, 0.5], value=0.1, key="mall.tau",
                           **BOUND)
    perturb = c3.radio("Perturb", ["top", "all"], horizontal=True, key="mall.perturb", **BOUND,
                       help="top: only the top-τ points by influence; all: every training point.")
    with c4:
        retrain = st.checkbox("Retrain on perturbed data", key="mall.retrain", **BOUND)
        adv = st.checkbox("Adversarial training", key="mall.adv", **BOUND)
        interventions = st.checkbox("Interventions", key="mall.interventions", **BOUND,
                                    help="Curated (remove top-τ), Transformed (replace them by their "
                                         "adversarial versions), Adversarial (PGD on all points).")
    return dict(attacks=tuple(a for a in ATTACKS if a in attacks), eps=tuple(sorted(float(e) for e in eps)),
                steps=int(steps), epochs=int(epochs), width=int(width), tau=float(tau), perturb=perturb,
                retrain=bool(retrain), adversarial_training=bool(adv), interventions=bool(interventions))


s = shared()
st.title("Influence malleability")
st.markdown(
    "Take the top-τ training points by influence magnitude, perturb the training images within an ℓ∞ "
    "ball of radius ε (FGSM, PGD or MIM on the trained model's loss), recompute the kernel — for MLP-Attn "
    "the attention map C = XᵀX changes too, so every feature moves — and recompute the influences. "
    "The **flip rate** is the share of those points whose influence changes sign; **Spearman ρ** compares "
    f"influence rankings before and after (lower = more malleable). Settings: {s.describe()}.")
require(bool(s.archs), "Pick at least one architecture in the sidebar.")
opts = controls_ui()
require(bool(opts["attacks"]) and bool(opts["eps"]), "Pick at least one attack and one ε.")
cfg = configs.malleability_config(s, **opts)
sec = configs.malleability_seconds(cfg, configs.input_dim(s))
if opts["adversarial_training"] or opts["retrain"] or opts["interventions"]:
    sec *= 3
res = obtain("malleability", run_malleability, cfg, "Malleability", auto=sec < configs.AUTO_SECONDS,
             button="Run the attacks", note=f"About {sec:.0f} s with these settings.")
if res is None:
    st.stop()

rows = plots.flip_data(res.frames["rows"])
eps_list = sorted(rows["eps"].astype(float).unique())
shown = st.columns([1, 3])[0].selectbox("ε shown in the bars", eps_list, index=len(eps_list) - 1, key="mall.shown_eps",
                     format_func=lambda e: f"{e:g}")
c1, c2 = st.columns(2)
with c1:
    data = rows[np.isclose(rows["eps"].astype(float), shown)]
    render.chart(plots.flip_bars_fig(rows, shown), data, "flip rates",
                 "Share of the top-τ training points whose influence changes sign under each attack; "
                 "higher bars mean influence is easier to manipulate.")
with c2:
    if "spearman" in rows:
        render.chart(plots.flip_bars_fig(rows, shown, "spearman", "Spearman ρ, before vs after (unitless)", ".2f"),
                     data, "spearman rho",
                     "Rank correlation of all training points' influence before and after the attack; 1 means "
                     "the ranking is intact, lower means the attack reshuffled it.")
if len(eps_list) > 1:
    c1, c2 = st.columns(2)
    with c1:
        render.chart(plots.eps_sweep_fig(rows), rows, "flip rate against eps",
                     "Flip rate as the perturbation budget grows; the ReLU/attention gap at small ε is the "
                     "paper's malleability claim, while at large ε both approach random sign flips (50 %).")
    with c2:
        if "spearman" in rows:
            render.chart(plots.eps_sweep_fig(rows, "spearman", "Spearman ρ (unitless)"), rows,
                         "spearman against eps", "Rank correlation against ε; a steeper fall means more malleable.")

inter = res.frames.get("interventions")
if inter is not None and not inter.empty:
    st.header("Interventions")
    c1, c2 = st.columns(2)
    with c1:
        render.chart(plots.interventions_fig(inter), inter, "interventions accuracy",
                     "Test accuracy after each change to the training set, per architecture.")
    with c2:
        if "influence_change" in inter:
            render.chart(plots.interventions_fig(inter, "influence_change", "change of influence (relative)"),
                         inter, "interventions influence change",
                         "How much the influences moved under each intervention; larger means the explanation "
                         "of the model changed more.")
elif opts["interventions"]:
    st.info("The run returned no intervention rows.")

st.header("One training image, before and after")
archs = [a for a in cfg.archs if f"{a}_top_idx" in res.arrays]
c1, c2 = st.columns(2)
arch = c1.selectbox("Architecture", archs, format_func=lambda a: ARCH_LABELS[a], key="mall.arch")
top = res.arrays[f"{arch}_top_idx"]
pos = c2.selectbox("Training image (top-τ by influence)", list(range(len(top))), key="mall.point",
                   format_func=lambda p: f"#{int(top[p])} (rank {p + 1})")
j = int(top[pos])
before, after = res.arrays[f"{arch}_infl_before"], res.arrays[f"{arch}_infl_after"]
shape = res.meta.get("image_shape")
attack, eps = res.meta.get("shown_attack", cfg.attacks[0]), res.meta.get("shown_eps", cfg.eps[0])
m = st.columns(3)
m[0].metric("influence before", f"{before[j]:+.4g}")
m[1].metric("influence after", f"{after[j]:+.4g}", delta=f"{after[j] - before[j]:+.3g}")
m[2].metric("sign flipped", "yes" if np.sign(before[j]) != np.sign(after[j]) else "no")
clean, pert = res.arrays[f"{arch}_X_clean"][pos], res.arrays[f"{arch}_X_pert"][pos]
data = pd.DataFrame({"pixel": np.arange(clean.size), "clean": clean, "perturbed": pert})
render.chart(plots.before_after_fig(clean, pert, shape, f"{ARCH_LABELS[arch]}: training image #{j}, "
                                                         f"{str(attack).upper()} at ε = {float(eps):g}"),
             data, f"{arch} image {j} before and after",
             "Left the clean training image, middle its perturbed version, right the change per pixel "
             "(bounded by ε).")
data = pd.DataFrame({"train_index": np.arange(before.size), "before": before, "after": after})
render.chart(plots.influence_shift_fig(before, after, j, arch), data, f"{arch} influence before and after",
             "Every training point's aggregate influence before (x) and after (y) the attack; points off the "
             "dotted diagonal moved, and points in the upper-left or lower-right quadrants flipped sign.")
render.settings(res.config)
render.cached_note(res)
