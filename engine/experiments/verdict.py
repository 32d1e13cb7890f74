"""The malleability claim's one rule (``flip_rule``) and its declared primary (``PRIMARY``): the verdict
of every cell of a malleability run, computed once into its ``verdict`` frame
(``engine.experiments.flips.verdict``) and read by the pages, ``report``, the exports and the README.

The claim: MLP-Attn's influence is more malleable than 2L-ReLU's. The statistics
(``engine.maths.metrics.INTERVAL_WORDS``): data draws are the unit of inference; a cell's gap is
MLP-Attn's flip excess minus 2L-ReLU's, paired within each draw, with a t interval over the draws.

Primary (declared before any number): the network's own leave-one-out (reading ``retrain``) at the
largest width of the run, for the run's first attack and ε. Why: the claim is about the influence of
a training point on the *network*, which only retraining measures for any loss and optimiser (the
kernel readings are exact only for the training they model), and the paper's mechanism — attention's
NTK does not converge — is a claim about large width. Without a retrain reading the primary is the
cell at the largest width whose reading is exact for the nets' training on every net (flow before
ridge); without such a cell the run has no primary and every cell is exploratory. Every other cell is
secondary: its gap must also hold after Holm's correction over the run's secondary cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .._lazy import LazyModule
from ..maths.gates import GATE_SHARE, TRAIN_GATE
from ..maths.metrics import LEVEL, interval_scope

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows

FLIP_OUTCOMES = ("holds", "fails", "did not train", "uninformative")
ROLES = ("primary", "secondary", "exploratory")
PRIMARY_READINGS = ("retrain", "flow", "ridge")  # preference order of the primary reading (retrain: always exact)
PRIMARY_WORDS = ("the network's own leave-one-out (reading retrain) at the largest width, first attack and ε; "
                 "without it, the cell at the largest width whose reading is exact for the nets' training")
RULE_WORDS = ("**holds** when MLP-Attn's flip excess (its flip rate minus the larger of the seed null and the "
              "random null) exceeds 2L-ReLU's: the 95 % interval of the gap (data draws the unit, paired within "
              "each draw) lies above zero — for a secondary cell after Holm's correction over the run's secondary "
              "cells — and MLP-Attn's own excess interval lies above zero; **did not train** when fewer than "
              f"{100 * GATE_SHARE:.0f} % of either net's runs end within {100 * TRAIN_GATE:.0f} points of the test "
              "accuracy of ridge regression with their own kernel K_m (a net below it is otherwise left out of the "
              "cell's estimate, and the gap with it is stated beside); **uninformative** with one network seed "
              "and one draw, or without the nulls; **fails** otherwise. One draw: the interval is about that "
              "sample only, and says so.")

_RULE_COLUMNS = ("flip_excess_mean", "flip_excess_low", "flip_excess_high", "trained_mean",
                 "null_seed_flip_rate_mean", "null_random_flip_rate_mean")


def _from(column: str) -> Any:
    return field(default=math.nan, metadata={"column": column})


@dataclass(frozen=True)
class Side:
    """One architecture's numbers in a verdict cell (``flip_rule``'s ``relu`` and ``attn``), each field
    read from the malleability summary column named in its metadata (``engine.experiments.flips.summary``
    computes them; fractions in [0, 1], excesses in [−1, 1]; NaN where the summary lacks the column)."""

    excess: float = _from("flip_excess_mean")           # flip rate minus the larger null, mean over the nets
    low: float = _from("flip_excess_low")               # its interval (``INTERVAL_WORDS``)
    high: float = _from("flip_excess_high")
    flip: float = _from("flip_rate_mean")               # the attack's flip rate over the top-τ points
    flip_sd: float = _from("flip_rate_sd")
    null_seed: float = _from("null_seed_flip_rate_mean")      # the next seed's net read on these points
    null_random: float = _from("null_random_flip_rate_mean")  # a random direction of the attack's size
    trained: float = _from("trained_mean")              # share of nets through the training gate
    test_acc: float = _from("test_acc_mean")            # the clean nets' test accuracy
    test_acc_kernel: float = _from("test_acc_kernel_mean")  # ridge with their own K_m

    @classmethod
    def of(cls, d: pd.DataFrame, arch: str) -> Side:
        """The ``arch`` row of a summary cell indexed by arch."""
        return cls(**{f.name: _num(d, arch, f.metadata["column"]) for f in fields(cls)})


# the columns ``engine.experiments.flips.with_gaps`` copies from the verdict frame onto the summary rows
GAPS = ("gap", "gap_low", "gap_high", "ratio", "ratio_low", "ratio_high", "gap_p", "gap_p_holm", "gap_draws",
        "role", "gap_all", "gap_all_low", "gap_all_high", "left_out")


def _num(d: pd.DataFrame, arch: str, col: str) -> float:
    v = d.at[arch, col] if col in d.columns else math.nan
    try:
        return math.nan if v is None or pd.isna(v) else float(v)
    except (TypeError, ValueError):
        return math.nan


def _text(d: pd.DataFrame, arch: str, col: str) -> str:
    v = d.at[arch, col] if col in d.columns else ""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.0f} %"


def _pts(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:+.0f}"


def gap_words(v: dict) -> str:
    """The gap with its interval and scope, and the ratio with its own only where it is defined,
    e.g. "gap +31 [+18, +44] points over 8 draws, 4.1× [2.2, 9]"."""
    scope = interval_scope(int(v["gap_draws"])) if math.isfinite(v.get("gap_draws", math.nan)) else "one draw"
    text = f"gap {_pts(v['gap'])} [{_pts(v['gap_low'])}, {_pts(v['gap_high'])}] points, {scope}"
    if math.isfinite(v.get("ratio", math.nan)):
        return text + f", {v['ratio']:.2g}× [{v['ratio_low']:.2g}, {v['ratio_high']:.2g}]"
    return text


def flip_rule(summary: pd.DataFrame | None, attack: str | None = None, eps: float | None = None) -> dict:
    """The malleability claim's verdict on one cell of a ``run_malleability`` summary (rows of one
    width and reading; ``attack`` default pgd if present else the first, ``eps`` default the first).

    Outcome (in ``FLIP_OUTCOMES``) by ``RULE_WORDS``; ``why`` one short line; ``numbers`` the flip rates,
    nulls and accuracies in words; ``role`` (``ROLES``); ``relu`` and ``attn``, each architecture's
    numbers (``Side``: its excess and interval, flip rate, nulls, share of nets through the gate, accuracies),
    and the gap columns (``GAPS``). Fractions in [0, 1] (excesses in [−1, 1], gaps in [−2, 2])."""
    out: dict[str, Any] = {"attack": attack, "eps": eps, "numbers": "—", "role": "exploratory"}
    if summary is None or summary.empty:
        return {**out, "outcome": "uninformative", "why": "not measured"}
    attacks = list(summary["attack"].unique())
    attack = attack or ("pgd" if "pgd" in attacks else attacks[0])
    d = summary[summary["attack"] == attack]
    eps = (float(d["eps"].iloc[0]) if len(d) else math.nan) if eps is None else float(eps)
    d = d[(d["eps"].astype(float) - eps).abs() < 1e-9].set_index("arch")
    out.update(attack=attack, eps=eps)
    if not {"relu", "attn"} <= set(d.index):
        return {**out, "outcome": "uninformative", "why": "needs both architectures"}
    if not set(_RULE_COLUMNS) <= set(d.columns):
        return {**out, "outcome": "uninformative", "why": "measured without the null baselines (nulls off)"}
    relu, attn = out["relu"], out["attn"] = Side.of(d, "relu"), Side.of(d, "attn")
    for key in GAPS:
        out[key] = _text(d, "attn", key) if key in ("role", "left_out") else _num(d, "attn", key)
    out["role"] = out["role"] or "exploratory"
    n_seeds = int(d["n_seeds"].min())
    draws = int(d["n_draws"].min()) if "n_draws" in d.columns else 1
    out["n_seeds"], out["n_draws"] = n_seeds, draws
    out["n_nets"] = int(d["n_nets"].min()) if "n_nets" in d.columns else n_seeds
    out["numbers"] = (f"flip excess MLP-Attn {_pct(attn.excess)} [{_pct(attn.low)}, {_pct(attn.high)}], 2L-ReLU "
                      f"{_pct(relu.excess)} [{_pct(relu.low)}, {_pct(relu.high)}]; "
                      f"MLP-Attn / 2L-ReLU: flips {_pct(attn.flip)} / {_pct(relu.flip)}, seed null "
                      f"{_pct(attn.null_seed)} / {_pct(relu.null_seed)}, random null "
                      f"{_pct(attn.null_random)} / {_pct(relu.null_random)}; test acc. "
                      f"{_pct(attn.test_acc)} / {_pct(relu.test_acc)} (K_m ridge "
                      f"{_pct(attn.test_acc_kernel)} / {_pct(relu.test_acc_kernel)})"
                      + (f"; {gap_words(out)}" if math.isfinite(out["gap"]) else ""))
    if not (math.isfinite(attn.excess) and math.isfinite(relu.excess)):
        return {**out, "outcome": "uninformative", "why": "measured without the null baselines (nulls off)"}
    failing = [(lbl, side.trained) for side, lbl in ((attn, "MLP-Attn"), (relu, "2L-ReLU"))
               if not side.trained >= GATE_SHARE]
    if failing:
        return {**out, "outcome": "did not train",
                "why": "; ".join(f"{lbl}: {_pct(share)} of nets within {100 * TRAIN_GATE:.0f} points of their K_m "
                                 f"ridge (needs {100 * GATE_SHARE:.0f} %)" for lbl, share in failing)}
    if n_seeds < 2 and draws < 2:
        return {**out, "outcome": "uninformative", "why": "one network seed and one draw: no seed null, no spread"}
    if not math.isfinite(out["gap_low"]):
        return {**out, "outcome": "uninformative", "why": "no interval of the gap between the two excesses"}
    gap = gap_words(out)
    if not attn.low > 0:
        return {**out, "outcome": "fails", "why": f"MLP-Attn's excess interval reaches {_pct(attn.low)}; {gap}"}
    if not out["gap_low"] > 0:
        return {**out, "outcome": "fails", "why": f"the gap's interval reaches zero: {gap}"}
    holm = out["gap_p_holm"]
    if out["role"] != "primary" and math.isfinite(holm) and not holm < 1 - LEVEL:
        return {**out, "outcome": "fails", "why": f"not after Holm's correction (p = {holm:.2g}): {gap}"}
    return {**out, "outcome": "holds", "why": gap}


def sensitivity_words(v: dict) -> str:
    """The gate's sensitivity line of a ``flip_rule`` result: which nets were left out and the gap with
    them; empty when none was."""
    if not v.get("left_out"):
        return ""
    return (f"left out below the training gate: {v['left_out']}; with them, gap {_pts(v['gap_all'])} "
            f"[{_pts(v['gap_all_low'])}, {_pts(v['gap_all_high'])}] points")


def roles(cells: pd.DataFrame) -> list[str]:
    """``ROLES`` of each row of a verdict frame (columns width, attack, eps, reading, objective_match), by
    ``PRIMARY_WORDS``: one primary at most; the rest secondary when there is a primary, else exploratory."""
    if cells.empty:
        return []
    first = cells.iloc[0]
    top = cells[(cells["width"] == cells["width"].max()) & (cells["attack"] == first["attack"])
                & ((cells["eps"].astype(float) - float(first["eps"])).abs() < 1e-12)]
    primary = None
    for name in PRIMARY_READINGS:
        hit = top[(top["reading"] == name) & (top["objective_match"].astype(bool) | (name == "retrain"))]
        if len(hit):
            primary = hit.index[0]
            break
    rest = "secondary" if primary is not None else "exploratory"
    return ["primary" if i == primary else rest for i in cells.index]
