"""NTK leave-one-out influence by exact kernel-ridge algebra (after Zhang & Zhang 2022).

With the empirical kernel K (n, n) of a trained net, ridge λ and targets Y (n, c):

    M = (K + λ I)⁻¹,   α = M Y,   f(x) = k(x, X) α.

Refitting without training point i changes the prediction by exactly

    f(x) − f₋ᵢ(x) = [k(x, X) M]_i · α_i / M_ii        (per output class)

Sign convention: ``I(x_i, x_test) = f(x_test) − f₋ᵢ(x_test)``, the part of the prediction
that point i is responsible for; positive means that removing i lowers the output.
λ is relative to the mean diagonal of K (``λ_abs = ridge · mean diag K``), as in
``engine.maths.ridge.kernel_regression``, so that it does not depend on the kernel's scale.
diag M, α and k(x, X) M all come from one in-place Cholesky factor L of K + λI (triangular
solves; M itself is never formed). K may be stored in float32 (``engine.maths.specs.STORAGE``); L and
every solve are float64, and the step refuses, before it allocates, what cannot fit.

Which output is scored (``INFLUENCE_TARGETS``, documented default ``DEFAULT_TARGET`` =
``"true"``) for c > 1 outputs; with c = 1 every target is the single output's influence:

- ``"true"``: the output of test point t's own label ``y_test[t]``.
- ``"margin"``: its margin ``f_{y_t}(x_t) − f_{j*}(x_t)``, j* the best other class of the
  kernel-ridge prediction f(x_t) = k(x_t, X) α (fixed by the full fit).
- ``"sum"``: the sum over all c outputs. Label-free with one-hot targets (it is the influence
  on an all-ones target); kept as ``influence_matrix``'s default for backward compatibility.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..runtime import budget as B
from ..runtime.errors import BadInput
from .ntk import empirical_ntk
from .ridge import check_ridge, check_solution, ridge_factor
from .specs import INFLUENCE_TARGETS, INVERSE_BLOCK as _INVERSE_BLOCK, factor_bytes

if TYPE_CHECKING:
    from .models import Net


def _factor(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, ridge: float,
            per_test_row: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kM = K_test M (n_test, n), α = M Y (n, c) and diag M (n,), M = (K + λI)⁻¹, float64,
    from one Cholesky factor L (M itself is never formed). ``per_test_row``: further bytes
    per (test point, training point) the caller will allocate, checked with the rest. A singular
    or non-finite kernel is one ``BadInput`` line naming the step, n and the ridge."""
    what = "the leave-one-out influence factorisation"
    ridge = check_ridge(ridge, what)
    n = K.shape[0]
    Y = Y.double().reshape(n, -1)
    nt, c = K_test.shape[0], Y.shape[1]
    B.require(factor_bytes(n, nt, c) + per_test_row * nt * n, K.device, f"the leave-one-out factorisation of a "
              f"{n} x {n} kernel (float64) for {nt} test points",
              lambda k: factor_bytes(k, nt, c) + per_test_row * nt * k, n)
    if not B.all_finite(K_test):
        raise BadInput(f"{what}: the {nt} x {n} test kernel holds NaN or infinite values; the net diverged "
                       "or the inputs overflow: lower the learning rate or the init scale")
    # One n x n copy of K, factored in place; sub-blocks of L stay BLAS-ready.
    L, _ = ridge_factor(K, ridge, what)
    alpha = check_solution(torch.cholesky_solve(Y, L), what, ridge)                       # (n, c)
    kM = check_solution(torch.cholesky_solve(K_test.double().T, L).T.contiguous(), what, ridge)  # (n_test, n)
    return kM, alpha, check_solution(_inverse_diagonal(L), what, ridge)


def _inverse_diagonal(L: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """diag (L Lᵀ)⁻¹ (n,): M_ii is the squared norm of column i of L⁻¹.

    Column i of L⁻¹ is zero above row i, so a block of columns j..j2 only needs the
    triangular solve with L[j:, j:]: n³/3 flops in all (half of what cholesky_inverse
    does, and torch's CPU cholesky_inverse runs far below the GEMM rate), n x block memory.
    """
    n = L.shape[0]
    block = block or _INVERSE_BLOCK
    diag = torch.empty(n, dtype=L.dtype, device=L.device)
    for j in range(0, n, block):
        j2 = min(j + block, n)
        E = torch.zeros(j2 - j, n - j, dtype=L.dtype, device=L.device).mT  # column-major, as LAPACK wants
        E.diagonal().fill_(1.0)                                            # columns j..j2 of I, rows j..n
        torch.linalg.solve_triangular(L[j:, j:], E, upper=False, out=E)
        diag[j:j2] = torch.linalg.vector_norm(E, dim=0).square_()
    return diag


def loo_influence(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """Per-class influence, float64 (n_test, n, c).

    K: (n, n) training kernel; K_test: (n_test, n) kernel between test and training points;
    Y: (n, c) or (n,) regression targets. Holds n_test · n · c floats; ``influence_matrix``
    scores one output per test point without that tensor.
    """
    c = Y.reshape(K.shape[0], -1).shape[1]
    kM, alpha, diag = _factor(K, K_test, Y, ridge, per_test_row=8 * c)
    return kM[:, :, None] * (alpha / diag[:, None])[None, :, :]


def _sum(kM, R, f, y):
    return kM * R.sum(dim=0)


def _true(kM, R, f, y):
    return R[y].mul_(kM)  # row t scores R[y_t] = α[:, y_t] / diag M


def _margin(kM, R, f, y):
    other = f.scatter(1, y[:, None], float("-inf")).argmax(dim=1)  # j*: best class other than y_t
    return R[y].sub_(R[other]).mul_(kM)


_TARGET_FNS = {"true": _true, "margin": _margin, "sum": _sum}


def _labels(y_test: torch.Tensor | None, n_test: int, c: int, device: torch.device | str) -> torch.Tensor:
    if y_test is None:
        raise BadInput(f"influence targets 'true' and 'margin' need y_test, the (n_test,) test labels, for "
                       f"c = {c} outputs; pass y_test or use target 'sum'")
    y = torch.as_tensor(y_test, device=device)
    if y.shape != (n_test,) or y.is_floating_point() or (n_test and not 0 <= int(y.min()) <= int(y.max()) < c):
        raise BadInput(f"y_test must be {n_test} integer labels in 0..{c - 1}; got shape {tuple(y.shape)}, "
                       f"dtype {y.dtype}")
    return y.long()


def influence_matrix(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, ridge: float = 1e-3,
                     target: str = "sum", y_test: torch.Tensor | None = None) -> torch.Tensor:
    """Influence of each training point on each test point's scored output, float64 (n_test, n).

    Entry [t, i] is I(x_i, x_test_t) on the output ``target`` selects (one of
    ``INFLUENCE_TARGETS``; see the module notes). y_test: (n_test,) integer labels, needed by
    "true" and "margin" when Y has c > 1 columns. Default "sum" for backward compatibility:
    with one-hot Y it does not depend on the labels, so prefer ``DEFAULT_TARGET``.
    Never forms the (n_test, n, c) tensor.
    """
    if target not in _TARGET_FNS:
        raise BadInput(f"unknown influence target {target!r}; allowed: {', '.join(INFLUENCE_TARGETS)}")
    n = K.shape[0]
    c = Y.reshape(n, -1).shape[1]
    y = None if c == 1 or target == "sum" else _labels(y_test, K_test.shape[0], c, K.device)
    kM, alpha, diag = _factor(K, K_test, Y, ridge)
    R = (alpha / diag[:, None]).T.contiguous()      # (c, n): α_ic / M_ii
    if c == 1:
        return kM * R[0]
    f = K_test.double() @ alpha if target == "margin" else None  # predictions (n_test, c)
    return _TARGET_FNS[target](kM, R, f, y)


def net_influence(net: Net, X: torch.Tensor, Y: torch.Tensor, X_test: torch.Tensor, *, ridge: float = 1e-3,
                  X_ref: torch.Tensor | None = None, target: str = "sum",
                  y_test: torch.Tensor | None = None, storage: str = "float64") -> torch.Tensor:
    """Influence (n_test, n) under the empirical NTK of ``net`` (an ``engine.maths.models.Net``).

    X (n, d) raw training inputs, Y (n, c) targets, X_test (n_test, d). ``X_ref`` is the
    training set that defines MLP-Attn's attention (pass the perturbed set after an attack
    so that C is recomputed); default: the net's own. ``target`` and ``y_test`` (n_test,)
    as in ``influence_matrix``; ``storage`` the kernels' precision (``engine.maths.specs.STORAGE``).
    """
    if target not in _TARGET_FNS:  # before the kernels are computed
        raise BadInput(f"unknown influence target {target!r}; allowed: {', '.join(INFLUENCE_TARGETS)}")
    K = empirical_ntk(net, X, X_ref=X_ref, storage=storage)
    K_test = empirical_ntk(net, X_test, X, X_ref=X_ref, storage=storage)
    return influence_matrix(K, K_test, Y, ridge, target=target, y_test=y_test)


def aggregate(I: torch.Tensor) -> torch.Tensor:
    """Influence of each training point averaged over test points, (n,)."""
    return I.mean(dim=0)


def top_indices(agg: torch.Tensor, tau: float) -> torch.Tensor:
    """Indices of the top-τ share of training points by |aggregate influence| (at least one)."""
    if not 0 < tau <= 1:
        raise BadInput(f"tau must lie in (0, 1], got {tau!r}")
    k = max(1, int(round(tau * agg.numel())))
    return torch.topk(agg.abs(), k).indices
