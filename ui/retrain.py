"""The leave-one-out retraining section of the Influence and Kernel regime pages (``engine.experiments.retrain``).

It never starts by itself: the run trains 2k + 1 heads per width and seed, so it waits for its
button (``obtain_planned(..., wait=True)``) and shows a finished result from the cache at once.
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from engine.experiments.registry import preset
from engine.experiments.retrain import run_retrain_loo
from engine.reporting import plots
from engine.runtime.errors import EngineError
from ui import render
from ui.common import plain

QUICK = preset("retrain-loo")
COLUMNS = ["arch", "width", "kernel", "loo", "pick", "n_seeds", "retrain_spearman_mean", "retrain_spearman_sd",
           "retrain_pearson_mean", "retrain_sign_agreement_mean", "retrain_rel_error_mean", "actual_rms_mean",
           "predicted_rms_mean", "test_acc_mean", "weight_movement_mean"]
HOW_TO_READ = ("Each line is 1 − Spearman ρ between the kernel's predicted and the network's actual change of the "
               "test outputs when one of the top-|influence| training points is left out and the net retrained "
               "from the same initialisation on the same batches: lower means the kernel's influence is the "
               "network's, and a line that falls with the dotted m^-½ is the lazy regime taking hold.")


def retrain_config(s, **overrides):
    """The quick preset on the sidebar's data, widths, architectures and attention (``overrides``:
    e.g. the Influence page's ridge and target)."""
    return replace(QUICK, data=s.data(), widths=tuple(sorted(s.widths)), archs=tuple(s.archs),
                   attention=s.attention, **overrides)


def section(s, **overrides) -> None:
    """Header, explanation, the run's button or result: chart, table and the stopping-ridge note."""
    from ui.runner import obtain_planned

    st.header("Is the kernel's influence the network's? Leave-one-out by retraining")
    st.markdown(
        f"For each architecture, width and seed the net is trained on the full set, then retrained without each "
        f"of the {QUICK.k} training points of largest |influence| (and {QUICK.k} drawn at random), from the same "
        "initialisation with the same mini-batches, all retrainings as one batched model. The change of its test "
        "outputs is set beside two kernel predictions, each with the trained net's eNTK and with K∞: the "
        "**ridge** leave-one-out (what this dashboard calls influence) and the leave-one-out of **kernel "
        f"gradient descent** run for the net's own {QUICK.train.epochs} epochs of SGD (η = {QUICK.train.lr:g}, "
        "MSE), the kernel regime's prediction of this very training. Heads start antisymmetric, so f₀ = 0 "
        "as the kernel assumes.")
    try:
        cfg = retrain_config(s, **overrides)
    except EngineError as exc:  # e.g. qkv attention or an odd width
        st.error(plain(exc))
        return
    heads = len(cfg.archs) * len(cfg.seeds) * len(cfg.widths) * (2 * cfg.k + 1)
    res = obtain_planned(run_retrain_loo, cfg, f"Leave-one-out by retraining, {heads} nets",
                         button="Retrain without each point", wait=True)
    if res is None:
        return
    data = plots.retrain_width_data(res.frames["summary"], "retrain_spearman", "top")
    render.chart(plots.retrain_width_fig(data), data, "kernel against retrained influence", HOW_TO_READ,
                 config=res.config, wide=True)
    summary = res.frames["summary"]
    bad = render.training_gate(res.frames["rows"].drop_duplicates(["arch", "width", "seed"]),
                               int(res.meta["n_classes"]), what="agreements")
    table = summary[[c for c in COLUMNS if c in summary]].reset_index(drop=True)
    st.dataframe(render.greyed(table, bad), hide_index=True)
    stop = {a: r for a, r in res.meta.get("stopping_ridge", {}).items() if r is not None}
    if stop:
        st.caption("Early stopping acts like a ridge of about "
                   + ", ".join(f"{r:.2g} ({plots.arch_label(a)})" for a, r in stop.items())
                   + f" relative to mean diag K∞, against the influence's {cfg.ridge:g}: the ridge leave-one-out "
                   "describes a net trained to convergence, which is why its scale (relative error, predicted "
                   "against actual RMS) misses this one's.")
    render.cached_note(res)
