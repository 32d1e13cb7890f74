"""The benchmark code runs and compares like with like (no timing is asserted)."""

import torch

from engine.bench import bench_entk, bench_training, torch_func_ntk
from engine.models import TwoLayerReLU, normalize_rows
from engine.ntk import empirical_ntk_features

CPU = torch.device("cpu")


def test_torch_func_recipe_agrees_with_the_closed_form_in_float64():
    phi = normalize_rows(torch.rand(7, 5, dtype=torch.float64))
    head = TwoLayerReLU(5, 32, 3, dtype=torch.float64)
    torch.testing.assert_close(torch_func_ntk(head, phi, phi), empirical_ntk_features(head, phi),
                               rtol=1e-10, atol=1e-12)


def test_bench_entries_are_ratios_of_same_run_measurements():
    out = bench_entk(20, 64, 30, CPU, lambda: None, peak=1e9)
    assert out["entk_max_rel_diff_vs_torch_func"] < 1e-5
    assert out["entk_speedup_vs_torch_func"] == out["torch_func_seconds"] / out["entk_seconds"]
    out = bench_training(40, (8, 16), 1, CPU, lambda: None, peak=1e9)
    assert out["sweep_batched_speedup_vs_loop"] == out["train_loop_seconds"] / out["train_seconds"]
