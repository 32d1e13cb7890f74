"""engine/tables: the numbers pages show, against numpy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import RTOL64
from engine.tables import mean_sd, percent, pm, sign_flipped, summarize


def test_summarize_is_numpy_mean_and_sample_sd_per_group():
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"arch": ["relu"] * 3 + ["attn"] * 3, "attention": [None] * 3 + ["linear"] * 3,
                         "width": [16] * 6, "seed": [0, 1, 2] * 2, "x": rng.normal(size=6), "y": rng.normal(size=6)})
    out = summarize(rows, ["arch", "attention", "width"], ["x", "y", "missing"])
    assert list(out.arch) == ["relu", "attn"] and list(out.n_seeds) == [3, 3]
    for arch in ("relu", "attn"):
        v = rows[rows.arch == arch].x.to_numpy()
        got = out[out.arch == arch].iloc[0]
        assert got.x_mean == pytest.approx(v.mean(), rel=1e-15) and got.x_sd == pytest.approx(v.std(ddof=1), rel=1e-14)
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

    from engine.tables import loglog_slope

    x = np.array([16.0, 64.0, 256.0, 1024.0, 4096.0])
    y = 3.0 * x ** -0.5 * np.array([1.1, 0.9, 1.05, 0.97, 1.0])
    ref = scipy.stats.linregress(np.log(x), np.log(y))
    assert loglog_slope(x, y) == pytest.approx((ref.slope, ref.intercept), rel=RTOL64)
    with_bad = loglog_slope([*x, 8.0, 2.0], [*y, 0.0, np.nan])  # zero and NaN are left out
    assert with_bad == pytest.approx((ref.slope, ref.intercept), rel=RTOL64)
    assert all(np.isnan(loglog_slope([4.0, 4.0], [1.0, 2.0])))  # one distinct x: no slope
