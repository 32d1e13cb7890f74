"""Malleability: how easily small perturbations of training images flip their influence."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pandas as pd
import streamlit as st

from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.malleability import example_key, run_malleability
from engine.experiments.registry import preset
from engine.maths import metrics
from engine.maths.specs import AttackSpec, TrainSpec
from engine.reporting import plots, protocols, rule, tables
from engine.reporting.plots import excess_fig, nulls_fig
from engine.reporting.plots.nulls import bars_data, excess_data, nulls_data, sweep_data
from ui import configs, render
from ui.common import ARCH_LABELS, plain, require, shared
from ui.runner import obtain_planned

BOUND = configs.BOUND
ATTACKS = configs.choices_of(MalleabilityConfig, "attacks")
EPS_CHOICES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
WIDTHS = (64, 256, 1024, 4096)
RIDGES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
QUICK = configs.QUICK["malleability"]
READINGS = configs.choices_of(MalleabilityConfig, "readings")


# One click to the protocols the README reports (grids/readme.toml's cells), each from the registry's preset:
# the paper's (Adam with coupled L2, 100 epochs, linear attention, at the README's n and m), the trained and
# centred one, and the network's own influence read three ways.
PROTOCOLS = {
    "paper protocol": (replace(QUICK, data=replace(QUICK.data, n=500), train=TrainSpec(epochs=100), attacks=("pgd",),
                               attack=replace(QUICK.attack, steps=20), widths=(1024,), attention="linear"),
                       "the README's paper-protocol row: Adam 1e-3 with coupled L2, 100 epochs, linear attention, "
                       "n = 500, m = 1024, ℓ2 PGD ε = 0.3 (neither net reaches its K_m baseline: 'did not train')"),
    "trained, centred": (preset("malleability", "trained"),
                         "the README's trained row: Adam 1e-3 without decay, 500 epochs, centred MLP-Attn, n = 500"),
    "three readings": (preset("malleability", "network"),
                                "every reading (ridge, flow, retraining) on lazy SGD, m = 64 / 1024 / 4096"),
}


def use_protocol(name: str | None) -> None:
    """Button callback: this page's controls set to a protocol, and its data size and attention used on this
    page only (``mall.protocol``; the shared sidebar, and so every other page, stays as it was). None: back to
    the sidebar's size and attention."""
    st.session_state["mall.protocol"] = name
    if name is None:
        return
    p = PROTOCOLS[name][0]
    st.session_state.update({"mall.attacks": list(p.attacks),
        "mall.eps": list(p.eps), "mall.norm": p.attack.norm, "mall.space": p.space, "mall.target": p.target,
        "mall.steps": p.attack.steps, "mall.epochs": p.train.epochs, "mall.seeds": len(p.seeds),
        "mall.widths": list(p.widths), "mall.tau": p.tau, "mall.perturb": p.perturb, "mall.retrain": p.retrain,
        "mall.adv": p.adversarial_training, "mall.interventions": p.interventions, "mall.ridge": p.ridge,
        "mall.kernel": p.influence_kernel, "mall.init": p.init, "mall.optimizer": p.train.optimizer,
        "mall.lr": p.train.lr, "mall.decay": p.train.weight_decay, "mall.loss": p.train.loss,
        "mall.readings": list(p.readings)})


def protocols_ui() -> None:
    cols = st.columns([1, 1, 1, 2], vertical_alignment="center")
    for col, (name, (_, what)) in zip(cols, PROTOCOLS.items(), strict=False):
        col.button(name.capitalize(), key=f"mall.protocol.{name}", on_click=use_protocol, args=(name,),
                   icon=":material/tune:", help=f"Sets this page's n, attention and controls to {what}; the "
                                                "sidebar and the other pages keep theirs.")
    cols[-1].caption("One click to each protocol the README reports; the verdict below then reads as the README's row "
                     "does (the runs take minutes: they wait for a click).")


def with_protocol(cfg: MalleabilityConfig, s) -> MalleabilityConfig:
    """The page's config with the active protocol's data size and attention (this page only), said in one line
    with a button back to the sidebar's."""
    name = st.session_state.get("mall.protocol")
    if name not in PROTOCOLS:
        return cfg
    p = PROTOCOLS[name][0]
    c1, c2 = st.columns([4, 1], vertical_alignment="center")
    c1.info(f"Protocol **{name}** on this page only: n = {p.data.n}, {p.data.n_test} test points, {p.attention} "
            f"attention (the sidebar and the other pages keep n = {s.n}, {plain(s.attention)} attention).")
    c2.button("Back to the sidebar's", key="mall.protocol.off", on_click=use_protocol, args=(None,))
    return configs.or_stop(replace, cfg, data=replace(cfg.data, n=p.data.n, n_test=p.data.n_test),
                           attention=p.attention)


def controls_ui() -> dict:
    c1, c2, c3, c4 = st.columns(4)
    attacks = c1.multiselect("Attacks", ATTACKS, default=list(QUICK.attacks), key="mall.attacks", **BOUND,
                             format_func=str.upper, help="FGSM: one gradient step; PGD: projected steps; "
                                                         "MIM: PGD with momentum.", wrap=True)
    norms, spaces = configs.choices_of(AttackSpec, "norm"), configs.choices_of(MalleabilityConfig, "space")
    norm = c2.radio("Attack norm", norms, index=norms.index(QUICK.attack.norm), horizontal=True, key="mall.norm",
                    **BOUND, help=configs.help_of(AttackSpec, "norm"))
    space = c3.radio("Attack space", spaces, index=spaces.index(QUICK.space), horizontal=True,
                     key="mall.space", **BOUND, help=configs.help_of(MalleabilityConfig, "space"))
    target = c4.radio("Influence on", configs.choices_of(MalleabilityConfig, "target"), horizontal=True,
                      key="mall.target", **BOUND, help=configs.help_of(MalleabilityConfig, "target"))
    c1, c2, c3, c4 = st.columns(4)
    eps = c1.multiselect(f"ε ({norm} radius, {space} units)", EPS_CHOICES, default=list(QUICK.eps),
                         key="mall.eps", **BOUND, help=configs.help_of(MalleabilityConfig, "eps"), wrap=True)
    steps = configs.number(c2, "Attack steps (PGD, MIM)", AttackSpec, "steps", "mall.steps",
                           value=QUICK.attack.steps, hi=200)
    epochs = configs.number(c3, "Training epochs", TrainSpec, "epochs", "mall.epochs",
                            value=QUICK.train.epochs, step=10, hi=1000)
    n_seeds = c4.number_input("Network seeds", 1, 10, len(QUICK.seeds), key="mall.seeds", **BOUND,
                              help="Flip rates are shown as mean ± sd over these seeds.")
    c1, c2, c3, c4, c5 = st.columns([1.3, 1, 0.9, 1.5, 1])  # room for the widths and the checkbox labels
    optimizer = configs.optimizer_ui(c5, key="mall.optimizer", lr_key="mall.lr")
    widths = c1.multiselect("Widths m", WIDTHS, default=list(QUICK.widths), key="mall.widths", **BOUND,
                            help=configs.help_of(MalleabilityConfig, "widths") + "; several draw the excess against width")
    tau = c2.select_slider("τ (share of top points)", [0.02, 0.05, 0.1, 0.2, 0.5], value=QUICK.tau,
                           key="mall.tau", **BOUND, help=configs.help_of(MalleabilityConfig, "tau"))
    perturb = c3.radio("Perturb", configs.choices_of(MalleabilityConfig, "perturb"), horizontal=True,
                       key="mall.perturb", **BOUND, help=configs.help_of(MalleabilityConfig, "perturb"))
    with c4:
        retrain = st.checkbox("Retrain on perturbed data", key="mall.retrain", **BOUND,
                              help=configs.help_of(MalleabilityConfig, "retrain"))
        adv = st.checkbox("Adversarial training", key="mall.adv", **BOUND,
                          help=configs.help_of(MalleabilityConfig, "adversarial_training"))
        interventions = st.checkbox("Interventions", key="mall.interventions", **BOUND,
                                    help=configs.help_of(MalleabilityConfig, "interventions"))
    c1, c2, c3, c4, c5 = st.columns(5)
    ridge = c1.select_slider("Ridge λ (relative)", RIDGES, value=QUICK.ridge, key="mall.ridge", **BOUND,
                             format_func=lambda r: f"{r:g}", help=configs.help_of(MalleabilityConfig, "ridge"))
    kernel = c2.radio("Influence kernel", configs.choices_of(MalleabilityConfig, "influence_kernel"),
                      horizontal=True, key="mall.kernel", **BOUND,
                      help=configs.help_of(MalleabilityConfig, "influence_kernel"))
    init = c3.radio("Initialisation", configs.choices_of(MalleabilityConfig, "init"), key="mall.init", **BOUND,
                    help=configs.help_of(MalleabilityConfig, "init"))
    lr = configs.float_input(c4, "Learning rate", TrainSpec, "lr", key="mall.lr", value=QUICK.train.lr)
    decay = configs.float_input(c5, "Weight decay", TrainSpec, "weight_decay", key="mall.decay",
                         value=QUICK.train.weight_decay)
    c1, c2 = st.columns([3, 1])
    readings = c1.multiselect("Influence readings", READINGS, default=list(QUICK.readings), key="mall.readings",
                              **BOUND, help=configs.help_of(MalleabilityConfig, "readings"))
    losses = configs.choices_of(TrainSpec, "loss")
    loss = c2.radio("Training loss", losses, index=losses.index(QUICK.train.loss), horizontal=True,
                    key="mall.loss", **BOUND, help=configs.help_of(TrainSpec, "loss") + "; the flow reading needs mse")
    return dict(attacks=tuple(a for a in ATTACKS if a in attacks), eps=tuple(sorted(float(e) for e in eps)),
                steps=int(steps), epochs=int(epochs), widths=tuple(sorted(int(w) for w in widths)), tau=float(tau),
                perturb=perturb, readings=tuple(r for r in READINGS if r in readings),
                retrain=bool(retrain), adversarial_training=bool(adv), interventions=bool(interventions),
                norm=norm, space=space, target=target, n_seeds=int(n_seeds), optimizer=optimizer,
                ridge=float(ridge), influence_kernel=kernel, init=init, lr=float(lr), weight_decay=float(decay),
                loss=loss)


s = shared()
st.title("Influence malleability")
st.markdown(
    "Take the top-τ training points by influence magnitude, perturb the training inputs within an "
    "ε-ball (ℓ∞ or ℓ2, on raw pixels or on the ℓ2-normalised rows the networks see) with FGSM, PGD or MIM "
    "on the trained model's loss, recompute the kernel — for MLP-Attn the attention map C = XᵀX changes "
    "too, so every feature moves — and recompute the influences. The **flip rate** is the share of those "
    "points whose influence changes sign; **Spearman ρ** compares influence rankings before and after "
    f"(lower = more malleable). Settings: {plain(s.describe())}.")
require(bool(s.archs), "Pick at least one architecture in the sidebar.")
protocols_ui()
opts = controls_ui()
require(bool(opts["attacks"]) and bool(opts["eps"]), "Pick at least one attack and one ε.")
require(bool(opts["widths"]) and bool(opts["readings"]), "Pick at least one width and one influence reading.")
cfg = configs.or_stop(configs.malleability_config, s, **opts)  # e.g. flow with Adam: one line, no traceback
cfg = with_protocol(cfg, s)
res = obtain_planned(run_malleability, cfg, "Malleability", button="Run the attacks")
if res is None:
    st.stop()
chart = partial(render.chart, config=res.config)  # every export carries this run's settings line

st.caption(f"Influence on **{cfg.target}** outputs; attack in **{cfg.attack.norm}**, **{cfg.space}** space; "
           f"{'**adversarially trained** nets' if cfg.adversarial_training else 'nets trained on clean data'}"
           f"{', retrained after the attack' if cfg.retrain else ''}; {len(cfg.seeds)} seed(s); flip rates over "
           f"the top {int(res.frames['rows']['n_top'].iloc[0])} points; influence kernel **{cfg.influence_kernel}** "
           f"at ridge {cfg.ridge:g}; {cfg.init} init; attack and kernels in "
           f"{res.frames['rows']['attack_precision'].iloc[0]} / {res.frames['rows']['kernel_precision'].iloc[0]}.")
PCT = {k: st.column_config.NumberColumn(v, format="%.1f") for k, v in tables.FLIP_TABLE.items() if k != "trained"}
eps_label = plots.eps_label(cfg.attack.norm, cfg.space)
c1, c2, _ = st.columns([1, 1, 2])
reading = c1.selectbox("Reading shown", list(cfg.readings), format_func=lambda r: plots.READING_LABELS[r],
                       key="mall.shown_reading", **BOUND, help=configs.help_of(MalleabilityConfig, "readings"))
width = c2.selectbox("Width shown", list(cfg.widths), index=len(cfg.widths) - 1, key="mall.shown_width", **BOUND)
full = res.frames["summary"]
one = full[(full["reading"] == reading) & (full["width"] == width)].reset_index(drop=True)
summary = tables.percent(one, ["flip_rate", "pair_flip_rate"])
eps_list = sorted(summary["eps"].astype(float).unique())
shown = st.columns([1, 3])[0].selectbox("ε shown in the bars", eps_list, index=len(eps_list) - 1,
                                        key="mall.shown_eps", **BOUND, format_func=lambda e: f"{e:g}")
rows = res.frames["rows"]
nets = rows[rows["width"] == width].drop_duplicates(["data_seed", "arch", "seed"])
bad = render.training_gate(nets, len(res.meta["class_names"]), by=("arch",), what="flip rates")
verdict = protocols.flip_verdict(one, eps=shown)
verdict_line = f"verdict ({verdict['attack'].upper()}, {plots.READING_LABELS[reading]}): {verdict['verdict']}"
st.markdown(f"**{verdict['verdict']}** ({verdict['role']}; {plots.READING_LABELS[reading]}, m = {width}, "
            f"{verdict['attack'].upper()} ε = {shown:g}): {plain(verdict['why'])}")
if verdict.get("left_out"):
    st.caption(plain(rule.sensitivity_words(verdict)))
with st.expander("The rule"):
    st.markdown(protocols.RULES["flip"])
render.gate_failures(nets)
st.dataframe(render.greyed(tables.flip_table(one), bad, by=("arch",)), hide_index=True, column_config={
    **PCT, "arch": st.column_config.TextColumn("net"), "attack": "attack", "eps": "ε",
    "trained": st.column_config.TextColumn(tables.FLIP_TABLE["trained"], help=(
        "Seeds whose test accuracy is within 10 points of ridge regression with their own trained kernel K_m "
        "(the training gate); a net below it did not train, and its flip rates compare two unrelated "
        "predictors.")),
    "null_seed": st.column_config.NumberColumn(tables.FLIP_TABLE["null_seed"], format="%.1f", help=(
        "No attack: the net of the next network seed against this one, on this net's top-τ points.")),
    "null_random": st.column_config.NumberColumn(tables.FLIP_TABLE["null_random"], format="%.1f", help=(
        "A random perturbation of the same ℓ2 size per moved row, in the same space, instead of the attack.")),
    "excess": st.column_config.NumberColumn(tables.FLIP_TABLE["excess"], format="%.1f", help=(
        "Flip rate minus the larger null, with a 95 % bootstrap interval over seeds and tracked points.")),
    "test_acc_after": st.column_config.NumberColumn(tables.FLIP_TABLE["test_acc_after"], format="%.1f", help=(
        "Test accuracy with the perturbed training set (MLP-Attn's attention moves every test feature).")),
    "test_acc_kernel": st.column_config.NumberColumn(tables.FLIP_TABLE["test_acc_kernel"], format="%.1f", help=(
        "Kernel ridge regression with the trained net's own kernel K_m: what a net of this width can reach.")),
    "test_acc_ntk": st.column_config.NumberColumn(tables.FLIP_TABLE["test_acc_ntk"], format="%.1f", help=(
        "Kernel ridge regression with K∞ on the same features: what the architecture can reach at infinite "
        "width."))})
if len(cfg.readings) > 1 or len(cfg.widths) > 1:
    st.subheader("Every reading, every width")
    gaps = res.frames["verdict"]
    if len(gaps):
        st.dataframe(tables.gap_table(gaps), hide_index=True, column_config={
            k: st.column_config.NumberColumn(v, format="%.3f" if k == "gap_p_holm" else "%.1f")
            for k, v in tables.GAP_TABLE.items() if k.startswith(("excess", "gap", "ratio"))})
        st.caption(plain(f"MLP-Attn's flip excess minus 2L-ReLU's, each over its larger null. Intervals: "
                         f"{metrics.INTERVAL_WORDS}. Primary: {rule.PRIMARY_WORDS}; the other cells are secondary "
                         "(Holm). Each "
                         "reading says what it is exact for; a training that is not that (e.g. cross-entropy read "
                         "by ridge) is flagged in objective match."))
    if len(cfg.widths) > 1:
        attack = str(verdict.get("attack") or cfg.attacks[0]).lower()
        data = plots.excess_width_data(full, attack, shown)
        chart(plots.excess_width_fig(data, cfg.attention), data, "flip excess against width",
              f"{attack.upper()} at {eps_label} = {shown:g}: the flip excess over the larger null per architecture "
              "(colour) and reading (dash), with its 95 % interval; the shaded band is the larger null's flip rate. "
              "If malleability is the signature of leaving the kernel regime, it should fall with width for a net "
              "that enters it and not for one that does not.")
    per_draw = res.frames.get("draws")
    if per_draw is not None and per_draw["data_seed"].nunique() > 1:
        data = plots.draw_gaps_data(gaps, per_draw, str(verdict.get("attack") or cfg.attacks[0]).lower(), shown)
        chart(plots.draw_gaps_fig(data), data, "gap per data draw",
              "Each open circle is one data draw's gap (MLP-Attn's mean excess over its nets in that draw minus "
              "2L-ReLU's); the diamond is their mean with the 95 % t interval over draws that the verdict reads. "
              "Draws, not nets, are the independent replicates.")

c1, c2 = st.columns(2)
data = summary[np.isclose(summary["eps"].astype(float), shown)]
with c1:
    chart(nulls_fig(one, shown, eps_label, cfg.attention), nulls_data(one, shown), "flip rates and nulls",
                 "Per net and attack: the attack's flip rate (solid) beside the seed null (another network seed, no "
                 "attack) and the random null (a random perturbation of the same size), means over seeds; a flip "
                 "rate no higher than its nulls says nothing about the attack.", verdict=verdict_line)
with c2:
    chart(excess_fig(one, shown, eps_label, cfg.attention), excess_data(one, shown), "flip excess",
                 "The flip rate minus the larger null, with its 95 % bootstrap interval over seeds and tracked "
                 "points; the claim holds where MLP-Attn's excess exceeds 2L-ReLU's beyond their gap's interval and its own "
                 "interval lies above zero (the verdict above).",
                 verdict=verdict_line)
c1, c2 = st.columns(2)
with c1:
    chart(plots.flip_bars_fig(summary, shown, eps_label=eps_label, attention=cfg.attention), bars_data(summary, shown),
                 "flip rates",
                 "Share of the top-τ training points whose influence changes sign under each attack, mean ± sd "
                 "over seeds; higher bars mean influence is easier to manipulate, and 50 % is a coin toss.")
with c2:
    chart(plots.flip_bars_fig(summary, shown, "spearman", "Spearman ρ, before vs after (unitless)", ".2f",
                                     eps_label=eps_label, attention=cfg.attention),
                 bars_data(summary, shown, "spearman"), "spearman rho",
                 "Rank correlation of all training points' influence before and after the attack; 1 means "
                 "the ranking is intact, lower means the attack reshuffled it.")
st.caption("Mean relative size of the applied perturbation ‖δ‖₂/‖x‖₂: " + ", ".join(
    f"{plots.arch_label(r.arch)} {r.attack.upper()} {tables.pm(r.rel_perturbation_mean, r.rel_perturbation_sd)}"
    for r in data.itertuples()))
if len(eps_list) > 1:
    c1, c2 = st.columns(2)
    with c1:
        chart(plots.eps_sweep_fig(summary, eps_label=eps_label, attention=cfg.attention), sweep_data(summary),
                     "flip rate against eps",
                     "Flip rate as the perturbation budget grows, mean ± sd over seeds; at large ε both nets "
                     "approach random sign flips (50 %).")
    with c2:
        chart(plots.eps_sweep_fig(summary, "spearman", "Spearman ρ (unitless)", eps_label=eps_label,
                                         attention=cfg.attention), sweep_data(summary, "spearman"),
                     "spearman against eps", "Rank correlation against ε; a steeper fall means more malleable.")

inter = res.frames.get("interventions")
if inter is not None and not inter.empty:
    inter = res.frames["interventions_summary"].rename(  # means over seeds
        columns={"test_acc_mean": "test_acc", "influence_change_mean": "influence_change"})
    st.header("Interventions")
    c1, c2 = st.columns(2)
    with c1:
        chart(plots.interventions_fig(inter, attention=cfg.attention), inter[["arch", "intervention", "test_acc"]],
                     "interventions accuracy",
                     "Test accuracy after each change to the training set, per architecture.")
    with c2:
        if "influence_change" in inter:
            chart(plots.interventions_fig(inter, "influence_change", "change of influence (relative)",
                                             attention=cfg.attention),
                         inter[["arch", "intervention", "influence_change"]], "interventions influence change",
                         "How much the influences moved under each intervention; larger means the explanation "
                         "of the model changed more.")
elif opts["interventions"]:
    st.info("The run returned no intervention rows.")

st.header("One training image, before and after")
c1, c2, c3, c4 = st.columns(4)
arch = c1.selectbox("Architecture", list(cfg.archs), format_func=lambda a: ARCH_LABELS[a], key="mall.arch", **BOUND)
attack = c2.selectbox("Attack", list(cfg.attacks), format_func=str.upper, key="mall.shown_attack", **BOUND)
eps = c3.selectbox("ε", list(cfg.eps), index=cfg.eps.index(shown) if shown in cfg.eps else 0,
                   format_func=lambda e: f"{e:g}", key="mall.example_eps", **BOUND)
if example_key(arch, attack, eps, "top_idx") not in res.arrays:  # kept with the ridge reading only
    st.info("The example images are kept with the ridge reading: add ridge to the influence readings to see one.")
    st.stop()
top = res.arrays[example_key(arch, attack, eps, "top_idx")]
pos = c4.selectbox("Training image (top-τ by influence)", list(range(len(top))), key="mall.point", **BOUND,
                   format_func=lambda p: f"#{int(top[p])} (rank {p + 1})")
j = int(top[pos])
before = res.arrays[example_key(arch, attack, eps, "infl_before")]
after = res.arrays[example_key(arch, attack, eps, "infl_after")]
shape = res.meta.get("image_shape") if cfg.space == "raw" else None
m = st.columns(3)
m[0].metric("influence before", f"{before[j]:+.4g}")
m[1].metric("influence after", f"{after[j]:+.4g}", delta=f"{after[j] - before[j]:+.3g}")
m[2].metric("sign flipped", "yes" if metrics.flip_rate(before[j], after[j]) == 1.0 else "no")
clean = res.arrays[example_key(arch, attack, eps, "X_clean")][pos]
pert = res.arrays[example_key(arch, attack, eps, "X_pert")][pos]
data = pd.DataFrame({"pixel": np.arange(clean.size), "clean": clean, "perturbed": pert})
chart(plots.before_after_fig(clean, pert, shape, f"{plots.arch_label(arch, cfg.attention)}: training image #{j}, "
                                                         f"{str(attack).upper()} at ε = {float(eps):g}"),
             data, f"{arch} image {j} before and after",
             f"Left the clean training input, middle its perturbed version, right the change per coordinate "
             f"({cfg.attack.norm} ball of radius ε in {cfg.space} space; seed {res.meta.get('shown_seed')}).")
data = pd.DataFrame({"train_index": np.arange(before.size), "before": before, "after": after})
chart(plots.influence_shift_fig(before, after, j, arch, cfg.attention), data, f"{arch} influence before and after",
             "Every training point's aggregate influence before (x) and after (y) the attack; points off the "
             "dotted diagonal moved, and points in the upper-left or lower-right quadrants flipped sign.")
render.settings(res.config)
with st.expander("The same view from the command line"):
    st.caption("Computes (or reads from the same cache) these attacks, and draws the flip-rate chart for a slide:")
    render.command(cfg)
    render.command(cfg, figure="malleability.png")
render.cached_note(res)
