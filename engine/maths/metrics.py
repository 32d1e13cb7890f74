"""The metrics every experiment and page reads, each defined once, below the experiments: seed
averages, sign flips and the flip rate, rank correlation, the flip excess over the larger null
with its interval (one value, ``Excess``), the gap between two architectures' excesses (``Gap``,
with Fieller's ratio and Holm's correction for a family of gaps), and the log-log slope. Data
draws are the unit of inference (``INTERVAL_WORDS``, the one statement of how intervals are made). The kernel distances
live beside the kernels (``engine.maths.ridge``).

Arrays in, floats or numpy out: numpy arrays, scalars or (CPU or CUDA) torch tensors, without
importing torch; the seed average works on a DataFrame of rows. Experiments compute their rows
with these; ``engine.reporting`` only formats what they return.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

import numpy as np

from .._lazy import LazyModule

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows

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


def _mean_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` with ties given their mean rank (scipy's ``rankdata`` "average")."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the highest rank of each distinct value
    return (last - (counts - 1) / 2.0)[inverse.ravel()]


def rank_correlation(before: ArrayLike, after: ArrayLike) -> float:
    """Spearman ρ between two influence vectors (n,): Pearson's r of their ranks, ties ranked by
    their mean rank (as ``scipy.stats.spearmanr``, which the tests compare against; numpy here, so
    that a run's first rows do not wait for scipy.stats to import).

    1 keeps the ranking, 0 scrambles it; NaN when either vector is constant or holds a NaN."""
    a, b = _numpy(before).astype(float).ravel(), _numpy(after).astype(float).ravel()
    if a.size != b.size:
        raise ValueError(f"rank_correlation needs two vectors of one length, not {a.size} and {b.size}")
    if a.size < 2 or np.isnan(a).any() or np.isnan(b).any() or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    ra, rb = _mean_ranks(a), _mean_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float(np.clip(ra @ rb / math.sqrt((ra @ ra) * (rb @ rb)), -1.0, 1.0))


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


def _replicates(units: list[tuple], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates (n_boot,) of the mean excess over the ``units`` of one data draw: resample
    the nets, then within each drawn net its tracked points (the three arrays paired)."""
    reps = np.zeros(n_boot)
    nets = rng.integers(0, len(units), size=(n_boot, len(units))) if len(units) > 1 else np.zeros((n_boot, 1), int)
    for slot in range(nets.shape[1]):  # every drawn net gets its own resample of points
        for j, (a, s, r) in enumerate(units):
            rows = np.flatnonzero(nets[:, slot] == j)
            if rows.size:
                idx = rng.integers(0, a.size, size=(rows.size, a.size))
                reps[rows] += _unit_excess(a[idx], None if s is None else s[idx], r[idx])
    return reps / nets.shape[1]


INTERVAL_WORDS = ("95 % t interval over data-draw means with G − 1 degrees of freedom (each draw's nets and tracked "
                  "points averaged within it, the two architectures paired within a draw, clipped to the possible "
                  "range); with one data draw, a percentile bootstrap over that draw's nets and tracked points, "
                  "marked \"one draw\": it says nothing about another sample")


def interval_scope(n_draws: int) -> str:
    """What an interval of ``excess_interval`` / ``gap_interval`` is over, in two or three words."""
    return "one draw" if int(n_draws) <= 1 else f"{int(n_draws)} draws"


def t_quantile(level: float, df: int) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (scipy)."""
    import scipy.stats

    return float(scipy.stats.t.ppf((1 + level) / 2, df))


def draw_means(units: Iterable[tuple], draws: Iterable) -> dict:
    """Mean excess of the nets of each data draw: {draw label: mean over its units' ``_unit_excess``},
    in first-seen order. ``units`` as ``excess_interval`` takes them, ``draws`` one label per unit."""
    by: dict = {}
    for u, d in zip(_as_units(units), draws, strict=True):
        by.setdefault(d, []).append(float(_unit_excess(*u)))
    return {d: float(np.mean(v)) for d, v in by.items()}


def _t_interval(values: np.ndarray, level: float, bound: float) -> tuple[float, float, float, float]:
    """Mean, t interval (clipped to [−bound, bound]) and two-sided p-value of H0: mean = 0, over G ≥ 2 values."""
    import scipy.stats

    g = values.size
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    half = t_quantile(level, g - 1) * sd / math.sqrt(g)
    if sd > 0:
        p = float(2 * scipy.stats.t.sf(abs(mean) / (sd / math.sqrt(g)), g - 1))
    else:
        p = 1.0 if mean == 0 else 0.0
    return mean, max(-bound, mean - half), min(bound, mean + half), p


def excess_interval(units: Iterable[tuple], n_boot: int = BOOTSTRAP, level: float = LEVEL, seed: int = 0,
                    draws: Iterable | None = None) -> Excess:
    """The flip excess and its interval, with data draws as the unit of inference.

    units: one tuple ``(attack, seed_null, random_null)`` per net (network seed × data draw),
    each a bool array (k,) of per-point sign flips over that net's top-τ points (the same
    points in all three; ``seed_null`` may be None when the run had no partner seed, or when
    the reading cannot differ between seeds). The excess of one net is ``mean(attack) −
    max(mean(seed_null), mean(random_null))``. ``draws``: the data draw of each unit.

    With two or more draws (``INTERVAL_WORDS``): the statistic is the mean over draws of each
    draw's mean net excess, and the interval a t interval over those G draw means (G − 1 degrees
    of freedom), clipped to [−1, 1]: nets and points are nested in draws, so only the draws are
    independent replicates of the experiment. With one draw (or ``draws`` None): the mean over
    nets and a percentile bootstrap that resamples the nets and, within each, its tracked points
    (the three arrays paired) — an interval about this one sample (``interval_scope``).
    Returns the ``Excess`` (value, low, high); ``level`` two-sided, ``seed`` fixes the replicates.
    """
    units = _as_units(units)
    if not units:
        return Excess(float("nan"), float("nan"), float("nan"))
    labels = None if draws is None else list(draws)
    if labels is not None and len(set(labels)) > 1:
        mean, lo, hi, _ = _t_interval(np.array(list(draw_means(units, labels).values())), level, 1.0)
        return Excess(mean, lo, hi)
    point = float(np.mean([_unit_excess(*u) for u in units]))
    reps = _replicates(units, n_boot, np.random.default_rng(seed))
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return Excess(point, float(lo), float(hi))


class Gap(NamedTuple):
    """How much larger one architecture's flip excess is than another's: the difference (a share)
    with its interval, and the ratio with its interval where the second's excess interval excludes
    zero (NaN otherwise: a ratio over an excess that may be nil says nothing); ``p``: two-sided
    p-value of "no difference"; ``n_draws``: the data draws the interval is over (1: one draw)."""

    difference: float
    low: float
    high: float
    ratio: float
    ratio_low: float
    ratio_high: float
    p: float = float("nan")
    n_draws: int = 0


def fieller(a: ArrayLike, b: ArrayLike, level: float = LEVEL) -> tuple[float, float, float]:
    """Ratio mean(a) / mean(b) of paired values (G,) with Fieller's interval: every ρ for which
    the paired t test of a − ρ·b at ``level`` does not reject mean zero. NaN bounds unless b's own t
    interval excludes zero (then the set is a bounded interval); G ≥ 2."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    g, nan = a.size, float("nan")
    ma, mb = float(a.mean()), float(b.mean())
    ratio = ma / mb if mb != 0 else nan
    q = t_quantile(level, g - 1) ** 2 / g
    cov = np.cov(np.stack([a, b]), ddof=1)
    A = mb * mb - q * cov[1, 1]
    if not A > 0:
        return ratio, nan, nan
    B, C = ma * mb - q * cov[0, 1], ma * ma - q * cov[0, 0]
    root = math.sqrt(max(B * B - A * C, 0.0))
    return ratio, float((B - root) / A), float((B + root) / A)


def gap_interval(units_a: Iterable[tuple], units_b: Iterable[tuple], draws_a: Iterable | None = None,
                 draws_b: Iterable | None = None, n_boot: int = BOOTSTRAP, level: float = LEVEL,
                 seed: int = 0) -> Gap:
    """Excess of ``units_a`` minus excess of ``units_b`` (each as ``excess_interval`` takes them).

    With two or more data draws that both sides measured: the difference of draw means, paired
    within each draw, with a t interval over the G per-draw gaps (clipped to [−2, 2]) and its
    p-value; the ratio with Fieller's interval (``fieller``), only where b's own t interval lies
    above zero. With one draw: a percentile bootstrap from independent resamples of the two sides'
    nets and points, the ratio from the same replicates, and p from the replicates' side of zero."""
    ua, ub = _as_units(units_a), _as_units(units_b)
    nan = float("nan")
    if not ua or not ub:
        return Gap(nan, nan, nan, nan, nan, nan)
    la = None if draws_a is None else list(draws_a)
    lb = None if draws_b is None else list(draws_b)
    if la is not None and lb is not None and len(set(la) & set(lb)) > 1:
        ma, mb = draw_means(ua, la), draw_means(ub, lb)
        both = [d for d in ma if d in mb]
        a, b = np.array([ma[d] for d in both]), np.array([mb[d] for d in both])
        diff, lo, hi, p = _t_interval(a - b, level, 2.0)
        ratio = ratio_lo = ratio_hi = nan
        if _t_interval(b, level, 1.0)[1] > 0:
            ratio, ratio_lo, ratio_hi = fieller(a, b, level)
        return Gap(diff, lo, hi, ratio, ratio_lo, ratio_hi, p, len(both))
    rng = np.random.default_rng(seed)
    ra, rb = _replicates(ua, n_boot, rng), _replicates(ub, n_boot, rng)
    pa, pb = float(np.mean([_unit_excess(*u) for u in ua])), float(np.mean([_unit_excess(*u) for u in ub]))
    q = [(1 - level) / 2, (1 + level) / 2]
    lo, hi = np.quantile(ra - rb, q)
    ratio = ratio_lo = ratio_hi = nan
    if np.quantile(rb, q[0]) > 0:
        ratio = pa / pb
        with np.errstate(divide="ignore", invalid="ignore"):  # a replicate of b at 0 gives ±inf: it widens the interval
            ratio_lo, ratio_hi = (float(v) for v in np.quantile(ra / rb, q))
    d = ra - rb
    p = float(min(1.0, 2 * min(np.mean(d <= 0), np.mean(d >= 0))))
    return Gap(pa - pb, float(lo), float(hi), ratio, ratio_lo, ratio_hi, p, 1)


def draw_interval(values: ArrayLike, draws: Iterable, level: float = LEVEL) -> tuple[float, float, float, int]:
    """A per-net quantity (e.g. a paired change, one value per net) pooled with data draws as the unit:
    each draw's mean over its nets, then the mean of the G draw means with a t interval over them (G − 1
    degrees of freedom); with one draw, a t interval over that draw's nets (about that sample only), and
    likewise where the draw means agree exactly (two draws of quantised flip counts can: a zero-width
    interval there would claim what the draws cannot show). Where every net agrees too, the interval is
    that value only where a two-sided sign test over the nets rejects zero (six or more nets at 95 %),
    else NaN bounds: four nets that each flipped one point the same way are not evidence of an effect.
    Returns (mean, low, high, G); NaN bounds with fewer than two values to spread."""
    v = np.asarray(values, dtype=float)
    labels = list(draws)
    ok = np.isfinite(v)
    v, labels = v[ok], [d for d, k in zip(labels, ok, strict=True) if k]
    nan = float("nan")
    if not v.size:
        return nan, nan, nan, 0
    by: dict = {}
    for x, d in zip(v, labels, strict=True):
        by.setdefault(d, []).append(float(x))
    means = np.array([np.mean(x) for x in by.values()]) if len(by) > 1 else v
    if means.size > 1 and np.ptp(means) == 0:
        means = v  # draws that agree exactly (counts of a few flips) have a spread they cannot measure: the nets'
    if means.size > 1 and np.ptp(means) == 0:  # every net the same value: a sign test over the nets decides
        same = float(means[0])
        sure = same != 0 and 2 * 0.5 ** means.size < 1 - level
        return same, same if sure else nan, same if sure else nan, len(by)
    if means.size < 2:
        return float(means.mean()), nan, nan, len(by)
    mean, lo, hi, _ = _t_interval(means, level, math.inf)
    return mean, lo, hi, len(by)


def holm(p: Iterable[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (same order; NaN stays NaN and is not counted): a family of
    tests whose adjusted p < α holds at family-wise error α."""
    p = np.asarray(list(p), dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m, running = len(order), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


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
