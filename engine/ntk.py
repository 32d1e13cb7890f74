"""Empirical and infinite-width NTKs of the two-layer ReLU head, and distances between them.

All kernels are with respect to the trained weights W only (``a`` is fixed) and averaged
over outputs; for these nets every output has the same kernel, so the average is exact.
Kernels are returned as float64 (n1, n2) tensors on the device of the inputs.

Closed form (``NTKMethod.CLOSED``, the default): with features Φ and S = 1[Φ Wᵀ > 0],

    K_m = (Φ1 Φ2ᵀ) ∘ (S1 S2ᵀ) / m.

S is 0/1, so ``S1 S2ᵀ`` is an integer count, computed exactly for m < 2²⁴ by whichever GEMM
is fastest here: ``count_dtype(device)`` times int8 (``torch._int_mm``, int32 accumulation),
float32 and, on CUDA, bf16 (fp32 accumulation) once per process and device on a kernel-sized
block and keeps the fastest exact one (``count_path_report`` says which and why; the
environment variable ``ENGINE_COUNT_DTYPE=auto|int8|float32|bfloat16`` forces one). Every
path gives the same integers, so the kernel is bit for bit the same whichever runs. int8 is
not always the fast one: without VNNI, CPU int8 GEMMs run 25–100x below fp32. The
feature Gram is formed in the features' own precision and the product in float64.
``NTKMethod.AUTOGRAD`` contracts per-sample Jacobians from ``torch.func`` and is the
reference the closed form is tested against. Nets with trainable attention (``qkv``) have
no closed form: their kernel covers every parameter and always comes from autograd.

Storage (``STORAGE``) changes nothing in how an entry is computed (closed form: the feature
Gram in the features' precision, exact counts, their product in float64; autograd: the
Jacobian contraction in the Jacobians' precision); it only sets the dtype the finished
entries are written in. ``"float32"`` halves the memory of K; each entry is the float64 one
rounded once (relative error ≤ 2⁻²⁴ ≈ 6e-8, bit for bit ``K64.float()``). Everything
downstream (distances, Cholesky, influence, eigenvalues) reads K into float64, because
κ(K + λI) reaches 1/ridge · n, beyond what a float32 solve resolves.

Before it allocates, every kernel step checks its peak bytes against the device's free
memory and refuses, in one line, what cannot fit: the GiB needed, the n that fits, and
float32 storage where that would fit.
"""

from __future__ import annotations

import enum
import math
import os
import threading
import time

import torch

from . import budget as B
from .errors import BadInput
from .settings import setting

_EXACT_COUNT_LIMIT = 2**24  # float32 holds every integer count below this
_INT8_MIN_INNER = 8  # torch._int_mm on CPU returns garbage for an inner dimension of 1 (seen: torch 2.14)
_ENTK_TILE = 512      # CPU tile rows of the closed form at most (tiles of 512 x 2048: 8 MiB in float64)
_ENTK_MIN_TILE = 128  # smallest tile side worth a GEMM of its own
_ENTK_SPLIT = 2       # blocks of rows at least, once tiles of _ENTK_MIN_TILE allow it
_ENTK_COLS = 2048     # CPU tile columns: wide enough for the count GEMM to run near its rate
_SERIAL_BELOW = 2**21  # element-wise passes over fewer entries run on one thread: every CPU tile (_serial)
_GRAIN = 32768         # torch's own grain: smaller element-wise ops run on one thread anyway
_SERIAL_WORK = 2**29   # kernels with fewer GEMM multiply-adds (~30 ms on one core) run on one thread whole


STORAGE = ("float64", "float32")
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def storage_setting():
    """The ``storage`` field of configs whose runs hold kernels (one help text for all)."""
    return setting("float64", "precision kernels are stored in: float64, or float32 for kernels that do not "
                   "fit otherwise (half the memory; each float64 entry rounded once, solves stay float64; "
                   "influence then moves by up to κ(K+λI)·6e-8: on 8000 MNIST digits 8e-6 for 2L-ReLU, but "
                   "4e-4 and 0.7 % of signs for MLP-Attn)", choices=STORAGE)


def storage_dtype(storage: str) -> torch.dtype:
    if storage not in _DTYPES:
        raise BadInput(f"unknown kernel storage {storage!r}; allowed: {', '.join(STORAGE)}")
    return _DTYPES[storage]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _require_kernel(what: str, n1: int, n2: int, dtype: torch.dtype, device, bytes_at) -> None:
    """Refuse a kernel step over the free memory; ``bytes_at(k, itemsize)`` is its peak with k
    points in place of n1 (and of n2 for a square kernel)."""
    size, small = _itemsize(dtype), bytes_at(n1, 4)
    alternative = f"stored in float32 it needs {small / B.GIB:.1f} GiB (storage float32)" \
        if dtype == torch.float64 else ""
    B.require(bytes_at(n1, size), device, f"the {n1} x {n2} {what} ({str(dtype).removeprefix('torch.')})",
              lambda k: bytes_at(k, size), n1, alternative, small)


class NTKMethod(str, enum.Enum):
    CLOSED = "closed"      # (Φ1Φ2ᵀ)∘(S1S2ᵀ)/m, chunked; default
    AUTOGRAD = "autograd"  # Jacobian contraction through torch.func; reference


def _int_mm_fits(S1: torch.Tensor, S2: torch.Tensor) -> bool:
    """Whether torch._int_mm takes S1 (n1, m) @ S2ᵀ; otherwise the counts go through float32."""
    if S1.device.type == "cuda":  # cuBLASLt int8: more than 16 rows, inner size and columns multiples of 8
        return S1.shape[0] > 16 and S1.shape[1] % 8 == 0 and S2.shape[0] % 8 == 0
    return S1.shape[1] >= _INT8_MIN_INNER


def _counts(S1: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
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
    return _counts(S1, S2).double()


COUNT_DTYPES = ("auto", "int8", "float32", "bfloat16")  # values of ENGINE_COUNT_DTYPE
COUNT_ENV = "ENGINE_COUNT_DTYPE"
_COUNT_TORCH = {"int8": torch.int8, "float32": torch.float32, "bfloat16": torch.bfloat16}
_PROBE = (128, 1024, 256)  # rows x width x columns of the timed block: a row block of a kernel at a usual width
_PROBE_SECONDS = 0.02      # time each path for about this long (one call if it is slow)
_probe_lock = threading.Lock()
_probed: dict[str, dict] = {}


def _device_key(device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def _forced_count_path(device) -> str | None:
    """The path ``ENGINE_COUNT_DTYPE`` forces on ``device``, None for ``auto`` or unset."""
    value = os.environ.get(COUNT_ENV, "").strip().lower() or "auto"
    if value not in COUNT_DTYPES:
        raise BadInput(f"{COUNT_ENV}={value!r} is not a count path; allowed: {', '.join(COUNT_DTYPES)}")
    if value == "bfloat16" and torch.device(device).type != "cuda":
        raise BadInput(f"{COUNT_ENV}=bfloat16 needs CUDA (CPU bf16 GEMMs round counts above 256); "
                       f"on {device} use int8, float32 or auto")
    return None if value == "auto" else value


def _probe_path(name: str, S1: torch.Tensor, S2: torch.Tensor, ref: torch.Tensor, sync, clock) -> dict:
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
        _counts(a, b)
        sync()
        best = min(best, clock() - t0)
        if clock() - start > _PROBE_SECONDS:
            break
    return {"rate_gops": 2 * S1.shape[0] * S1.shape[1] * S2.shape[0] / best / 1e9}


def _probe(device) -> dict:
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
            with _one_thread():
                paths = {name: _probe_path(name, S1, S2, ref, sync, time.thread_time) for name in names}
        rates = {k: v["rate_gops"] for k, v in paths.items() if "rate_gops" in v}
        _probed[key] = {"device": key, "fastest": max(rates, key=rates.get), "rates_gops": rates,
                        "unavailable": {k: v["unavailable"] for k, v in paths.items() if "unavailable" in v},
                        "probe": f"{rows} x {m} @ {m} x {cols} 0/1",
                        "threads": 1 if dev.type == "cpu" else torch.get_num_threads()}
        return _probed[key]


def count_dtype(device="cpu") -> torch.dtype:
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


def count_path_report(device="cpu") -> dict:
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


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) blocks of near-equal sizes <= ``size`` covering range(n)."""
    if n <= 0:
        return []
    k = -(-n // max(1, size))
    step = -(-n // k)
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def _tiles(n1: int, n2: int, rows: int, cols: int, same: bool):
    """(i, i2, j, j2) tiles of an (n1, n2) kernel: row blocks of <= ``rows``, each cut into
    column blocks of <= ``cols``. ``same`` (a symmetric kernel): per row block the square
    diagonal tile, then only the columns right of it; the rest is mirrored."""
    for i, i2 in _blocks(n1, rows):
        if same:
            yield i, i2, i, i2
            yield from ((i, i2, i2 + j, i2 + j2) for j, j2 in _blocks(n2 - i2, cols))
        else:
            yield from ((i, i2, j, j2) for j, j2 in _blocks(n2, cols))


class _serial:
    """Run the enclosed ops on one thread when ``entries`` < _SERIAL_BELOW (then restored;
    below torch's grain they run on one anyway).

    An element-wise pass over a cache-sized tile takes microseconds; split over OpenMP
    threads on a busy machine it waits at the barrier for a thread the OS has not scheduled
    (measured: 0.97 s against 1.4 ms for K∞'s passes at n = 300 with two threads). Per tile
    only element-wise passes go inside, whose results do not depend on the thread count;
    GEMMs stay on every thread, except in a kernel whose GEMMs are small in all
    (< ``_SERIAL_WORK`` multiply-adds, ~30 ms on one core): a small GEMM split over two
    threads waits at the same barrier (K∞ at n = 300: 0.01 of the GEMM rate with two
    threads on a busy machine, 0.24 with one), so such a kernel runs on one thread whole."""

    def __init__(self, entries: int, device_type: str, below: int = _SERIAL_BELOW, grain: int = _GRAIN):
        self.off = (device_type != "cpu" or not grain <= entries < below
                    or torch.get_num_threads() == 1)

    def __enter__(self):
        if not self.off:
            self.threads = torch.get_num_threads()
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if not self.off:
            torch.set_num_threads(self.threads)


def _one_thread() -> _serial:
    """The enclosed CPU ops run on one thread (the thread count is restored after)."""
    return _serial(0, "cpu", below=1, grain=0)


def _entk_tiles(n1: int, n2: int, chunk: int, device_type: str) -> tuple[int, int]:
    """(rows, columns) per tile of the closed-form kernel."""
    if device_type == "cuda":
        return max(1, chunk), max(1, n2)  # row blocks over the full width: few, large kernels
    # CPU: at least _ENTK_SPLIT blocks of rows once n allows tiles of _ENTK_MIN_TILE, so that the
    # symmetric half saves work from n = 2 * _ENTK_MIN_TILE up; at most _ENTK_TILE rows and
    # _ENTK_COLS columns: the count GEMM of a (512, m) @ (m, 512) tile ran at 0.55 of this
    # CPU's GEMM rate, of a (512, m) @ (m, 4000) strip at 0.77; the float64 tile stays 8 MiB.
    rows = max(1, min(chunk, _ENTK_TILE, max(_ENTK_MIN_TILE, -(-max(n1, n2) // _ENTK_SPLIT))))
    return rows, max(rows, _ENTK_COLS)


def _signs(phi: torch.Tensor, W: torch.Tensor, dtype: torch.dtype, chunk: int) -> torch.Tensor:
    """S = 1[Φ Wᵀ > 0] (n, m) in ``dtype``. The pre-activations are written into S itself when
    it has the features' dtype and turned into 0/1 in place (one GEMM, one pass); otherwise
    through a (chunk, m) buffer."""
    n, m = phi.shape[0], W.shape[0]
    S = torch.empty(n, m, dtype=dtype, device=phi.device)
    direct = dtype == phi.dtype
    P = None if direct else torch.empty(min(chunk, n), m, dtype=phi.dtype, device=phi.device)
    for i, i2 in _blocks(n, chunk):
        if direct:
            torch.mm(phi[i:i2], W.T, out=S[i:i2]).gt_(0)
        else:
            torch.gt(torch.mm(phi[i:i2], W.T, out=P[:i2 - i]), 0, out=S[i:i2])
    return S


def closed_ntk_bytes(n1: int, n2: int, m: int, chunk: int, same: bool, count_size: int, itemsize: int,
                     device_type: str = "cpu") -> int:
    """Peak bytes of the closed-form empirical NTK: K (``itemsize`` per entry), the sign
    matrices (``count_size`` per entry), the pre-activation buffer (at most float64) and one
    tile's temporaries (Gram, counts, float64 scratch, and two for the diagonal tile's mean)."""
    rows, cols = _entk_tiles(n1, n2, chunk, device_type)
    signs = (n1 if same else n1 + n2) * m * count_size
    tile = min(rows, n1) * min(cols, n2) * (8 + 8 + 8 + 16)
    return itemsize * n1 * n2 + signs + min(chunk, n1) * m * 8 + tile


def _closed(head, phi1, phi2, chunk, dtype=torch.float64):
    W = head.W.detach()
    m = W.shape[0]
    if m >= _EXACT_COUNT_LIMIT:
        raise BadInput(f"width {m} too large for exact activation counts (limit {_EXACT_COUNT_LIMIT - 1})")
    dev = phi1.device
    cdt = count_dtype(dev)
    same = phi2 is None
    n1, n2 = phi1.shape[0], (phi1 if same else phi2).shape[0]
    csize = _itemsize(cdt)
    _require_kernel(f"empirical NTK at width {m}", n1, n2, dtype, dev,
                    lambda k, size: closed_ntk_bytes(k, k if same else n2, m, chunk, same, csize, size, dev.type))
    phi1 = phi1.detach()
    phi2 = phi1 if same else phi2.detach()
    Wc = W.to(phi1.dtype)
    d = phi1.shape[1]
    small = (n1 + (0 if same else n2)) * d * m + n1 * n2 * (m + d)  # multiply-adds of its GEMMs
    with _serial(small, dev.type, _SERIAL_WORK, 0):  # small kernels: one thread whole
        S1 = _signs(phi1, Wc, cdt, chunk)
        S2 = S1 if same else _signs(phi2, Wc, cdt, chunk)
    K = torch.empty(n1, n2, dtype=dtype, device=dev)
    rows, cols = _entk_tiles(n1, n2, chunk, dev.type)
    # float64 storage: each tile is finished in place in K; float32: in a float64 scratch
    # tile, rounded once into K.
    size = rows * min(cols, n2)  # the largest tile
    scratch = None if dtype == torch.float64 else torch.empty(size, dtype=torch.float64, device=dev)
    # For X2 = X1 only the tiles on and right of the diagonal are computed and mirrored. The
    # feature Gram is formed in the features' own precision (float32 features carry no more
    # digits); the counts are exact; their product is taken in float64: three passes.
    with _serial(small, dev.type, _SERIAL_WORK, 0):
        for i, i2, j, j2 in _tiles(n1, n2, rows, cols, same):
            G = phi1[i:i2] @ phi2[j:j2].T
            C = _counts(S1[i:i2], S2[j:j2])
            T = K[i:i2, j:j2] if scratch is None else scratch[:G.numel()].view_as(G)
            with _serial(G.numel(), dev.type):
                T.copy_(G).mul_(C).div_(m)
                if same and j == i:
                    T.copy_((T + T.T) / 2)  # rounding makes a diagonal tile's Gram a hair asymmetric
                if scratch is not None:
                    K[i:i2, j:j2] = T
                if same and j != i:
                    K[j:j2, i:i2] = K[i:i2, j:j2].T
    return K


def jacobian_bytes(n1: int, n2: int | None, c: int, P: int, itemsize: int) -> int:
    """Peak bytes of the autograd NTK: the per-sample Jacobians of n1 (+ n2) rows, twice (the
    chunks and their concatenation), the kernel as the einsum's float32 result and two
    float64 copies (20 bytes an entry), and 32 MiB for torch.func's own buffers (measured:
    they vary by 20 MiB from run to run)."""
    rows = n1 if n2 is None else n1 + n2
    return 2 * rows * c * P * itemsize + 20 * n1 * (n1 if n2 is None else n2) + 2**25


def _jacobian_ntk(module, A1, A2, args=(), chunk: int = 64):
    """Σ_c J_c(A1) J_c(A2)ᵀ / c from per-sample Jacobians of ``module(x, *args)`` w.r.t.
    all its parameters (torch.func: vmap over samples of jacrev)."""
    from torch.func import functional_call, jacrev, vmap

    params = {k: v.detach() for k, v in module.named_parameters()}
    buffers = dict(module.named_buffers())
    P = sum(v.numel() for v in params.values())
    n_rows = A1.shape[0] + (0 if A2 is None else A2.shape[0])
    with torch.no_grad():
        c = module(A1[:1], *args).shape[1]
    size = A1.element_size()
    n2 = None if A2 is None else A2.shape[0]

    def bytes_at(k):
        return jacobian_bytes(k, n2, c, P, size)

    B.require(bytes_at(A1.shape[0]), A1.device, f"the autograd NTK's Jacobians ({n_rows} samples x {c} outputs x "
              f"{P} parameters)", bytes_at, A1.shape[0], "a smaller width")

    def f(p, x):
        return functional_call(module, (p, buffers), (x[None], *args))[0]  # (c,)

    jac = vmap(jacrev(f), in_dims=(None, 0))

    def J(A):  # (n, c, P)
        return torch.cat([torch.cat([j.flatten(2) for j in jac(params, A[i:i + chunk]).values()], dim=2)
                          for i in range(0, A.shape[0], chunk)])

    J1 = J(A1.detach())
    J2 = J1 if A2 is None else J(A2.detach())
    return torch.einsum("icp,jcp->ij", J1, J2).double() / c


def _autograd(head, phi1, phi2, chunk, dtype=torch.float64):
    return _jacobian_ntk(head, phi1, phi2).to(dtype)


_NTK_FNS = {NTKMethod.CLOSED: _closed, NTKMethod.AUTOGRAD: _autograd}


def empirical_ntk(net, X1: torch.Tensor, X2: torch.Tensor | None = None,
                  method: NTKMethod | str = NTKMethod.CLOSED, chunk: int = 2048,
                  X_ref: torch.Tensor | None = None, storage: str = "float64") -> torch.Tensor:
    """Empirical NTK of ``net`` (an ``engine.models.Net``) between raw inputs.

    X1: (n1, d), X2: (n2, d) or None for X2 = X1 (then S and the symmetric half are shared).
    X_ref: training set that defines MLP-Attn's attention (default: the net's own).
    Returns float64 (n1, n2), averaged over outputs, with respect to W — or, for trainable
    attention (``qkv``, ``net.fixed_features`` False), to every parameter, always by autograd.
    ``NTKMethod.AUTOGRAD`` differentiates the whole net from its raw inputs.
    ``storage``: one of ``STORAGE`` (the dtype of the returned K; see the module notes).
    """
    method = NTKMethod(method)
    dtype = storage_dtype(storage)
    if chunk < 1:
        raise BadInput(f"chunk must be >= 1, got {chunk}")
    if method is NTKMethod.AUTOGRAD or not net.fixed_features:
        ref = net.X_ref if X_ref is None else X_ref
        return _jacobian_ntk(net, X1.to(ref.dtype), None if X2 is None else X2.to(ref.dtype), (ref,)).to(dtype)
    with torch.no_grad():
        phi1 = net.features(X1, X_ref)
        phi2 = None if X2 is None else net.features(X2, X_ref)
    return _run(method, net.mlp, phi1, phi2, chunk, dtype)


def _run(method, head, phi1, phi2, chunk, dtype=torch.float64):
    try:
        return _NTK_FNS[method](head, phi1, phi2, chunk, dtype)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not isinstance(exc, torch.OutOfMemoryError) \
                and "can't allocate memory" not in str(exc):
            raise
        n1 = phi1.shape[0]
        n2 = n1 if phi2 is None else phi2.shape[0]
        raise BadInput(f"out of memory for a {n1} x {n2} kernel at width {head.W.shape[0]} on "
                       f"{phi1.device.type} with chunk {chunk}: use a smaller n (the kernel alone needs "
                       f"{n1 * n2 * _itemsize(dtype) / 2**30:.1f} GiB) or a smaller chunk, e.g. {max(1, chunk // 4)}") from exc


def empirical_ntk_features(head, phi1: torch.Tensor, phi2: torch.Tensor | None = None,
                           method: NTKMethod | str = NTKMethod.CLOSED, chunk: int = 2048,
                           storage: str = "float64") -> torch.Tensor:
    """As ``empirical_ntk`` but for a ``TwoLayerReLU`` head on given features Φ (n, d)."""
    return _run(NTKMethod(method), head, phi1, phi2, chunk, storage_dtype(storage))


_KINF_BLOCK = {"cpu": 2**21, "cuda": 2**26}  # entries per block at most: cache-sized on CPU, large on GPU
_KINF_TILE = 512        # CPU tile rows at most, and _KINF_COLS columns: few GEMM calls (each one waits
_KINF_COLS = 2048       # for every thread on a busy machine), buffers of 8 MiB at most
_KINF_SPLIT = 4         # blocks of rows at least, once tiles of _KINF_MIN_TILE allow it: the symmetric
_KINF_MIN_TILE = 64     # half then skips 3/8 of the GEMM from n = 256 up


def kinf_bytes(n1: int, n2: int, d: int, rows: int, same: bool, itemsize: int) -> int:
    """Peak bytes of ``infinite_ntk``: K, float64 copies of the inputs (and the halved rows), and
    three blocks of at most ``rows`` x n2 (two buffers and a float64 scratch; CPU tiles are
    smaller)."""
    return itemsize * n1 * n2 + 8 * (2 * n1 if same else 2 * n1 + n2) * (d + 1) + 3 * 8 * min(rows, n1) * n2


def _kinf_tiles(n1: int, n2: int, rows: int, device_type: str) -> tuple[int, int]:
    """(rows, columns) per tile of ``infinite_ntk`` with at most ``rows`` rows."""
    if device_type == "cuda":
        return rows, max(1, n2)
    r = max(1, min(rows, _KINF_TILE, max(_KINF_MIN_TILE, -(-max(n1, n2) // _KINF_SPLIT))))
    return r, max(r, _KINF_COLS)


def infinite_ntk(X1: torch.Tensor, X2: torch.Tensor | None = None, chunk: int | None = None,
                 storage: str = "float64") -> torch.Tensor:
    """Infinite-width NTK of the head w.r.t. W, w ~ N(0, σ²I) (independent of σ):

        K∞(x, x') = xᵀx' · (π − θ) / (2π),   θ = arccos(xᵀx' / (|x| |x'|)).

    X1: (n1, d) features (already normalised if the net normalises), X2 likewise or None.
    Returns (n1, n2) in ``storage`` (float64 by default; float32 rounds each float64 entry
    once). Zero rows give zero kernel entries. For X2 = None the result is
    exactly symmetric and its diagonal is exactly ``|x|² / 2`` (θ = 0 there; arccos is
    ill-conditioned at 1, where rounding would cost 1e-8). ``chunk``: rows per tile at most
    (default: about 2²¹ entries per block on CPU, 2²⁶ on CUDA; CPU tiles are cache-sized
    below that); besides the output only three tiles are held, never a temporary the size
    of K. Not differentiable: inputs are detached.
    """
    dtype = storage_dtype(storage)
    same = X2 is None
    n1, n2, d = X1.shape[0], (X1 if same else X2).shape[0], X1.shape[1]
    dev = X1.device
    budget = _KINF_BLOCK["cuda" if dev.type == "cuda" else "cpu"]
    if chunk is not None and chunk < 1:
        raise BadInput(f"chunk must be >= 1, got {chunk}")
    rows = max(1, min(n1, budget // max(n2, 1) if chunk is None else chunk))
    _require_kernel("infinite-width NTK", n1, n2, dtype, dev,
                    lambda k, size: kinf_bytes(k, k if same else n2, d, rows, same, size))
    A = X1.detach().double()
    B_ = A if same else X2.detach().double()
    K = torch.empty(n1, n2, dtype=dtype, device=dev)
    if n1 == 0 or n2 == 0:
        return K
    rA2 = _inverse_norms(A).mul_(2)  # 2/|a|: scales the halved Gram below to the cosine exactly
    rB = rA2 / 2 if same else _inverse_norms(B_)
    r, c = _kinf_tiles(n1, n2, rows, dev.type)
    G_buf = torch.empty(r * min(max(r, c), n2), dtype=torch.float64, device=dev)  # the largest tile
    C_buf = torch.empty_like(G_buf)
    S_buf = None if dtype == torch.float64 else torch.empty_like(G_buf)  # float64 diagonal tiles
    # Symmetric case: only the tiles on and right of the diagonal are computed (about half the
    # GEMM and half the arccos) and mirrored below it. Five passes over each tile after its
    # GEMM, in place: cosine (two scalings), clamp, arccos, then xᵀx'/2 · (1 − θ/π). The GEMM
    # halves its own output (alpha = 1/2, exact), so (π − θ)/(2π) needs no pass of its own.
    with _serial(n1 * n2 * d, dev.type, _SERIAL_WORK, 0):  # small kernels: one thread whole
        for i, i2, j, j2 in _tiles(n1, n2, r, c, same):
            G = G_buf[:(i2 - i) * (j2 - j)].view(i2 - i, j2 - j)
            G.addmm_(A[i:i2], B_[j:j2].T, beta=0, alpha=0.5)  # xᵀx'/2; beta = 0: G's old bytes are not read
            C = C_buf[:G.numel()].view_as(G)
            diagonal = same and i == j
            T = S_buf[:G.numel()].view_as(G) if S_buf is not None and diagonal else K[i:i2, j:j2]
            with _serial(G.numel(), dev.type):
                torch.mul(G, rA2[i:i2, None], out=C).mul_(rB[j:j2]).clamp_(-1.0, 1.0).arccos_()  # θ
                torch.addcmul(G, G, C, value=-1 / math.pi, out=T)  # float32 K: rounded once here
                if diagonal:
                    C.copy_(T.T)
                    T.add_(C).div_(2)  # the diagonal tile's GEMM is a hair asymmetric
                    T.diagonal().copy_((A[i:i2] * A[i:i2]).sum(dim=1) / 2)  # exact: θ = 0 there
                    if S_buf is not None:
                        K[i:i2, j:j2] = T
                else:
                    if same:
                        K[j:j2, i:i2] = K[i:i2, j:j2].T
    return K


def _inverse_norms(A: torch.Tensor) -> torch.Tensor:
    """1 / |a| per row (n,), 0 for zero rows (their cosine is then 0 and K entries 0)."""
    r = A.norm(dim=1)
    return torch.where(r > 0, 1 / r.clamp_min(1e-300), torch.zeros_like(r))


def relative_distance(K: torch.Tensor, K_ref: torch.Tensor, block: int = 1024) -> float:
    """‖K − K_ref‖_F / ‖K_ref‖_F, accumulated in float64 by row blocks (any storage)."""
    num = den = 0.0
    for i in range(0, K.shape[0], block):
        R = K_ref[i:i + block].double()
        num += float((K[i:i + block].double() - R).square().sum())
        den += float(R.square().sum())
    return math.sqrt(num / den) if den else math.nan


def check_ridge(ridge: float, what: str) -> float:
    """A relative ridge λ: finite and > 0 (NaN, inf and 0 give one-line ``BadInput`` naming ``what``)."""
    try:
        value = math.nan if isinstance(ridge, (bool, str, bytes)) else float(ridge)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BadInput(f"{what}: ridge λ must be a finite number > 0, got {ridge!r}")
    return value


def checked_cholesky(A: torch.Tensor, what: str, ridge: float, lam: float, out: torch.Tensor | None = None):
    """Lower Cholesky factor of A = K + λI (n, n), float64, in place when ``out`` is A.

    One-line ``BadInput`` instead of a ``LinAlgError`` (or a factor of NaN): naming the step
    ``what``, n, the ridge and λ, and what to change, when A holds NaN or inf (checked first:
    LAPACK may pass NaN through) or is not positive definite in float64 (duplicate or nearly
    equal training points make K singular, and a ridge near its lower bound cannot lift it)."""
    n = A.shape[0]
    if not B.all_finite(A):
        raise BadInput(f"{what}: the {n} x {n} kernel (+ λI, ridge {ridge:g}) holds NaN or infinite values; "
                       "the net diverged or the inputs overflow: lower the learning rate or the init scale, "
                       "or rescale the data")
    try:
        return torch.linalg.cholesky(A, out=out)
    except torch.linalg.LinAlgError:
        raise BadInput(f"{what}: K + λI is not positive definite for the {n} x {n} kernel at ridge {ridge:g} "
                       f"(λ = {lam:.3g} absolute): duplicate or nearly equal training points make K singular "
                       "and this ridge is too small to lift it; use a larger ridge (e.g. --ridge 1e-3) or "
                       "remove duplicate points") from None


def ridge_factor(K: torch.Tensor, ridge: float, what: str) -> tuple[torch.Tensor, float]:
    """(L, λ): the Cholesky factor of K + λI, λ = ridge · mean diag K, float64 (n, n), from one
    copy of K factored in place (its transpose view has LAPACK's column-major layout, so
    sub-blocks of L stay BLAS-ready). Failures as in ``checked_cholesky``."""
    ridge = check_ridge(ridge, what)
    lam = ridge * float(K.diagonal().double().mean())
    L = K.mT.to(dtype=torch.float64, copy=True)
    L.diagonal().add_(lam)
    checked_cholesky(L, what, ridge, lam, out=L)
    return L, lam


def check_solution(x: torch.Tensor, what: str, ridge: float) -> torch.Tensor:
    """``x`` when finite; else one-line ``BadInput``: the solve with K + λI overflowed."""
    if not B.all_finite(x):
        raise BadInput(f"{what}: solving with K + λI gave NaN or infinite values at ridge {ridge:g} "
                       "(K + λI is too close to singular in float64); use a larger ridge (e.g. --ridge 1e-3)")
    return x


def kernel_regression(K_train: torch.Tensor, K_test_train: torch.Tensor, Y: torch.Tensor,
                      ridge: float, what: str = "kernel ridge regression") -> torch.Tensor:
    """Kernel ridge predictions ``K(x, X) (K + ridge·I)⁻¹ Y``.

    K_train (n, n), K_test_train (n_test, n) in any storage, Y (n, c) float. Solved in
    float64; returns float64 (n_test, c). ``ridge`` is relative to the mean diagonal of
    K_train so that it is scale free. A singular or non-finite kernel is one ``BadInput``
    line naming ``what`` (the caller's step), n and the ridge.
    """
    check_ridge(ridge, what)
    n, nt = K_train.shape[0], K_test_train.shape[0]
    c = Y.reshape(n, -1).shape[1]
    B.require(ridge_bytes(n, nt, c), K_train.device, f"kernel ridge regression on a {n} x {n} kernel (float64)",
              lambda k: ridge_bytes(k, nt, c), n)
    L, _ = ridge_factor(K_train, ridge, what)  # one n x n copy; cholesky_solve makes one more
    alpha = check_solution(torch.cholesky_solve(Y.double().reshape(n, -1), L), what, ridge)
    return K_test_train.double() @ alpha


def ridge_bytes(n: int, n_test: int, c: int) -> int:
    """Peak bytes of ``kernel_regression`` beside its inputs: the factor, the copy of it that
    ``cholesky_solve`` makes, the test kernel in float64 and the small outputs."""
    return 8 * (2 * n * n + 3 * n_test * n + 3 * (n + n_test) * c)


def whitened_distance(K_m: torch.Tensor, K_inf: torch.Tensor, ridge: float = 1e-3,
                      what: str = "the whitened kernel distance") -> float:
    """‖(K∞ + λI)^-½ (K_m − K∞) (K∞ + λI)^-½‖₂, the spectral norm, λ = ridge · mean diag K∞.

    K_m, K_inf: symmetric (n, n) training kernels (any float dtype; computed in float64).
    Scale free, and measured in the geometry kernel ridge regression sees: a value ≪ 1 means
    K_m acts like K∞ on every direction the ridge does not suppress. Computed through the
    Cholesky factor L of K∞ + λI: ``L⁻¹ D L⁻ᵀ`` is similar to the symmetric-square-root
    form (same eigenvalues), so their spectral norms agree. A singular or non-finite K∞, or a
    non-finite K_m, is one ``BadInput`` line naming ``what``, n and the ridge.
    """
    check_ridge(ridge, what)
    if K_m.shape != K_inf.shape or K_m.ndim != 2 or K_m.shape[0] != K_m.shape[1]:
        raise BadInput(f"K_m and K_inf must be the same square shape; got {tuple(K_m.shape)} and {tuple(K_inf.shape)}")
    n = K_m.shape[0]
    B.require(whitened_bytes(n), K_m.device, f"the whitened distance of two {n} x {n} kernels (float64)",
              whitened_bytes, n)
    K_inf = K_inf.double()
    D = K_m.to(K_inf) - K_inf
    D = (D + D.T) / 2  # exact no-op for symmetric inputs; keeps eigvalsh honest otherwise
    lam = ridge * float(K_inf.diagonal().mean())
    if not B.all_finite(D):
        raise BadInput(f"{what}: the {n} x {n} kernel K_m holds NaN or infinite values; the net diverged: "
                       "lower the learning rate or the init scale")
    L = checked_cholesky(K_inf + lam * torch.eye(K_inf.shape[0], dtype=K_inf.dtype, device=K_inf.device),
                         what, ridge, lam)
    Z = torch.linalg.solve_triangular(L, D, upper=False)        # L⁻¹ D
    W = check_solution(torch.linalg.solve_triangular(L, Z.T, upper=False), what, ridge)  # L⁻¹ D L⁻ᵀ
    return float(torch.linalg.eigvalsh((W + W.T) / 2).abs().max())


def whitened_bytes(n: int) -> int:
    """Peak bytes of ``whitened_distance``: twelve n x n float64 arrays (inputs read in
    float64, the difference and its symmetric part, the factor, two solves, the symmetric
    part of the result, eigvalsh's copy and workspace). Repeated runs at n = 2000 peaked
    anywhere between 7 and 10 of them, so the count keeps a margin."""
    return 8 * 12 * n * n


def prediction_gap(K_m: torch.Tensor, K_m_test: torch.Tensor, K_inf: torch.Tensor, K_inf_test: torch.Tensor,
                   Y: torch.Tensor, ridge: float = 1e-3) -> float:
    """‖f_KRR(K_m) − f_KRR(K∞)‖_F / ‖f_KRR(K∞)‖_F on the test points.

    K_m, K_inf: (n, n) training kernels; K_m_test, K_inf_test: (n_test, n); Y: (n, c) or (n,)
    targets. ``f_KRR`` is ``kernel_regression`` with ``ridge`` relative to each kernel's own
    mean diagonal.
    """
    f_m = kernel_regression(K_m.double(), K_m_test.double(), Y, ridge, "kernel ridge regression on K_m")
    f_inf = kernel_regression(K_inf.double(), K_inf_test.double(), Y, ridge, "kernel ridge regression on K∞")
    return float(torch.linalg.norm(f_m - f_inf) / torch.linalg.norm(f_inf))
