"""Attacks on the training inputs of a trained net: FGSM, PGD and MIM, in ℓ∞ or ℓ2, plain torch.

The objective is the trained model's training loss on the (perturbed) training set. For
MLP-Attn the attention map is recomputed from the perturbed set inside the objective, so
moving one point changes C and with it every feature: perturbations propagate globally.
Every iterate stays in the per-row ε-ball (ℓ∞ or ℓ2) around the clean inputs and in the
data's box ([0, 1] for images). ``mask`` restricts which rows may move (the top-τ points,
or all); the other rows are returned exactly as they came in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..runtime.errors import Cancelled
from .specs import AttackMethod, AttackNorm, AttackSpec
from .training import CancelFlag, loss_fn

if TYPE_CHECKING:
    from .models import Net


def training_loss(net: Net, Xp: torch.Tensor, y: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """The net's mean training loss with features recomputed from the perturbed set Xp."""
    return loss_fn(net.head(net.features(Xp, X_ref=Xp)), y, loss, n_classes)


def _row_norm(v: torch.Tensor) -> torch.Tensor:
    return v.norm(dim=1, keepdim=True)


def _direction(g: torch.Tensor, norm: AttackNorm) -> torch.Tensor:
    """The steepest-ascent unit step of the norm: sign(g) for ℓ∞, g/‖g‖₂ per row for ℓ2."""
    if norm is AttackNorm.LINF:
        return g.sign()
    return g / _row_norm(g).clamp_min(torch.finfo(g.dtype).tiny)  # a zero gradient row stays zero


def _project(Xp: torch.Tensor, X: torch.Tensor, eps: float, box: tuple[float, float] | None,
             norm: AttackNorm = AttackNorm.LINF) -> torch.Tensor:
    """Nearest point of the per-row ε-ball around X, then clipped to the box.

    Clipping after the ball keeps the point in the ball when X lies in the box: each
    coordinate only moves towards X's own coordinate.
    """
    if norm is AttackNorm.LINF:
        Xp = torch.max(torch.min(Xp, X + eps), X - eps)
    else:
        delta = Xp - X
        n = _row_norm(delta)
        scale = torch.where(n > eps, eps / n.clamp_min(torch.finfo(X.dtype).tiny), torch.ones_like(n))
        Xp = X + delta * scale
    return Xp if box is None else Xp.clamp(*box)


def _random_start(X: torch.Tensor, eps: float, norm: AttackNorm, seed: int) -> torch.Tensor:
    """A uniform random point of the ε-ball around each row, (n, d), drawn on the CPU."""
    gen = torch.Generator().manual_seed(int(seed))
    if norm is AttackNorm.LINF:
        noise = (torch.rand(X.shape, generator=gen, dtype=X.dtype) * 2 - 1) * eps
    else:
        # Gaussian direction, radius ε·U^(1/d): uniform in volume.
        u = torch.randn(X.shape, generator=gen, dtype=X.dtype)
        u = u / _row_norm(u).clamp_min(torch.finfo(X.dtype).tiny)
        r = torch.rand(X.shape[0], 1, generator=gen, dtype=X.dtype) ** (1.0 / X.shape[1])
        noise = u * r * eps
    return noise.to(X.device)


def _grad(net, Xp, y, loss, n_classes):
    Xp = Xp.detach().requires_grad_(True)
    value = training_loss(net, Xp, y, loss, n_classes)
    (g,) = torch.autograd.grad(value, Xp)
    return g, float(value.detach())


def attack(net: Net, X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: AttackSpec, loss: str,
           mask: torch.Tensor | None = None, box: tuple[float, float] | None = (0.0, 1.0),
           cancel: CancelFlag | None = None) -> torch.Tensor:
    """Adversarial training inputs (n, d), same dtype and device as X.

    ``cancel`` (anything with ``is_set()``) is checked before every step; ``Cancelled`` stops it.

    X: clean raw inputs (n, d); y: labels (n,); loss: "ce" or "mse" (the training loss);
    mask: bool (n,) rows allowed to move (None: all); the others come back bit-for-bit.
    ``spec.eps`` is the radius of each row's ball in ``spec.norm``. PGD and MIM return the
    iterate with the highest loss seen (the start included), so their loss never falls
    below the start's; FGSM returns its one step, whatever its loss.
    """
    method, norm = AttackMethod(spec.method), AttackNorm(spec.norm)
    X = X.detach()
    eps = spec.eps
    keep = None if mask is None else ~mask.to(X.device, torch.bool).reshape(-1, 1)
    move = torch.ones(X.shape[0], 1, dtype=X.dtype, device=X.device) if keep is None else (~keep).to(X.dtype)

    def fixed(Xp):  # rows that may not move stay exact even if the box would clip them
        return Xp if keep is None else torch.where(keep, X, Xp)

    if method is AttackMethod.FGSM:
        g, _ = _grad(net, X, y, loss, n_classes)
        return fixed(_project(X + eps * _direction(g, norm) * move, X, eps, box, norm)).detach()

    Xp = X.clone()
    if method is AttackMethod.PGD and spec.random_start:
        Xp = fixed(_project(X + _random_start(X, eps, norm, spec.seed) * move, X, eps, box, norm))
    best, best_loss = Xp.clone(), None
    velocity = torch.zeros_like(X)
    for step in range(spec.steps):
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"attack cancelled at step {step + 1}/{spec.steps}")
        g, value = _grad(net, Xp, y, loss, n_classes)
        if best_loss is None or value > best_loss:
            best, best_loss = Xp.clone(), value
        if method is AttackMethod.MIM:
            # Momentum accumulates ℓ1-normalised gradients (Dong et al.), in either norm.
            velocity = spec.momentum * velocity + g / g.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
            g = velocity
        Xp = fixed(_project(Xp + spec.alpha * _direction(g, norm) * move, X, eps, box, norm)).detach()
    assert best_loss is not None  # AttackSpec.steps >= 1: the loop ran
    with torch.no_grad():
        if float(training_loss(net, Xp, y, loss, n_classes)) > best_loss:
            best = Xp
    return best.detach()
