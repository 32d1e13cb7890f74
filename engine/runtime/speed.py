"""This machine's speed now: the factor that turns the reference estimates into seconds here.

Estimates (``engine.runtime.budget``) are in seconds of a reference 2-core CPU. The factor is the
reference's rate of a 768³ float32 GEMM over that GEMM's rate here and now (``time_gemm``): timed
on the threads a run started now would get (``engine.runtime.cores.choose``, from the cores other
work leaves free) for about ``gemm.SPEED_TIME_S``, so that the time other work takes from it
counts, and scaled by ``thread_effect`` where that count is not the reference's (a run gains
less from threads than a GEMM). A timing is reused for ``SPEED_FRESH_S``, then taken again: the
load moves. Runs that finish correct it (``record_run``): their measured over estimated time,
over the GEMM's factor when they started, is a per-device correction for what the GEMM does not
see. ``$ENGINE_SPEED_FACTOR`` pins the whole factor.

The GEMM is torch's, the library runs compute with. Where torch is not loaded (``--estimate`` on
the command line, which would spend 2-4 s loading it) numpy's GEMM is timed and converted by this
machine's calibration: numpy's rate over torch's, measured here on the same thread count, kept
on disk (``engine.runtime.gemm``) under a key of the CPU model and the versions of Python, torch,
numpy and numpy's BLAS. A torch timing measures that ratio (numpy's GEMM right after torch's)
and writes it atomically where the calibration lacks it for that thread count or is older than
``RATIO_KEEP_S``; an estimate whose thread count the calibration lacks loads torch and writes
it. No BLAS is assumed faster than another: numpy's ran 1.35x torch's on the reference AVX2
EPYC, 1.27x on a Zen 4 and 1.11x on a Sapphire Rapids, where a fixed 1.35 made the numpy-timed
factor 1.2x the torch-timed one idle and 1.3-4.3x under load.

Fixed costs are not speed: a run in a fresh process (the command line's) starts an interpreter
and imports torch, pandas and, for CIFAR-10 (``budget.TORCHVISION_DECODES``), torchvision. ``import_seconds`` counts them
from the CPU seconds the calibration measured when it loaded torch itself, stretched by the load.
"""

from __future__ import annotations

import glob
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import gemm
from .errors import BadInput

if TYPE_CHECKING:
    from .cores import ThreadChoice

SPEED_GEMM_N = 768        # the timed GEMM: 768³ float32, ~0.9 GFLOP, a few ms to a few tenths of a second
# That GEMM's torch rate on a machine where the estimates hold (measured / estimated = 1). Set from
# `bench --estimates` on a 2-core AMD EPYC (AVX2, torch's 2 threads, 2026-12-02): its probes ran
# 1.6x longer than estimated (geometric mean of eight, two rounds; benchmarks/RESULTS.md) while
# this GEMM ran at 125 GFLOP/s, so 1.6 x 125. Timed against budget.FLOPS instead (the effective
# rate of whole steps, 60 GFLOP/s, not of one large GEMM), that machine read as 2x faster than the
# estimates when it was 1.6x slower, and runs the dashboard judged under 30 s took a minute or more.
SPEED_GEMM_FLOPS = 2.0e11
REF_THREADS = 2           # the reference CPU's threads: SPEED_GEMM_FLOPS is its GEMM's rate on both
# The share of a default run's compute that runs in parallel on several threads (Amdahl's p): the
# GEMM's rate grows with the threads almost in proportion, a run's less (small shapes on one
# thread, Python between steps). Measured on the 2-core Zen 4 EPYC, quick presets' wall time less
# imports on 1 thread against 2 (2026-12-05): malleability 0.32, influence and alignment 0.44,
# dynamics 0.58, ntk-sweep 0.64.
RUN_PARALLEL = 0.5
SPEED_FRESH_S = 30.0      # a timing this recent is reused; an older one is taken again
SPEED_MIN, SPEED_MAX = 0.25, 100.0  # factors beyond these are a broken timer, not a machine
SPEED_MIN_RUN_S = 2.0     # runs shorter than this (estimated or measured) are mostly fixed costs: not recorded
SPEED_KEEP = 0.5          # weight of the previous value when a new one refreshes it (geometric mean)
SPEED_ENV = "ENGINE_SPEED_FACTOR"  # pins the factor (tests, or a user who knows better)
RATIO_KEEP_S = 3600.0     # a calibration ratio younger than this is not measured again by a torch timing
# What a run in a fresh process imports before it computes: (modules, CPU seconds where no
# calibration has measured them: a 2-core Zen 4 EPYC, 2026-12-03).
IMPORTS: dict[str, tuple[tuple[str, ...], float]] = {
    "torch": (("torch",), 1.5),
    "pandas": (("pandas", "diskcache"), 0.2),                   # the result cache
    "torchvision": (("torchvision.datasets",), 1.4),            # CIFAR-10 only (budget.TORCHVISION_DECODES)
}
PROCESS_S = 0.5  # a fresh process's own start, command line and exit (torch's teardown), beyond its imports


@dataclass(frozen=True)
class Timing:
    factor: float             # reference rate / torch's rate now (numpy's converted) x thread_effect(threads)
    library: str              # whose GEMM was timed: "torch" or "numpy"
    gflops: float             # that library's rate now, GFLOP/s
    threads: int              # the threads it ran on: cores.choose's count for a run started now
    busy: float | None        # cores other work kept busy (cores.choose's look; None: not looked at)
    usable: int               # cores this process may use
    calibration: str | None   # the calibration file read (numpy) or written (torch); None: none
    at: float                 # time.perf_counter() when it was taken
    queue: float | None = None  # threads other work had ready to run (``runnable_others``; None: unreadable)


_timings: deque[Timing] = deque(maxlen=32)  # the latest CPU timings, oldest first
_correction: dict[str, float] = {}          # device type -> measured / (estimated x GEMM factor) of finished runs


def _clamp(factor: float) -> float:
    return float(min(max(factor, SPEED_MIN), SPEED_MAX))


def _blend(prev: float | None, new: float) -> float:
    return new if prev is None else math.exp(SPEED_KEEP * math.log(prev) + (1 - SPEED_KEEP) * math.log(new))


def thread_effect(threads: int) -> float:
    """How much longer a run on ``threads`` threads takes than the GEMM's rate on them says,
    against the reference's ``REF_THREADS``: the GEMM's rate scales with the threads, a run's by
    Amdahl's s(t) = 1 / (1 - p + p / t) with p = ``RUN_PARALLEL``. 1 at the reference's count; on
    1 thread 0.67 (the run loses less than the GEMM's half), on 16 5.7."""
    s = lambda t: 1.0 / (1.0 - RUN_PARALLEL + RUN_PARALLEL / t)  # noqa: E731
    return threads / REF_THREADS * s(REF_THREADS) / s(threads)


def _run_threads():
    """``cores.choose``'s choice for a run started now: from torch's count in this thread where
    torch is loaded (as ``cores.for_run``), else from the count torch would start with."""
    from .cores import choose

    torch = sys.modules.get("torch")
    return choose(torch.get_num_threads() if torch is not None else gemm.torch_default_threads())


def runnable_others(samples: int = 5, every_s: float = 0.01) -> float | None:
    """Threads other work has ready to run now, beside the calling one: the run queue
    (``/proc/loadavg``'s running count less this process's), averaged over ``samples`` looks ``every_s``
    apart; None where it cannot be read. Unlike ``cores.busy_cores`` it sees past the core
    count: four spinning threads on two cores read 4, not 2. This process's running threads are not
    counted (``_own_running``)."""
    seen = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                seen.append(max(0, int(f.read().split()[3].split("/")[0]) - _own_running()))
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(every_s)
    return sum(seen) / len(seen)


def _own_running() -> int:
    """This process's threads that are running now (at least the calling one): a BLAS pool of ours
    still spinning after a GEMM is not other work."""
    count = 0
    for stat in glob.glob("/proc/self/task/*/stat"):
        try:
            with open(stat) as f:
                count += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return max(1, count)


def _load_torch() -> dict[str, float]:
    """Import torch and what a run imports before it computes, timing each part (the process's
    CPU seconds: torch starts threads as it loads) where this process had not loaded torch; {}
    where it had."""
    import importlib

    if "torch" in sys.modules:
        return {}
    spent = {}
    for name, (modules, _) in IMPORTS.items():
        t0 = time.process_time()
        try:
            for module in modules:
                importlib.import_module(module)
        except ImportError:
            continue
        spent[name] = time.process_time() - t0
    return spent


def _ratio(record: dict | None, threads: int) -> float | None:
    entry = (record or {}).get("numpy_over_torch", {}).get(str(threads))
    return None if entry is None else float(entry["ratio"])


def time_gemm(library: str | None = None, n: int = SPEED_GEMM_N) -> Timing:
    """Time an (n, n) @ (n, n) float32 GEMM on ``cores.choose``'s threads now and keep it as the
    CPU's timing. ``library``: "torch", or "numpy" (its rate converted by this machine's
    calibration; ``BadInput`` where that lacks this thread count); default torch where it is
    loaded or the calibration lacks the thread count, else numpy. A torch timing writes the
    calibration where its ratio for this thread count is missing or old."""
    if library not in (None, "torch", "numpy"):
        raise BadInput(f"unknown GEMM library {library!r}; allowed: torch, numpy")
    key = gemm.calibration_key()
    path = gemm.calibration_path(key)
    record = gemm.read_calibration(path, key) if path is not None else None
    choice = _run_threads()
    queue = runnable_others()  # before any GEMM of ours, whose threads would count
    ratio = _ratio(record, choice.threads)
    library = library or ("torch" if "torch" in sys.modules or ratio is None else "numpy")
    if library == "numpy":
        if ratio is None:
            raise BadInput(f"no speed calibration for {choice.threads} thread(s) here"
                           f"{f' ({path})' if path else ''}: time torch's GEMM first")
        gflops = gemm.numpy_rate(n, choice.threads)
        torch_rate = gflops / ratio
    else:
        imports = _load_torch()
        torch_rate = gflops = gemm.torch_rate(n, choice.threads)
        entry = (record or {}).get("numpy_over_torch", {}).get(str(choice.threads))
        if path is not None and (imports or entry is None or time.time() - entry["written"] > RATIO_KEEP_S):
            measured = gemm.numpy_rate(n, choice.threads) / torch_rate
            new = dict(record or {"format": gemm.CALIBRATION_FORMAT, "key": key, "numpy_over_torch": {}})
            new["numpy_over_torch"] = {**new["numpy_over_torch"], str(choice.threads): {
                "ratio": _blend(None if entry is None else entry["ratio"], measured), "written": time.time()}}
            new["import_cpu_s"] = {**new.get("import_cpu_s", {}), **imports}
            gemm.write_calibration(path, new)
            record = new
    torch_rate = _under_load(torch_rate, record, path, key, choice, queue)
    timing = Timing(_clamp(SPEED_GEMM_FLOPS / torch_rate * thread_effect(choice.threads)), library, gflops / 1e9, choice.threads, choice.busy,
                    choice.usable, None if path is None else str(path), time.perf_counter(), queue)
    _timings.append(timing)
    return timing


def _under_load(rate: float, record: dict | None, path: Path | None, key: dict, choice: ThreadChoice,
                queue: float | None) -> float:
    """The torch-equivalent GEMM rate a run started now will see on ``choice.threads`` threads.

    Idle (no other thread ready to run, no busy core): the timed ``rate``, kept in the calibration as
    this machine's idle rate for that thread count where it is the fastest seen. Beside other work,
    one 0.2 s timing reads a share of the cores that the scheduler has not yet evened out: on a 2-core
    Zen 4 beside a two-thread GEMM, fresh processes read 1.7-2.0x or 3.2x the reference in turn,
    while a run of seconds gets its fair share, the usable cores over the threads that want them
    (``choice.usable / (others + threads)``; measured 1.87x its idle time). So where the idle rate is
    known, the rate is the geometric mean of the timing and that fair share of the idle rate (the idle
    rate of another thread count scaled by the threads where this one's was never timed idle)."""
    threads, known = str(choice.threads), (record or {}).get("idle_torch_gflops", {})
    idle = known.get(threads)
    if idle is None and known:  # a GEMM's rate grows with its threads almost in proportion (1.94x from 1 to 2)
        most = max(known, key=int)
        idle = known[most] * choice.threads / int(most)
    others = max([x for x in (queue, choice.busy) if x is not None], default=None)
    if others is not None and others < 0.5:
        if path is not None and (idle is None or rate / 1e9 > idle):
            new = dict(record or {"format": gemm.CALIBRATION_FORMAT, "key": key, "numpy_over_torch": {}})
            new["idle_torch_gflops"] = {**new.get("idle_torch_gflops", {}), threads: rate / 1e9}
            gemm.write_calibration(path, new)
        return rate
    if idle is None or others is None:
        return rate
    fair = idle * 1e9 * min(1.0, choice.usable / (others + choice.threads))
    return math.sqrt(rate * fair)


def calibrate(n: int = SPEED_GEMM_N, library: str | None = None) -> float:
    """Time the GEMM now (``time_gemm``) and return the CPU's factor from it, without the
    correction of finished runs."""
    return time_gemm(library, n).factor


def latest_timing() -> Timing | None:
    """The CPU's latest GEMM timing in this process, None before the first."""
    return _timings[-1] if _timings else None


def _fresh_timing() -> Timing:
    t = latest_timing()
    return t if t is not None and time.perf_counter() - t.at <= SPEED_FRESH_S else time_gemm()


def import_seconds(image_data: bool, fresh_process: bool = True) -> float:
    """Seconds a run spends before it computes: in a ``fresh_process`` (a command-line run) the
    process's own start and exit (``PROCESS_S``) and its imports of torch, pandas and (for
    ``image_data``) torchvision; in this process only the imports it has not done. CPU seconds
    the calibration measured (else ``IMPORTS``' defaults), stretched by the load of the latest
    timing: one thread among the others ready to run (the larger of its busy cores and its run
    queue) on the usable cores."""
    measured = gemm.last_calibration().get("import_cpu_s", {})
    seconds = PROCESS_S if fresh_process else 0.0
    for name, (modules, default) in IMPORTS.items():
        if name == "torchvision" and not image_data:
            continue
        if fresh_process or not all(m in sys.modules for m in modules):
            seconds += measured.get(name, default)
    t = latest_timing()
    others = [x for x in (t.busy, t.queue) if x is not None] if t is not None else []
    return seconds * (max(1.0, (max(others) + 1.0) / t.usable) if t is not None and others else 1.0)


def seconds_here(reference_s: float, device: str = "cpu", image_data: bool = True) -> dict[str, Any]:
    """A run's reference seconds as seconds here now, for a run in a process of its own (the
    command line's) on ``device`` ("cpu", "cuda"): times ``speed_factor``, plus
    ``import_seconds``. Returns ``estimate_seconds_here`` and its parts: ``speed_factor``,
    ``speed_factor_from`` (``timed_with``), ``import_seconds``, and on the CPU the GEMM timing's
    ``threads`` and ``speed_calibration`` file (else None)."""
    kind = str(device).split(":")[0]
    factor = speed_factor(kind)
    imports = import_seconds(image_data)
    t = latest_timing() if kind == "cpu" and not os.environ.get(SPEED_ENV) else None
    return {"estimate_seconds_here": reference_s * factor + imports, "speed_factor": factor,
            "speed_factor_from": timed_with(kind), "import_seconds": imports, "device": kind,
            "threads": None if t is None else t.threads, "speed_calibration": None if t is None else t.calibration}


def timed_with(device: str = "cpu") -> str | None:
    """How ``speed_factor(device)`` is made now: ``$ENGINE_SPEED_FACTOR``; on the CPU the library
    whose GEMM was timed ("torch" or "numpy"), with " and finished runs" once a run corrected it,
    None before the first timing; on a GPU "finished runs", or "none" (a factor of 1)."""
    kind = str(device).split(":")[0]
    if os.environ.get(SPEED_ENV):
        return SPEED_ENV
    if kind != "cpu":
        return "finished runs" if kind in _correction else "none"
    t = latest_timing()
    if t is None:
        return None
    return t.library + (" and finished runs" if kind in _correction else "")


def record_run(estimated_s: float, measured_s: float, device: str = "cpu") -> float | None:
    """Correct the speed factor of ``device`` ("cpu", "cuda") by a run that finished: its
    measured / estimated seconds over the CPU's GEMM factor when it started (the newest timing
    taken before it), averaged geometrically with the previous correction (weight
    ``SPEED_KEEP``; 1 before the first run on the CPU, none on a GPU). Runs estimated or
    measured under ``SPEED_MIN_RUN_S`` are skipped: their time is fixed costs, not speed (a
    server's first run imports torchvision, seconds, beside an estimate of tenths of a second).
    Returns the factor it gives now against that GEMM timing, or None when nothing was recorded."""
    if not (estimated_s > 0 and measured_s > 0) or min(estimated_s, measured_s) < SPEED_MIN_RUN_S:
        return None
    kind = str(device).split(":")[0]
    base = None
    if kind == "cpu" and _timings:
        started = time.perf_counter() - measured_s
        before = [t for t in _timings if t.at <= started]
        base = (before[-1] if before else _timings[-1]).factor
    seen = measured_s / estimated_s / (base or 1.0)
    prev = _correction.get(kind, 1.0 if base is not None else None)
    _correction[kind] = _clamp(_blend(prev, _clamp(seen)))
    return (base or 1.0) * _correction[kind]


def speed_factor(device: str = "cpu") -> float:
    """How many times longer than its estimate (the reference 2-core CPU's seconds) a run takes
    here now: ``$ENGINE_SPEED_FACTOR`` when set; on the CPU, a GEMM timing at most
    ``SPEED_FRESH_S`` old (``time_gemm``: the threads a run gets now, under the load now) times
    the correction of finished runs; on a GPU that correction, else 1 (the CPU estimate is an
    upper bound). Multiply an ``Estimate``'s seconds by it before deciding what starts by
    itself; a run in a fresh process adds ``import_seconds``."""
    pinned = os.environ.get(SPEED_ENV)
    if pinned:
        try:
            value = float(pinned)
        except ValueError:
            raise BadInput(f"{SPEED_ENV} must be a number > 0, got {pinned!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise BadInput(f"{SPEED_ENV} must be a number > 0, got {pinned!r}")
        return value
    kind = str(device).split(":")[0]
    if kind != "cpu":
        return _correction.get(kind, 1.0)
    return _fresh_timing().factor * _correction.get("cpu", 1.0)  # each clamped, not their product
