"""A run's thread count (engine.runtime.cores): the cores this process may use (affinity,
cgroup quota) less those other work keeps busy, at least one; applied to the run's thread only,
restored after, recorded in the result; OpenMP waits passively once the engine is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from engine.data import DataSpec
from engine.runtime import cores
from engine.runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("files, want", [
    ({"cpu.max": "200000 100000\n"}, 2.0),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_cgroup_quota_reads_v2_and_v1(tmp_path, files, want):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cores.cgroup_quota(tmp_path) == want


@pytest.mark.parametrize("had, usable, busy, want", [
    (4, 4, 0.0, 4), (4, 4, 1.6, 2), (4, 4, 2.4, 2), (4, 4, 3.9, 1), (4, 4, 7.0, 1),
    (1, 4, 0.0, 1),        # never more than the thread had (a grid worker's share, OMP_NUM_THREADS)
    (8, 2, 0.0, 2),        # never more than the usable cores
    (4, 4, None, 4),       # load unknown: the usable cores
])
def test_choose_takes_the_free_cores(monkeypatch, had, usable, busy, want):
    monkeypatch.delenv("ENGINE_THREADS", raising=False)
    choice = cores.choose(had, usable=usable, busy=busy, look=False)
    assert choice.threads == want and choice.usable == usable and choice.busy == busy


def test_engine_threads_fixes_the_count_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv("ENGINE_THREADS", "3")
    assert cores.choose(8, usable=2, busy=2.0).threads == 3
    monkeypatch.setenv("ENGINE_THREADS", "two")
    with pytest.raises(BadInput, match=r"ENGINE_THREADS='two'.*whole number"):
        cores.choose(2)


def test_usable_cores_follow_the_affinity():
    assert cores.usable_cores() <= len(os.sched_getaffinity(0))
    code = "from engine.runtime import cores; print(cores.usable_cores())"
    p = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0 and "taskset" in p.stderr:
        pytest.skip(f"taskset unavailable: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "1"


def test_busy_cores_sees_a_spinning_process():
    """A process spinning on one of our cores is seen as (about) one busy core; the lower
    bound only, since other work (a parallel test worker) may add to it."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = cores.busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert seen is not None and seen >= 0.6, seen


def test_for_run_limits_the_calling_thread_only_and_restores_it(monkeypatch):
    monkeypatch.setenv("ENGINE_THREADS", "1")
    before = torch.get_num_threads()
    seen = {}

    def job():
        had = torch.get_num_threads()
        with cores.for_run("cpu") as choice:
            seen["inside"] = torch.get_num_threads()
            seen["choice"] = choice
            started.set()
            other_done.wait(timeout=30)
        seen["after"] = torch.get_num_threads()
        seen["had"] = had

    def other():
        started.wait(timeout=30)
        seen["other"] = torch.get_num_threads()
        other_done.set()

    started, other_done = threading.Event(), threading.Event()
    threads = [threading.Thread(target=job), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert seen["inside"] == 1 and seen["choice"].threads == 1
    assert seen["after"] == seen["had"]
    assert seen["other"] == before  # a thread beside the run keeps the process's count
    with cores.for_run("cuda") as choice:
        assert choice is None


def test_a_computed_result_records_its_threads(monkeypatch):
    from engine.experiments.registry import EXPERIMENTS

    monkeypatch.setenv("ENGINE_THREADS", "1")
    exp = EXPERIMENTS["spectrum"]
    res = exp.run(exp.config(data=DataSpec(dataset="synthetic", n=40, n_test=1)))
    assert res.meta["threads"] == {"threads": 1, "usable": cores.usable_cores(), "busy": None,
                                   "why": "ENGINE_THREADS"}


def test_the_engine_makes_openmp_wait_passively_unless_told_otherwise():
    code = "import os, engine; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert p.stdout.strip() == "PASSIVE", p.stderr
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**env, "OMP_WAIT_POLICY": "ACTIVE"})
    assert p.stdout.strip() == "ACTIVE", p.stderr


FAULTS = """
import resource, sys, torch, engine
{entry}
buf = [torch.empty(1_600_000).fill_(1.0) for _ in range(2)]  # warm: the first blocks fault in either way
del buf
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    x = torch.empty(1_600_000)  # 6.4 MB, above glibc's default mmap threshold
    x.fill_(1.0)
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
ENTRIES = {  # how a process comes to run experiments, and whether it tunes the allocator
    "import engine": ("", False),
    "the CLI": ("from engine.cli import main\ntry:\n    main(['doctor', '--help'])\nexcept SystemExit:\n    pass", True),
    "a grid worker": ("from engine.grid.backends import _init_worker\n_init_worker(1)", True),
}


def _faults(entry: str, env: dict) -> int:
    script = FAULTS.format(entry=ENTRIES[entry][0])
    return int(subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                              env=env, check=True).stdout.splitlines()[-1])


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_entry_points_keep_freed_blocks_so_repeated_steps_fault_no_pages_in(entry):
    """keep_freed_blocks, called by the entry points that run experiments (the CLI, the grid's
    workers, app.py) and never by ``import engine``: a freed 6.4 MB block is reused, so twenty
    fresh allocations of it fault (almost) no pages in; glibc's defaults (ENGINE_MALLOC_KEEP=0,
    or a bare ``import engine``) map and fault each one afresh. Page faults counted by the
    kernel, not timed."""
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_MALLOC_KEEP"}
    tuned, default = _faults(entry, env), _faults(entry, {**env, "ENGINE_MALLOC_KEEP": "off"})
    assert default >= 20, default
    if ENTRIES[entry][1]:
        assert tuned * 10 <= default, (tuned, default)
    else:
        assert tuned >= 20, tuned  # a library leaves the process's allocator alone


def test_the_dashboard_tunes_the_allocator_at_its_entry():
    """app.py calls keep_freed_blocks (AppTest runs it in this process, whose allocator the
    test suite's own settings decide, so the call is read from its source)."""
    import ast

    tree = ast.parse((ROOT / "app.py").read_text())
    calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
             and getattr(n.value.func, "id", None) == "keep_freed_blocks"]
    assert len(calls) == 1


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("ON", True), ("yes", True), ("", True),
                                       ("0", False), ("false", False), ("Off", False), ("no", False),
                                       (" no ", False)])
def test_the_malloc_switch_takes_the_usual_words(monkeypatch, value, on):
    from engine.runtime.memory import keep_freed_blocks, malloc_keep_wanted

    monkeypatch.setenv("ENGINE_MALLOC_KEEP", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        assert malloc_keep_wanted() is on
        if not on:
            assert keep_freed_blocks() is False


def test_an_unknown_malloc_switch_warns_once_in_one_line_and_keeps_the_default(monkeypatch):
    from engine.runtime import memory

    monkeypatch.setenv("ENGINE_MALLOC_KEEP", "nope")
    monkeypatch.setattr(memory, "_warned", [])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert memory.malloc_keep_wanted() is True
        assert memory.malloc_keep_wanted() is True
    (line,) = [str(w.message) for w in seen]
    assert "\n" not in line and "'nope'" in line and "0, false, off, no" in line


def test_side_by_side_gives_what_one_after_the_other_gives_and_raises_what_a_task_raised():
    from engine.runtime.cores import limit_own_threads, restore_own_threads, side_by_side

    def net(seed):
        g = torch.Generator().manual_seed(seed)
        W, X = torch.randn(64, 48, generator=g), torch.randn(200, 48, generator=g)
        for _ in range(20):
            W = W - 0.01 * torch.relu(X @ W.T).T @ X / 200
        return W

    saved = limit_own_threads(2)
    try:
        together = side_by_side([lambda: net(0), lambda: net(1)])
        assert torch.get_num_threads() == 2  # the caller's count is back
    finally:
        restore_own_threads(saved)
    assert all(torch.equal(a, net(s)) for s, a in enumerate(together))

    def boom():
        raise BadInput("task 2 failed")

    with pytest.raises(BadInput, match="task 2 failed"):
        side_by_side([lambda: net(0), boom])


def test_busy_cores_does_not_count_this_process_own_threads():
    # Other work may run beside the suite (another xdist worker): compare looks with and without a
    # spinning thread of ours, alternated, so what the others do cancels. Counted, the thread
    # would add about a whole core.
    def look(spinning: bool) -> float:
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                sum(range(1000))

        t = threading.Thread(target=spin)
        if spinning:
            t.start()
        try:
            busy = cores.busy_cores(0.3)
        finally:
            stop.set()
            if spinning:
                t.join()
        assert busy is not None
        return busy

    added = sorted(look(True) - look(False) for _ in range(3))
    assert added[1] < 0.5, added  # the spinning thread is ours: not other work


def test_look_ahead_takes_the_look_a_run_then_reuses(monkeypatch):
    """A run starts the look at the load before torch imports (``look_ahead``, in a thread):
    ``choose`` then waits for that look and reads it, without a second sleep; none with
    ``ENGINE_THREADS`` set or while a look is fresh."""
    calls = []
    started = threading.Event()

    def look() -> float:
        started.set()
        calls.append(threading.current_thread().name)
        time.sleep(0.2)
        return 1.0

    monkeypatch.setattr(cores, "busy_cores", look)
    monkeypatch.setattr(cores, "_last_look", None)
    monkeypatch.delenv("ENGINE_THREADS", raising=False)
    cores.look_ahead()
    assert started.wait(5)
    choice = cores.choose(had=2, usable=2)
    assert calls == ["load-look"] and choice.busy == 1.0 and choice.threads == 1
    cores.look_ahead()  # the look is fresh: no second one
    assert calls == ["load-look"]
    monkeypatch.setattr(cores, "_last_look", None)
    monkeypatch.setenv("ENGINE_THREADS", "2")
    cores.look_ahead()  # the count is fixed: nothing to look at
    assert not any(t.name == "load-look" for t in threading.enumerate())
    assert calls == ["load-look"]
