"""This machine's speed now: the factor that turns the reference estimates into seconds here.

Estimates (``engine.runtime.budget``) are in seconds of a reference 2-core machine. A short
float32 GEMM calibrates the factor on first use (``calibrate``: that GEMM's rate where the
estimates hold, over its rate now), and every run that finishes refreshes it with its measured
against its estimated time (``record_run``), per device type. ``$ENGINE_SPEED_FACTOR`` pins it.
The GEMM is torch's when torch is loaded (the dashboard, a run) and numpy's otherwise (an
``--estimate`` on the command line, which then costs about 0.4 s of CPU instead of 3-5 s).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from .errors import BadInput

SPEED_GEMM_N = 768        # the calibration GEMM: 768³ float32, ~0.9 GFLOP, a few ms to a few tenths of a second
# That GEMM's rate on a machine where the estimates hold (measured / estimated = 1). Set from
# `bench --estimates` on a 2-core AMD EPYC (AVX2, torch's 2 threads, 2026-12-02): its probes ran
# 1.6x longer than estimated (geometric mean of eight, two rounds; benchmarks/RESULTS.md) while
# this GEMM ran at 125 GFLOP/s, so 1.6 x 125. Timed against budget.FLOPS instead (the effective
# rate of whole steps, 60 GFLOP/s, not of one large GEMM), that machine read as 2x faster than the
# estimates when it was 1.6x slower, and runs the dashboard judged under 30 s took a minute or more.
SPEED_GEMM_FLOPS = 2.0e11
# numpy's BLAS (OpenBLAS) ran the same GEMM 1.35x faster than torch's (MKL) on that machine
# (benchmarks/RESULTS.md, start-up), so its reference is 1.35 x as high. Where the two BLAS
# differ by another ratio, the numpy-timed factor is off by the difference (RESULTS.md gives
# it on a second CPU); finished runs correct it (record_run).
SPEED_GEMM_FLOPS_NUMPY = 1.35 * SPEED_GEMM_FLOPS
SPEED_REPEATS = 5         # timed products after one warm-up; their median (a loaded machine's rate, not its best)
SPEED_MIN, SPEED_MAX = 0.25, 100.0  # factors beyond these are a broken timer, not a machine
SPEED_MIN_RUN_S = 2.0     # runs shorter than this (estimated or measured) are mostly fixed costs: not recorded
SPEED_KEEP = 0.5          # weight of the previous factor when a finished run refreshes it (geometric mean)
SPEED_ENV = "ENGINE_SPEED_FACTOR"  # pins the factor (tests, or a user who knows better)
_speed: dict[str, float] = {}      # device type -> measured / estimated, from the runs that finished here
_gemm_factor: list[float] = []     # the latest GEMM calibration (CPU), empty until one has run
_gemm_library: list[str] = []      # the library that GEMM was timed with: "torch" or "numpy"


def _clamp_speed(factor: float) -> float:
    return float(min(max(factor, SPEED_MIN), SPEED_MAX))


def calibrate(n: int = SPEED_GEMM_N, repeats: int = SPEED_REPEATS, library: str | None = None) -> float:
    """Time an (n, n) @ (n, n) float32 GEMM on the CPU now and store its reference rate over its
    rate now as the speed factor used until a finished run refreshes it (``record_run``). A
    fraction of a second; a loaded machine gives a factor above 1. ``library``: "torch"
    (reference ``SPEED_GEMM_FLOPS``) or "numpy" (``SPEED_GEMM_FLOPS_NUMPY``); default torch
    when it is loaded, else numpy. Returns the factor."""
    import statistics
    import time

    library = library or ("torch" if "torch" in sys.modules else "numpy")
    a: Any  # the two operands: torch tensors or numpy arrays, by library
    b: Any
    if library == "torch":
        import torch

        a, b, reference = torch.randn(n, n), torch.randn(n, n), SPEED_GEMM_FLOPS
    elif library == "numpy":
        import numpy as np

        g = np.random.default_rng(0)
        a, b = (g.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        reference = SPEED_GEMM_FLOPS_NUMPY
    else:
        raise BadInput(f"unknown GEMM library {library!r}; allowed: torch, numpy")
    a @ b  # warm-up: thread pool and allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    rate = 2.0 * n ** 3 / max(statistics.median(times), 1e-9)
    factor = _clamp_speed(reference / rate)
    _gemm_factor[:], _gemm_library[:] = [factor], [library]
    return factor


def timed_with(device: str = "cpu") -> str | None:
    """How ``speed_factor(device)`` is made now: ``$ENGINE_SPEED_FACTOR``, "finished runs", a GEMM
    timed with "torch" or "numpy" (CPU), "none" (a GPU no run has finished on: 1), or None
    before the CPU's first calibration."""
    kind = str(device).split(":")[0]
    if os.environ.get(SPEED_ENV):
        return SPEED_ENV
    if kind in _speed:
        return "finished runs"
    if kind != "cpu":
        return "none"
    return _gemm_library[0] if _gemm_library else None


def record_run(estimated_s: float, measured_s: float, device: str = "cpu") -> float | None:
    """Refresh the speed factor of ``device`` ("cpu", "cuda") from a run that finished:
    measured / estimated seconds, averaged geometrically with the previous factor (weight
    ``SPEED_KEEP``; before the first run, the CPU's GEMM calibration where it has run). Runs
    estimated or measured under ``SPEED_MIN_RUN_S`` are skipped: their time is fixed costs, not
    speed (a server's first run imports torchvision, seconds, beside an estimate of tenths of a
    second, and alone would multiply every later estimate by 20). Returns the new factor, or
    None when nothing was recorded."""
    if not (estimated_s > 0 and measured_s > 0) or min(estimated_s, measured_s) < SPEED_MIN_RUN_S:
        return None
    ratio = _clamp_speed(measured_s / estimated_s)
    prev = _speed.get(device, _gemm_factor[0] if device == "cpu" and _gemm_factor else None)
    new = ratio if prev is None else math.exp(SPEED_KEEP * math.log(prev) + (1 - SPEED_KEEP) * math.log(ratio))
    _speed[device] = _clamp_speed(new)
    return _speed[device]


def speed_factor(device: str = "cpu") -> float:
    """How many times longer than its estimate (the reference 2-core CPU's seconds) a run takes
    here now: ``$ENGINE_SPEED_FACTOR`` when set; else the factor refreshed by the runs that
    finished on this device type (``record_run``); else, on the CPU, a GEMM timing against
    ``SPEED_GEMM_FLOPS`` (``calibrate``, run once on first use); else 1 (a GPU: the CPU estimate is an
    upper bound). Multiply an ``Estimate``'s seconds by it before deciding what starts by itself."""
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
    if kind in _speed:
        return _speed[kind]
    if kind != "cpu":
        return 1.0
    return _gemm_factor[0] if _gemm_factor else calibrate()
