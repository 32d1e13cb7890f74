"""Background jobs for long experiment runs: progress, ETA, cancel, dedupe by cache key.

A ``JobManager`` runs ``run_*(cfg, progress=..., cancel=..., **kwargs)`` calls on daemon
threads, at most ``max_workers`` at a time (torch releases the GIL in its kernels). A job is
identified by the config's cache key (``engine.runtime.cache.config_key(kind, cfg, data_dir)``), so
two callers asking for the same result, e.g. two browser tabs, share one computation.
Finished jobs keep their ``Result`` in memory (a few of them) while the engine's disk cache
keeps them for good.

Cancelling is cooperative: ``cancel`` sets the job's flag and the run raises
``engine.runtime.errors.Cancelled`` at its next check; the job is CANCELLED the moment it does (a
queued job at once). A finished job never blocks a new submission: a DONE one is served, a
FAILED or CANCELLED one (or one that is being cancelled) is replaced by a fresh run.

Each run's engine estimate, times this machine's speed factor, gives its ETA until progress
reports give a rate, and a run that finishes (not read from the cache) refreshes the factor
with its measured / estimated time (``engine.runtime.speed.record_run``), so the next plan is
made at the speed the machine has now.

Worker threads are daemons and an ``atexit`` hook sets every job's cancel flag without
waiting, so a server stops promptly even while a run is in a long torch call.

The dashboard holds one manager per server process (``st.cache_resource``); this module
never imports streamlit.
"""

from __future__ import annotations

import atexit
import enum
import os
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .cache import Result, config_key
from .errors import Cancelled, EngineError
from .speed import record_run, speed_factor
from .stream import landing

if TYPE_CHECKING:  # torch only for the device's type: a job manager never loads it
    import torch

    from .cache import Config


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
RATE_WINDOW_S = 10.0       # the ETA follows the progress rate over at least this many recent seconds
MIN_SAMPLES_FOR_ETA = 3    # progress reports needed before an ETA is shown
MIN_SECONDS_FOR_ETA = 0.5  # ... and the time they must span; a shorter rate is noise
SAMPLE_EVERY_S = 0.1       # reports closer than this overwrite the newest sample (bounded history)
KEEP_SAMPLES = 64          # the history is thinned beyond this many samples (a long window stays small)


@dataclass(eq=False)
class Job:
    """One run. Fields are written by the worker thread and read by anyone."""

    key: str                       # cache key of (kind, config, data): the dedupe identity
    kind: str
    label: str                     # one line for the user, e.g. "NTK sweep, 8 nets"
    state: JobState = JobState.QUEUED
    frac: float = 0.0              # progress in [0, 1]
    stage: str = "queued"          # what the run is doing now
    submitted: float = 0.0         # clock times (manager's clock, seconds)
    started: float | None = None
    finished: float | None = None
    result: Result | None = None
    error: str | None = None       # one line (EngineError message, or type: message)
    detail: str | None = None      # traceback of unexpected errors, for logs
    cancel_event: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.monotonic
    # (clock time, frac) of recent progress reports: one at or before the rate window, the rest in it
    history: deque = field(default_factory=deque, repr=False)
    finished_event: threading.Event = field(default_factory=threading.Event, repr=False)
    estimate_s: float | None = None  # the engine's estimate times this machine's speed factor, if known
    first_report: tuple[float, float] | None = field(default=None, repr=False)  # (clock time, frac)
    # (unit, rows) of every unit the run finished so far, in order (engine.runtime.stream): the page's partial chart
    landed: list = field(default_factory=list, repr=False)

    def _landed(self, unit: dict, rows: list[dict]) -> None:
        self.landed.append((unit, rows))  # list.append is atomic: the page reads a prefix

    @property
    def done(self) -> bool:
        return self.state in FINISHED

    @property
    def cancelling(self) -> bool:
        """Cancel was asked for and the run has not stopped yet."""
        return self.cancel_event.is_set() and not self.done

    def elapsed_s(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or self.clock()) - self.started

    def eta_s(self) -> float | None:
        """Seconds left, from measured progress, moving smoothly.

        The measured rate is the progress over the rate window: the last ``RATE_WINDOW_S`` seconds or
        the later half of the time since the first report, whichever is longer (a run's stages differ
        in pace, a net's training and its attacks by 4x: a short window swung a 5-minute run's ETA
        between 0:29 and 21:12), counting down between reports. Where the engine's estimate is known,
        the two are blended by the share done: the estimate leads at the start, the measurement at the
        end. When the measured time has run out (the run is slower than its rate said), the rate since
        the first report with the time since the last one counted as spent: a longer ETA, never a
        made-up "0 s left". Before there is a rate, ``estimate_s`` minus the time elapsed, when known
        and not yet exceeded. 0.0 once done; None while queued, after a failure or cancel, and when
        nothing is known.
        """
        if self.state is not JobState.RUNNING:
            return 0.0 if self.state is JobState.DONE else None
        now = self.clock()
        prior = None
        if self.estimate_s is not None and self.started is not None:
            prior = self.estimate_s - (now - self.started)
            prior = prior if prior > 0.0 else None
        samples = tuple(self.history)  # a snapshot: the worker appends while we read
        if len(samples) >= MIN_SAMPLES_FOR_ETA:
            (t0, f0), (t1, f1) = samples[0], samples[-1]
            if t1 - t0 >= MIN_SECONDS_FOR_ETA and f1 > f0:
                left = (1.0 - f1) * (t1 - t0) / (f1 - f0) - (now - t1)  # counts down between reports
                if left >= 0.0:
                    return left if prior is None else f1 * left + (1.0 - f1) * prior
                first = self.first_report
                if first is not None and f1 > first[1]:  # overdue: the whole run's rate, up to now
                    return (1.0 - f1) * (now - first[0]) / (f1 - first[1])
                return None
        return prior

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished (or timeout); True if it has."""
        return self.done or self.finished_event.wait(timeout)

    def _progress(self, frac: float, stage: str) -> None:
        now = self.clock()
        self.frac = min(max(float(frac), self.frac), 1.0)  # never runs backwards
        self.stage = stage
        if self.first_report is None:
            self.first_report = (now, self.frac)
        h = self.history
        if len(h) >= 2 and now - h[-2][0] < SAMPLE_EVERY_S:
            h[-1] = (now, self.frac)
        else:
            h.append((now, self.frac))
        # keep one sample at the window's start (RATE_WINDOW_S, or half the time since the first report),
        # and the last few reports however old (sparse ones); at most about KEEP_SAMPLES in between
        window = max(RATE_WINDOW_S, 0.5 * (now - self.first_report[0]))
        while len(h) > MIN_SAMPLES_FOR_ETA and h[1][0] <= now - window:
            h.popleft()
        if len(h) > KEEP_SAMPLES:  # thin the middle: every other sample, ends kept
            kept = list(h)
            h.clear()
            h.extend([kept[0], *kept[1:-1:2], kept[-1]])


class JobManager:
    """Runs experiment calls in the background, one job per cache key.

    ``submit`` returns the existing job for the same (kind, config, data_dir) when one is
    done, or queued or running and not being cancelled; otherwise it starts a fresh one.
    ``clock`` times everything (progress samples, ETA); tests inject a fake one.
    """

    def __init__(self, max_workers: int = 2, keep_finished: int = 8,
                 clock: Callable[[], float] = time.monotonic):
        self._slots = threading.BoundedSemaphore(max_workers)
        self._threads: set[threading.Thread] = set()
        self._jobs: dict[str, Job] = {}
        self._live: set[Job] = set()   # not finished, including replaced ones still stopping
        self._lock = threading.Lock()
        self._keep = keep_finished
        self._clock = clock
        self._closed = False
        _MANAGERS.add(self)

    @staticmethod
    def key(kind: str, config: Config, data_dir: str | os.PathLike | None = None) -> str:
        """The job identity, ``config_key(kind, config, data_dir)``; raises what that raises
        (e.g. ``DataMissing`` when the data cannot be fingerprinted)."""
        return config_key(kind, config, data_dir)

    def submit(self, kind: str, config: Config, fn: Callable[..., Result], label: str = "", *,
               data_dir: str | os.PathLike | None = None, **kwargs: Any) -> Job:
        """Start ``fn(config, progress=, cancel=, [data_dir=], **kwargs)`` unless the same key is live or done.

        data_dir: part of the job's identity (``config_key``'s data fingerprint) and passed
        on to ``fn`` when given. Raises what ``config_key`` raises.
        """
        key = config_key(kind, config, data_dir)
        if data_dir is not None:
            kwargs["data_dir"] = data_dir
        with self._lock:
            if self._closed:
                raise RuntimeError("the job manager has been shut down")
            job = self._jobs.get(key)
            if job is not None and (job.state is JobState.DONE or not (job.done or job.cancelling)):
                return job
            job = Job(key, kind, label or kind, submitted=self._clock(), clock=self._clock)
            self._jobs[key] = job
            self._live.add(job)
            self._evict()
            thread = threading.Thread(target=self._thread, args=(job, fn, config, kwargs),
                                      name=f"engine-job-{kind}", daemon=True)
            self._threads = {t for t in self._threads if t.is_alive()} | {thread}
            thread.start()
            return job

    def get(self, kind: str, config: Config, data_dir: str | os.PathLike | None = None) -> Job | None:
        return self._jobs.get(config_key(kind, config, data_dir))

    def get_key(self, key: str) -> Job | None:
        return self._jobs.get(key)

    def jobs(self) -> list[Job]:
        """All known jobs, newest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.submitted, reverse=True)

    def cancel(self, key: str) -> bool:
        """Ask a queued or running job to stop; True if there was one to stop.

        A queued job is CANCELLED at once; a running one when its run raises ``Cancelled``.
        """
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.done:
                return False
            self._cancel(job)
            return True

    def forget(self, key: str) -> None:
        """Drop a finished job (its result stays in the disk cache)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.done:
                del self._jobs[key]

    def shutdown(self, cancel: bool = True, wait: bool = True, timeout: float | None = None) -> None:
        """Refuse new jobs; with ``cancel`` set every unfinished job's flag; with ``wait`` join the workers."""
        with self._lock:
            self._closed = True
            if cancel:
                for job in list(self._live):
                    self._cancel(job)
            threads = list(self._threads)
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            for t in threads:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # ---------------------------------------------------------------- worker side

    def _cancel(self, job: Job) -> None:
        """Caller holds the lock."""
        job.cancel_event.set()
        if job.state is JobState.QUEUED:
            self._finish(job, JobState.CANCELLED, error="cancelled before it started")

    def _thread(self, job: Job, fn: Callable[..., Result], config: Config, kwargs: dict[str, Any]) -> None:
        while not self._slots.acquire(timeout=0.1):  # queued; wake now and then to notice a cancel
            if job.done:
                return
        try:
            with self._lock:
                if job.state is not JobState.QUEUED:  # cancelled while it waited
                    return
                job.state, job.started, job.stage = JobState.RUNNING, self._clock(), "starting"
            self._run(job, fn, config, kwargs)
        finally:
            self._slots.release()

    def _run(self, job: Job, fn: Callable[..., Result], config: Config, kwargs: dict[str, Any]) -> None:
        reference, device = _estimate(config, kwargs.get("device", "cpu"))
        if reference is not None:
            job.estimate_s = reference * _speed(device)
        t0 = time.perf_counter()
        try:
            with landing(job._landed):
                result = fn(config, progress=job._progress, cancel=job.cancel_event, **kwargs)
        except Cancelled as exc:
            self._finish(job, JobState.CANCELLED, error=str(exc) or "cancelled")
        except EngineError as exc:
            self._finish(job, JobState.FAILED, error=str(exc))
        except Exception as exc:  # anything else is a bug, but the UI must still say so in one line
            line = (str(exc).strip().splitlines() or [""])[0]
            self._finish(job, JobState.FAILED, error=f"{type(exc).__name__}: {line}",
                         detail=traceback.format_exc())
        else:
            # a cache read says nothing of speed, and a resumed run did only part of what its estimate counts
            if reference is not None and not getattr(result, "cached", False) and not result.meta.get("resumed_units"):
                record_run(reference, time.perf_counter() - t0, device)
            job.result = result
            job.frac, job.stage = 1.0, "done"
            self._finish(job, JobState.DONE)
        finally:
            if not job.done:  # SystemExit and the like: never leave a job "running" forever
                self._finish(job, JobState.FAILED, error="the run was interrupted")

    def _finish(self, job: Job, state: JobState, error: str | None = None,
                detail: str | None = None) -> None:
        job.error, job.detail = error, detail
        job.finished = self._clock()
        if job.started is None:
            job.started = job.finished
        job.state = state  # after the fields above, so that readers who see `done` see them too
        job.finished_event.set()
        self._live.discard(job)

    def _evict(self) -> None:
        """Keep at most `keep_finished` finished jobs (oldest go first); caller holds the lock."""
        finished = sorted((j for j in self._jobs.values() if j.done), key=lambda j: j.finished or 0.0)
        for job in finished[:max(0, len(finished) - self._keep)]:
            del self._jobs[job.key]


def _estimate(config: Config, device: str | torch.device) -> tuple[float | None, str]:
    """The engine's estimate of ``config`` in reference seconds and the device type the run goes
    to; (None, "cpu") for a config the registry does not know (a grid run, a test's)."""
    try:
        from ..experiments.registry import estimate
        from .device import device_type

        return float(estimate(config).seconds), device_type(device)
    except Exception:  # no estimate is no reason to fail a run
        return None, "cpu"


def _speed(device: str) -> float:
    try:
        return speed_factor(device)
    except EngineError:  # a bad $ENGINE_SPEED_FACTOR: the reference seconds
        return 1.0


_MANAGERS: weakref.WeakSet[JobManager] = weakref.WeakSet()


@atexit.register
def _cancel_all_at_exit() -> None:
    """Ask every run to stop when the interpreter exits; never wait (the threads are daemons)."""
    for manager in list(_MANAGERS):
        manager.shutdown(cancel=True, wait=False)
