"""engine.maths.metrics: the gap between two architectures' flip excesses, and intervals pooled over
data draws (the single-draw excess, flip rate and rank correlation are checked in test_tables.py)."""

import math

import numpy as np
import pytest

from conftest import ATOL64
from engine.maths.metrics import excess_interval, gap_interval


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
    nil = [(np.zeros(30, bool), np.zeros(30, bool), np.zeros(30, bool))] * 3   # an excess of exactly 0
    assert math.isnan(gap_interval(a, nil, n_boot=200).ratio)
    assert all(math.isnan(v) for v in gap_interval([], b))


def test_intervals_over_several_draws_resample_the_draws():
    """Two draws whose nets disagree completely: the draw-level spread must show in the interval
    (replicate means are 0, ½ or 1 over two resampled draws), while resampling the six nets as if
    independent hides it."""
    one = (np.ones(20, bool), np.zeros(20, bool), np.zeros(20, bool))     # excess 1
    none = (np.zeros(20, bool), np.zeros(20, bool), np.zeros(20, bool))   # excess 0
    units, draws = [one] * 3 + [none] * 3, [0] * 3 + [1] * 3
    pooled = excess_interval(units, n_boot=2000, draws=draws)
    flat = excess_interval(units, n_boot=2000)
    assert pooled.value == flat.value == pytest.approx(0.5)
    assert pooled.low == 0.0 and pooled.high == 1.0
    assert flat.low > 0.1 and flat.high < 0.9


def test_a_single_draw_label_is_the_single_draw_interval_bit_for_bit():
    rng = np.random.default_rng(2)
    units = [_unit(rng, 0.4, 0.1) for _ in range(3)]
    assert excess_interval(units, draws=[5, 5, 5]) == excess_interval(units)
