"""The numbers pages show, computed once and tested: means ± sd over seeds, percentages,
flip aggregation, and the paper's tables beside what was measured.

Figure builders (``engine.plots``) only draw what these functions return; a page reads a
number from here in one hop.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def summarize(rows: pd.DataFrame, by: list[str], metrics) -> pd.DataFrame:
    """Mean, sample sd (ddof 1; NaN for one seed) and count over seeds of each metric.

    rows: one row per seed with the ``by`` columns and numeric ``metrics``. Returns one row
    per group with ``{metric}_mean``, ``{metric}_sd`` and ``n_seeds``. Missing ``by``
    values (e.g. attention of the ReLU net) form their own group.
    """
    metrics = [m for m in metrics if m in rows.columns]
    if rows.empty:
        return pd.DataFrame(columns=[*by, *[f"{m}_{s}" for m in metrics for s in ("mean", "sd")], "n_seeds"])
    keys = rows[by].astype(object).where(rows[by].notna(), "")
    out = []
    for key, g in rows.groupby([keys[c] for c in by], sort=False):
        key = key if isinstance(key, tuple) else (key,)
        row = {c: (g[c].iloc[0]) for c in by}
        for m in metrics:
            v = pd.to_numeric(g[m], errors="coerce").astype(float)
            row[f"{m}_mean"] = float(v.mean()) if v.notna().any() else np.nan
            row[f"{m}_sd"] = float(v.std(ddof=1)) if v.notna().sum() > 1 else np.nan
        row["n_seeds"] = int(len(g))
        out.append(row)
    return pd.DataFrame(out)


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
        s = abs(sd * scale)
        decimals = max(0, digits - 1 - int(np.floor(np.log10(s))))
        text = f"{m:.{decimals}f} ± {s:.{decimals}f}"
    return text + (f" {unit}" if unit else "")


def percent(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """A copy with the given fraction columns (and their _mean/_sd) scaled to percent, as
    ``{c}_pct``, ``{c}_pct_mean`` and ``{c}_pct_sd``."""
    out = frame.copy()
    for c in columns:
        for suffix in ("", "_mean", "_sd"):
            if c + suffix in out.columns:
                out[f"{c}_pct{suffix}"] = 100.0 * out[c + suffix].astype(float)
    return out


def sign_flipped(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """True where an influence changed sign (zero counts as its own sign), elementwise."""
    return np.sign(np.asarray(before)) != np.sign(np.asarray(after))
