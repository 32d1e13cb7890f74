"""NTK leave-one-out influence by exact kernel-ridge algebra (after Zhang & Zhang 2022).

With the empirical kernel K (n, n) of a trained net, ridge λ and targets Y (n, c):

    M = (K + λ I)⁻¹,   α = M Y,   f(x) = k(x, X) α.

Refitting without training point i changes the prediction by exactly

    f(x) − f₋ᵢ(x) = [k(x, X) M]_i · α_i / M_ii        (per output class)

Sign convention: ``I(x_i, x_test) = f(x_test) − f₋ᵢ(x_test)``, the part of the prediction
that point i is responsible for; positive means that removing i lowers the output. The
returned matrix sums this over output classes (the per-class tensor is available too).
λ is relative to the mean diagonal of K (``λ_abs = ridge · mean diag K``), as in
``engine.ntk.kernel_regression``, so that it does not depend on the kernel's scale.
"""

from __future__ import annotations

import torch

from .errors import BadInput
from .ntk import empirical_ntk


def loo_influence(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """Per-class influence, float64 (n_test, n, c).

    K: (n, n) training kernel; K_test: (n_test, n) kernel between test and training points;
    Y: (n, c) or (n,) regression targets.
    """
    if not ridge > 0:
        raise BadInput(f"ridge λ must be > 0, got {ridge!r}")
    K, K_test = K.double(), K_test.double()
    Y = Y.double().reshape(K.shape[0], -1)
    n = K.shape[0]
    lam = ridge * float(K.diagonal().mean())
    M = torch.linalg.inv(K + lam * torch.eye(n, dtype=K.dtype, device=K.device))
    M = (M + M.T) / 2
    alpha = M @ Y                                   # (n, c)
    kM = K_test @ M                                 # (n_test, n)
    return kM[:, :, None] * (alpha / M.diagonal()[:, None])[None, :, :]


def influence_matrix(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """Influence summed over classes, float64 (n_test, n): entry [t, i] is I(x_i, x_test_t)."""
    return loo_influence(K, K_test, Y, ridge).sum(dim=2)


def net_influence(net, X: torch.Tensor, Y: torch.Tensor, X_test: torch.Tensor, ridge: float = 1e-3,
                  X_ref: torch.Tensor | None = None) -> torch.Tensor:
    """Influence (n_test, n) under the empirical NTK of ``net`` (an ``engine.models.Net``).

    X (n, d) raw training inputs, Y (n, c) targets, X_test (n_test, d). ``X_ref`` is the
    training set that defines MLP-Attn's attention (pass the perturbed set after an attack
    so that C is recomputed); default: the net's own.
    """
    K = empirical_ntk(net, X, X_ref=X_ref)
    K_test = empirical_ntk(net, X_test, X, X_ref=X_ref)
    return influence_matrix(K, K_test, Y, ridge)


def aggregate(I: torch.Tensor) -> torch.Tensor:
    """Influence of each training point averaged over test points, (n,)."""
    return I.mean(dim=0)


def top_indices(agg: torch.Tensor, tau: float) -> torch.Tensor:
    """Indices of the top-τ share of training points by |aggregate influence| (at least one)."""
    if not 0 < tau <= 1:
        raise BadInput(f"tau must lie in (0, 1], got {tau!r}")
    k = max(1, int(round(tau * agg.numel())))
    return torch.topk(agg.abs(), k).indices
