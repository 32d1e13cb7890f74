"""Exact activation counts S1 S2ᵀ of 0/1 matrices, through whichever path is fastest here.

A count path is the GEMM (int8 through ``torch._int_mm`` with int32 accumulation, float32, or
on CUDA bf16 with fp32 accumulation) *and* the conversion of its counts into the float64
product a kernel needs: ``count_product`` is that whole path for one tile of K_m,
``exact_counts`` for float64 counts alone. Both convert in same-dtype passes through reused
buffers: a mixed int32 x float64 multiply falls into torch's per-element casting loop (measured
here: 4-11x a vectorised pass; issue 36 saw the conversion take 0.275 s beside a 0.041 s int8
GEMM on an AMX CPU).

``count_dtype(device, shape)`` times every exact path's whole tile path once per process,
device and tile shape, on a block of that tile (its width m, up to ``_PROBE_COLS`` of its
columns and ``_PROBE_ROWS`` of its rows, rounded down to powers of two), and keeps float32 unless another path is at least
``_MARGIN`` faster there; without a shape, on a fixed (128, 1024) @ (1024, 256) block.
``count_path_report`` says which and why. ``ENGINE_COUNT_DTYPE=auto|int8|float32|bfloat16``
forces one. Every path gives the same integers for m < 2²⁴, so the kernel is bit for bit the
same whichever runs. int8 is not always the fast one: without VNNI, CPU int8 GEMMs run 25-100x
below fp32.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from typing import Callable

import torch

from ..runtime.errors import BadInput
from .tiles import one_thread, serial

_INT8_MIN_INNER = 8  # torch._int_mm on CPU returns garbage for an inner dimension of 1 (seen: torch 2.14)
_PASS_ENTRIES = 2**18  # float64 entries converted and multiplied per pass on CPU: 2 MiB, cache-sized
_GEMM_ROWS = 256       # rows per count GEMM of exact_counts: near the GEMM's rate, a reused int32 block


def _int_mm_fits(S1: torch.Tensor, S2: torch.Tensor) -> bool:
    """Whether torch._int_mm takes S1 (n1, m) @ S2ᵀ; otherwise the counts go through float32."""
    if S1.device.type == "cuda":  # cuBLASLt int8: more than 16 rows, inner size and columns multiples of 8
        return S1.shape[0] > 16 and S1.shape[1] % 8 == 0 and S2.shape[0] % 8 == 0
    return S1.shape[1] >= _INT8_MIN_INNER


def gemm_counts(S1: torch.Tensor, S2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """S1 S2ᵀ of 0/1 matrices through S's own GEMM: exact integers in float32 or int32.

    ``out`` (n1, n2), optional: a buffer the counts are written into when its dtype is the
    one this path produces (int32 for int8 S, else float32/float64); read the returned tensor.
    """
    if S1.dtype == torch.int8 and _int_mm_fits(S1, S2):
        return torch._int_mm(S1, S2.T) if out is None or out.dtype != torch.int32 else \
            torch._int_mm(S1, S2.T, out=out)
    if S1.dtype == torch.bfloat16:  # CUDA only: tensor cores accumulate and write fp32
        return torch.mm(S1, S2.T, out_dtype=torch.float32)
    if S1.dtype == torch.int8:
        S1, S2 = S1.float(), S2.float()
    return S1 @ S2.T if out is None or out.dtype != S1.dtype else torch.mm(S1, S2.T, out=out)


def _buffer(work: dict, key: str, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (shape) view of ``work[key]``, a flat buffer kept between calls and grown when needed."""
    numel = shape[0] * shape[1]
    buf = work.get(key)
    if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
        buf = work[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel].view(shape)


def _counts_dtype(S: torch.Tensor) -> torch.dtype:
    return torch.int32 if S.dtype == torch.int8 else torch.float64 if S.dtype == torch.float64 else torch.float32


def exact_counts(S1: torch.Tensor, S2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """S1 S2ᵀ of 0/1 matrices S1 (n1, m), S2 (n2, m) as exact float64 counts (n1, n2).

    S's dtype picks the GEMM: bf16 (CUDA, fp32 accumulation), int8 (``torch._int_mm``, int32
    accumulation; float32 for shapes it does not take) or float32/float64. All are exact for
    m < 2²⁴; ``count_dtype`` says which is fastest on a device. The GEMM runs in blocks of
    ``_GEMM_ROWS`` rows into one reused buffer, each block converted into ``out`` (float64,
    allocated when None) by one vectorised pass.
    """
    n1, n2 = S1.shape[0], S2.shape[0]
    out = torch.empty(n1, n2, dtype=torch.float64, device=S1.device) if out is None else out
    work: dict = {}
    for i in range(0, n1, _GEMM_ROWS):
        i2 = min(i + _GEMM_ROWS, n1)
        out[i:i2].copy_(gemm_counts(S1[i:i2], S2, _buffer(work, "counts", (i2 - i, n2), _counts_dtype(S1),
                                                          S1.device)))
    return out


def count_product(G: torch.Tensor, S1: torch.Tensor, S2: torch.Tensor, out: torch.Tensor,
                  work: dict | None = None) -> torch.Tensor:
    """out ← G ∘ (S1 S2ᵀ) / m in float64: one tile of the closed-form K_m, the whole count path.

    G (n1, n2): the feature Gram, any float dtype; S1 (n1, m), S2 (n2, m): 0/1 in a count
    dtype (``count_dtype``); out (n1, n2) float64, may be a view into K. Each entry is
    float64(G) · float64(count) / m, each operation rounded once: the same bits on every path
    and blocking. The counts' GEMM runs on every thread into a buffer kept in ``work`` (pass
    the same dict for every tile of a kernel); the conversion and the product run in passes
    of ``_PASS_ENTRIES`` (the tile whole on CUDA), each pass of one dtype.
    """
    work = {} if work is None else work
    n1, n2 = out.shape
    m = S1.shape[1]
    C = gemm_counts(S1, S2, _buffer(work, "counts", (n1, n2), _counts_dtype(S1), out.device))
    step = n1 if out.device.type == "cuda" else max(1, min(n1, _PASS_ENTRIES // max(1, n2)))
    X = _buffer(work, "float64", (step, n2), torch.float64, out.device)
    with serial(out.numel(), out.device.type):
        for i in range(0, n1, step):
            i2 = min(i + step, n1)
            x = X[:i2 - i]
            x.copy_(C[i:i2])  # exact: integers below 2²⁴
            out[i:i2].copy_(G[i:i2]).mul_(x).div_(m)
    return out


COUNT_DTYPES = ("auto", "int8", "float32", "bfloat16")  # values of ENGINE_COUNT_DTYPE
COUNT_ENV = "ENGINE_COUNT_DTYPE"
_COUNT_TORCH = {"int8": torch.int8, "float32": torch.float32, "bfloat16": torch.bfloat16}
_PROBE = (128, 1024, 256)  # rows x width x columns of the block timed without a shape
_PROBE_ROWS = 128          # a tile's block keeps at most this many rows,
_PROBE_COLS = 1024         # this many columns,
_PROBE_WIDTH = 8192        # and this width (wider, the GEMM is all of the path: its rate no longer moves)
_PROBE_SECONDS = 0.02      # time each path for about this long (one call after the warm-up if it is slow)
_MARGIN = 1.1              # another path replaces float32 only this much faster: the probe's own noise
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


def _block(block: tuple[int, int, int], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random 0/1 S1 (rows, m), S2 (cols, m) as int8 and a float32 Gram (rows, cols) on ``dev``.
    S2 repeats S1's first rows (a GEMM's time does not depend on its values; drawing them all
    took longer than timing the paths)."""
    rows, m, cols = block
    g = torch.Generator().manual_seed(0)
    S1 = torch.randint(0, 2, (rows, m), generator=g, dtype=torch.int8)
    S2 = S1[:64].repeat(-(-cols // min(64, rows)), 1)[:cols]
    return S1.to(dev), S2.to(dev), torch.rand(rows, cols, generator=g).to(dev)


def _timed(fn: Callable[[], object], sync: Callable[[], None], clock: Callable[[], float]) -> float:
    """Best seconds of ``fn`` by ``clock`` over up to three calls within _PROBE_SECONDS (after a
    warm-up call)."""
    fn()
    sync()
    best, start = math.inf, clock()
    for _ in range(3):
        t0 = clock()
        fn()
        sync()
        best = min(best, clock() - t0)
        if clock() - start > _PROBE_SECONDS:
            break
    return best


def _rates(dev: torch.device, block: tuple[int, int, int], names: list[str],
           check: bool) -> tuple[dict[str, float], dict[str, str]]:
    """({path: rate of its whole tile path on ``block``, Gop/s}, {path: why unavailable}); with
    ``check``, each path's counts are first compared with float64 ones."""
    S1, S2, G = _block(block, dev)
    ref = S1.double() @ S2.double().T if check else None  # exact: integers far below 2⁵³
    out = torch.empty(G.shape, dtype=torch.float64, device=dev)
    rates, unavailable = {}, {}
    if dev.type == "cuda":
        sync, clock, ctx = (lambda: torch.cuda.synchronize(dev)), time.perf_counter, serial(0, "cuda")
    else:
        # One thread, timed in this thread's CPU seconds: which path is faster is a property
        # of the instruction set, and two threads on a busy machine time the barrier
        # instead (measured: fp32 0.46 against int8 0.39 Gop/s, where one thread gives
        # 70-80 against 2-3).
        sync, clock, ctx = (lambda: None), time.thread_time, one_thread()
    with ctx:
        for name in names:
            a, b = S1.to(_COUNT_TORCH[name]), S2.to(_COUNT_TORCH[name])
            if ref is not None:
                try:
                    exact = torch.equal(exact_counts(a, b), ref)
                except (RuntimeError, NotImplementedError, AttributeError) as exc:
                    if isinstance(exc, torch.OutOfMemoryError):
                        raise
                    unavailable[name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
                    continue
                if not exact:
                    unavailable[name] = "counts not exact"
                    continue
            seconds = _timed(functools.partial(count_product, G, a, b, out, {}), sync, clock)
            rates[name] = 2 * block[0] * block[1] * block[2] / seconds / 1e9
    return rates, unavailable


def _choose(rates: dict[str, float]) -> str:
    """float32 unless another path's rate is at least _MARGIN times its own."""
    best = max(rates, key=lambda k: rates[k])
    return best if "float32" not in rates or rates[best] >= _MARGIN * rates["float32"] else "float32"


def _label(block: tuple[int, int, int]) -> str:
    rows, m, cols = block
    return f"{rows} x {m} @ {m} x {cols} 0/1"


def _probe(device: torch.device | str) -> dict:
    """Check and time every exact count path on ``device`` once per process (cached by device)."""
    key = _device_key(device)
    with _probe_lock:
        if key in _probed:
            return _probed[key]
        dev = torch.device(key)
        names = ["bfloat16", "int8", "float32"] if dev.type == "cuda" else ["float32", "int8"]
        rates, unavailable = _rates(dev, _PROBE, names, check=True)
        _probed[key] = {"device": key, "fastest": _choose(rates), "rates_gops": rates, "unavailable": unavailable,
                        "probe": _label(_PROBE), "threads": 1 if dev.type == "cpu" else torch.get_num_threads(),
                        "shapes": {}}
        return _probed[key]


def _probe_block(tile: tuple[int, int, int]) -> tuple[int, int, int]:
    """The block timed for tiles of (rows, m, cols): the width m (at most _PROBE_WIDTH), rows and
    columns rounded down to powers of two up to _PROBE_ROWS and _PROBE_COLS, so that kernels of
    nearby sizes share one probe."""
    rows, m, cols = tile
    return (2 ** int(math.log2(max(1, min(rows, _PROBE_ROWS)))), max(1, min(m, _PROBE_WIDTH)),
            2 ** int(math.log2(max(1, min(cols, _PROBE_COLS)))))


def _probe_shape(device: torch.device | str, tile: tuple[int, int, int]) -> str:
    """The fastest path for tiles of ``tile`` = (rows, m, cols) on ``device``: the available
    paths' whole tile path timed on its block once per process (cached by device and block)."""
    base = _probe(device)
    block = _probe_block(tile)
    label = _label(block)
    with _probe_lock:
        if label not in base["shapes"]:
            rates, _ = _rates(torch.device(base["device"]), block, list(base["rates_gops"]), check=False)
            base["shapes"][label] = {"fastest": _choose(rates), "rates_gops": rates}
        return base["shapes"][label]["fastest"]


def count_dtype(device: torch.device | str = "cpu", tile: tuple[int, int, int] | None = None) -> torch.dtype:
    """The dtype of the 0/1 sign matrices whose count path is fastest on ``device``.

    ``tile``: (rows, m, columns) of the kernel's tiles; each exact path's whole tile path
    (``count_product``: GEMM and conversion) is timed on a block of it (on CPU: on one
    thread, in its CPU seconds) the first time a device asks for such a block (tens of
    milliseconds, once per process). Without ``tile``, on a (128, 1024) @ (1024, 256) block.
    float32 is always exact (m < 2²⁴), the fallback, and kept unless another path is at least
    ``_MARGIN`` faster. ``ENGINE_COUNT_DTYPE`` (int8, float32, bfloat16) forces a path. Raises
    ``BadInput`` for an unknown value, bf16 off CUDA, or a forced path this torch build
    cannot run.
    """
    forced = _forced_count_path(device)
    if forced is None:
        return _COUNT_TORCH[_probe(device)["fastest"] if tile is None else _probe_shape(device, tile)]
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

    Keys: ``count_dtype`` (the path in use without a tile), ``source`` ("measured" or
    ``ENGINE_COUNT_DTYPE``), ``fastest`` (the measured choice), ``rates_gops`` (each exact
    path's whole tile path on the probe, 10⁹ multiply-adds x 2 per second), ``unavailable``
    (path: why), ``probe`` (the block timed), ``threads`` (torch threads when it was timed),
    ``shapes`` (block: {"fastest", "rates_gops"} for each kernel tile timed so far), ``device``.
    """
    report = dict(_probe(device))
    report["shapes"] = {k: dict(v) for k, v in report["shapes"].items()}
    forced = _forced_count_path(device)
    used = str(count_dtype(device)).removeprefix("torch.")
    return {**report, "count_dtype": used, "source": COUNT_ENV if forced else "measured"}


def measured_count_paths() -> dict:
    """{device: ``count_path_report(device)``} for each device this process has already timed
    (this call times nothing): the count paths its empirical NTKs used, for provenance."""
    with _probe_lock:
        devices = list(_probed)
    return {d: count_path_report(d) for d in devices}
