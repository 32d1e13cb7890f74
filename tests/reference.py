"""Independent numpy references (float64) that the engine's numbers are checked against.

Nothing here imports the engine: each function is the textbook formula, written once and
imported by every test that needs it (``from reference import ...``).

- ``unit``, ``unit_back``: row normalisation x / ‖x‖ and its vector-Jacobian product.
- ``features``: φ of 2L-ReLU (normalised rows) and of MLP-Attn (normalised C z, C = Rᵀ R of the
  normalised reference rows, i.e. linear attention X Xᵀ X row by row).
- ``loss_grad``: the net's training loss (cross-entropy, or MSE on ±1 targets) and its gradient
  in the inputs X, through the features.
- ``ntk_relu``: the empirical NTK of the first layer, (Φ₁Φ₂ᵀ) ∘ (S₁S₂ᵀ) / m, S = 1[Φ Wᵀ > 0].
- ``arccos_ntk``: the infinite-width kernel of that layer, ⟨a, b⟩ (π − θ) / 2π.
- ``ridge_predict``, ``loo_changes``, ``loo_true``: kernel-ridge predictions and leave-one-out
  changes by brute-force refits without each point (the same absolute λ for every fit).
- ``step_direction``, ``project``, ``attack``: FGSM / PGD / MIM in ℓ∞ or ℓ2, with a box.
"""

from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------- features and the loss

def unit(V):
    """Rows scaled to unit ℓ2 norm (n, d)."""
    return V / np.linalg.norm(V, axis=1, keepdims=True)


def unit_back(V, dU):
    """Vector-Jacobian product of ``unit`` at V with the upstream gradient dU (n, d)."""
    U = unit(V)
    return (dU - U * (U * dU).sum(axis=1, keepdims=True)) / np.linalg.norm(V, axis=1, keepdims=True)


def features(X, X_ref, arch):
    """φ: normalize(x) for relu; normalize(C z), C = Rᵀ R of the normalised X_ref, for attn."""
    Z = unit(X)
    if arch == "relu":
        return Z
    R = unit(X_ref)
    return unit(Z @ (R.T @ R))


def loss_grad(X, y, W, a, arch, loss="ce"):
    """Training loss of the net (attention over X itself) and its gradient in X (n, d).

    W (m, d) first layer, a (m, c) readout, output m^-½ relu(φ Wᵀ) a. ``loss``: "ce" (mean
    cross-entropy on labels y) or "mse" (mean squared error on ±1 targets, one output)."""
    n, m = X.shape[0], W.shape[0]
    Z = unit(X)
    A = Z @ Z.T @ Z if arch == "attn" else Z
    phi = unit(A)
    pre = phi @ W.T
    out = np.maximum(pre, 0) @ a / math.sqrt(m)
    if loss == "ce":
        s = out - out.max(axis=1, keepdims=True)
        p = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
        value = -np.mean(np.log(p[np.arange(n), y]))
        dout = (p - np.eye(out.shape[1])[y]) / n
    else:
        t = (2.0 * y - 1.0)[:, None]
        value = np.mean((out - t) ** 2)
        dout = 2 * (out - t) / out.size
    dphi = ((dout @ a.T / math.sqrt(m)) * (pre > 0)) @ W
    dA = unit_back(A, dphi)
    # A = Z Zᵀ Z: each of its three factors contributes (product rule)
    dZ = dA @ (Z.T @ Z) + Z @ dA.T @ Z + (Z @ Z.T) @ dA if arch == "attn" else dA
    return value, unit_back(X, dZ)


# ---------------------------------------------------------------- kernels

def ntk_relu(P1, P2, W):
    """Empirical NTK of the first layer on features P1 (n1, d), P2 (n2, d): (P1P2ᵀ)∘(S1S2ᵀ)/m."""
    S1, S2 = (P1 @ W.T > 0).astype(float), (P2 @ W.T > 0).astype(float)
    return (P1 @ P2.T) * (S1 @ S2.T) / W.shape[0]


def arccos_ntk(A, B):
    """The infinite-width limit of ``ntk_relu``: ⟨a, b⟩ (π − θ(a, b)) / 2π, (n1, n2)."""
    dots = A @ B.T
    cos = np.clip(dots / np.outer(np.linalg.norm(A, axis=1), np.linalg.norm(B, axis=1)), -1, 1)
    return dots * (np.pi - np.arccos(cos)) / (2 * np.pi)


# ---------------------------------------------------------------- kernel ridge and leave-one-out

def ridge_predict(K, K_test, Y, lam_abs):
    """K_test (K + λI)⁻¹ Y with an absolute ridge λ."""
    return K_test @ np.linalg.solve(K + lam_abs * np.eye(len(K)), Y)


def loo_changes(K, K_test, Y, ridge):
    """full − without_i predictions (n, n_test, c) by refitting n times, and the full fit.
    λ = ridge · mean diag K, the same for the full and the reduced fits."""
    Y = np.asarray(Y).reshape(len(K), -1)
    lam = ridge * np.mean(np.diag(K))
    full = ridge_predict(K, K_test, Y, lam)
    changes = []
    for i in range(len(K)):
        keep = np.arange(len(K)) != i
        changes.append(full - ridge_predict(K[np.ix_(keep, keep)], K_test[:, keep], Y[keep], lam))
    return np.stack(changes), full


def loo_true(K, K_test, Y, y_test, ridge):
    """f(x_t) − f₋ᵢ(x_t) on test point t's own class, by n refits; (n_test, n)."""
    changes, _ = loo_changes(K, K_test, Y, ridge)           # (n, n_test, c)
    return changes[:, np.arange(K_test.shape[0]), y_test].T


# ---------------------------------------------------------------- attacks

def step_direction(g, norm):
    """sign(g) for ℓ∞, g / ‖g‖₂ row by row for ℓ2 (zero rows stay zero)."""
    if norm == "linf":
        return np.sign(g)
    n = np.linalg.norm(g, axis=1, keepdims=True)
    return np.divide(g, n, out=np.zeros_like(g), where=n > 0)


def project(Xp, X, eps, norm, box):
    """Back into the ε-ball around X (ℓ∞ clip or ℓ2 rescale), then into the box."""
    if norm == "linf":
        Xp = np.clip(Xp, X - eps, X + eps)
    else:
        d = Xp - X
        n = np.linalg.norm(d, axis=1, keepdims=True)
        Xp = X + d * np.where(n > eps, eps / np.where(n > 0, n, 1.0), 1.0)
    return Xp if box is None else np.clip(Xp, *box)


def attack(f, X, method, norm, eps, steps=1, alpha=None, mu=1.0, move=None, box=None, start=None):
    """(returned point, every iterate, their losses); ``f(X) -> (loss, grad)``. PGD and MIM
    return the iterate of largest loss; ``move`` (n,) masks the rows that may move."""
    move = np.ones((len(X), 1)) if move is None else move[:, None].astype(float)
    if method == "fgsm":
        x1 = project(X + eps * step_direction(f(X)[1], norm) * move, X, eps, norm, box)
        return x1, [x1], [f(x1)[0]]
    alpha = 2.5 * eps / steps if alpha is None else alpha
    Xp = X.copy() if start is None else start
    v = np.zeros_like(X)
    iterates, losses = [], []
    for _ in range(steps):
        value, g = f(Xp)
        iterates.append(Xp)
        losses.append(value)
        if method == "mim":
            v = mu * v + g / np.abs(g).sum(axis=1, keepdims=True)
            g = v
        Xp = project(Xp + alpha * step_direction(g, norm) * move, X, eps, norm, box)
    iterates.append(Xp)
    losses.append(f(Xp)[0])
    return iterates[int(np.argmax(losses))], iterates, losses


def gap_columns(relu, attn) -> dict:
    """Hand-made gap columns (as ``engine.experiments.flips.with_gaps`` adds them): the difference of
    the excesses with the interval from the two intervals' ends, the ratio where 2L-ReLU's low end > 0."""
    (r, rlo, rhi), (a, alo, ahi) = relu, attn
    ratio = (a / r, alo / rhi, ahi / rlo) if rlo > 0 else (math.nan,) * 3
    return dict(zip(("gap", "gap_low", "gap_high", "ratio", "ratio_low", "ratio_high"),
                    (a - r, alo - rhi, ahi - rlo, *ratio), strict=True))
