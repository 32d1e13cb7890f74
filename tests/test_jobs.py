"""engine.jobs: dedupe by cache key, cancel, progress and ETA, captured errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from engine.cache import Result, config_key
from engine.errors import BadInput, Cancelled
from engine.jobs import Job, JobManager, JobState


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


def test_progress_and_eta():
    now = [100.0]
    job = Job("k", "fake", "label", clock=lambda: now[0])
    assert job.eta_s() is None                       # queued
    job.state, job.started = JobState.RUNNING, 100.0
    now[0] = 110.0
    job._progress(0.25, "training")
    assert job.stage == "training" and job.elapsed_s() == pytest.approx(10.0)
    assert job.eta_s() == pytest.approx(30.0)        # 10 s for a quarter, 30 s for the rest
    job._progress(0.1, "late report")                # progress never runs backwards
    assert job.frac == 0.25
    job._progress(0.001, "x")
    fresh = Job("k2", "fake", "l", state=JobState.RUNNING, started=110.0, clock=lambda: now[0])
    fresh._progress(0.001, "start")
    assert fresh.eta_s() is None                     # too early to extrapolate


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
