"""engine.runtime.speed and engine.runtime.gemm: the speed factor from torch's GEMM, or numpy's
converted by this machine's calibration on disk; its threads are cores.choose's; finished runs
correct it; a fresh process's imports are counted."""

import json
import math
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest
import torch

from engine.runtime import cores, gemm, speed
from engine.runtime.errors import BadInput, CacheWarning

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A user cache folder of its own, no pinned factor, no timing or correction yet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(speed.SPEED_ENV, raising=False)
    monkeypatch.setattr(speed, "_timings", deque(maxlen=32))
    monkeypatch.setattr(speed, "_correction", {})
    monkeypatch.setattr(gemm, "_calibration", {})
    return tmp_path


def _timing(factor=1.0, busy=None, usable=2, threads=1, at=None, queue=None):
    return speed.Timing(factor, "torch", 100.0, threads, busy, usable, None, time.perf_counter() if at is None else at,
                        queue)


def test_torch_writes_the_calibration_and_numpy_reads_it(fresh, monkeypatch):
    """The round trip: a torch timing writes numpy's rate over torch's under this machine's key
    (CPU model and library versions), for its thread count; a numpy timing then converts its
    rate by exactly that ratio."""
    monkeypatch.setenv("ENGINE_THREADS", "1")  # the same thread count for both timings, whatever the load
    with pytest.raises(BadInput, match="no speed calibration for 1 thread"):
        speed.time_gemm("numpy")              # nothing written yet: numpy alone says nothing of torch
    t = speed.time_gemm("torch")
    key, path = gemm.calibration_key(), gemm.calibration_path()
    assert path.parent == fresh / "cache" / "influence-malleability" / "speed" and t.calibration == str(path)
    record = json.loads(path.read_text())
    assert record["key"] == key and key["cpu"] == gemm.cpu_model()
    assert key["torch"] == torch.__version__.split("+")[0] and key["numpy"] == __import__("numpy").__version__
    ratio = record["numpy_over_torch"]["1"]["ratio"]
    assert t.library == "torch" and t.factor == pytest.approx(
        speed.SPEED_GEMM_FLOPS / (t.gflops * 1e9) * speed.thread_effect(1))
    u = speed.time_gemm("numpy")
    assert (u.library, u.threads, u.calibration) == ("numpy", 1, str(path))
    assert u.factor == pytest.approx(speed.SPEED_GEMM_FLOPS / (u.gflops * 1e9 / ratio) * speed.thread_effect(1))
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # written atomically: no temporary left
    assert speed.time_gemm().library == "torch"  # torch loaded: its own GEMM, not a conversion


def test_a_calibration_for_another_key_is_not_used(fresh, monkeypatch):
    """Another CPU's or library's calibration lives under its own name and is not read; one
    copied over this machine's name is ignored with a warning naming the file and the field."""
    monkeypatch.setenv("ENGINE_THREADS", "1")
    key = gemm.calibration_key()
    other = {**key, "torch": "0.0-other"}
    record = {"format": gemm.CALIBRATION_FORMAT, "key": other,
              "numpy_over_torch": {"1": {"ratio": 1.0, "written": time.time()}}}
    assert gemm.calibration_path(other) != gemm.calibration_path(key)
    gemm.write_calibration(gemm.calibration_path(other), record)
    assert gemm.read_calibration() is None     # not this machine's name: absent, no warning
    gemm.write_calibration(gemm.calibration_path(key), record)
    with pytest.warns(CacheWarning, match=f"{gemm.calibration_path(key)} is for another machine or library "
                                          r"\(torch '0.0-other'\); ignored"):
        with pytest.raises(BadInput, match="no speed calibration"):
            speed.time_gemm("numpy")


@pytest.mark.parametrize("text,why", [("{not json", "unreadable"), ("[1, 2]", "not a speed calibration"),
                                      ('{"format": 1}', "for another machine")])
def test_a_damaged_calibration_is_ignored_with_a_warning_and_rewritten(fresh, monkeypatch, text, why):
    monkeypatch.setenv("ENGINE_THREADS", "1")
    path = gemm.calibration_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.warns(CacheWarning, match=f"speed calibration {path} is {why}") as seen:
        assert gemm.read_calibration() is None
    assert len(seen) == 1 and "\n" not in str(seen[0].message)
    with pytest.warns(CacheWarning):
        speed.time_gemm("torch")             # torch's timing writes a good one over it
    assert gemm.read_calibration()["numpy_over_torch"]["1"]["ratio"] > 0


def test_damaged_fields_are_named():
    key = {"cpu": "x"}
    good = {"format": 1, "key": key, "numpy_over_torch": {"2": {"ratio": 1.1, "written": 1.0}},
            "import_cpu_s": {"torch": 1.0}}
    assert gemm._damage(good, key) is None
    assert gemm._damage({**good, "numpy_over_torch": {"2": {"ratio": -1, "written": 1.0}}}, key).endswith(
        "(numpy_over_torch)")
    assert gemm._damage({**good, "import_cpu_s": {"scipy": 1.0}}, key).endswith("(import_cpu_s)")


def test_the_gemm_runs_on_the_threads_cores_choose_gives_a_run(fresh, monkeypatch):
    """The timing's thread count is cores.choose's for a run started now (its look at the load
    is shared: a look is kept LOOK_KEPT seconds), pinned or chosen from the free cores."""
    monkeypatch.setenv("ENGINE_THREADS", "1")
    assert speed.time_gemm("torch").threads == cores.choose(torch.get_num_threads()).threads == 1
    monkeypatch.delenv("ENGINE_THREADS")
    t = speed.time_gemm("torch")
    choice = cores.choose(torch.get_num_threads())
    assert (t.threads, t.busy, t.usable) == (choice.threads, choice.busy, choice.usable)
    assert torch.get_num_threads() >= t.threads  # the calling thread's count is restored


def test_a_run_gains_less_from_threads_than_the_gemm():
    """thread_effect is 1 at the reference's thread count; below it a run loses less than the
    GEMM (under 1), above it gains less (over 1)."""
    assert speed.thread_effect(speed.REF_THREADS) == pytest.approx(1.0)
    effects = [speed.thread_effect(t) for t in (1, 2, 4, 16)]
    assert effects == sorted(effects) and effects[0] < 1 < effects[2]
    p = speed.RUN_PARALLEL  # on one thread: half the GEMM's rate, but only 1 / s(2) of the run's
    assert speed.thread_effect(1) == pytest.approx(0.5 / (1 - p + p / 2))


def test_numpys_blas_is_limited_alone():
    """numpy's own BLAS runs on the timing's threads; scipy's (which K∞ limits under its own
    lock) is left as it was."""
    import numpy as np
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS)
    from threadpoolctl import threadpool_info

    own = os.path.dirname(np.__file__)
    before = {i["filepath"]: i["num_threads"] for i in threadpool_info()}
    with gemm._numpy_threads(1):
        inside = {i["filepath"]: i["num_threads"] for i in threadpool_info()}
    assert {p: n for p, n in inside.items() if p.startswith(own)} == {p: 1 for p in before if p.startswith(own)}
    assert {p: n for p, n in inside.items() if not p.startswith(own)} == {
        p: n for p, n in before.items() if not p.startswith(own)}
    assert {i["filepath"]: i["num_threads"] for i in threadpool_info()} == before


@pytest.mark.parametrize("env,want", [({}, None), ({"OMP_NUM_THREADS": "1"}, 1),
                                      ({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"}, 2)])
def test_torchs_default_thread_count_is_known_without_torch(env, want):
    """The numpy path chooses threads from the count torch would start with: torch's own rule."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    code = ("from engine.runtime.gemm import torch_default_threads\nguess = torch_default_threads()\n"
            "import torch\nprint(guess, torch.get_num_threads())")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**clean, **env}, timeout=120)
    guess, real = map(int, p.stdout.split())
    assert guess == real and (want is None or guess == want)


def test_an_estimate_in_a_fresh_process_times_numpy_after_torch_wrote_the_calibration(fresh):
    """Across processes: the first estimate on a machine (no calibration) loads torch, times its
    GEMM and its imports and writes the calibration; the next reads it and loads no torch."""
    env = {**os.environ, "XDG_CACHE_HOME": str(fresh / "cache"), "ENGINE_THREADS": "1"}
    env.pop(speed.SPEED_ENV, None)
    script = ("import json, sys\nfrom engine.cli import main\nrc = main([*sys.argv[1:], '--json'])\n"
              "print('LOADED', rc, 'torch' in sys.modules, file=sys.stderr)")
    argv = ["influence", "--preset", "quick", "--estimate", "--device", "cpu"]
    outs = []
    for loads_torch in (True, False):
        p = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True, text=True,
                           env=env, timeout=300)
        assert p.stderr.strip().splitlines()[-1] == f"LOADED 0 {loads_torch}", p.stderr[-2000:]
        outs.append(json.loads(p.stdout))
    first, second = outs
    assert (first["speed_factor_from"], second["speed_factor_from"]) == ("torch", "numpy")
    path = gemm.calibration_path()
    assert first["speed_calibration"] == second["speed_calibration"] == str(path)
    record = json.loads(path.read_text())
    assert set(record["import_cpu_s"]) == {"torch", "pandas", "torchvision"}  # timed where it loaded them
    assert second["threads"] == 1
    # MNIST's files are read without torchvision (only CIFAR-10's need it: budget.TORCHVISION_DECODES)
    least = speed.PROCESS_S + sum(v for k, v in record["import_cpu_s"].items() if k != "torchvision")
    assert second["import_seconds"] >= least or second["import_seconds"] == pytest.approx(least)  # summed in another order
    assert second["estimate_seconds_here"] == pytest.approx(
        second["estimate_seconds"] * second["speed_factor"] + second["import_seconds"])


def test_imports_count_in_a_fresh_process_and_stretch_with_the_load(fresh, monkeypatch):
    """A fresh process pays its start and every import (torchvision for image data only), from
    the calibration's CPU seconds; this process only what it has not loaded; a loaded machine
    stretches them (one thread among the busy ones)."""
    gemm.write_calibration(fresh / "c.json", {"import_cpu_s": {"torch": 1.0, "pandas": 0.5, "torchvision": 2.0}})
    speed._timings.append(_timing(busy=0.2))
    fixed = speed.PROCESS_S
    assert speed.import_seconds(image_data=False) == pytest.approx(fixed + 1.5)
    assert speed.import_seconds(image_data=True) == pytest.approx(fixed + 3.5)
    assert speed.import_seconds(image_data=False, fresh_process=False) == pytest.approx(
        0.5 * ("pandas" not in sys.modules or "diskcache" not in sys.modules))  # torch is loaded here
    speed._timings.append(_timing(busy=2.0, usable=2))  # one thread among two busy ones on two cores
    assert speed.import_seconds(image_data=True) == pytest.approx((fixed + 3.5) * 1.5)
    speed._timings.append(_timing(busy=2.0, queue=4.0, usable=2))  # the run queue sees past the cores
    assert speed.import_seconds(image_data=True) == pytest.approx((fixed + 3.5) * 2.5)


def test_the_run_queue_is_read_without_the_caller(fresh):
    queue = speed.runnable_others(samples=3, every_s=0.0)
    assert queue is None or queue >= 0.0
    t = speed.time_gemm("torch")
    assert t.queue is None or t.queue >= 0.0


def test_finished_runs_correct_the_gemm_factor(fresh, monkeypatch):
    """A run's measured / estimated time over the GEMM factor at its start corrects the factor
    halfway (geometrically); a later timing (the load changed) keeps the correction."""
    speed._timings.append(_timing(factor=2.0, at=time.perf_counter() - 100))  # the timing before the run
    speed._timings.append(_timing(factor=8.0))     # taken during the run, under its own load: not its base
    assert speed.record_run(0.2, 4.0) is None      # fixed costs
    assert speed.record_run(10.0, 80.0) == pytest.approx(2.0 * 4.0 ** (1 - speed.SPEED_KEEP))
    assert speed._correction["cpu"] == pytest.approx(2.0)
    assert speed.speed_factor("cpu") == pytest.approx(8.0 * 2.0)  # the latest timing, corrected
    assert speed.timed_with("cpu") == "torch and finished runs"
    assert speed.record_run(10.0, 40.0, "cuda") == pytest.approx(4.0) and speed.speed_factor("cuda") == 4.0


def test_an_old_timing_is_taken_again(fresh, monkeypatch):
    monkeypatch.setenv("ENGINE_THREADS", "1")
    speed.speed_factor("cpu")
    first = speed.latest_timing()
    speed.speed_factor("cpu")
    assert speed.latest_timing() is first          # fresh: reused
    monkeypatch.setattr(speed, "SPEED_FRESH_S", 0.0)
    speed.speed_factor("cpu")
    assert speed.latest_timing() is not first and speed.latest_timing().at > first.at


def test_the_factor_is_pinned_or_bounded(fresh, monkeypatch):
    monkeypatch.setenv("ENGINE_THREADS", "1")
    factor = speed.speed_factor("cpu")
    assert speed.SPEED_MIN <= factor <= speed.SPEED_MAX and speed.timed_with() == "torch"
    assert speed.speed_factor("cuda") == 1.0 and speed.timed_with("cuda") == "none"
    monkeypatch.setenv(speed.SPEED_ENV, "2")
    assert speed.speed_factor() == 2.0 and speed.timed_with() == speed.timed_with("cuda") == speed.SPEED_ENV
    monkeypatch.setenv(speed.SPEED_ENV, "fast")
    with pytest.raises(BadInput, match="ENGINE_SPEED_FACTOR.*'fast'"):
        speed.speed_factor()
    with pytest.raises(BadInput, match="unknown GEMM library 'mkl'; allowed: torch, numpy"):
        speed.time_gemm("mkl")


def test_beside_other_work_the_rate_meets_the_fair_share_of_the_idle_rate(fresh):
    """Idle: the timed rate, kept as the machine's idle rate where it is the fastest seen. Beside other
    work: the geometric mean of the timing and the idle rate times the cores over the threads that want
    them; another thread count's idle rate scaled by the threads where this one's was never timed."""
    from engine.runtime.cores import ThreadChoice

    key = gemm.calibration_key()
    path = gemm.calibration_path(key)
    idle2 = ThreadChoice(2, 2, 0.0, "test")
    assert speed._under_load(2.0e11, None, path, key, idle2, 0.0) == 2.0e11
    record = json.loads(path.read_text())
    assert record["idle_torch_gflops"] == {"2": pytest.approx(200.0)}
    assert speed._under_load(1.5e11, record, path, key, idle2, 0.0) == 1.5e11  # slower: the record keeps 200
    assert json.loads(path.read_text())["idle_torch_gflops"] == {"2": pytest.approx(200.0)}
    loaded = ThreadChoice(1, 2, 1.9, "test")  # two busy threads: one thread of ours gets 2/3 of a core
    got = speed._under_load(4.0e10, record, path, key, loaded, 2.0)
    assert got == pytest.approx(math.sqrt(4.0e10 * 200e9 * 1 / 2 * 2 / 3))
    assert speed._under_load(4.0e10, record, path, key, loaded, None) == pytest.approx(
        math.sqrt(4.0e10 * 100e9 * 2 / 2.9))  # the queue unread: the busy cores (1.9) stand for it
    assert speed._under_load(4.0e10, None, path, key, loaded, 2.0) == 4.0e10  # no idle rate known: the timing
