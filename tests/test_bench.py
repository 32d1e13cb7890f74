"""The benchmarks compare like with like and report usable figures (no timing is asserted)."""

import math

import pytest
import torch

from conftest import ATOL64, RTOL32, RTOL64
from engine.bench import bench_entk, bench_training, run, run_scale, torch_func_ntk
from engine.models import TwoLayerReLU, normalize_rows
from engine.ntk import empirical_ntk_features

CPU = torch.device("cpu")
STEPS = ("spectrum", "kinf", "loo", "entk")


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_torch_func_recipe_agrees_with_the_closed_form_in_float64():
    phi = normalize_rows(torch.rand(7, 5, dtype=torch.float64))
    head = TwoLayerReLU(5, 32, 3, dtype=torch.float64)
    torch.testing.assert_close(torch_func_ntk(head, phi, phi), empirical_ntk_features(head, phi),
                               rtol=RTOL64, atol=ATOL64)


def test_entk_benchmark_compares_kernels_that_agree():
    out = bench_entk(20, 64, 30, CPU, lambda: None, peak=1e9)
    assert out["entk_max_rel_diff_vs_torch_func"] < RTOL32  # float32 recipe against exact counts
    for key in ("entk_seconds", "torch_func_seconds", "entk_speedup_vs_torch_func", "entk_fraction_of_gemm_peak"):
        assert _positive(out[key]), key
    assert out["entk_size"] == {"n": 20, "m": 64, "d": 30}


def test_training_benchmark_ratios_are_finite_and_positive():
    out = bench_training(40, (8, 16), 1, CPU, lambda: None, peak=1e9)
    for key in ("train_seconds", "train_loop_seconds", "sweep_batched_speedup_vs_loop",
                "train_fraction_of_gemm_peak"):
        assert _positive(out[key]), key
    assert out["train_size"]["widths"] == [8, 16]


def _check_scale(out, n, m):
    for step in STEPS:
        for key in ("seconds", "floor_seconds", "ratio"):
            assert _positive(out[f"scale_{step}_{key}"]), (step, key)
        assert out[f"scale_{step}_floor"], step  # says what the floor is
        assert out[f"scale_{step}_ratio"] == pytest.approx(out[f"scale_{step}_seconds"]
                                                           / out[f"scale_{step}_floor_seconds"])
    # Each step's result against one rebuilt from its floor's output.
    assert out["scale_spectrum_max_rel_diff"] < RTOL64  # the same decomposition as the floor
    assert out["scale_kinf_max_rel_diff"] < RTOL32
    assert out["scale_loo_max_rel_diff"] < 1e3 * RTOL64
    assert out["scale_entk_max_rel_diff"] < RTOL32
    assert _positive(out["scale_influence_true_seconds"])
    assert out["scale_size"]["n"] == n and out["scale_size"]["m"] == m
    assert 1 <= out["scale_spectrum_rank"] <= min(n, out["scale_size"]["d"])
    for arch in ("relu", "attn"):  # float32 storage: a small, nonzero change (bounded in test_memory)
        assert 0 < out[f"scale_storage32_{arch}_influence_rel_diff"] < 1e-2
        assert 0 <= out[f"scale_storage32_{arch}_sign_disagreement"] < 0.05
        assert isinstance(out[f"scale_storage32_{arch}_top10_same"], bool)


def test_run_scale_falls_back_to_random_rows_and_says_so(tmp_path):
    out = run_scale(n=300, device="cpu", data_dir=tmp_path, repeat=1, n_test=20, m=256)
    assert out["scale_fallback"] is True and "MNIST missing" in out["scale_data"]
    assert out["scale_size"]["d"] == 784
    _check_scale(out, 300, 256)


def test_run_scale_on_real_digits(mnist_dir):
    calls = []
    out = run_scale(n=300, device="cpu", data_dir=mnist_dir, repeat=1, n_test=20, m=256,
                    progress=lambda f, s: calls.append(f))
    assert out["scale_fallback"] is False and out["scale_data"].startswith("mnist")
    assert out["scale_size"]["d"] == 784
    _check_scale(out, 300, 256)
    assert calls[0] == 0.0 and calls[-1] == 1.0 and calls == sorted(calls)


def test_run_entry_routes_scale(tmp_path):
    out = run(device="cpu", scale=True, scale_n=40, data_dir=tmp_path)
    assert {f"scale_{s}_ratio" for s in STEPS} <= out.keys()
    assert "gemm_gflops" not in out  # the scale run replaces the regular suite
    assert all(v is None or not isinstance(v, float) or math.isfinite(v) for v in out.values())
