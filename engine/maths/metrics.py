"""The metrics every experiment and page reads, each defined once, below the experiments: seed
averages, sign flips and the flip rate, rank correlation, the flip excess over the larger null
with its bootstrap interval (one value, ``Excess``), the gap between two architectures'
excesses (``Gap``), and the log-log slope. The kernel distances
live beside the kernels (``engine.maths.ridge``).

Arrays in, floats or numpy out: numpy arrays, scalars or (CPU or CUDA) torch tensors, without
importing torch; the seed average works on a DataFrame of rows. Experiments compute their rows
with these; ``engine.reporting`` only formats what they return.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

import numpy as np
import pandas as pd

ArrayLike = Any  # a numpy array, a scalar or a (CPU or CUDA) torch tensor: torch is not imported here


def summarize(rows: pd.DataFrame, by: list[str], metrics: Iterable[str]) -> pd.DataFrame:
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


def _numpy(x: ArrayLike) -> np.ndarray:
    """A numpy view of an array, a scalar or a (CPU or CUDA) torch tensor, without importing torch."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def sign_flipped(before: ArrayLike, after: ArrayLike) -> np.ndarray:
    """True where an influence changed sign, elementwise (zero counts as its own sign).

    before, after: same shape, numpy arrays, scalars or torch tensors; returns bool numpy."""
    return np.sign(_numpy(before)) != np.sign(_numpy(after))


def flip_rate(before: ArrayLike, after: ArrayLike) -> float:
    """Share of entries whose sign differs between ``before`` and ``after`` (the flip rate).

    The one flip-rate function of the engine: the malleability rows (attack, seed null,
    random null, interventions) and the pages all count flips here. Any shape, as long as
    both agree (e.g. the top-τ aggregate influences (k,), or an influence matrix's top-τ
    columns (n_test, k)); numpy or torch; zero counts as its own sign (0 → 0 is no flip,
    0 → ± is one). Empty inputs give NaN."""
    flips = sign_flipped(before, after)
    return float(flips.mean()) if flips.size else float("nan")


def rank_correlation(before: ArrayLike, after: ArrayLike) -> float:
    """Spearman ρ between two influence vectors (n,), ties ranked by their mean rank (scipy).

    1 keeps the ranking, 0 scrambles it; NaN when either vector is constant."""
    import scipy.stats

    a, b = _numpy(before).ravel(), _numpy(after).ravel()
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(scipy.stats.spearmanr(a, b).statistic)


class Excess(NamedTuple):
    """A flip excess (attack minus the larger null, a share in [-1, 1]) with its two-sided
    ``LEVEL`` bootstrap interval; NaN throughout where nothing was measured."""

    value: float
    low: float
    high: float


BOOTSTRAP = 2000        # bootstrap replicates of an interval
LEVEL = 0.95            # two-sided coverage of every interval here


def _unit_excess(a: np.ndarray, s: np.ndarray | None, r: np.ndarray) -> np.ndarray:
    """Excess of one net (or of replicates along the last axis' resamples): attack minus the larger null."""
    null = r.mean(axis=-1) if s is None else np.maximum(s.mean(axis=-1), r.mean(axis=-1))
    return a.mean(axis=-1) - null


def _as_units(units: Iterable[tuple]) -> list[tuple]:
    return [tuple(None if u is None else np.asarray(u, dtype=float) for u in unit) for unit in units]


def _replicates(units: list[tuple], draws: Iterable | None, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates (n_boot,) of the mean excess over ``units``.

    One data draw (``draws`` None or a single label): resample the nets, then within each its
    tracked points. Several draws: resample the draws (clusters) first, then the nets within
    each drawn draw, then their points, so that what varies between draws (the sample itself)
    enters the spread, not only the network seeds."""
    draws = [] if draws is None else list(draws)
    labels = list(dict.fromkeys(draws))
    reps = np.zeros(n_boot)
    if len(labels) <= 1:
        nets = rng.integers(0, len(units), size=(n_boot, len(units))) if len(units) > 1 else np.zeros((n_boot, 1), int)
        for slot in range(nets.shape[1]):  # every drawn net gets its own resample of points
            for j, (a, s, r) in enumerate(units):
                rows = np.flatnonzero(nets[:, slot] == j)
                if rows.size:
                    idx = rng.integers(0, a.size, size=(rows.size, a.size))
                    reps[rows] += _unit_excess(a[idx], None if s is None else s[idx], r[idx])
        return reps / nets.shape[1]
    members = [[j for j, d in enumerate(draws) if d == label] for label in labels]
    for b in range(n_boot):
        total, count = 0.0, 0
        for c in rng.integers(0, len(labels), size=len(labels)):
            for j in rng.choice(members[c], size=len(members[c]), replace=True):
                a, s, r = units[j]
                idx = rng.integers(0, a.size, size=a.size)
                total += float(_unit_excess(a[idx], None if s is None else s[idx], r[idx]))
                count += 1
        reps[b] = total / count
    return reps


def excess_interval(units: Iterable[tuple], n_boot: int = BOOTSTRAP, level: float = LEVEL, seed: int = 0,
                    draws: Iterable | None = None) -> Excess:
    """The flip excess and its percentile bootstrap interval, over nets and tracked points.

    units: one tuple ``(attack, seed_null, random_null)`` per net (network seed × data draw),
    each a bool array (k,) of per-point sign flips over that net's top-τ points (the same
    points in all three; ``seed_null`` may be None when the run had no partner seed, or when
    the reading cannot differ between seeds). The excess of one net is ``mean(attack) −
    max(mean(seed_null), mean(random_null))``; the statistic is its mean over nets. Each
    replicate resamples the nets with replacement and, within each, its tracked points with
    replacement (the same draw of points for the three arrays, which are paired); with one net
    only the points are resampled. ``draws``: the data draw of each unit; with several, the
    draws are resampled first (``_replicates``). Returns the ``Excess`` (value, low, high);
    ``level`` two-sided, ``seed`` fixes the replicates.
    """
    units = _as_units(units)
    if not units:
        return Excess(float("nan"), float("nan"), float("nan"))
    point = float(np.mean([_unit_excess(*u) for u in units]))
    reps = _replicates(units, draws, n_boot, np.random.default_rng(seed))
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return Excess(point, float(lo), float(hi))


class Gap(NamedTuple):
    """How much larger one architecture's flip excess is than another's: the difference (a share)
    with its interval, and the ratio with its interval where the second's excess interval excludes
    zero (NaN otherwise: a ratio over an excess that may be nil says nothing)."""

    difference: float
    low: float
    high: float
    ratio: float
    ratio_low: float
    ratio_high: float


def gap_interval(units_a: Iterable[tuple], units_b: Iterable[tuple], draws_a: Iterable | None = None,
                 draws_b: Iterable | None = None, n_boot: int = BOOTSTRAP, level: float = LEVEL,
                 seed: int = 0) -> Gap:
    """Excess of ``units_a`` minus excess of ``units_b`` (each as ``excess_interval`` takes them),
    with a percentile bootstrap interval from independent resamples of the two (draws first when
    each side has several); the ratio a / b with its interval from the same replicates, only where
    b's own interval lies above zero."""
    ua, ub = _as_units(units_a), _as_units(units_b)
    nan = float("nan")
    if not ua or not ub:
        return Gap(nan, nan, nan, nan, nan, nan)
    rng = np.random.default_rng(seed)
    ra, rb = _replicates(ua, draws_a, n_boot, rng), _replicates(ub, draws_b, n_boot, rng)
    pa, pb = float(np.mean([_unit_excess(*u) for u in ua])), float(np.mean([_unit_excess(*u) for u in ub]))
    q = [(1 - level) / 2, (1 + level) / 2]
    lo, hi = np.quantile(ra - rb, q)
    ratio = ratio_lo = ratio_hi = nan
    if np.quantile(rb, q[0]) > 0:
        ratio = pa / pb
        with np.errstate(divide="ignore", invalid="ignore"):  # a replicate of b at 0 gives ±inf: it widens the interval
            ratio_lo, ratio_hi = (float(v) for v in np.quantile(ra / rb, q))
    return Gap(pa - pb, float(lo), float(hi), ratio, ratio_lo, ratio_hi)


def loglog_slope(x: ArrayLike, y: ArrayLike) -> tuple[float, float]:
    """Least-squares slope and intercept of log y against log x, over the points where both are
    finite and positive; (NaN, NaN) with fewer than two distinct x. The one fitted exponent every
    page and run uses (widths against κ, gaps against width, coordinate checks)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if np.unique(x[ok]).size < 2:
        return float("nan"), float("nan")
    slope, icpt = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)
    return float(slope), float(icpt)
