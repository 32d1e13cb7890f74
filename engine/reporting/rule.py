"""The malleability claim's one rule (``flip_rule``): the verdict the Reproduction page, the protocol
table (``engine.reporting.protocols.flip_verdict``) and the README's tables
(``engine.reporting.report.readme_tables``) give a malleability summary, with the words that state it.
"""

from __future__ import annotations

import math

import pandas as pd

from ..maths.gates import TRAIN_GATE

FLIP_FACTOR = 2.0       # "far more": the kernel claim's factor (``engine.reporting.protocols``)
FLIP_OUTCOMES = ("holds", "fails", "did not train", "uninformative")
RULE_WORDS = ("**holds** when MLP-Attn's flip excess (its flip rate minus the larger of the seed null and the "
              "random null) exceeds 2L-ReLU's beyond the 95 % bootstrap interval of their difference (the gap; "
              "draws, nets and tracked points resampled) and MLP-Attn's own excess interval is above zero; a ratio "
              "is stated, with its interval, only where 2L-ReLU's excess interval excludes zero; **did not train** "
              f"when any seed of either net ends more than {100 * TRAIN_GATE:.0f} points below the test accuracy of "
              "ridge regression with its own kernel K_m; **uninformative** with one network seed or without the "
              "nulls; **fails** otherwise.")


_RULE_COLUMNS = ("flip_excess_mean", "flip_excess_low", "flip_excess_high", "trained_mean",
                 "null_seed_flip_rate_mean", "null_random_flip_rate_mean")


def _num(d, arch: str, col: str) -> float:
    v = d.at[arch, col] if col in d.columns else math.nan
    return math.nan if v is None or pd.isna(v) else float(v)


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.0f} %"


def flip_rule(summary: pd.DataFrame | None, attack: str | None = None, eps: float | None = None) -> dict:
    """The malleability claim's verdict on a ``run_malleability`` summary at one ``attack``
    (default pgd if present, else the first) and ``eps`` (default the first).

    **holds** when MLP-Attn's ``flip_excess`` (flip rate minus the larger null, mean over nets)
    is at least ``FLIP_FACTOR`` × 2L-ReLU's (or 2L-ReLU's is ≤ 0) and the lower end of
    MLP-Attn's interval is above zero; **did not train** when any seed of either net fails
    the training gate (``passes_gate``); **uninformative** when an architecture, the nulls
    or a second network seed (the seed null) is missing; **fails** otherwise.

    Returns outcome (in FLIP_OUTCOMES), why, numbers (text), attack, eps, ratio, n_seeds and
    per arch ``{arch}_excess``, ``_low``, ``_high``, ``_flip``, ``_null_seed``, ``_null_random``,
    ``_trained`` (share of seeds through the gate), fractions in [0, 1] (excess in [−1, 1]).
    """
    out = {"attack": attack, "eps": eps, "numbers": "—"}
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
    for arch in ("relu", "attn"):
        for key, col in (("excess", "flip_excess_mean"), ("low", "flip_excess_low"), ("high", "flip_excess_high"),
                         ("flip", "flip_rate_mean"), ("flip_sd", "flip_rate_sd"),
                         ("null_seed", "null_seed_flip_rate_mean"), ("null_random", "null_random_flip_rate_mean"),
                         ("trained", "trained_mean"), ("test_acc", "test_acc_mean"),
                         ("test_acc_kernel", "test_acc_kernel_mean")):
            out[f"{arch}_{key}"] = _num(d, arch, col)
    a, r, low = out["attn_excess"], out["relu_excess"], out["attn_low"]
    n_seeds = int(d["n_seeds"].min())
    for key in ("gap", "gap_low", "gap_high", "ratio", "ratio_low", "ratio_high"):
        out[key] = _num(d, "attn", key)
    out["n_seeds"] = n_seeds
    out["numbers"] = (f"flip excess MLP-Attn {_pct(a)} [{_pct(low)}, {_pct(out['attn_high'])}], 2L-ReLU "
                      f"{_pct(r)} [{_pct(out['relu_low'])}, {_pct(out['relu_high'])}]; MLP-Attn / 2L-ReLU: flips "
                      f"{_pct(out['attn_flip'])} / {_pct(out['relu_flip'])}, seed null {_pct(out['attn_null_seed'])}"
                      f" / {_pct(out['relu_null_seed'])}, random null {_pct(out['attn_null_random'])} / "
                      f"{_pct(out['relu_null_random'])}; test acc. {_pct(out['attn_test_acc'])} / "
                      f"{_pct(out['relu_test_acc'])} (K_m ridge {_pct(out['attn_test_acc_kernel'])} / "
                      f"{_pct(out['relu_test_acc_kernel'])})"
                      + (f"; {gap_words(out)}" if math.isfinite(out["gap"]) else ""))
    if not (math.isfinite(a) and math.isfinite(r)):
        return {**out, "outcome": "uninformative", "why": "measured without the null baselines (nulls off)"}
    failing = [(lbl, round((1 - out[f"{arch}_trained"]) * n_seeds)) for arch, lbl in (("attn", "MLP-Attn"),
               ("relu", "2L-ReLU")) if not out[f"{arch}_trained"] >= 1]
    if failing:
        return {**out, "outcome": "did not train",
                "why": "; ".join(f"{lbl}: {k} of {n_seeds} seed(s) more than {100 * TRAIN_GATE:.0f} points below "
                                 f"their K_m ridge's test accuracy" for lbl, k in failing)}
    if n_seeds < 2:
        return {**out, "outcome": "uninformative", "why": "one network seed: no seed null to compare with"}
    if not math.isfinite(out["gap_low"]):
        return {**out, "outcome": "uninformative", "why": "no interval of the gap between the two excesses"}
    gap = gap_words(out)
    match = _num(d, "attn", "objective_match_mean")
    if math.isfinite(match) and match < 1:  # e.g. ridge read on nets trained with cross-entropy
        gap += "; the reading is not exact for this training (see exact_for in the rows)"
    if not low > 0:
        return {**out, "outcome": "fails", "why": "MLP-Attn's flip excess is not above zero (its interval reaches "
                f"{_pct(low)}): the nulls flip as often; {gap}"}
    if not out["gap_low"] > 0:
        return {**out, "outcome": "fails", "why": f"the gap's interval reaches zero: {gap}"}
    return {**out, "outcome": "holds", "why": f"MLP-Attn's flip excess exceeds 2L-ReLU's: {gap}"}


def gap_words(v: dict) -> str:
    """The gap between the two excesses with its interval, and the ratio with its own only where
    it is defined (``engine.maths.metrics.gap_interval``), e.g. "gap 31 [18, 44] points, 4.1× [2.2, 9]"."""
    text = f"gap {_pts(v['gap'])} [{_pts(v['gap_low'])}, {_pts(v['gap_high'])}] points"
    if math.isfinite(v.get("ratio", math.nan)):
        return text + f", {v['ratio']:.2g}× [{v['ratio_low']:.2g}, {v['ratio_high']:.2g}]"
    return text + ", no ratio (2L-ReLU's excess interval reaches zero)"


def _pts(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.0f}"
