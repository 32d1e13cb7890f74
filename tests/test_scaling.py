import math

import numpy as np
import pandas as pd
import pytest

from engine.errors import BadInput
from engine.scaling import ScalingConfig, _smallest_width, run_scaling, theory_exponent
from engine.training import TrainSpec


@pytest.mark.parametrize("target,exact", [(0.1, 100.0), (0.02, 2500.0), (0.3, 11.1)])
def test_bisection_finds_the_smallest_width_within_a_quarter_octave(target, exact):
    width, evals = _smallest_width(lambda w: 1 / math.sqrt(w), 4, 2**16, target)
    assert exact <= width <= exact * 2**0.25 + 1
    assert all(d <= target for w, d in evals.items() if w >= width)
    assert len(evals) < 20


def test_bisection_reports_censoring_and_the_easy_case():
    assert _smallest_width(lambda w: 1.0, 4, 64, 0.5)[0] is None
    assert _smallest_width(lambda w: 0.0, 4, 64, 0.5)[0] == 4


def test_theory_exponents():
    assert theory_exponent("relu", "linear") == 2.0
    assert theory_exponent("attn", "linear") == 6.0
    assert theory_exponent("attn", "stacked:2") == 10.0
    assert theory_exponent("attn", "softmax") is None


def test_run_scaling_structure_and_fit():
    cfg = ScalingConfig(n=16, d=8, kappas=(2.0, 8.0), attentions=("linear", "stacked:2"), target=0.3,
                        measure="init", min_width=4, max_width=4096)
    res = run_scaling(cfg)
    widths, fit = res.frames["widths"], res.frames["fit"]
    assert len(widths) == 2 * 3 and not widths.censored.any()
    np.testing.assert_allclose(widths.kappa_measured, widths.kappa, rtol=1e-8)
    assert list(fit.theory_exponent) == [2.0, 6.0, 10.0]
    for _, row in fit.iterrows():
        key = "" if pd.isna(row.attention) else row.attention
        g = widths[(widths.arch == row.arch) & (widths.attention.fillna("") == key)]
        slope = np.polyfit(np.log(g.kappa), np.log(g.width_needed.astype(float)), 1)[0]
        assert row.exponent == pytest.approx(slope)


def test_censored_points_are_left_out_of_the_fit():
    cfg = ScalingConfig(n=16, d=8, kappas=(2.0, 4.0), archs=("relu",), target=0.01, measure="trained",
                        min_width=4, max_width=8, train=TrainSpec(epochs=1))
    res = run_scaling(cfg)
    assert res.frames["widths"].censored.all() and res.frames["fit"].points.iloc[0] == 0
    assert res.frames["fit"].exponent.isna().all()


@pytest.mark.parametrize("kwargs,match", [({"kappas": (0.5,)}, "kappas"), ({"target": 1.5}, "target"),
                                          ({"measure": "final"}, "measure"), ({"min_width": 64, "max_width": 8},
                                                                               "min_width"),
                                          ({"attentions": ("cosine",)}, "attention")])
def test_bad_configs(kwargs, match):
    with pytest.raises(BadInput, match=match):
        run_scaling(ScalingConfig(**kwargs))
