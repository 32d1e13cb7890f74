"""engine/tables: the numbers pages show, against numpy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import ATOL64_MEAN, RTOL64, RTOL64_MEAN, RTOL64_SD
from engine.maths.metrics import sign_flipped, summarize
from engine.reporting.tables import mean_sd, percent, pm


def test_summarize_is_numpy_mean_and_sample_sd_per_group():
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"arch": ["relu"] * 3 + ["attn"] * 3, "attention": [None] * 3 + ["linear"] * 3,
                         "width": [16] * 6, "seed": [0, 1, 2] * 2, "x": rng.normal(size=6), "y": rng.normal(size=6)})
    out = summarize(rows, ["arch", "attention", "width"], ["x", "y", "missing"])
    assert list(out.arch) == ["relu", "attn"] and list(out.n_seeds) == [3, 3]
    for arch in ("relu", "attn"):
        v = rows[rows.arch == arch].x.to_numpy()
        got = out[out.arch == arch].iloc[0]
        assert got.x_mean == pytest.approx(v.mean(), rel=RTOL64_MEAN)
        assert got.x_sd == pytest.approx(v.std(ddof=1), rel=RTOL64_SD)
    assert "missing_mean" not in out
    assert pd.isna(out.attention.iloc[0]) and out.attention.iloc[1] == "linear"  # missing stays missing


def test_one_seed_has_no_sd_and_an_empty_frame_keeps_its_columns():
    one = summarize(pd.DataFrame({"a": ["r"], "x": [0.5]}), ["a"], ["x"])
    assert one.x_mean.iloc[0] == 0.5 and np.isnan(one.x_sd.iloc[0])
    empty = summarize(pd.DataFrame(columns=["a", "x"]), ["a"], ["x"])
    assert empty.empty and {"x_mean", "x_sd", "n_seeds"} <= set(empty.columns)


def test_percent_and_mean_sd_columns():
    f = pd.DataFrame({"flip_rate_mean": [0.25], "flip_rate_sd": [0.05], "flip_rate": [0.2]})
    p = percent(f, ["flip_rate"])
    assert (p.flip_rate_pct.iloc[0], p.flip_rate_pct_mean.iloc[0], p.flip_rate_pct_sd.iloc[0]) == (20.0, 25.0, 5.0)
    m = mean_sd(f, "flip_rate")
    assert (m["mean"].iloc[0], m["sd"].iloc[0]) == (0.25, 0.05)


@pytest.mark.parametrize("mean,sd,kw,text", [
    (8.3, 10.4, {}, "8 ± 10"),
    (0.145, 0.0059, {}, "0.1450 ± 0.0059"),
    (0.04, 0.02, {"scale": 100, "unit": "%"}, "4.0 ± 2.0 %"),
    (3.36, None, {}, "3.36"),
    (0.3, 0.0, {}, "0.3 ± 0"),
    (float("nan"), 0.1, {}, "—"),
])
def test_pm_rounds_the_mean_to_the_sd(mean, sd, kw, text):
    assert pm(mean, sd, **kw) == text


def test_sign_flipped_counts_zero_as_its_own_sign():
    assert sign_flipped(np.array([1.0, -2.0, 0.0, 3.0]), np.array([2.0, 1.0, 0.0, -1e-300])).tolist() == \
        [False, True, False, True]


def test_loglog_slope_matches_scipy_and_skips_what_a_log_cannot_take():
    import scipy.stats

    from engine.maths.metrics import loglog_slope

    x = np.array([16.0, 64.0, 256.0, 1024.0, 4096.0])
    y = 3.0 * x ** -0.5 * np.array([1.1, 0.9, 1.05, 0.97, 1.0])
    ref = scipy.stats.linregress(np.log(x), np.log(y))
    assert loglog_slope(x, y) == pytest.approx((ref.slope, ref.intercept), rel=RTOL64)
    with_bad = loglog_slope([*x, 8.0, 2.0], [*y, 0.0, np.nan])  # zero and NaN are left out
    assert with_bad == pytest.approx((ref.slope, ref.intercept), rel=RTOL64)
    assert all(np.isnan(loglog_slope([4.0, 4.0], [1.0, 2.0])))  # one distinct x: no slope


def test_flip_rate_and_rank_correlation_against_numpy_and_scipy():
    import scipy.stats
    import torch

    from engine.maths.metrics import flip_rate, rank_correlation

    rng = np.random.default_rng(4)
    a, b = rng.normal(size=200), rng.normal(size=200)
    a[:10] = 0.0
    b[5:15] = 0.0
    want = np.mean(np.sign(a) != np.sign(b))
    assert flip_rate(a, b) == want and flip_rate(torch.from_numpy(a), torch.from_numpy(b)) == want
    M, N = rng.normal(size=(7, 9)), rng.normal(size=(7, 9))
    assert flip_rate(M, N) == np.mean(np.sign(M) != np.sign(N))                # any shape
    assert flip_rate(1.0, -2.0) == 1.0 and flip_rate(0.0, 0.0) == 0.0 and np.isnan(flip_rate([], []))
    assert rank_correlation(a, b) == pytest.approx(scipy.stats.spearmanr(a, b).statistic, rel=RTOL64)
    assert rank_correlation(torch.from_numpy(a), torch.from_numpy(2 * a + 1)) == pytest.approx(1.0)
    assert np.isnan(rank_correlation(np.ones(5), a[:5]))
    for ties in (rng.integers(0, 4, size=(2, 60)), rng.integers(0, 30, size=(2, 31))):  # tied ranks: mean ranks
        assert rank_correlation(*ties) == pytest.approx(scipy.stats.spearmanr(*ties).statistic, rel=RTOL64)
    f32 = torch.from_numpy(a).float(), torch.from_numpy(b).float()
    assert rank_correlation(*f32) == pytest.approx(scipy.stats.spearmanr(*(t.numpy() for t in f32)).statistic,
                                                   rel=RTOL64)
    assert np.isnan(rank_correlation(np.r_[a[:5], np.nan], a[:6]))  # scipy propagates a NaN
    with pytest.raises(ValueError, match="one length"):
        rank_correlation(a, b[:-1])


def test_excess_interval_is_a_percentile_bootstrap_over_points_and_nets():
    from engine.maths.metrics import excess_interval

    rng = np.random.default_rng(1)
    a, s, r = rng.random(40) < 0.4, rng.random(40) < 0.1, rng.random(40) < 0.2
    point, lo, hi = excess_interval([(a, s, r)], n_boot=500, seed=3)
    assert point == pytest.approx(a.mean() - max(s.mean(), r.mean()), abs=ATOL64_MEAN)
    ref = np.random.default_rng(3)               # one net: its points resampled, the three arrays together
    idx = ref.integers(0, 40, size=(500, 40))
    reps = a[idx].mean(1) - np.maximum(s[idx].mean(1), r[idx].mean(1))
    assert (lo, hi) == tuple(np.quantile(reps, [0.025, 0.975]))
    assert lo < point < hi
    # nets whose points all agree: only the nets' resampling is left
    units = [(np.full(10, v), np.zeros(10, bool), np.full(10, 0.1 > 0.2)) for v in (0.0, 1.0, 1.0, 0.0, 1.0)]
    point, lo, hi = excess_interval(units, n_boot=800, seed=5)
    nets = np.random.default_rng(5).integers(0, 5, size=(800, 5))
    e = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    assert point == pytest.approx(0.6) and (lo, hi) == tuple(np.quantile(e[nets].mean(1), [0.025, 0.975]))
    # no seed null: the random null alone
    assert excess_interval([(a, None, r)], n_boot=50)[0] == pytest.approx(a.mean() - r.mean(), abs=ATOL64_MEAN)
    assert all(np.isnan(excess_interval([])))
    constant = excess_interval([(np.ones(8, bool), np.zeros(8, bool), np.zeros(8, bool))] * 2, n_boot=50)
    assert constant == (1.0, 1.0, 1.0)
