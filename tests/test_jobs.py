"""engine.runtime.jobs: dedupe by cache key, cancel, progress and ETA, captured errors, shutdown."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

import engine.runtime.jobs
from engine.runtime.cache import Result, config_key
from engine.runtime.errors import BadInput, Cancelled
from engine.runtime.jobs import Job, JobManager, JobState
from tests.conftest import REL_ETA


@dataclass(frozen=True)
class Cfg:
    x: int = 1


class Counter:
    """A fake run_*: counts calls, waits on a gate, reports progress, honours cancel."""

    def __init__(self, steps: int = 5, open_gate: bool = False):
        self.calls = 0
        self.gate = threading.Event()
        if open_gate:
            self.gate.set()
        self.steps = steps
        self.lock = threading.Lock()

    def __call__(self, cfg, progress=None, cancel=None, **kwargs):
        with self.lock:
            self.calls += 1
        for i in range(self.steps):
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled in the fake run")
            progress(i / self.steps, f"step {i}")
            self.gate.wait(5)
        return Result("fake", {}, meta={"x": cfg.x, **kwargs})


@pytest.fixture()
def manager():
    m = JobManager(max_workers=2)
    yield m
    m.shutdown()


def test_same_config_runs_once(manager):
    fn = Counter()
    a = manager.submit("fake", Cfg(1), fn, "a")
    b = manager.submit("fake", Cfg(1), fn, "b")     # a second tab asking for the same result
    assert a is b
    assert a.key == config_key("fake", Cfg(1))
    fn.gate.set()
    assert a.wait(5)
    assert a.state is JobState.DONE and a.result.meta["x"] == 1
    c = manager.submit("fake", Cfg(1), fn)           # done: served from memory, not rerun
    assert c is a and fn.calls == 1
    d = manager.submit("fake", Cfg(2), fn)           # a different config is a different job
    assert d.wait(5) and fn.calls == 2


def test_kwargs_reach_the_run(manager):
    fn = Counter(steps=1)
    fn.gate.set()
    job = manager.submit("fake", Cfg(3), fn, device="cpu")
    assert job.wait(5) and job.result.meta["device"] == "cpu"


def test_cancel_stops_a_running_job_and_allows_a_rerun(manager):
    fn = Counter(steps=1000)
    job = manager.submit("fake", Cfg(), fn)
    while job.state is not JobState.RUNNING:
        job.wait(0.01)
    assert manager.cancel(job.key)
    fn.gate.set()
    assert job.wait(5)
    assert job.state is JobState.CANCELLED and "cancelled" in job.error
    assert manager.cancel(job.key) is False           # nothing left to stop
    again = manager.submit("fake", Cfg(), Counter(steps=1, open_gate=True))
    assert again is not job                            # a cancelled job is replaced
    again.wait(5)


def test_cancel_before_start():
    m = JobManager(max_workers=1)
    blocker = Counter(steps=1)
    first = m.submit("fake", Cfg(1), blocker)
    queued = m.submit("fake", Cfg(2), Counter(steps=1, open_gate=True))
    assert queued.state is JobState.QUEUED
    assert m.cancel(queued.key)
    blocker.gate.set()
    assert first.wait(5) and queued.wait(5)
    assert queued.state is JobState.CANCELLED
    m.shutdown()


def test_progress_and_eta_follow_the_recent_rate():
    now = [100.0]
    job = Job("k", "fake", "label", clock=lambda: now[0])
    assert job.eta_s() is None                       # queued
    job.state, job.started = JobState.RUNNING, 100.0
    now[0] = 110.0                                   # 10 s of setup before the first report
    job._progress(0.25, "training")
    assert job.stage == "training" and job.elapsed_s() == pytest.approx(10.0)
    assert job.eta_s() is None                       # one sample: no rate yet
    now[0] = 111.0
    job._progress(0.30, "training")
    assert job.eta_s() is None                       # two samples are not enough
    now[0] = 112.0
    job._progress(0.35, "training")
    assert job.eta_s() == pytest.approx(13.0)        # 5 %/s, 65 % left; the setup does not count
    now[0] = 113.0
    assert job.eta_s() == pytest.approx(12.0)        # counts down between reports
    now[0] = 140.0                                   # overdue: no made-up "0 s left", but the rate since
    assert job.eta_s() == pytest.approx(0.65 * 30 / 0.10)  # the first report with the wait counted as spent
    job._progress(0.1, "late report")                # progress never runs backwards
    assert job.frac == 0.35
    fresh = Job("k2", "fake", "l", state=JobState.RUNNING, started=110.0, clock=lambda: now[0])
    for _ in range(5):
        fresh._progress(0.001, "start")              # no progress at all: no rate
    assert fresh.eta_s() is None


def test_eta_uses_the_later_half_of_the_run_with_the_managers_clock():
    """Slow for 60 s, then fast for 20 s: the ETA follows the rate over the later half of the run (40 s:
    from 20 % to 70 %), between the last ten seconds' (15 s left) and the average since the start's (34 s)."""
    now = [1000.0]
    m = JobManager(clock=lambda: now[0])
    reported, gate = threading.Event(), threading.Event()

    def run(cfg, progress=None, cancel=None, **kwargs):
        for t in range(61):                          # 0.5 %/s for a minute: 30 %
            now[0] = 1000.0 + t
            progress(0.005 * t, "slow part")
        for t in range(1, 21):                       # then 2 %/s for 20 s: 70 %
            now[0] = 1060.0 + t
            progress(0.30 + 0.02 * t, "fast part")
        reported.set()
        gate.wait(5)
        return Result("fake", {})

    job = m.submit("fake", Cfg(7), run)
    assert reported.wait(5)
    assert job.state is JobState.RUNNING and job.frac == pytest.approx(0.70)
    assert job.elapsed_s() == pytest.approx(80.0)
    assert job.eta_s() == pytest.approx(0.30 * 40 / 0.50)  # 30 % at 1.25 %/s
    assert len(job.history) <= engine.runtime.jobs.KEEP_SAMPLES + 1  # the window, thinned
    gate.set()
    assert job.wait(5) and job.eta_s() == 0.0
    m.shutdown()


def test_sparse_reports_still_give_an_eta():
    """A report every 30 s (one per width of a sweep): the last reports give the rate."""
    now = [0.0]
    job = Job("k", "fake", "l", state=JobState.RUNNING, started=0.0, clock=lambda: now[0])
    for i in range(1, 4):
        now[0] = 30.0 * i
        job._progress(0.1 * i, "width")
    assert job.eta_s() == pytest.approx(0.7 * 60 / 0.2)  # 10 % per 30 s, 70 % left
    now[0] = 100.0
    assert job.eta_s() == pytest.approx(210.0 - 10.0)    # counts down between reports


def test_before_any_rate_the_eta_is_the_scaled_estimate():
    now = [50.0]
    job = Job("k", "fake", "l", state=JobState.RUNNING, started=40.0, clock=lambda: now[0], estimate_s=30.0)
    assert job.eta_s() == pytest.approx(20.0)            # 10 s of its 30 s estimate spent
    now[0] = 80.0
    assert job.eta_s() is None                           # past its estimate and no rate: nothing made up


def test_a_finished_run_refreshes_the_speed_factor(monkeypatch, tmp_path):
    """A registered config's run corrects the speed factor by its measured / estimated seconds
    over the GEMM factor at its start; a cache read does not, nor does a resumed run."""
    from engine.experiments.registry import EXPERIMENTS
    from engine.runtime import speed

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the GEMM timing writes this machine's calibration
    monkeypatch.delenv(speed.SPEED_ENV, raising=False)
    monkeypatch.setattr(speed, "_correction", {})
    monkeypatch.setattr(speed, "_timings", deque(maxlen=32))  # the job's estimate times the GEMM afresh
    cfg = EXPERIMENTS["spectrum"].probe()
    reference = EXPERIMENTS["spectrum"].estimate(cfg).seconds
    monkeypatch.setattr(speed, "SPEED_MIN_RUN_S", 0.0)
    monkeypatch.setattr(speed, "SPEED_MIN", 1e-9)      # a 0.2 s fake run is far faster than the estimate
    clock = {"cached": False, "meta": {}}

    def run(cfg, progress=None, cancel=None, **kwargs):
        time.sleep(0.2)
        return Result("spectrum", {}, cached=clock["cached"], meta=dict(clock["meta"]))

    m = JobManager()
    job = m.submit("spectrum", cfg, run, device="cpu")
    assert job.wait(10) and job.state is JobState.DONE
    assert job.estimate_s is not None
    base = speed._timings[0].factor                   # the GEMM timed when the job started
    correction = speed._correction["cpu"]
    ratio = base * correction ** (1 / (1 - speed.SPEED_KEEP))  # what the run measured (the prior correction: 1)
    assert 0.2 / reference <= ratio * (1 + 1e-9) and ratio <= job.elapsed_s() / reference * (1 + 1e-9)
    m.forget(job.key)
    clock["cached"] = True
    assert m.submit("spectrum", cfg, run, device="cpu").wait(10)
    assert speed._correction["cpu"] == correction     # a cache read says nothing of speed
    m.forget(job.key)
    clock.update(cached=False, meta={"resumed_units": 2})
    assert m.submit("spectrum", cfg, run, device="cpu").wait(10)
    assert speed._correction["cpu"] == correction     # nor does a run that resumed an earlier one's units
    m.shutdown()


def test_the_speed_factor_ignores_fixed_costs_and_starts_from_the_calibration(monkeypatch):
    """A run estimated at tenths of a second that took seconds (a server's first data load
    imports torchvision) says nothing of speed; a long run moves the GEMM's factor halfway
    (geometrically), not all the way."""
    from engine.runtime import speed

    monkeypatch.delenv(speed.SPEED_ENV, raising=False)
    monkeypatch.setattr(speed, "_correction", {})
    monkeypatch.setattr(speed, "_timings", deque([speed.Timing(1.0, "torch", 200.0, 2, 0.0, 2, None,
                                                               time.perf_counter())]))  # what the GEMM timing said
    assert speed.record_run(0.2, 4.0) is None and speed.speed_factor("cpu") == 1.0
    assert speed.record_run(10.0, 1.0) is None          # measured under the minimum: fixed costs too
    assert speed.record_run(10.0, 40.0) == pytest.approx(4.0 ** (1 - speed.SPEED_KEEP))
    assert speed.speed_factor("cpu") == pytest.approx(2.0)
    assert speed.record_run(10.0, 40.0, "cuda") == pytest.approx(4.0)  # no GPU calibration: the run alone


def test_frequent_reports_keep_a_short_history():
    now = [0.0]
    job = Job("k", "fake", "l", state=JobState.RUNNING, started=0.0, clock=lambda: now[0])
    for i in range(10_000):                          # a report every millisecond for 10 s
        now[0] = i * 1e-3
        job._progress(i / 20_000, "step")
    assert len(job.history) <= 110
    assert job.eta_s() == pytest.approx(10.0, rel=REL_ETA)


def test_progress_reaches_the_job(manager):
    fn = Counter(steps=3)
    job = manager.submit("fake", Cfg(5), fn)
    while job.stage in ("queued", "starting"):
        job.wait(0.01)
    assert job.stage.startswith("step") and 0 <= job.frac < 1
    fn.gate.set()
    job.wait(5)
    assert job.frac == 1.0 and job.eta_s() == 0.0


def test_errors_are_captured_in_one_line(manager):
    def bad_input(cfg, progress=None, cancel=None):
        raise BadInput("n must be an integer >= 2; got 1")

    def bug(cfg, progress=None, cancel=None):
        raise ZeroDivisionError("division by zero\nsecond line")

    j1 = manager.submit("bad", Cfg(), bad_input)
    j2 = manager.submit("bug", Cfg(), bug)
    assert j1.wait(5) and j2.wait(5)
    assert j1.state is JobState.FAILED and j1.error == "n must be an integer >= 2; got 1"
    assert j2.state is JobState.FAILED and j2.error == "ZeroDivisionError: division by zero"
    assert "Traceback" in j2.detail
    fixed = manager.submit("bad", Cfg(), Counter(steps=1, open_gate=True))  # a failed job is replaced on resubmit
    assert fixed is not j1
    fixed.wait(0.1)


def test_finished_jobs_are_evicted():
    m = JobManager(max_workers=1, keep_finished=2)
    fn = Counter(steps=1)
    fn.gate.set()
    for x in range(5):
        m.submit("fake", Cfg(x), fn).wait(5)
    m.submit("fake", Cfg(99), fn).wait(5)
    assert len(m.jobs()) <= 3
    assert m.get("fake", Cfg(99)) is not None
    m.shutdown()


def looping(cfg, progress=None, cancel=None, every: float = 0.05, limit: float = 60.0, log=None, **kwargs):
    """A run that checks its cancel flag every `every` seconds, for up to `limit` seconds. ``log`` (a
    list, or a file's path) counts its work: "step" after each pause, "done" when it ends uncancelled."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if cancel.is_set():
            raise Cancelled("cancelled in the loop")
        progress(min((time.monotonic() - start) / limit, 1.0), "looping")
        time.sleep(every)
        _note(log, "step")
    _note(log, "done")
    return Result("loop", {})


def _note(log, word: str) -> None:
    if isinstance(log, list):
        log.append(word)
    elif log is not None:
        with open(log, "a") as f:
            f.write(word + "\n")


def _running(job, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while job.state is JobState.QUEUED and time.monotonic() < deadline:
        time.sleep(0.005)
    assert job.state is JobState.RUNNING


def test_cancel_takes_effect_at_the_runs_next_check_of_its_flag(manager):
    """Counted in the run's own steps, not in seconds: after ``cancel`` it finishes at most the step
    it is in (a slow machine is slow, not wrong; pytest-timeout bounds a run that never stops)."""
    steps: list[str] = []
    job = manager.submit("loop", Cfg(1), looping, log=steps)
    _running(job)
    while len(steps) < 2:  # a few steps in
        time.sleep(0.01)
    assert manager.cancel(job.key)
    at_cancel = len(steps)
    assert job.cancelling
    job.wait()
    assert len(steps) - at_cancel <= 1, f"{len(steps) - at_cancel} steps after the cancel"
    assert "done" not in steps
    assert job.state is JobState.CANCELLED and not job.cancelling


def test_a_queued_job_is_cancelled_at_once():
    m = JobManager(max_workers=1)
    first = m.submit("loop", Cfg(1), looping)
    queued = m.submit("loop", Cfg(2), looping)
    _running(first)
    assert m.cancel(queued.key)
    assert queued.state is JobState.CANCELLED       # no wait for a free worker
    m.shutdown()
    assert first.state is JobState.CANCELLED


def test_finished_jobs_never_block_a_new_submission(manager):
    job = manager.submit("loop", Cfg(1), looping)
    _running(job)
    manager.cancel(job.key)
    stopping = manager.submit("loop", Cfg(1), looping)  # asked again while it is still stopping
    assert stopping is not job and not stopping.cancel_event.is_set()
    assert job.wait(1) and job.state is JobState.CANCELLED
    assert manager.get("loop", Cfg(1)) is stopping
    manager.cancel(stopping.key)
    assert stopping.wait(1)
    done = manager.submit("loop", Cfg(1), looping, limit=0.0)
    assert done.wait(5) and done.state is JobState.DONE
    assert manager.submit("loop", Cfg(1), looping) is done   # a done job is served


def test_shutdown_sets_every_cancel_flag():
    m = JobManager(max_workers=1)
    jobs = [m.submit("loop", Cfg(x), looping) for x in range(3)]
    _running(jobs[0])
    m.shutdown(cancel=True, wait=False)
    assert all(j.cancel_event.is_set() for j in jobs)
    assert all(j.state is JobState.CANCELLED for j in jobs[1:])  # the queued ones at once
    assert jobs[0].wait(1) and jobs[0].state is JobState.CANCELLED
    with pytest.raises(RuntimeError):
        m.submit("loop", Cfg(9), looping)


def test_data_dir_is_part_of_the_key_and_reaches_the_run(manager, monkeypatch):
    assert manager.key("fake", Cfg(1), "/data/a") == config_key("fake", Cfg(1), "/data/a")
    seen = []

    def key(kind, config, data_dir=None):             # as if the data in the two folders differed
        seen.append(data_dir)
        return config_key(kind, config, data_dir) + f"|{data_dir}"

    monkeypatch.setattr(engine.runtime.jobs, "config_key", key)
    fn = Counter(steps=1, open_gate=True)
    a = manager.submit("fake", Cfg(1), fn, data_dir="/data/a")
    b = manager.submit("fake", Cfg(1), fn, data_dir="/data/b")
    assert a is not b and a.key.endswith("|/data/a")
    assert a.wait(5) and a.result.meta["data_dir"] == "/data/a"
    assert manager.get("fake", Cfg(1), data_dir="/data/a") is a
    assert manager.key("fake", Cfg(1), "/data/b") == b.key
    assert "/data/a" in seen
    assert b.wait(5)


SIGTERM_SCRIPT = """
import signal, sys, time
sys.path.insert(0, {root!r})
from engine.runtime.jobs import JobManager, JobState
from tests.test_jobs import looping

signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))   # as streamlit's server does, in effect
m = JobManager()
jobs = [m.submit("loop", {{"x": x}}, looping, every={every}, limit=60.0, log={log!r}) for x in range(2)]
while any(j.state is not JobState.RUNNING for j in jobs):
    time.sleep(0.01)
print("running", flush=True)
jobs[0].wait()
"""


@pytest.mark.parametrize("every", [0.1, 30.0], ids=["checks-its-flag", "in-a-long-call"])
def test_the_process_exits_on_sigterm_without_finishing_its_jobs(tmp_path, every):
    """SIGTERM ends the process with its runs unfinished: neither 60-second run goes on to its end,
    and a run inside a 30-second call is not waited for (no step after it). The runs' own work
    says so, not a clock; pytest-timeout bounds a process that never exits."""
    root = str(Path(__file__).resolve().parents[1])
    script, log = tmp_path / "server.py", tmp_path / "steps"
    script.write_text(SIGTERM_SCRIPT.format(root=root, every=every, log=str(log)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert proc.stdout.readline().strip() == "running"
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait() == 0
        steps = log.read_text().split() if log.exists() else []
        assert "done" not in steps
        if every > 1:  # the first pause had not ended at SIGTERM: a step logged means the exit waited for it
            assert "step" not in steps
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_eta_moves_smoothly_through_stages_of_different_pace():
    """A recorded trace of the malleability quick run's shape: per net, training (20 % of a unit's
    progress in 75 % of its time) then its attacks (80 % in 25 %), six nets, reports every 0.1 s.
    Read once a second from a fifth of the way in, the ETA never jumps by more than half its value
    beyond the second that passed, and stays within 2x of the truth at every read."""
    now = [0.0]
    job = Job("k", "fake", "l", state=JobState.RUNNING, started=0.0, clock=lambda: now[0])
    total, trace = 120.0, []
    unit = total / 6
    for k in range(int(total * 10) + 1):
        t = k / 10
        u, r = divmod(t, unit)
        done = (u + (0.2 * r / (0.75 * unit) if r < 0.75 * unit else 0.2 + 0.8 * (r - 0.75 * unit) / (0.25 * unit))) / 6
        now[0] = t
        job._progress(min(done, 1.0), "unit")
        if k % 10 == 0 and t >= 0.2 * total and t < total:
            trace.append((t, job.eta_s()))
    for (t0, a), (t1, b) in zip(trace, trace[1:], strict=False):
        assert abs(b - (a - (t1 - t0))) <= 0.5 * a, (t0, a, b)
    for t, eta in trace:
        assert 0.5 <= eta / (total - t) <= 2.0 or total - t < 10, (t, eta)
