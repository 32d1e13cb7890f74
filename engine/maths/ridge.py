"""Kernel ridge regression and the distances between two kernels, all in float64.

``kernel_regression`` solves (K + λ·mean(diag K)·I) α = Y through one checked Cholesky;
``relative_distance`` is the Frobenius distance, ``whitened_distance`` the distance after
whitening by K∞ + λI, and ``prediction_gap`` how far apart the two kernels' ridge predictions
lie. Every solve refuses a NaN, an infinite entry or a factorisation that fails in one line
that names the step and the ridge to raise.
"""

from __future__ import annotations

import math

import torch

from ..runtime import budget as B
from ..runtime.errors import BadInput
from .tiles import eig_threads


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


def checked_cholesky(A: torch.Tensor, what: str, ridge: float, lam: float,
                     out: torch.Tensor | None = None) -> torch.Tensor:
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
    with eig_threads(W.shape[0], W.device.type):
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
