"""engine.experiments.scaling: the fixed width grid, the width-needed rule, the exponent fit and a tiny run."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import RTOL32, RTOL64, RTOL64_SAME, RTOL64_SOLVE
from engine.data import DataSpec, load_sample
from engine.experiments.configs.scaling import ScalingConfig, width_grid
from engine.experiments.scaling import fit_exponent, run_scaling, theory_exponent, width_needed
from engine.maths.kinf import infinite_ntk
from engine.maths.models import Net
from engine.maths.ntk import empirical_ntk
from engine.maths.specs import TrainSpec
from engine.maths.training import n_outputs, train
from engine.runtime.errors import BadInput

FAST = TrainSpec(epochs=5)


# ---------------------------------------------------------------- the grid

@pytest.mark.parametrize("per_octave", [1, 2, 3, 8])
def test_a_smaller_range_grid_is_part_of_a_larger_ones(per_octave):
    big = width_grid(2, 65536, per_octave)
    assert big == sorted(set(big)) and big[0] == 2 and big[-1] == 65536
    rng = np.random.default_rng(0)
    for _ in range(50):
        lo, hi = sorted(int(v) for v in rng.integers(2, 65537, size=2))
        small = width_grid(lo, hi, per_octave)
        assert set(small) <= set(big) and all(lo <= w <= hi for w in small)
        assert set(small) <= set(width_grid(lo, hi, 2 * per_octave))  # a finer grid holds a coarser one
    assert width_grid(16, 64, 2) == [16, 23, 32, 45, 64]
    assert width_grid(16, 64, 1) == [16, 32, 64]


# ---------------------------------------------------------------- width needed

W = [16, 32, 64, 128]


@pytest.mark.parametrize("dists,expected", [
    ([0.5, 0.3, 0.08, 0.05], (64, True)),     # monotone: first pass, then passes for good
    ([0.05, 0.3, 0.08, 0.05], (64, False)),   # passes at 16, fails at 32, passes from 64: not monotone
    ([0.5, 0.3, 0.1, 0.2], (None, False)),    # the largest width fails: censored (it passed at 64 once)
    ([0.5, 0.3, 0.2, 0.2], (None, True)),     # never passes
    ([0.01, 0.02, 0.03, 0.04], (16, True)),   # passes everywhere, though rising
    ([0.5, 0.3, 0.2, 0.1], (128, True)),      # equal to the target counts as within
])
def test_width_needed_on_hand_made_curves(dists, expected):
    assert width_needed(W, dists, 0.1) == expected


# ---------------------------------------------------------------- exponent

def test_fit_exponent_equals_polyfit_and_skips_censored_points():
    rng = np.random.default_rng(1)
    kappas = [2.0, 4.0, 8.0, 16.0, 32.0]
    widths = [int(w) for w in rng.integers(4, 5000, size=5)]
    slope, icpt = fit_exponent(kappas, widths)
    ref = np.polyfit(np.log(kappas), np.log(widths), 1)
    assert slope == pytest.approx(ref[0], rel=RTOL64) and icpt == pytest.approx(ref[1], rel=RTOL64)
    # censored points (None, or NaN from a pandas column) are left out
    censored = [widths[0], None, widths[2], math.nan, widths[4]]
    ref = np.polyfit(np.log(kappas)[[0, 2, 4]], np.log(np.array(widths, float)[[0, 2, 4]]), 1)
    assert fit_exponent(kappas, censored) == pytest.approx(tuple(ref), rel=RTOL64)
    assert fit_exponent(kappas, pd.Series(censored, dtype=float).tolist()) == pytest.approx(tuple(ref), rel=RTOL64)
    # an exact power law
    assert fit_exponent(kappas, [3 * k**6 for k in kappas]) == pytest.approx((6.0, math.log(3)), rel=RTOL64_SOLVE)
    assert fit_exponent([2.0, 4.0], [10, None]) == (None, None)
    assert fit_exponent([2.0, 2.0], [10, 20]) == (None, None)


def test_theory_exponents():
    assert theory_exponent("relu", "linear") == 2.0
    assert theory_exponent("attn", "linear") == 6.0
    assert theory_exponent("attn", "stacked:2") == 10.0
    assert theory_exponent("attn", "softmax") is None


# ---------------------------------------------------------------- runs

def _tiny(**kw):
    base = dict(n=16, d=8, kappas=(2.0, 8.0), max_width=64, train=FAST, seeds=(0, 1), target=0.2)
    return ScalingConfig(**{**base, **kw})


def _keyed(ev):
    return ev.assign(attention=ev.attention.fillna("")).set_index(["arch", "attention", "kappa", "width", "seed"])


@pytest.mark.slow
def test_a_larger_range_keeps_the_widths_found_and_the_evaluations():
    small, large = run_scaling(_tiny()), run_scaling(_tiny(max_width=128))
    assert small.meta["grid"] == width_grid(16, 64, 2) and set(small.meta["grid"]) <= set(large.meta["grid"])
    ev_s, ev_l = _keyed(small.frames["evaluations"]), _keyed(large.frames["evaluations"])
    assert len(ev_s) == 2 * 2 * 5 * 2
    shared = ev_l.loc[ev_s.index]
    assert (shared.distance.to_numpy() == ev_s.distance.to_numpy()).all()  # bit for bit
    found = 0
    for (_, s), (_, g) in zip(small.frames["widths"].iterrows(), large.frames["widths"].iterrows(), strict=True):
        assert (s.arch, s.kappa) == (g.arch, g.kappa)
        if pd.isna(s.width_needed):
            continue
        extra = ev_l.xs((g.arch, g.attention if isinstance(g.attention, str) else "", g.kappa),
                        level=["arch", "attention", "kappa"]).groupby("width").distance.mean()
        if (extra[extra.index > 64] <= 0.2).all():  # the larger range's extra widths pass as well
            assert g.width_needed == s.width_needed
            found += 1
    assert found >= 2
    for res in (small, large):
        for _, f in res.frames["fit"].iterrows():
            assert f.points == 2
            if f.exponent_low is not None and not pd.isna(f.exponent_low):
                assert f.exponent_low - 1e-12 <= f.exponent <= f.exponent_high + 1e-12


def test_censored_points_are_left_out_of_the_fit():
    res = run_scaling(_tiny(archs=("relu",), target=0.01, max_width=32, train=TrainSpec(epochs=1)))
    assert res.frames["widths"].censored.all() and res.frames["fit"].points.iloc[0] == 0
    fit = res.frames["fit"].iloc[0]
    assert all(v is None or pd.isna(v) for v in (fit.exponent, fit.exponent_low, fit.exponent_high))


def _whitened(K, K_ref, ridge):
    """‖(K_ref+λI)^-½ (K − K_ref) (K_ref+λI)^-½‖₂ by eigendecomposition, λ = ridge · mean diag K_ref."""
    lam = ridge * np.mean(np.diag(K_ref))
    e, V = np.linalg.eigh(K_ref + lam * np.eye(len(K_ref)))
    R = V @ np.diag(e ** -0.5) @ V.T
    return np.abs(np.linalg.eigvalsh(R @ (K - K_ref) @ R)).max()


@pytest.mark.parametrize("measure,metric", [("movement", "whitened"), ("movement", "frobenius"),
                                            ("init", "whitened"), ("trained", "whitened")])
def test_measures_and_metrics_against_a_direct_computation(measure, metric):
    cfg = _tiny(kappas=(4.0,), max_width=32, measure=measure, metric=metric)
    ev = run_scaling(cfg).frames["evaluations"]
    # K_m depends on W only through the activation signs: a few epochs may leave it exactly in place
    assert np.isfinite(ev.distance).all() and (ev.distance >= 0).all() and (ev.distance > 0).any()
    sample = load_sample(DataSpec("synthetic", n=16, n_test=1, seed=cfg.seed, normalize=False, synthetic_d=8,
                                  synthetic_kappa=4.0, synthetic_classes=2), None)
    X = sample.X.float()
    for arch in ("relu", "attn"):
        row = ev[ev.arch == arch].sort_values("distance").iloc[-1]  # the largest: a nontrivial value
        width, seed = int(row.width), int(row.seed)
        net = Net(arch, X, width, n_outputs(2), seed, 1.0, "linear", False)
        K0 = empirical_ntk(net, X).numpy()
        with torch.no_grad():
            K_inf = infinite_ntk(net.features(X)).numpy()
        train(net, X, sample.y, 2, cfg.train, seed)
        Kt = empirical_ntk(net, X).numpy()
        K, K_ref = {"movement": (Kt, K0), "init": (K0, K_inf), "trained": (Kt, K_inf)}[measure]
        want = _whitened(K, K_ref, cfg.ridge) if metric == "whitened" else \
            np.linalg.norm(K - K_ref) / np.linalg.norm(K_ref)
        assert want > 0 and row.distance == pytest.approx(want, rel=RTOL32)


@pytest.mark.parametrize("kwargs,match", [({"kappas": (0.5,)}, "kappas"), ({"target": 1.5e3}, "target"),
                                          ({"measure": "final"}, "measure"), ({"metric": "spectral"}, "metric"),
                                          ({"min_width": 64, "max_width": 8}, "min_width"),
                                          ({"attentions": ("cosine",)}, "attention"),
                                          ({"kappas": (math.inf,)}, "kappas"), ({"per_octave": 0}, "per_octave")])
def test_bad_configs(kwargs, match):
    with pytest.raises(BadInput, match=match):
        ScalingConfig(**kwargs)


def test_the_exponent_resolution_is_one_grid_step_over_the_kappa_range():
    """One grid step (2^(1/p) in width) at one end of the κ range moves the fitted slope by exactly it."""
    from engine.experiments.scaling import exponent_resolution, fit_exponent

    kappas, widths = [2.0, 4.0, 16.0], [64, 128, 512]
    base, _ = fit_exponent(kappas[::2], widths[::2])
    for per_octave in (1, 2, 4):
        moved, _ = fit_exponent(kappas[::2], [widths[0], widths[2] * 2 ** (1 / per_octave)])
        assert exponent_resolution(kappas, per_octave) == pytest.approx(moved - base, rel=RTOL64_SAME)
    assert exponent_resolution([8.0], 1) is None and exponent_resolution([8.0, 8.0], 2) is None
