"""The empirical NTK of the two-layer ReLU head: closed form, and autograd as its reference.

All kernels are with respect to the trained weights W only (``a`` is fixed) and averaged
over outputs; for these nets every output has the same kernel, so the average is exact.
Kernels are returned as float64 (n1, n2) tensors on the device of the inputs. The
infinite-width kernel is ``engine.maths.kinf``, ridge regression and the distances between
kernels ``engine.maths.ridge``.

Closed form (``NTKMethod.CLOSED``, the default): with features Φ and S = 1[Φ Wᵀ > 0],

    K_m = (Φ1 Φ2ᵀ) ∘ (S1 S2ᵀ) / m.

S is 0/1, so ``S1 S2ᵀ`` is an integer count, exact for m < 2²⁴ through whichever GEMM is
fastest here (``engine.maths.counts``); the kernel is bit for bit the same whichever runs. The
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
from typing import TYPE_CHECKING, Callable

import torch

from ..runtime import budget as B
from ..runtime.errors import BadInput
from .counts import count_dtype, count_product
from .specs import STORAGE
from .tiles import SERIAL_WORK, row_blocks, serial, tile_ranges

if TYPE_CHECKING:
    from .models import Net, TwoLayerReLU

_EXACT_COUNT_LIMIT = 2**24  # float32 holds every integer count below this
_ENTK_TILE = 512      # CPU tile rows of the closed form at most (tiles of 512 x 2048: 8 MiB in float64)
_ENTK_MIN_TILE = 128  # smallest tile side worth a GEMM of its own
_ENTK_SPLIT = 2       # blocks of rows at least, once tiles of _ENTK_MIN_TILE allow it
_ENTK_COLS = 2048     # CPU tile columns: wide enough for the count GEMM to run near its rate


_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def storage_dtype(storage: str) -> torch.dtype:
    if storage not in _DTYPES:
        raise BadInput(f"unknown kernel storage {storage!r}; allowed: {', '.join(STORAGE)}")
    return _DTYPES[storage]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def require_kernel(what: str, n1: int, n2: int, dtype: torch.dtype, device: torch.device | str,
                   bytes_at: Callable[[int, int], int]) -> None:
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
    # int8 S takes the comparison's bools as its own bytes (0/1): no bool temporary cast after
    signs = S.view(torch.bool) if dtype == torch.int8 else S
    for i, i2 in row_blocks(n, chunk):
        if direct:
            torch.mm(phi[i:i2], W.T, out=S[i:i2]).gt_(0)
        else:
            assert P is not None  # allocated above whenever S cannot take the product itself
            torch.gt(torch.mm(phi[i:i2], W.T, out=P[:i2 - i]), 0, out=signs[i:i2])
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
    same = phi2 is None
    n1, n2 = phi1.shape[0], (phi1 if same else phi2).shape[0]
    rows, cols = _entk_tiles(n1, n2, chunk, dev.type)
    cdt = count_dtype(dev, (min(rows, n1), m, min(cols, n2)))  # the count path timed at this kernel's tiles
    csize = _itemsize(cdt)
    require_kernel(f"empirical NTK at width {m}", n1, n2, dtype, dev,
                    lambda k, size: closed_ntk_bytes(k, k if same else n2, m, chunk, same, csize, size, dev.type))
    phi1 = phi1.detach()
    phi2 = phi1 if same else phi2.detach()
    Wc = W.to(phi1.dtype)
    d = phi1.shape[1]
    small = (n1 + (0 if same else n2)) * d * m + n1 * n2 * (m + d)  # multiply-adds of its GEMMs
    with serial(small, dev.type, SERIAL_WORK, 0):  # small kernels: one thread whole
        S1 = _signs(phi1, Wc, cdt, chunk)
        S2 = S1 if same else _signs(phi2, Wc, cdt, chunk)
    K = torch.empty(n1, n2, dtype=dtype, device=dev)
    # float64 storage: each tile is finished in place in K; float32: in a float64 scratch
    # tile, rounded once into K.
    size = rows * min(cols, n2)  # the largest tile
    scratch = None if dtype == torch.float64 else torch.empty(size, dtype=torch.float64, device=dev)
    # For X2 = X1 only the tiles on and right of the diagonal are computed and mirrored. The
    # feature Gram is formed in the features' own precision (float32 features carry no more
    # digits); the counts are exact; their product is taken in float64 (count_product: the
    # counts' GEMM and its conversion, in buffers kept across tiles).
    work: dict = {}
    with serial(small, dev.type, SERIAL_WORK, 0):
        for i, i2, j, j2 in tile_ranges(n1, n2, rows, cols, same):
            G = phi1[i:i2] @ phi2[j:j2].T
            T = K[i:i2, j:j2] if scratch is None else scratch[:G.numel()].view_as(G)
            count_product(G, S1[i:i2], S2[j:j2], T, work)
            with serial(G.numel(), dev.type):
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


def _jacobian_ntk(module: torch.nn.Module, A1: torch.Tensor, A2: torch.Tensor | None, args: tuple = (),
                  chunk: int = 64) -> torch.Tensor:
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


def empirical_ntk(net: Net, X1: torch.Tensor, X2: torch.Tensor | None = None,
                  method: NTKMethod | str = NTKMethod.CLOSED, chunk: int = 2048,
                  X_ref: torch.Tensor | None = None, storage: str = "float64") -> torch.Tensor:
    """Empirical NTK of ``net`` (an ``engine.maths.models.Net``) between raw inputs.

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


def empirical_ntk_at(net: Net, W: torch.Tensor, X: torch.Tensor, X2: torch.Tensor | None = None) -> torch.Tensor:
    """``empirical_ntk(net, X, X2)`` with the head's weights W (m, d) put in place for the call and
    the net's own restored after it (a snapshot along training holds W only)."""
    current = net.mlp.W.detach().clone()
    with torch.no_grad():
        net.mlp.W.copy_(W)
    try:
        return empirical_ntk(net, X, X2)
    finally:
        with torch.no_grad():
            net.mlp.W.copy_(current)


def empirical_ntk_features(head: TwoLayerReLU, phi1: torch.Tensor, phi2: torch.Tensor | None = None,
                           method: NTKMethod | str = NTKMethod.CLOSED, chunk: int = 2048,
                           storage: str = "float64") -> torch.Tensor:
    """As ``empirical_ntk`` but for a ``TwoLayerReLU`` head on given features Φ (n, d)."""
    return _run(NTKMethod(method), head, phi1, phi2, chunk, storage_dtype(storage))


