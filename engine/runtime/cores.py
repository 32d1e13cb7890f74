"""How many threads a run gets: the cores this process may use, less those other work keeps busy.

On a shared machine (a lecturer's laptop with a browser, a workstation with other jobs) a run
on every core spins its OpenMP threads against whatever else runs: measured on a 2-core Zen 4
beside two busy processes, the Malleability default took 4-7× its idle time and 2.5× its CPU
time. Two things fix that, both here:

- **passive waits** (``OMP_WAIT_POLICY=PASSIVE`` unless the user set one, by ``engine/__init__``
  before torch loads): an OpenMP thread that waits for work sleeps instead of spinning, so a
  thread the OS has not scheduled costs the others nothing;
- **threads from the free cores** (``choose``): the cores this process may run on (its CPU
  affinity and its cgroup's CPU quota), less the cores other work kept busy over a short look
  at ``/proc/stat`` when the run starts, at least one and never more than the calling thread
  had. ``for_run`` applies the choice to the calling thread only (a dashboard job's thread,
  the CLI's main thread) and restores it after.

``ENGINE_THREADS=N`` fixes the count (no look at the load); the choice is recorded in every
computed result's ``meta["threads"]``. The count moves a result's last bits (the order of a
float sum), never more: where bits must repeat across runs, fix it (the grid does, per cell).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import BadInput

LOOK_SECONDS = 0.15  # how long the load is looked at when a run starts
LOOK_KEPT = 5.0      # a look this recent is reused (runs started back to back look once)
_look_lock = threading.Lock()
_last_look: tuple[float, float | None] | None = None  # (monotonic time, busy cores)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS: no affinity call
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, int(quota)) if quota is not None else cores)


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup may use per period (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``), or None where there is no quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def _cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) jiffies summed over ``cpus`` from ``/proc/stat``; None where it is unreadable."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        ticks = [float(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def busy_cores(seconds: float = LOOK_SECONDS) -> float | None:
    """How many of this process's cores other work keeps busy, looked at for ``seconds`` while
    the calling thread sleeps; None where ``/proc/stat`` cannot say (then the 1-minute load
    average is read instead, where there is one). This process's own CPU time over the look is
    taken off: a BLAS pool still spinning after a GEMM of ours (OpenBLAS's, 0.7 of a core for a
    while on a 2-core Zen 4) is not other work, and once made a 2-thread run take 1."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    before = _cpu_times(cpus)
    if before is None:
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    own, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    after = _cpu_times(cpus)
    own, wall = time.process_time() - own, time.perf_counter() - wall
    if after is None or after[1] <= before[1]:
        return None
    return max(0.0, len(cpus) * (after[0] - before[0]) / (after[1] - before[1]) - own / max(wall, 1e-9))


def _recent_busy() -> float | None:
    """``busy_cores()``, or the look taken less than ``LOOK_KEPT`` seconds ago."""
    global _last_look
    with _look_lock:
        if _last_look is None or time.monotonic() - _last_look[0] > LOOK_KEPT:
            _last_look = (time.monotonic(), busy_cores())
        return _last_look[1]


def look_ahead() -> None:
    """Take ``choose``'s look at the load now, in a background thread, so that it overlaps what runs
    before the run starts (torch's import: a run's first rows no longer wait the look's sleep).
    Nothing when ``ENGINE_THREADS`` fixes the count or a look is still fresh."""
    if os.environ.get("ENGINE_THREADS", "").strip() or (
            _last_look is not None and time.monotonic() - _last_look[0] <= LOOK_KEPT / 2):
        return
    threading.Thread(target=_recent_busy, name="load-look", daemon=True).start()


@dataclass(frozen=True)
class ThreadChoice:
    threads: int           # what the run gets
    usable: int            # cores this process may use (affinity, cgroup quota)
    busy: float | None     # cores other work kept busy at the start (None: not looked at)
    why: str               # one line: how the count was chosen

    def as_dict(self) -> dict:
        return asdict(self)


def choose(had: int, usable: int | None = None, busy: float | None = None, look: bool = True) -> ThreadChoice:
    """Threads for a run whose thread had ``had``: ``ENGINE_THREADS`` when set, else the usable
    cores less the busy ones (rounded to the nearest core), at least 1, at most ``had``."""
    usable = usable_cores() if usable is None else usable
    fixed = os.environ.get("ENGINE_THREADS", "").strip()
    if fixed:
        if not fixed.isdigit() or int(fixed) < 1:
            raise BadInput(f"ENGINE_THREADS={fixed!r} is not a thread count; allowed: a whole number ≥ 1, or unset")
        return ThreadChoice(int(fixed), usable, None, "ENGINE_THREADS")
    if busy is None and look:
        busy = _recent_busy()
    free = usable if busy is None else int(usable - busy + 0.5)
    threads = max(1, min(had, usable, free))
    why = (f"{usable} usable core(s)" + (f", {busy:.1f} busy with other work" if busy is not None else "")
           + (f", capped at the {had} this thread had" if had < min(usable, free) else ""))
    return ThreadChoice(threads, usable, busy, why)


@contextlib.contextmanager
def for_run(device_type: str) -> Iterator[ThreadChoice | None]:
    """Run the enclosed work on ``choose``'s thread count in the calling thread (CPU only;
    restored after). Yields the choice, None on a GPU."""
    if device_type != "cpu":
        yield None
        return
    import torch

    choice = choose(torch.get_num_threads())
    saved = limit_own_threads(choice.threads)
    try:
        yield choice
    finally:
        restore_own_threads(saved)


@functools.cache
def _own_thread_setters():
    """(omp_set_num_threads, MKL_Set_Num_Threads_Local or None) of torch's own libraries, which
    set the calling thread's count only; None where they are not found (then the process-wide
    ``torch.set_num_threads`` is used, which every thread started meanwhile inherits)."""
    import torch

    try:
        lib = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*"))
        handle = ctypes.CDLL(lib[0])  # already loaded: its symbols and its libgomp's
        omp = handle.omp_set_num_threads
    except (IndexError, OSError, AttributeError):
        return None
    mkl = getattr(handle, "MKL_Set_Num_Threads_Local", None)  # the C entry (the lower-case one takes a pointer)
    n = torch.get_num_threads()
    omp(n + 1)  # torch's count follows this OpenMP runtime only if it is the one torch uses
    follows = torch.get_num_threads() == n + 1
    omp(n)
    return (omp, mkl) if follows else None


def limit_own_threads(threads: int) -> tuple[int, int | None]:
    """Run the calling thread's torch ops on ``threads`` threads; returns what restores it."""
    import torch

    before = torch.get_num_threads()
    setters = _own_thread_setters()
    if setters is None:
        torch.set_num_threads(threads)
        return before, None
    omp, mkl = setters
    omp(threads)
    return before, (mkl(threads) if mkl is not None else None)  # MKL's previous local count (0: none)


def restore_own_threads(saved: tuple[int, int | None]) -> None:
    import torch

    before, mkl_before = saved
    setters = _own_thread_setters()
    if setters is None:
        torch.set_num_threads(before)
        return
    omp, mkl = setters
    omp(before)
    if mkl is not None:
        mkl(mkl_before)


def side_by_side(tasks: list) -> list:
    """Run independent callables (nets that share nothing: two seeds' training) one per core where the
    calling thread has a thread per task, each on its share of those threads; else one after the other
    on all of them. Returns their results in order; the first exception is raised after all finished.

    Two nets side by side on one thread each beat the same two in turn on two threads: on a 2-core
    Zen 4 EPYC the malleability quick preset's pair trained in 1.8 s against 2.3 s (2026-12-07), the
    weights bit for bit the same (a net's ops do not depend on the threads that run them here:
    ``tests/test_cores.py``). ``ENGINE_SIDE_BY_SIDE=0`` turns it off."""
    import torch

    threads = torch.get_num_threads()
    if len(tasks) < 2 or threads < len(tasks) or os.environ.get("ENGINE_SIDE_BY_SIDE", "1") == "0":
        return [task() for task in tasks]
    share = threads // len(tasks)
    out: list = [None] * len(tasks)
    errors: list[BaseException | None] = [None] * len(tasks)

    def run(i: int) -> None:
        saved = limit_own_threads(share)
        try:
            out[i] = tasks[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            errors[i] = e
        finally:
            restore_own_threads(saved)

    workers = [threading.Thread(target=run, args=(i,), name=f"side-by-side-{i}") for i in range(1, len(tasks))]
    for w in workers:
        w.start()
    run(0)  # the caller's own thread does the first
    for w in workers:
        w.join()
    for e in errors:
        if e is not None:
            raise e
    return out
