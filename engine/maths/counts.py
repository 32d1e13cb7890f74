"""Exact activation counts S1 S2ᵀ of 0/1 matrices, through whichever GEMM is fastest here.

``count_dtype(device)`` times int8 (``torch._int_mm``, int32 accumulation), float32 and, on
CUDA, bf16 (fp32 accumulation) once per process and device on a kernel-sized block, and keeps
the fastest exact one; ``count_path_report`` says which and why. ``ENGINE_COUNT_DTYPE=auto|int8|
float32|bfloat16`` forces one. Every path gives the same integers for m < 2²⁴, so the kernel is
bit for bit the same whichever runs. int8 is not always the fast one: without VNNI, CPU int8
GEMMs run 25–100x below fp32.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

import torch

from ..runtime.errors import BadInput
from .tiles import one_thread

_INT8_MIN_INNER = 8  # torch._int_mm on CPU returns garbage for an inner dimension of 1 (seen: torch 2.14)


def _int_mm_fits(S1: torch.Tensor, S2: torch.Tensor) -> bool:
    """Whether torch._int_mm takes S1 (n1, m) @ S2ᵀ; otherwise the counts go through float32."""
    if S1.device.type == "cuda":  # cuBLASLt int8: more than 16 rows, inner size and columns multiples of 8
        return S1.shape[0] > 16 and S1.shape[1] % 8 == 0 and S2.shape[0] % 8 == 0
    return S1.shape[1] >= _INT8_MIN_INNER


def gemm_counts(S1: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
    """S1 S2ᵀ of 0/1 matrices through S's own GEMM: exact integers in float32 or int32."""
    if S1.dtype == torch.bfloat16:  # CUDA only: tensor cores accumulate and write fp32
        return torch.mm(S1, S2.T, out_dtype=torch.float32)
    if S1.dtype == torch.int8:
        if _int_mm_fits(S1, S2):
            return torch._int_mm(S1, S2.T)
        S1, S2 = S1.float(), S2.float()
    return S1 @ S2.T


def exact_counts(S1: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
    """S1 S2ᵀ of 0/1 matrices S1 (n1, m), S2 (n2, m) as exact float64 counts (n1, n2).

    S's dtype picks the GEMM: bf16 (CUDA, fp32 accumulation), int8 (``torch._int_mm``, int32
    accumulation; float32 for shapes it does not take) or float32/float64. All are exact for
    m < 2²⁴; ``count_dtype`` says which is fastest on a device.
    """
    return gemm_counts(S1, S2).double()


COUNT_DTYPES = ("auto", "int8", "float32", "bfloat16")  # values of ENGINE_COUNT_DTYPE
COUNT_ENV = "ENGINE_COUNT_DTYPE"
_COUNT_TORCH = {"int8": torch.int8, "float32": torch.float32, "bfloat16": torch.bfloat16}
_PROBE = (128, 1024, 256)  # rows x width x columns of the timed block: a row block of a kernel at a usual width
_PROBE_SECONDS = 0.02      # time each path for about this long (one call if it is slow)
_probe_lock = threading.Lock()
_probed: dict[str, dict] = {}


def _device_key(device: torch.device | str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def _forced_count_path(device: torch.device | str) -> str | None:
    """The path ``ENGINE_COUNT_DTYPE`` forces on ``device``, None for ``auto`` or unset."""
    value = os.environ.get(COUNT_ENV, "").strip().lower() or "auto"
    if value not in COUNT_DTYPES:
        raise BadInput(f"{COUNT_ENV}={value!r} is not a count path; allowed: {', '.join(COUNT_DTYPES)}")
    if value == "bfloat16" and torch.device(device).type != "cuda":
        raise BadInput(f"{COUNT_ENV}=bfloat16 needs CUDA (CPU bf16 GEMMs round counts above 256); "
                       f"on {device} use int8, float32 or auto")
    return None if value == "auto" else value


def _probe_path(name: str, S1: torch.Tensor, S2: torch.Tensor, ref: torch.Tensor, sync: Callable[[], None],
                clock: Callable[[], float]) -> dict:
    """{"rate_gops"} or {"unavailable": why} for one count path on the probe block, timed by
    ``clock`` (best of up to five calls within _PROBE_SECONDS, after a warm-up)."""
    a, b = S1.to(_COUNT_TORCH[name]), S2.to(_COUNT_TORCH[name])
    try:
        exact = torch.equal(exact_counts(a, b), ref)  # also the warm-up call
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        if isinstance(exc, torch.OutOfMemoryError):
            raise
        return {"unavailable": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"}
    if not exact:
        return {"unavailable": "counts not exact"}
    best, start = math.inf, clock()
    for _ in range(5):
        t0 = clock()
        gemm_counts(a, b)
        sync()
        best = min(best, clock() - t0)
        if clock() - start > _PROBE_SECONDS:
            break
    return {"rate_gops": 2 * S1.shape[0] * S1.shape[1] * S2.shape[0] / best / 1e9}


def _probe(device: torch.device | str) -> dict:
    """Time every exact count path on ``device`` once per process (cached by device)."""
    key = _device_key(device)
    with _probe_lock:
        if key in _probed:
            return _probed[key]
        dev = torch.device(key)
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        rows, m, cols = _PROBE
        g = torch.Generator().manual_seed(0)
        S1 = (torch.rand(rows, m, generator=g) > 0.5).to(dev)
        S2 = (torch.rand(cols, m, generator=g) > 0.5).to(dev)
        ref = S1.double() @ S2.double().T  # exact: integers far below 2⁵³
        names = ("bfloat16", "int8", "float32") if dev.type == "cuda" else ("float32", "int8")
        if dev.type == "cuda":
            paths = {name: _probe_path(name, S1, S2, ref, sync, time.perf_counter) for name in names}
        else:
            # One thread, timed in this thread's CPU seconds: which path is faster is a property
            # of the instruction set, and two threads on a busy machine time the barrier
            # instead (measured: fp32 0.46 against int8 0.39 Gop/s, where one thread gives
            # 70-80 against 2-3).
            with one_thread():
                paths = {name: _probe_path(name, S1, S2, ref, sync, time.thread_time) for name in names}
        rates = {k: v["rate_gops"] for k, v in paths.items() if "rate_gops" in v}
        _probed[key] = {"device": key, "fastest": max(rates, key=lambda k: rates[k]), "rates_gops": rates,
                        "unavailable": {k: v["unavailable"] for k, v in paths.items() if "unavailable" in v},
                        "probe": f"{rows} x {m} @ {m} x {cols} 0/1",
                        "threads": 1 if dev.type == "cpu" else torch.get_num_threads()}
        return _probed[key]


def count_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype of the 0/1 sign matrices whose GEMM gives exact counts fastest on ``device``.

    ``ENGINE_COUNT_DTYPE`` (int8, float32, bfloat16) forces a path; unset or ``auto``, every
    exact path is timed (on CPU: on one thread, in its CPU seconds) on a (128, 1024) @
    (1024, 256) block the first time a device asks
    (tens of milliseconds, once per process) and the fastest is kept. float32 is always exact
    (m < 2²⁴) and the fallback. Raises ``BadInput`` for an unknown value, bf16 off CUDA, or a
    forced path this torch build cannot run.
    """
    forced = _forced_count_path(device)
    if forced is None:
        return _COUNT_TORCH[_probe(device)["fastest"]]
    why = _probe(device)["unavailable"].get(forced)
    if why:
        raise BadInput(f"{COUNT_ENV}={forced} cannot run on {_device_key(device)} ({why}); "
                       f"use {' or '.join(_probe(device)['rates_gops'])} or auto")
    return _COUNT_TORCH[forced]


def cpu_count_dtype() -> torch.dtype:
    """``count_dtype("cpu")``."""
    return count_dtype("cpu")


def count_path_report(device: torch.device | str = "cpu") -> dict:
    """Which count path kernels use on ``device`` and why (JSON-able; for bench and provenance).

    Keys: ``count_dtype`` (the path in use), ``source`` ("measured" or "ENGINE_COUNT_DTYPE"),
    ``fastest`` (the measured choice), ``rates_gops`` (each exact path's rate on the probe,
    10⁹ multiply-adds x 2 per second), ``unavailable`` (path: why), ``probe`` (the block
    timed), ``threads`` (torch threads when it was timed), ``device``.
    """
    report = dict(_probe(device))
    forced = _forced_count_path(device)
    used = str(count_dtype(device)).removeprefix("torch.")
    return {**report, "count_dtype": used, "source": COUNT_ENV if forced else "measured"}


def measured_count_paths() -> dict:
    """{device: ``count_path_report(device)``} for each device this process has already timed
    (this call times nothing): the count paths its empirical NTKs used, for provenance."""
    with _probe_lock:
        devices = list(_probed)
    return {d: count_path_report(d) for d in devices}
