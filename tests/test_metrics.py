"""engine.maths.metrics: the gap between two architectures' flip excesses, intervals with data draws as
the unit (t over draw means, checked against scipy and for coverage on simulated clustered data),
Fieller's ratio against a brute-force inversion of the paired t test, and Holm's correction (the
single-draw excess, flip rate and rank correlation are checked in test_tables.py)."""

import math

import numpy as np
import pytest
import scipy.stats

from conftest import ATOL64, ATOL_RATIO_SCAN, MIN_COVERAGE_95
from engine.maths.metrics import LEVEL, draw_means, excess_interval, fieller, gap_interval, holm


def _unit(rng, p_attack, p_null, k=30):
    return rng.random(k) < p_attack, rng.random(k) < p_null, rng.random(k) < p_null


def test_the_gap_is_the_difference_of_the_two_excesses_and_its_ratio_needs_a_nonzero_denominator():
    rng = np.random.default_rng(0)
    a = [_unit(rng, 0.6, 0.05) for _ in range(3)]
    b = [_unit(rng, 0.2, 0.05) for _ in range(3)]
    gap = gap_interval(a, b, n_boot=400)
    ea, eb = excess_interval(a, n_boot=10)[0], excess_interval(b, n_boot=10)[0]
    assert gap.difference == pytest.approx(ea - eb, abs=ATOL64)
    assert gap.low < gap.difference < gap.high and gap.low > 0
    assert gap.ratio == pytest.approx(ea / eb) and gap.ratio_low < gap.ratio < gap.ratio_high
    assert gap.n_draws == 1 and gap.p < 0.05
    nil = [(np.zeros(30, bool), np.zeros(30, bool), np.zeros(30, bool))] * 3   # an excess of exactly 0
    assert math.isnan(gap_interval(a, nil, n_boot=200).ratio)
    assert all(math.isnan(v) for v in gap_interval([], b)[:6])


def _t_reference(values, bound):
    """scipy's t interval over the values, clipped to the possible range: the independent reference."""
    v = np.asarray(values, dtype=float)
    lo, hi = scipy.stats.t.interval(LEVEL, v.size - 1, loc=v.mean(), scale=scipy.stats.sem(v))
    return v.mean(), max(-bound, lo), min(bound, hi)


@pytest.mark.parametrize("n_draws", [2, 3, 5])
def test_with_several_draws_the_interval_is_a_t_interval_over_draw_means(n_draws):
    rng = np.random.default_rng(n_draws)
    draws = [d for d in range(n_draws) for _ in range(3)]
    a = [_unit(rng, 0.3 + 0.1 * d, 0.05) for d in draws]
    b = [_unit(rng, 0.1, 0.05) for _ in draws]
    per_a = [np.mean([float(u[0].mean() - max(u[1].mean(), u[2].mean())) for u, e in zip(a, draws, strict=True) if e == d])
             for d in range(n_draws)]
    per_b = [np.mean([float(u[0].mean() - max(u[1].mean(), u[2].mean())) for u, e in zip(b, draws, strict=True) if e == d])
             for d in range(n_draws)]
    assert list(draw_means(a, draws).values()) == pytest.approx(per_a, abs=ATOL64)
    assert tuple(excess_interval(a, draws=draws)) == pytest.approx(_t_reference(per_a, 1.0), abs=ATOL64)
    gap = gap_interval(a, b, draws, draws)
    ref = _t_reference(np.subtract(per_a, per_b), 2.0)
    assert (gap.difference, gap.low, gap.high) == pytest.approx(ref, abs=ATOL64)
    assert gap.p == pytest.approx(scipy.stats.ttest_1samp(np.subtract(per_a, per_b), 0.0).pvalue, abs=ATOL64)
    assert gap.n_draws == n_draws


def test_draws_that_disagree_widen_the_interval_beyond_a_bootstrap_of_the_nets():
    """The issue's case: three draws whose gaps disagree. Resampling the nets as if independent gave an
    interval several times narrower than the per-draw gaps support; the t interval is theirs."""
    one = (np.ones(20, bool), np.zeros(20, bool), np.zeros(20, bool))     # excess 1
    none = (np.zeros(20, bool), np.zeros(20, bool), np.zeros(20, bool))   # excess 0
    half = (np.arange(20) < 10, np.zeros(20, bool), np.zeros(20, bool))   # excess 0.5
    units, draws = [one] * 3 + [none] * 3 + [half] * 3, [0] * 3 + [1] * 3 + [2] * 3
    pooled, flat = excess_interval(units, draws=draws), excess_interval(units, n_boot=2000)
    assert pooled.value == flat.value == pytest.approx(0.5)
    half_width = scipy.stats.t.ppf((1 + LEVEL) / 2, 2) * 0.5 / math.sqrt(3)   # sd of (1, 0, 0.5) is 0.5
    assert (pooled.low, pooled.high) == pytest.approx((0.5 - half_width, 1.0), abs=ATOL64)   # clipped at 1
    assert flat.high - flat.low < 0.6 * (pooled.high - pooled.low)


def test_a_single_draw_label_is_the_single_draw_interval_bit_for_bit():
    rng = np.random.default_rng(2)
    units = [_unit(rng, 0.4, 0.1) for _ in range(3)]
    assert excess_interval(units, draws=[5, 5, 5]) == excess_interval(units)


def _simulate(rng, n_draws, nets, k, mu, sd_draw, sd_net):
    """Nets nested in data draws: each draw shifts the attack's flip probability, each net again; the
    nulls never flip, so the true excess is the mean flip probability ``mu`` (kept inside (0, 1))."""
    units, draws = [], []
    for d in range(n_draws):
        p_draw = mu + sd_draw * rng.standard_normal()
        for _ in range(nets):
            p = float(np.clip(p_draw + sd_net * rng.standard_normal(), 0.0, 1.0))
            units.append((rng.random(k) < p, np.zeros(k, bool), np.zeros(k, bool)))
            draws.append(d)
    return units, draws


@pytest.mark.parametrize("n_draws", [3, 5, 8])
def test_the_interval_covers_the_truth_on_simulated_clustered_data(n_draws):
    rng = np.random.default_rng(100 + n_draws)
    trials, mu, covered, covered_gap = 400, 0.3, 0, 0
    for _ in range(trials):
        a, da = _simulate(rng, n_draws, 3, 20, mu, 0.08, 0.04)
        b, _ = _simulate(rng, n_draws, 3, 20, 0.1, 0.03, 0.02)
        e = excess_interval(a, draws=da)
        covered += e.low <= mu <= e.high
        g = gap_interval(a, b, da, da)
        covered_gap += g.low <= mu - 0.1 <= g.high
    assert covered / trials >= MIN_COVERAGE_95
    assert covered_gap / trials >= MIN_COVERAGE_95


def test_fieller_is_the_set_of_ratios_the_paired_t_test_does_not_reject():
    rng = np.random.default_rng(7)
    a, b = 0.3 + 0.05 * rng.standard_normal(6), 0.1 + 0.02 * rng.standard_normal(6)
    ratio, lo, hi = fieller(a, b)
    grid = np.linspace(0, 10, 200001)  # a brute-force scan of ρ (every 100th point: a step of 0.005)
    coarse = grid[::100]
    accepted = coarse[np.array([scipy.stats.ttest_1samp(a - r * b, 0.0).pvalue for r in coarse]) >= 1 - LEVEL]
    assert ratio == pytest.approx(a.mean() / b.mean())
    assert lo == pytest.approx(accepted.min(), abs=ATOL_RATIO_SCAN) and hi == pytest.approx(accepted.max(), abs=ATOL_RATIO_SCAN)
    assert math.isnan(fieller(a, b - b.mean())[1])              # b's interval reaches zero: no bounded set


def test_holm_against_its_definition():
    p = np.array([0.01, 0.04, np.nan, 0.03, 0.2])
    adjusted = holm(p)
    finite = [0, 1, 3, 4]
    order = sorted(finite, key=lambda i: p[i])
    m = len(finite)
    expect = {}
    for rank, i in enumerate(order):
        expect[i] = min(1.0, max(min(1.0, (m - j) * p[order[j]]) for j in range(rank + 1)))
    assert [adjusted[i] for i in finite] == pytest.approx([expect[i] for i in finite], abs=ATOL64)
    assert math.isnan(adjusted[2])


def test_draw_interval_is_a_t_interval_over_draw_means_or_over_the_nets_where_draws_cannot_spread():
    from scipy import stats

    from engine.maths.metrics import draw_interval

    def t(values):
        v = np.asarray(values, dtype=float)
        return stats.t.interval(0.95, v.size - 1, loc=v.mean(), scale=stats.sem(v))

    values, draws = [0.1, 0.3, 0.2, 0.6, 0.5, np.nan], [0, 0, 1, 1, 2, 2]
    mean, lo, hi, g = draw_interval(values, draws)
    means = [0.2, 0.4, 0.5]  # the NaN net is left out, its draw keeps its other net
    assert g == 3 and mean == pytest.approx(np.mean(means)) and (lo, hi) == pytest.approx(t(means))
    one = draw_interval([0.1, 0.3, 0.2], [4, 4, 4])
    assert one[3] == 1 and one[1:3] == pytest.approx(t([0.1, 0.3, 0.2]))
    agree = draw_interval([0.0, -0.2, -0.1, -0.1], [0, 0, 1, 1])  # both draw means -0.1: the nets spread it
    assert agree[3] == 2 and agree[1:3] == pytest.approx(t([0.0, -0.2, -0.1, -0.1])) and agree[1] < 0 < agree[2]
    same = draw_interval([0.2, 0.2, 0.2, 0.2], [0, 0, 1, 1])  # every net the same: a sign test over 4 nets
    assert same[0] == pytest.approx(0.2) and np.isnan(same[1]) and np.isnan(same[2]) and same[3] == 2
    six = draw_interval([0.2] * 6, [0, 0, 1, 1, 2, 2])  # 2 / 2⁶ < 0.05: six nets that agree are evidence
    assert six[1:3] == pytest.approx((0.2, 0.2))
    assert np.isnan(draw_interval([0.0] * 6, [0, 0, 1, 1, 2, 2])[1])  # no change at all: no interval
    assert np.isnan(draw_interval([0.2], [0])[1]) and draw_interval([], [])[3] == 0
