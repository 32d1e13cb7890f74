"""Empirical and infinite-width NTKs of the two-layer ReLU head, and distances between them.

All kernels are with respect to the trained weights W only (``a`` is fixed) and averaged
over outputs; for these nets every output has the same kernel, so the average is exact.
Kernels are returned as float64 (n1, n2) tensors on the device of the inputs.

Closed form (``NTKMethod.CLOSED``, the default): with features Φ and S = 1[Φ Wᵀ > 0],

    K_m = (Φ1 Φ2ᵀ) ∘ (S1 S2ᵀ) / m.

S is 0/1, so ``S1 S2ᵀ`` is an integer count, computed exactly with low-precision GEMMs
(int8 with int32 accumulation on CPU, bf16 with fp32 accumulation on CUDA) for m < 2²⁴;
the feature Gram is formed in the features' own precision and the product in float64. ``NTKMethod.AUTOGRAD`` contracts per-sample Jacobians from
``torch.func`` and is the reference the closed form is tested against. Nets with trainable attention (``qkv``) have no closed
form: their kernel covers every parameter and always comes from autograd.

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
import functools
import math

import torch

from . import budget as B
from .errors import BadInput
from .settings import setting

_EXACT_COUNT_LIMIT = 2**24  # float32 holds every integer count below this
_INT8_MIN_INNER = 8  # torch._int_mm on CPU returns garbage for an inner dimension of 1 (seen: torch 2.14)


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


def exact_counts(S1: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
    """S1 S2ᵀ of 0/1 matrices as exact float64 counts.

    CUDA: S is bf16 (0/1 exact) and the tensor-core GEMM accumulates and writes fp32.
    CPU: S is int8 and the VNNI GEMM accumulates in int32 (several times the fp32 rate);
    fp32 where int8 GEMMs are missing. All are exact below 2²⁴.
    """
    if S1.dtype == torch.bfloat16:
        return torch.mm(S1, S2.T, out_dtype=torch.float32).double()
    if S1.dtype == torch.int8:
        if S1.shape[1] >= _INT8_MIN_INNER:
            return torch._int_mm(S1, S2.T).double()
        S1, S2 = S1.float(), S2.float()
    return (S1 @ S2.T).double()


@functools.cache
def cpu_count_dtype() -> torch.dtype:
    """int8 when this torch build has CPU int8 GEMMs (torch._int_mm), else float32."""
    try:
        ones = torch.ones(32, 32, dtype=torch.int8)
        ok = int(torch._int_mm(ones, ones)[0, 0]) == 32
    except (AttributeError, RuntimeError, NotImplementedError):
        ok = False
    return torch.int8 if ok else torch.float32


def _signs(phi: torch.Tensor, W: torch.Tensor, dtype: torch.dtype, chunk: int) -> torch.Tensor:
    """S = 1[Φ Wᵀ > 0] (n, m) in ``dtype``, built by row chunks so that the fp32
    pre-activations never exceed (chunk, m)."""
    return torch.cat([(phi[i:i + chunk] @ W.T > 0).to(dtype) for i in range(0, phi.shape[0], chunk)])


def closed_ntk_bytes(n1: int, n2: int, m: int, chunk: int, same: bool, count_size: int, itemsize: int) -> int:
    """Peak bytes of the closed-form empirical NTK: K (``itemsize`` per entry), the sign
    matrices (``count_size`` per entry) and one row block's temporaries."""
    rows = min(chunk, n1)
    signs = (n1 if same else n1 + n2) * m * count_size
    block = rows * n2 * (4 + 8 + 8 + 8) + rows * m * 4  # Gram, its float64 copy, counts, product; pre-activations
    return itemsize * n1 * n2 + signs + block


def _closed(head, phi1, phi2, chunk, dtype=torch.float64):
    W = head.W.detach()
    m = W.shape[0]
    if m >= _EXACT_COUNT_LIMIT:
        raise BadInput(f"width {m} too large for exact activation counts (limit {_EXACT_COUNT_LIMIT - 1})")
    cdt = torch.bfloat16 if phi1.device.type == "cuda" else cpu_count_dtype()
    same = phi2 is None
    n1, n2 = phi1.shape[0], (phi1 if same else phi2).shape[0]
    csize = _itemsize(cdt)
    _require_kernel(f"empirical NTK at width {m}", n1, n2, dtype, phi1.device,
                    lambda k, size: closed_ntk_bytes(k, k if same else n2, m, chunk, same, csize, size))
    phi1 = phi1.detach()
    phi2 = phi1 if same else phi2.detach()
    Wc = W.to(phi1.dtype)
    S2 = _signs(phi2, Wc, cdt, chunk)
    S1 = S2 if same else _signs(phi1, Wc, cdt, chunk)
    K = torch.empty(n1, n2, dtype=dtype, device=phi1.device)
    # Row chunks bound the memory of the (chunk, n2) blocks; for X2 = X1 only the blocks on
    # and right of the diagonal are computed and the rest mirrored. The feature Gram is
    # formed in the features' own precision (float32 features carry no more digits); each
    # block is finished in float64 and rounded once into K's storage.
    for i in range(0, n1, chunk):
        i2 = min(i + chunk, n1)
        j0 = i if same else 0
        G = (phi1[i:i2] @ phi2[j0:].T).double().mul_(exact_counts(S1[i:i2], S2[j0:])).div_(m)
        if same:
            w = i2 - i
            G[:, :w] = (G[:, :w] + G[:, :w].T) / 2  # rounding makes GEMM blocks a hair asymmetric
        K[i:i2, j0:] = G
        if same:
            K[i2:, i:i2] = K[i:i2, i2:].T
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


_KINF_BLOCK = {"cpu": 2**21, "cuda": 2**26}  # elements per row block: cache-sized on CPU, large on GPU


def kinf_bytes(n1: int, n2: int, d: int, rows: int, same: bool, itemsize: int) -> int:
    """Peak bytes of ``infinite_ntk``: K, float64 copies of the inputs, and three row blocks
    (the two buffers and the copy made when a block is mirrored below the diagonal)."""
    return itemsize * n1 * n2 + 8 * (n1 if same else n1 + n2) * (d + 1) + 3 * 8 * min(rows, n1) * n2


def infinite_ntk(X1: torch.Tensor, X2: torch.Tensor | None = None, chunk: int | None = None,
                 storage: str = "float64") -> torch.Tensor:
    """Infinite-width NTK of the head w.r.t. W, w ~ N(0, σ²I) (independent of σ):

        K∞(x, x') = xᵀx' · (π − θ) / (2π),   θ = arccos(xᵀx' / (|x| |x'|)).

    X1: (n1, d) features (already normalised if the net normalises), X2 likewise or None.
    Returns (n1, n2) in ``storage`` (float64 by default; float32 rounds each float64 entry
    once). Zero rows give zero kernel entries. For X2 = None the result is
    exactly symmetric and its diagonal is exactly ``|x|² / 2`` (θ = 0 there; arccos is
    ill-conditioned at 1, where rounding would cost 1e-8). ``chunk``: rows per block
    (default: about 2²¹ entries on CPU, 2²⁶ on CUDA); besides the output only two blocks
    are held, never a temporary the size of K. Not differentiable: inputs are detached.
    """
    dtype = storage_dtype(storage)
    same = X2 is None
    n1, n2, d = X1.shape[0], (X1 if same else X2).shape[0], X1.shape[1]
    budget = _KINF_BLOCK["cuda" if X1.device.type == "cuda" else "cpu"]
    rows = max(1, min(n1, budget // max(n2, 1) if chunk is None else chunk))
    _require_kernel("infinite-width NTK", n1, n2, dtype, X1.device,
                    lambda k, size: kinf_bytes(k, k if same else n2, d, rows, same, size))
    A = X1.detach().double()
    B_ = A if same else X2.detach().double()
    K = torch.empty(n1, n2, dtype=dtype, device=A.device)
    if n1 == 0 or n2 == 0:
        return K
    rA = _inverse_norms(A)
    rB = rA if same else _inverse_norms(B_)
    G_buf = torch.empty(rows * n2, dtype=torch.float64, device=A.device)
    C_buf = torch.empty_like(G_buf)
    for i in range(0, n1, rows):
        i2 = min(i + rows, n1)
        # Symmetric case: only the blocks on and right of the diagonal are computed (half
        # the GEMM and half the arccos) and mirrored below it.
        j0 = i if same else 0
        G = G_buf[:(i2 - i) * (n2 - j0)].view(i2 - i, n2 - j0)  # contiguous, so mm writes in place
        C = C_buf[:G.numel()].view_as(G)
        torch.mm(A[i:i2], B_[j0:].T, out=G)                        # xᵀx'
        torch.mul(G, rA[i:i2, None], out=C)
        C.mul_(rB[j0:]).clamp_(-1.0, 1.0).arccos_()                # θ
        C.mul_(-1 / (2 * math.pi)).add_(0.5)                       # (π − θ) / (2π)
        G.mul_(C)
        if same:
            w = i2 - i
            C[:, :w] = G[:, :w].T
            G[:, :w] += C[:, :w]
            G[:, :w] /= 2  # the diagonal block's GEMM is a hair asymmetric
        K[i:i2, j0:] = G
        if same:
            K[i2:, i:i2] = K[i:i2, i2:].T
    if same:
        K.diagonal().copy_((A * A).sum(dim=1) / 2)
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
    if not bool(torch.isfinite(A).all()):
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
    if not bool(torch.isfinite(x).all()):
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
    if not bool(torch.isfinite(D).all()):
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
