"""Background jobs for long experiment runs: progress, ETA, cancel, dedupe by cache key.

A ``JobManager`` runs ``run_*(cfg, progress=..., cancel=..., **kwargs)`` calls on a small
thread pool (torch releases the GIL in its kernels). A job is identified by the config's
cache key (``engine.cache.config_key(kind, cfg)``), so two callers asking for the same
result, e.g. two browser tabs, share one computation. Finished jobs keep their ``Result``
in memory (a few of them) while the engine's disk cache keeps them for good.

The dashboard holds one manager per server process (``st.cache_resource``); this module
never imports streamlit.
"""

from __future__ import annotations

import enum
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from .cache import Result, config_key
from .errors import Cancelled, EngineError


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
MIN_FRAC_FOR_ETA = 0.02  # below this, a linear extrapolation is noise
MIN_SECONDS_FOR_ETA = 0.5


@dataclass
class Job:
    """One run. Fields are written by the worker thread and read by anyone."""

    key: str                       # cache key of (kind, config): the dedupe identity
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
    future: Future | None = None
    clock: Callable[[], float] = time.monotonic

    @property
    def done(self) -> bool:
        return self.state in FINISHED

    def elapsed_s(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or self.clock()) - self.started

    def eta_s(self) -> float | None:
        """Seconds left by linear extrapolation of progress; None until it means something."""
        if self.state is not JobState.RUNNING:
            return 0.0 if self.state is JobState.DONE else None
        elapsed = self.elapsed_s()
        if self.frac < MIN_FRAC_FOR_ETA or elapsed < MIN_SECONDS_FOR_ETA:
            return None
        return elapsed * (1.0 - self.frac) / self.frac

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished (or timeout); True if it has."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _progress(self, frac: float, stage: str) -> None:
        self.frac = min(max(float(frac), self.frac), 1.0)  # never runs backwards
        self.stage = stage


class JobManager:
    """Runs experiment calls in the background, one job per cache key.

    ``submit`` returns the existing job for the same (kind, config) when one is queued,
    running or done; a failed or cancelled job is replaced by a fresh one.
    """

    def __init__(self, max_workers: int = 2, keep_finished: int = 8,
                 clock: Callable[[], float] = time.monotonic):
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="engine-job")
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._keep = keep_finished
        self._clock = clock

    @staticmethod
    def key(kind: str, config) -> str:
        return config_key(kind, config)

    def submit(self, kind: str, config, fn: Callable[..., Result], label: str = "", **kwargs) -> Job:
        """Start ``fn(config, progress=, cancel=, **kwargs)`` unless the same key is live or done."""
        key = config_key(kind, config)
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.state not in (JobState.FAILED, JobState.CANCELLED):
                return job
            job = Job(key, kind, label or kind, submitted=self._clock(), clock=self._clock)
            self._jobs[key] = job
            self._evict()
            job.future = self._pool.submit(self._run, job, fn, config, kwargs)
            return job

    def get(self, kind: str, config) -> Job | None:
        return self._jobs.get(config_key(kind, config))

    def get_key(self, key: str) -> Job | None:
        return self._jobs.get(key)

    def jobs(self) -> list[Job]:
        """All known jobs, newest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.submitted, reverse=True)

    def cancel(self, key: str) -> bool:
        """Ask a queued or running job to stop; True if there was one to stop."""
        job = self._jobs.get(key)
        if job is None or job.done:
            return False
        job.cancel_event.set()
        if job.future is not None and job.future.cancel():  # never started
            self._finish(job, JobState.CANCELLED, error="cancelled before it started")
        return True

    def forget(self, key: str) -> None:
        """Drop a finished job (its result stays in the disk cache)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.done:
                del self._jobs[key]

    def shutdown(self, cancel: bool = True) -> None:
        if cancel:
            for job in list(self._jobs.values()):
                job.cancel_event.set()
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    # ---------------------------------------------------------------- worker side

    def _run(self, job: Job, fn, config, kwargs) -> None:
        if job.cancel_event.is_set():
            self._finish(job, JobState.CANCELLED, error="cancelled before it started")
            return
        job.state, job.started, job.stage = JobState.RUNNING, self._clock(), "starting"
        try:
            result = fn(config, progress=job._progress, cancel=job.cancel_event, **kwargs)
        except Cancelled as exc:
            self._finish(job, JobState.CANCELLED, error=str(exc))
        except EngineError as exc:
            self._finish(job, JobState.FAILED, error=str(exc))
        except Exception as exc:  # anything else is a bug, but the UI must still say so in one line
            line = (str(exc).strip().splitlines() or [""])[0]
            self._finish(job, JobState.FAILED, error=f"{type(exc).__name__}: {line}",
                         detail=traceback.format_exc())
        else:
            job.result = result
            job.frac, job.stage = 1.0, "done"
            self._finish(job, JobState.DONE)

    def _finish(self, job: Job, state: JobState, error: str | None = None,
                detail: str | None = None) -> None:
        job.error, job.detail = error, detail
        job.finished = self._clock()
        if job.started is None:
            job.started = job.finished
        job.state = state  # last, so that readers who see `done` see everything else

    def _evict(self) -> None:
        """Keep at most `keep_finished` finished jobs (oldest go first); caller holds the lock."""
        finished = sorted((j for j in self._jobs.values() if j.done), key=lambda j: j.finished or 0.0)
        for job in finished[:max(0, len(finished) - self._keep)]:
            del self._jobs[job.key]
