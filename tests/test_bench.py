"""The benchmarks compare like with like and report usable figures (no timing is asserted)."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import ATOL64, RTOL32, RTOL64
from engine import bench
from engine.bench import machine_info, peer_neural_tangents, run, run_scale, timing
from engine.bench.cases import bench_entk, bench_page, bench_torch_func, bench_training, torch_func_ntk
from engine.maths.models import TwoLayerReLU, normalize_rows
from engine.maths.ntk import empirical_ntk_features
from engine.runtime.errors import BadInput

CPU = torch.device("cpu")
STEPS = ("spectrum", "kinf", "loo", "entk")
TINY = {"entk": (20, 64, 30), "gemm": 64, "train": (40, (8, 16), 1)}


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def _sync():
    pass


def test_torch_func_recipe_agrees_with_the_closed_form_in_float64():
    phi = normalize_rows(torch.rand(7, 5, dtype=torch.float64))
    head = TwoLayerReLU(5, 32, 3, dtype=torch.float64)
    torch.testing.assert_close(torch_func_ntk(head, phi, phi), empirical_ntk_features(head, phi),
                               rtol=RTOL64, atol=ATOL64)


def test_interleaved_alternates_and_stops_at_its_deadline():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    t = timing.interleave(fns, 3, _sync, calls={"b": 2})
    assert calls == ["a", "b"] + ["a", "b", "b"] * 3  # warm-ups, then rounds; b twice per round
    assert t["repeats"] == 3 and set(t) == {"a", "b", "repeats"}
    for name in "ab":
        assert t[name]["seconds"] >= 0 and t[name]["cpu_seconds"] >= 0
    calls.clear()
    assert timing.interleave(fns, 5, _sync, deadline=0.0)["repeats"] == 1  # past it: one round kept
    assert calls == ["a", "b", "a", "b"]


def test_entk_benchmark_pairs_the_kernel_with_the_gemm():
    out = bench_entk(20, 64, 30, CPU, _sync, gemm_size=64, repeat=2)
    for key in ("entk_seconds", "entk_cpu_seconds", "gemm_seconds", "entk_fraction_of_gemm_peak",
                "entk_fraction_of_gemm_peak_cpu", "gemm_gflops"):
        assert _positive(out[key]), key
    assert out["entk_size"] == {"n": 20, "m": 64, "d": 30} and out["entk_repeats"] == 2
    assert out["entk_fraction_of_gemm_peak"] == pytest.approx(
        bench.entk_flops(20, 64, 30) / out["entk_seconds"] / (out["gemm_gflops"] * 1e9))


def test_torch_func_benchmark_compares_kernels_that_agree():
    out = bench_torch_func(20, 64, 30, CPU, _sync, repeat=1)
    assert out["entk_max_rel_diff_vs_torch_func"] < RTOL32  # float32 recipe against exact counts
    for key in ("torch_func_seconds", "entk_speedup_vs_torch_func", "entk_speedup_vs_torch_func_cpu"):
        assert _positive(out[key]), key


def test_training_benchmark_ratios_are_finite_and_positive():
    out = bench_training(40, (8, 16), 1, CPU, _sync, gemm_size=64, repeat=1)
    for key in ("train_seconds", "train_loop_seconds", "sweep_batched_speedup_vs_loop",
                "train_fraction_of_gemm_peak", "train_fraction_of_gemm_peak_cpu"):
        assert _positive(out[key]), key
    assert out["train_size"]["widths"] == [8, 16]


def test_machine_info_names_the_cpu_and_threads():
    info = machine_info()
    assert isinstance(info["cpu_model"], str) and info["cpu_model"]
    assert info["threads"] == torch.get_num_threads() and info["torch"] == torch.__version__
    assert set(info["cpu_flags"]) <= set(timing._SIMD_FLAGS)


def _script(tmp_path, body: str) -> Path:
    p = tmp_path / "page.py"
    p.write_text(body)
    return p


@pytest.mark.parametrize("body,reason", [
    ("import time\ntime.sleep(30)\n", "timed out after 1 s"),
    ("raise ValueError('no page here')\n", "exit 1: ValueError: no page here"),
    ("print('not json')\n", "no JSON line"),
])
def test_page_render_failures_are_rows_not_crashes(tmp_path, body, reason):
    out = bench_page(timeout=1, script=_script(tmp_path, body))
    assert out["page_render"] is None and reason in out["page_render_error"]


def test_page_render_reads_the_scripts_json_line(tmp_path):
    out = bench_page(timeout=60, script=_script(tmp_path, "print('log')\nprint('{\"page_render_cold_s\": 2.0}')\n"))
    assert out == {"page_render_cold_s": 2.0}


def test_run_writes_each_part_as_it_comes_and_a_failing_part_is_a_row(tmp_path, monkeypatch):
    monkeypatch.setitem(bench.SIZES, True, {**TINY, "entk": (20, 0, 30)})  # width 0: the eNTK parts fail
    monkeypatch.delenv(bench.NT_PYTHON_ENV, raising=False)
    path = tmp_path / "rows.jsonl"
    out = run(quick=True, device="cpu", page=False, out=path, peer="neural-tangents")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["part"] for r in rows] == ["machine", "count_path", "entk", "torch_func", "train", "peer"]
    assert all(r["run"] == rows[0]["run"] and r["threads"] == torch.get_num_threads() for r in rows)
    assert rows[0]["cpu_model"] == out["cpu_model"]
    assert "width" in rows[2]["entk_error"] and "width" in out["torch_func_error"]
    assert _positive(out["train_fraction_of_gemm_peak"])  # the parts after a failure still ran
    assert out["count_path"]["count_dtype"] in ("int8", "float32")
    assert bench.NT_PYTHON_ENV in out["peer_skipped"]
    run(quick=True, device="cpu", page=False, out=path)  # a second run appends
    assert len(path.read_text().splitlines()) == len(rows) + 5


@pytest.mark.parametrize("kwargs,match", [({"peer": "jax"}, "allowed: neural-tangents"),
                                          ({"timeout": 0}, "timeout must be > 0"),
                                          ({"out": "/nonexistent-folder/rows.jsonl"}, "cannot write bench results")])
def test_run_refuses_bad_arguments_in_one_line(kwargs, match):
    with pytest.raises(BadInput, match=match):
        run(quick=True, device="cpu", page=False, **kwargs)


def test_peer_is_skipped_with_a_reason_where_it_cannot_run(monkeypatch, tmp_path):
    monkeypatch.delenv(bench.NT_PYTHON_ENV, raising=False)
    assert bench.NT_PYTHON_ENV in peer_neural_tangents(10, 16, 5)["peer_skipped"]
    assert "not an executable" in peer_neural_tangents(10, 16, 5, python=str(tmp_path / "none"))["peer_skipped"]
    # This environment's own Python has no jax: the peer says so and is skipped.
    out = peer_neural_tangents(10, 16, 5, python=sys.executable)
    assert "cannot import" in out["peer_skipped"]
    with pytest.raises(BadInput, match="allowed: STRUCTURED_DERIVATIVES"):
        peer_neural_tangents(10, 16, 5, implementation="FAST")


def _nt_python():
    python = os.environ.get(bench.NT_PYTHON_ENV)
    if not python:
        pytest.skip(f"{bench.NT_PYTHON_ENV} is not set (an environment with neural-tangents; benchmarks/README.md)")
    return python


@pytest.mark.slow
def test_peer_neural_tangents_computes_the_same_kernel():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the one-core comparison: the peer is pinned to one core of ours
    try:
        out = peer_neural_tangents(40, 64, 12, python=_nt_python(), repeat=2, timeout=240)
    finally:
        torch.set_num_threads(threads)
    assert "peer_error" not in out and "peer_skipped" not in out, out
    assert out["peer_threads"] == 1 and len(out["peer_cpus"]) == 1
    assert set(out["peer_cpus"]) <= os.sched_getaffinity(0)
    assert out["peer_max_rel_diff"] < RTOL32  # jax float32 against exact counts, float64 product
    assert _positive(out["peer_speedup"]) and _positive(out["peer_speedup_cpu"])
    assert out["peer_versions"]["neural_tangents"] == "0.6.5"


def _check_scale(out, n, m):
    for step in STEPS:
        for key in ("seconds", "floor_seconds", "ratio", "cpu_seconds", "floor_cpu_seconds", "cpu_ratio"):
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
    assert not [k for k in out if k.endswith("_error")]


def test_run_scale_falls_back_to_random_rows_and_says_so(tmp_path):
    path = tmp_path / "scale.jsonl"
    out = run_scale(n=300, device="cpu", data_dir=tmp_path, repeat=1, n_test=20, m=256, out=path)
    assert out["scale_fallback"] is True and "MNIST missing" in out["scale_data"]
    assert out["scale_size"]["d"] == 784
    _check_scale(out, 300, 256)
    parts = [json.loads(line)["part"] for line in path.read_text().splitlines()]
    assert parts == ["scale_machine"] + [f"scale_{s}" for s in ("spectrum", "kinf", "loo", "storage32", "entk")]


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
