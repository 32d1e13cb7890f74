"""The optimisers every trainer here steps: Adam, AdamW and plain SGD, elementwise and in place.

They follow ``torch.optim``'s update rules (PyTorch's documented algorithms, no AMSGrad, no
momentum for SGD), and ``tests/test_optim.py`` checks each against ``torch.optim`` step by step.
They exist because constructing any ``torch.optim`` optimiser imports ``torch._dynamo`` (its
``__init__`` is wrapped by ``torch._disable_dynamo``): 1.4 s of every fresh process's first training
on a 2-core CPU, a tenth of the Malleability quick run, before the first net could land. All
updates are elementwise, so batching nets into one parameter (``engine.maths.grads``) changes nothing.

Adam (Kingma & Ba; weight decay as L2 added to the gradient, as ``torch.optim.Adam``):
    g ← g + λθ;  m ← β₁m + (1 − β₁)g;  v ← β₂v + (1 − β₂)g²;
    θ ← θ − (η / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
AdamW (Loshchilov & Hutter): the same with λ decoupled, θ ← θ(1 − ηλ) before the step.
SGD: θ ← θ − η(g + λθ).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
EPS = 1e-8


class Optimizer:
    """Steps ``params`` (tensors with ``requires_grad``) from their ``.grad`` in place."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0):
        self.params = list(params)
        self.lr, self.weight_decay, self.t = float(lr), float(weight_decay), 0

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self._update(i, p, p.grad)

    def _update(self, i: int, p: torch.Tensor, g: torch.Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    def _update(self, i: int, p: torch.Tensor, g: torch.Tensor) -> None:
        if self.weight_decay:
            g = g.add(p, alpha=self.weight_decay)
        p.add_(g, alpha=-self.lr)


class Adam(Optimizer):
    """One fused kernel per step (``torch._fused_adam_``, the op ``torch.optim.Adam(fused=True)``
    calls: the same bits); ``reference_step`` is the rule above written out, for the tests."""

    decoupled = False

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0):
        super().__init__(params, lr, weight_decay)
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        steps = [self.steps[i] for i in live]
        torch._foreach_add_(steps, 1)
        fused = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
        grads = [self.params[i].grad for i in live]
        fused([self.params[i] for i in live], grads, [self.m[i] for i in live],  # type: ignore[arg-type]
              [self.v[i] for i in live], [], steps, lr=self.lr, beta1=BETAS[0], beta2=BETAS[1],
              weight_decay=self.weight_decay, eps=EPS, amsgrad=False, maximize=False)

    def _update(self, i: int, p: torch.Tensor, g: torch.Tensor) -> None:
        """The rule written out (``reference_step`` calls it; ``step`` runs the fused kernel)."""
        (b1, b2), m, v = BETAS, self.m[i], self.v[i]
        if self.weight_decay and self.decoupled:
            p.mul_(1.0 - self.lr * self.weight_decay)
        elif self.weight_decay:
            g = g.add(p, alpha=self.weight_decay)
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        denom = (v.sqrt() / math.sqrt(1.0 - b2 ** self.t)).add_(EPS)
        p.addcdiv_(m, denom, value=-self.lr / (1.0 - b1 ** self.t))

    @torch.no_grad()
    def reference_step(self) -> None:
        Optimizer.step(self)


class AdamW(Adam):
    decoupled = True


OPTIMIZERS: dict[str, type[Optimizer]] = {"adam": Adam, "adamw": AdamW, "sgd": SGD}
