"""ℓ∞ attacks on the training inputs of a trained net: FGSM, PGD and MIM, in plain torch.

The objective is the trained model's training loss on the (perturbed) training set. For
MLP-Attn the attention map is recomputed from the perturbed set inside the objective, so
moving one point changes C and with it every feature: perturbations propagate globally.
Every iterate stays in the ε-ball around the clean inputs and in the data's box ([0, 1] for
images). ``mask`` restricts which rows may move (the top-τ points, or all).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from .errors import BadInput
from .training import loss_fn


class AttackMethod(str, enum.Enum):
    FGSM = "fgsm"  # one signed-gradient step of size ε
    PGD = "pgd"    # projected signed-gradient ascent, optional random start
    MIM = "mim"    # momentum iterative method (Dong et al. 2018)


@dataclass(frozen=True)
class AttackSpec:
    method: str = "pgd"              # "fgsm" | "pgd" | "mim"
    eps: float = 0.05                # ℓ∞ radius in input units (pixels in [0, 1])
    steps: int = 20                  # iterations of PGD and MIM (FGSM: 1)
    step_size: float | None = None   # None: 2.5·ε/steps (PGD, MIM)
    random_start: bool = False       # PGD: start from a uniform point of the ball
    momentum: float = 1.0            # MIM decay μ
    seed: int = 0                    # random start

    def __post_init__(self):
        try:
            AttackMethod(self.method)
        except ValueError:
            raise BadInput(f"unknown attack {self.method!r}; allowed: fgsm, pgd, mim") from None
        if not self.eps >= 0:
            raise BadInput(f"eps must be >= 0, got {self.eps!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise BadInput(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.step_size is not None and not self.step_size > 0:
            raise BadInput(f"step_size must be > 0, got {self.step_size!r}")
        if not self.momentum >= 0:
            raise BadInput(f"momentum must be >= 0, got {self.momentum!r}")

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else 2.5 * self.eps / self.steps


def training_loss(net, Xp: torch.Tensor, y: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """The net's mean training loss with features recomputed from the perturbed set Xp."""
    return loss_fn(net.head(net.features(Xp, X_ref=Xp)), y, loss, n_classes)


def _project(Xp, X, eps, box):
    Xp = torch.max(torch.min(Xp, X + eps), X - eps)
    return Xp if box is None else Xp.clamp(*box)


def _grad(net, Xp, y, loss, n_classes):
    Xp = Xp.detach().requires_grad_(True)
    value = training_loss(net, Xp, y, loss, n_classes)
    (g,) = torch.autograd.grad(value, Xp)
    return g, float(value.detach())


def attack(net, X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: AttackSpec, loss: str,
           mask: torch.Tensor | None = None, box: tuple[float, float] | None = (0.0, 1.0)) -> torch.Tensor:
    """Adversarial training inputs (n, d), same dtype and device as X.

    X: clean raw inputs (n, d); y: labels (n,); loss: "ce" or "mse" (the training loss);
    mask: bool (n,) rows allowed to move (None: all). PGD and MIM return the iterate with
    the highest loss seen (the clean start included), so the loss never decreases.
    """
    method = AttackMethod(spec.method)
    X = X.detach()
    eps = spec.eps
    move = torch.ones(X.shape[0], 1, dtype=X.dtype, device=X.device) if mask is None else \
        mask.to(X.device, X.dtype).reshape(-1, 1)
    if method is AttackMethod.FGSM:
        g, _ = _grad(net, X, y, loss, n_classes)
        return _project(X + eps * g.sign() * move, X, eps, box).detach()

    Xp = X.clone()
    if method is AttackMethod.PGD and spec.random_start:
        gen = torch.Generator().manual_seed(int(spec.seed))
        noise = (torch.rand(X.shape, generator=gen, dtype=X.dtype) * 2 - 1).to(X.device) * eps
        Xp = _project(X + noise * move, X, eps, box)
    best, best_loss = Xp.clone(), None
    velocity = torch.zeros_like(X)
    for _ in range(spec.steps):
        g, value = _grad(net, Xp, y, loss, n_classes)
        if best_loss is None or value > best_loss:
            best, best_loss = Xp.clone(), value
        if method is AttackMethod.MIM:
            velocity = spec.momentum * velocity + g / g.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
            g = velocity
        Xp = _project(Xp + spec.alpha * g.sign() * move, X, eps, box).detach()
    with torch.no_grad():
        if float(training_loss(net, Xp, y, loss, n_classes)) > best_loss:
            best = Xp
    return best.detach()
