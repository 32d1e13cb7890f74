"""The numbers pages show, computed once and tested: means ± sd over seeds, percentages,
flip aggregation, and the paper's tables beside what was measured.

Figure builders (``engine.reporting.plots``) only draw what these functions return; a page reads a
number from here in one hop.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd


def mean_sd(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The ``{metric}_mean`` and ``{metric}_sd`` columns of a summary as ``mean`` and ``sd``."""
    out = frame.copy()
    out["mean"], out["sd"] = frame[f"{metric}_mean"], frame[f"{metric}_sd"]
    return out


def pm(mean: float, sd: float | None, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    """``mean ± sd`` as text with ``digits`` significant digits in the sd and the mean rounded
    to the same decimal place (``mean`` alone, to ``digits + 1`` digits, without an sd),
    e.g. ``8 ± 10 %`` or ``0.145 ± 0.006``."""
    if mean is None or (isinstance(mean, float) and np.isnan(mean)):
        return "—"
    m = mean * scale
    has_sd = sd is not None and not (isinstance(sd, float) and np.isnan(sd))
    if not has_sd or sd == 0:
        text = f"{m:.{digits + 1}g}" + (" ± 0" if has_sd else "")
    else:
        assert sd is not None  # has_sd
        s = abs(sd * scale)
        decimals = max(0, digits - 1 - int(np.floor(np.log10(s))))
        text = f"{m:.{decimals}f} ± {s:.{decimals}f}"
    return text + (f" {unit}" if unit else "")


def percent(frame: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """A copy with the given fraction columns (and their _mean/_sd) scaled to percent, as
    ``{c}_pct``, ``{c}_pct_mean`` and ``{c}_pct_sd``."""
    out = frame.copy()
    for c in columns:
        for suffix in ("", "_mean", "_sd"):
            if c + suffix in out.columns:
                out[f"{c}_pct{suffix}"] = 100.0 * out[c + suffix].astype(float)
    return out


FLIP_TABLE = {  # column of ``flip_table`` -> what it shows (the page's column headers)
    "flip": "flip rate (%)", "flip_sd": "± sd", "null_seed": "seed null (%)", "null_random": "random null (%)",
    "excess": "excess (%)", "excess_low": "excess low", "excess_high": "excess high",
    "train_acc": "train acc. (%)", "test_acc": "test acc. (%)", "test_acc_after": "test acc. after (%)",
    "test_acc_kernel": "K_m ridge acc. (%)", "test_acc_ntk": "K∞ ridge acc. (%)", "trained": "seeds trained",
}


def flip_table(summary: pd.DataFrame) -> pd.DataFrame:
    """A malleability summary as the table the Malleability page shows, one row per (arch,
    attack, ε): the flip rate with its sd, both nulls, the excess with its 95 % interval, and
    the accuracies that say whether the nets trained (train, test, test after the attack, the
    K_m and K∞ ridge baselines), all in percent; ``trained`` as "k / n" seeds through the gate."""
    def col(name):
        return 100.0 * pd.to_numeric(summary.get(name, pd.Series(np.nan, index=summary.index)), errors="coerce")

    out = summary[["arch", "attack", "eps"]].copy()
    for key, name in (("flip", "flip_rate_mean"), ("flip_sd", "flip_rate_sd"),
                      ("null_seed", "null_seed_flip_rate_mean"), ("null_random", "null_random_flip_rate_mean"),
                      ("excess", "flip_excess_mean"), ("excess_low", "flip_excess_low"),
                      ("excess_high", "flip_excess_high"), ("train_acc", "train_acc_mean"),
                      ("test_acc", "test_acc_mean"), ("test_acc_after", "test_acc_after_mean"),
                      ("test_acc_kernel", "test_acc_kernel_mean"), ("test_acc_ntk", "test_acc_ntk_mean")):
        out[key] = col(name)
    share = pd.to_numeric(summary.get("trained_mean", pd.Series(np.nan, index=summary.index)), errors="coerce")
    out["trained"] = [("—" if pd.isna(s) else f"{round(s * n)} / {n}") for s, n in zip(share, summary["n_seeds"], strict=True)]
    return out




GAP_TABLE = {  # column of ``gap_table`` -> what it shows
    "width": "m", "attack": "attack", "eps": "ε", "reading": "reading", "excess_attn": "MLP-Attn excess (%)",
    "excess_relu": "2L-ReLU excess (%)", "gap": "gap (% points)", "gap_low": "gap low", "gap_high": "gap high",
    "ratio": "ratio", "ratio_low": "ratio low", "ratio_high": "ratio high", "gap_p_holm": "p (Holm)",
    "trained": "through the gate (MLP-Attn / 2L-ReLU)", "left_out": "left out (below the gate)", "objective_match": "objective match",
    "n_draws": "draws", "role": "role", "outcome": "verdict",
}


def gap_table(verdict: pd.DataFrame) -> pd.DataFrame:
    """A malleability ``verdict`` frame as the table pages show: excesses and the gap in percent
    points, the ratio as a factor (empty where it is not defined), in ``GAP_TABLE``'s order."""
    out = verdict[["width", "attack", "eps", "reading"]].copy()
    for c in ("excess_attn", "excess_relu", "gap", "gap_low", "gap_high"):
        out[c] = 100.0 * pd.to_numeric(verdict[c], errors="coerce")
    for c in ("ratio", "ratio_low", "ratio_high"):
        out[c] = pd.to_numeric(verdict[c], errors="coerce")
    out["gap_p_holm"] = pd.to_numeric(verdict["gap_p_holm"], errors="coerce")
    out["trained"] = [f"{100 * a:.0f} % / {100 * r:.0f} %" for a, r in zip(verdict["trained_attn"],
                                                                         verdict["trained_relu"], strict=True)]
    for c in ("left_out", "objective_match", "n_draws", "role", "outcome"):
        out[c] = verdict[c]
    return out[list(GAP_TABLE)]
