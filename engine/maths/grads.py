"""The stacked ReLU head's weight gradient in closed form, and the training precisions.

Where the features are fixed only W trains, and ``engine.maths.training.train_many`` stacks k
heads into one: W (Σm, d), block-diagonal readout A (Σm, k·n_out) of the nets' ``a·s_m``. On a
mini-batch of feature rows φ_b (B, d):

    H = φ_b Wᵀ (B, Σm),   F = relu(H) A (B, k·n_out),   L = Σ_j w_j L_j(F_j),
    ∂L/∂W = ((G Aᵀ) ⊙ 1[H > 0])ᵀ φ_b,   G = ∂L/∂F,

two GEMMs of the head's size (H and the gradient) and two of the readout's. G per net j (w_j = 1,
or its width under μP, ``training.loss_weights``): MSE, L_j = mean over (B, n_out) of (F_j − T)²,
G_j = (w_j / (B·n_out))·2(F_j − T); cross-entropy, L_j = mean over B of −log softmax(F_j)[y],
G_j = (w_j / B)(softmax(F_j) − onehot(y)). These are the operations autograd runs on the same loss
(``training.per_model_loss``), in its order: mean's backward divides w_j by the count, the square's
multiplies by 2(F − T), mm's backward for the column-major Wᵀ is (dH)ᵀ φ_b, relu's zeroes where
relu(H) ≤ 0. So a float32 step writes autograd's gradient (equal to float rounding, bit for bit
where the BLAS picks the same kernels), and the same torch optimiser steps on it.

Precision (``TrainSpec.train_precision``): ``float32`` is the reference. ``bfloat16`` rounds the
operands of the two head GEMMs to bfloat16 (8-bit mantissa; products accumulated in float32 by
oneDNN and cuBLAS, the result rounded to bfloat16); the readout, the loss, the gradient's mask,
the weights and the optimiser's state stay float32. The trainers that keep autograd (trainable
attention, masked leave-one-out retraining, the linearised pair) run their forward under
``torch.autocast`` to bfloat16 instead (``autocast``).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from ..runtime.errors import BadInput

# The dtype each training precision multiplies in; None: the weights' own (float32).
LOW_DTYPES: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}


def check_precision(precision: str, dtype: torch.dtype) -> torch.dtype | None:
    """The GEMM dtype for ``precision`` (None: the weights' own); one-line ``BadInput`` for a
    low precision on weights that are not float32 (float64 nets are references: they stay exact)."""
    if precision not in LOW_DTYPES:
        raise BadInput(f"unknown train_precision {precision!r}; allowed: {', '.join(LOW_DTYPES)}")
    low = LOW_DTYPES[precision]
    if low is not None and dtype != torch.float32:
        raise BadInput(f"train_precision {precision} trains float32 nets; this one is {str(dtype).removeprefix('torch.')}")
    return low


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context an autograd trainer runs its forward in: bfloat16 autocast of the GEMMs
    (``torch.autocast``; weights and gradients stay float32), or nothing for float32."""
    if LOW_DTYPES[precision] is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=LOW_DTYPES[precision])


class StackedHead:
    """Mini-batches of the stacked head f = relu(φ Wᵀ) A on fixed features, ∂L/∂W in closed form.

    phi (n, d) features; y (n,) labels; W (Σm, d) the trained parameter, whose ``grad`` each
    ``step`` overwrites (no zeroing, no accumulation); A (Σm, k·n_out) the block-diagonal readout;
    loss ``"mse"`` (targets ``targets`` (n, n_out): ±1 or one-hot) or ``"ce"``; weights (k,) the
    nets' loss weights, None for 1. ``features(inputs)`` gives the features of an epoch's new
    inputs (adversarial training). Outputs and losses are in W's dtype.
    """

    def __init__(self, phi: torch.Tensor, y: torch.Tensor, targets: torch.Tensor, W: torch.Tensor, A: torch.Tensor,
                 k: int, loss: str, n_classes: int, weights: torch.Tensor | None = None, precision: str = "float32",
                 features: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.W, self.A, self.k, self.n_out = W, A, k, A.shape[1] // k
        self.loss, self.n_classes, self.features = loss, n_classes, features
        self.low = check_precision(precision, W.dtype)
        self.y, self.t = y, targets.to(W.dtype)
        # ∂(Σ_j w_j L_j)/∂L_j: what autograd's backward of the (weighted) sum hands each net's loss
        self.w = torch.ones(k, dtype=W.dtype, device=W.device) if weights is None else weights.to(W.dtype)
        self._set_features(phi)
        if W.grad is None or W.grad.shape != W.shape:
            W.grad = torch.zeros_like(W)

    def _set_features(self, phi: torch.Tensor) -> None:
        self.phi = phi if self.low is None else phi.to(self.low)  # cast once, not per step

    def epoch(self, order: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
        """Start an epoch: its rows in ``order`` (n,), gathered once so that each batch is a slice;
        new features first when the epoch trains on new ``inputs`` (n, d)."""
        if inputs is not None:
            if self.features is None:
                raise BadInput("new inputs for an epoch need the features of the head")
            with torch.no_grad():
                self._set_features(self.features(inputs))
        self.rows, self.y_epoch, self.t_epoch = self.phi[order], self.y[order], self.t[order]

    def _forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        W = self.W.detach()
        H = rows @ (W if self.low is None else W.to(self.low)).T        # (B, Σm)
        R = torch.relu(H) if self.low is None else torch.relu(H).to(W.dtype)
        return R, (R @ self.A).view(rows.shape[0], self.k, self.n_out)  # (B, Σm), (B, k, n_out)

    def _losses(self, out: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k mean losses (k,), as ``per_model_loss`` computes them, and what the gradient
        reuses: the log-softmax (B, n_out, k) for cross-entropy, F − T (B, k, n_out) for MSE."""
        if self.loss == "ce":  # F.cross_entropy's own two steps, so that the backward can reuse the first
            lsm = torch.log_softmax(out.permute(0, 2, 1), dim=1)
            return torch.nn.functional.nll_loss(lsm, y[:, None].expand(-1, self.k), reduction="none").mean(dim=0), lsm
        diff = out - t[:, None, :]
        return (diff ** 2).mean(dim=(0, 2)), diff

    @torch.no_grad()
    def losses(self) -> torch.Tensor:
        """The k mean losses (k,) on every row (before training), as ``per_model_loss``."""
        return self._losses(self._forward(self.phi)[1], self.y, self.t)[0]

    @torch.no_grad()
    def step(self, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of this epoch: write ∂L/∂W into ``W.grad``; returns the k mean losses (k,)."""
        rows, y, t = self.rows[start:stop], self.y_epoch[start:stop], self.t_epoch[start:stop]
        B = stop - start
        R, out = self._forward(rows)
        per, kept = self._losses(out, y, t)
        if self.loss == "ce":  # (softmax − onehot)·w/B, by log-softmax's backward of nll's −w/B at the label
            G = torch.ops.aten._log_softmax_backward_data(t[:, :, None] * -(self.w / B)[None, None, :], kept, 1,
                                                          kept.dtype).permute(0, 2, 1)
        else:  # mean's backward w/(B·n_out), times the square's 2(F − T)
            G = (self.w / (B * self.n_out))[None, :, None] * (2.0 * kept)
        dR = torch.ops.aten.threshold_backward(G.reshape(B, -1).mm(self.A.T), R, 0)  # (B, Σm): relu's backward
        grad = self.W.grad
        assert grad is not None  # made in __init__, and an optimiser's zero_grad(set_to_none) is never called
        if self.low is None:
            torch.mm(dR.T, rows, out=grad)                              # (Σm, d), as mm's backward for Wᵀ
        else:
            grad.copy_(dR.to(self.low).T @ rows)
        return per
