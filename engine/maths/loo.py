"""Leave-one-out two ways: by retraining a batch of masked heads, and by a kernel's prediction.

``train_masked`` trains many two-layer heads as one batched model, each with its own 0/1 mask
over the training points: a left-out point stays in its batch with its loss terms multiplied
by 0, so every other point keeps its weight and the objective is the full one minus that
point's term (the ``retrain-loo`` experiment's docstring says why, and where the batched heads
follow their lone runs bit for bit). ``kernel_loo`` (exact leave-one-out of kernel ridge
regression) and ``flow_loo`` (of kernel gradient descent for the net's own steps) are the
kernels' predictions of the same change; ``agreement`` sets one against the other.
Sign convention as ``engine.maths.influence``: change = f(x_t) − f₋ᵢ(x_t).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..runtime import budget as B
from ..runtime.errors import BadInput
from .flow import KernelFlow, flow_rates
from .influence import loo_influence
from .models import TwoLayerReLU
from .ridge import kernel_regression
from .span import SpanRun, sgd_in_span
from .specs import INFLUENCE_TARGETS, TrainSpec
from .training import CancelFlag, optimise, resolve_loss, targets

# ---------------------------------------------------------------- the batched masked trainer

def head_outputs(H: torch.Tensor, heads: Sequence[TwoLayerReLU], frozen: torch.Tensor | None = None) -> torch.Tensor:
    """Outputs (k, rows, n_out) of k heads from their stacked pre-activations H = φ Wᵀ (rows, Σm).

    Each head's block goes through ``TwoLayerReLU.forward``'s own operations (relu, the ±1
    readout, antisymmetric twins summed pairwise, then the output scale), so a head computes
    here what it computes alone. ``frozen`` (rows, Σm) bool: the activation pattern at W₀; given,
    relu is replaced by that fixed pattern (the head linearised around W₀,
    ``engine.maths.flow.linearised_head``), which makes training linear regression on the eNTK
    features.
    """
    R = torch.relu(H) if frozen is None else H.masked_fill(~frozen, 0.0)
    out = []
    for part, head in zip(R.split([h.width for h in heads], dim=1), heads, strict=True):
        if getattr(head, "init", "gaussian") == "antisymmetric":
            half = head.width // 2
            o = (part[:, :half] - part[:, half:]) @ head.a[:half]
        else:
            o = part @ head.a
        out.append(o / (math.sqrt(head.width) if head.param == "ntk" else head.width))
    return torch.stack(out)


def masked_losses(out: torch.Tensor, y: torch.Tensor, keep: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """Each head's batch loss (k,): out (k, B, n_out), labels y (B,), keep (k, B) 0/1 in out's dtype.

    MSE: Σ_b keep_b Σ_c (out − t)² / (B · n_out); cross-entropy: Σ_b keep_b CE_b / B. A kept
    row contributes exactly what it does to ``engine.maths.training.per_model_loss``; a dropped one
    nothing, and the normaliser stays that of the full batch (module notes).
    """
    rows = y.shape[0]
    if loss == "ce":
        per = torch.nn.functional.cross_entropy(out.permute(1, 2, 0), y[:, None].expand(-1, out.shape[0]),
                                                reduction="none").T  # (k, B)
        return (per * keep).sum(dim=1) / rows
    t = targets(y, n_classes).to(out.dtype)
    return (keep[:, :, None] * (out - t) ** 2).sum(dim=(1, 2)) / (rows * out.shape[2])


@dataclass
class MaskedRun:
    W: torch.Tensor        # (Σm, d) trained stacked weights
    W0: torch.Tensor       # (Σm, d) initial stacked weights
    losses: list           # (epochs + 1) rows of k losses: [0] full-batch at init, then each epoch's mean

    def pre_activations(self, feats: torch.Tensor) -> torch.Tensor:
        """feats Wᵀ (rows, Σm) for feature rows (rows, d); ``span.SpanRun`` has the same, without W."""
        return feats @ self.W.T


def train_masked(phi: torch.Tensor, y: torch.Tensor, n_classes: int, heads: Sequence[TwoLayerReLU],
                 keep: torch.Tensor, spec: TrainSpec, seed: int = 0, progress: Callable[[float, str], None] | None = None,
                 cancel: CancelFlag | None = None, frozen: torch.Tensor | None = None,
                 in_span: bool | None = None) -> MaskedRun | SpanRun:
    """Train k heads as one batched model, head j on the points where ``keep[j]`` is True.

    phi (n, d) fixed features (their dtype is the training dtype); y (n,) labels; heads: k
    ``TwoLayerReLU`` whose weights are the initialisations (not changed here; one head may
    appear several times); keep (k, n) bool. Batches follow ``engine.maths.training``'s order for
    ``seed`` (the same for every head, dropped points included); ``spec`` gives optimiser, rate,
    decay, batch size, loss and parametrisation (μP weights head j's loss by its width, as
    ``engine.maths.training.loss_weights`` does). ``frozen`` (n, Σm) bool: train the linearised
    heads instead (``head_outputs``). A head kept everywhere follows ``engine.maths.training.train``.
    ``in_span``: plain SGD run in the span of the training features (``engine.maths.span``: the same
    steps, summed in another order), where it takes fewer FLOPs; None chooses it for float32 SGD
    when n < 2d (bfloat16 GEMMs stay in weight space), False keeps the weight-space steps (which follow a lone head's run bit for bit).
    Returns a ``MaskedRun`` or, in the span, a ``span.SpanRun`` (its W formed on first use): read new
    rows' outputs through ``pre_activations``.
    """
    k, n = keep.shape
    if k != len(heads) or n != phi.shape[0]:
        raise BadInput(f"keep must be (heads, points) = ({len(heads)}, {phi.shape[0]}), got {tuple(keep.shape)}")
    loss_name = resolve_loss(spec, n_classes)
    for head in heads:  # as engine.maths.training: the spec decides the parametrisation
        head.param = spec.param
    w8 = keep.to(phi.dtype)
    weights = None if spec.param == "ntk" else torch.tensor([float(h.width) for h in heads], dtype=phi.dtype,
                                                            device=phi.device)

    if in_span if in_span is not None else B.in_span(n, phi.shape[1], spec):
        return sgd_in_span(phi, y, n_classes, heads, w8, spec, seed, progress, cancel, frozen, weights, loss_name)

    W0 = torch.cat([h.W.detach() for h in heads]).to(phi.dtype).clone()
    W = torch.nn.Parameter(W0.clone())

    def batch_losses(idx):
        out = head_outputs(phi[idx] @ W.T, heads, None if frozen is None else frozen[idx])
        return masked_losses(out, y[idx], w8[:, idx], loss_name, n_classes)

    def per_model(idx, _inputs):  # the full set (idx None) for the loss before the first step
        return batch_losses(torch.arange(n, device=phi.device) if idx is None else idx)

    losses, _, _ = optimise([W], per_model, y, k, spec, seed, progress, cancel, None, weights)
    return MaskedRun(W.detach(), W0, losses)


# ---------------------------------------------------------------- kernels' predictions and agreement

def score(D: torch.Tensor, target: str, y_test: torch.Tensor, jstar: torch.Tensor | None = None) -> torch.Tensor:
    """Changes (n_test, k, c) scored on ``target``, (n_test, k) float64.

    ``true``: the output of the test point's label; ``margin``: that minus output j*[t]
    (``jstar`` (n_test,), the best other class, fixed by the caller); ``sum``: all outputs.
    One output (c = 1): that output, whatever the target.
    """
    if target not in INFLUENCE_TARGETS:
        raise BadInput(f"unknown influence target {target!r}; allowed: {', '.join(INFLUENCE_TARGETS)}")
    D = D.double()
    if D.shape[2] == 1:
        return D[:, :, 0]
    if target == "sum":
        return D.sum(dim=2)
    rows = torch.arange(D.shape[0], device=D.device)
    own = D[rows, :, y_test]
    return own if target == "true" else own - D[rows, :, jstar]


def best_other(f: torch.Tensor, y_test: torch.Tensor) -> torch.Tensor:
    """j*[t] = argmax over classes other than y_test[t] of f (n_test, c): margin's rival class
    (zeros for one output, where every target scores that output and y_test are 0/1 labels)."""
    if f.shape[1] == 1:
        return torch.zeros(f.shape[0], dtype=torch.long, device=f.device)
    return f.scatter(1, y_test[:, None], float("-inf")).argmax(dim=1)


@dataclass
class KernelLOO:
    """One kernel's leave-one-out changes at some training points, and the margin's rival classes."""

    D: torch.Tensor       # (n_test, p, c) float64: f(x_t) − f₋ᵢ(x_t) per class, i = points[j]
    points: torch.Tensor  # (p,) training indices, ascending
    jstar: torch.Tensor   # (n_test,) best other class of the kernel's full prediction

    def scored(self, target: str, y_test: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
        """(n_test, p) or (n_test, len(cols)) on ``target``; ``cols`` are training indices among ``points``.
        For the ridge leave-one-out these are ``influence_matrix``'s numbers."""
        if cols is None:
            return score(self.D, target, y_test, self.jstar)
        where = torch.searchsorted(self.points, cols.to(self.points.device))
        if not torch.equal(self.points[where.clamp(max=len(self.points) - 1)], cols.to(self.points.device)):
            raise BadInput(f"points {cols.tolist()} are not all among this leave-one-out's {len(self.points)} points")
        return score(self.D[:, where.to(self.D.device)], target, y_test, self.jstar)


def kernel_loo(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, y_test: torch.Tensor, ridge: float) -> KernelLOO:
    """Exact leave-one-out of kernel ridge regression (``engine.maths.influence``) with K (n, n),
    K_test (n_test, n), targets Y (n, c), at every training point."""
    D = loo_influence(K, K_test, Y, ridge)
    jstar = best_other(kernel_regression(K, K_test, Y, ridge, "the kernel's ridge prediction"), y_test)
    return KernelLOO(D, torch.arange(K.shape[0], device=D.device), jstar)


def flow_loo(K: torch.Tensor, K_test: torch.Tensor, Y: torch.Tensor, y_test: torch.Tensor, points: torch.Tensor,
             spec: TrainSpec, F0: torch.Tensor, F0_test: torch.Tensor) -> KernelLOO:
    """Leave-one-out of kernel gradient descent run as long as ``spec`` trains (MSE, SGD):
    ``engine.maths.flow.KernelFlow`` with all n points and without each of ``points``, from the
    net's initial outputs F0 (n, c) and F0_test (n_test, c). The rate per point η' = 2η/(n·c)
    is the full set's in every refit, as masking keeps each point's weight (module notes)."""
    n, c = Y.shape
    rates = flow_rates(spec, n, c)
    if rates is None:
        raise BadInput("the gradient-flow leave-one-out needs plain SGD on MSE (--optimizer sgd --loss mse)")
    eta, beta, per_epoch = rates
    tau = float(spec.epochs * per_epoch)
    full = KernelFlow(K, K_test).predict(Y, F0, F0_test, eta, beta, tau)
    points = torch.sort(points.to(K.device)).values
    D = []
    for i in points.tolist():
        keep = torch.arange(n, device=K.device) != i
        D.append(full - KernelFlow(K[keep][:, keep], K_test[:, keep]).predict(Y[keep], F0[keep], F0_test, eta,
                                                                             beta, tau))
    return KernelLOO(torch.stack(D, dim=1), points, best_other(full, y_test))


def stopping_ridge(spec: TrainSpec, n: int, n_out: int, mean_diag: float) -> float | None:
    """The ridge, relative to ``mean_diag`` of the kernel, that early stopping after ``spec``'s
    steps roughly amounts to for MSE and SGD: λ ≈ 1/(η'τ) + β/η' = n·c/(2ητ) + n·c·w/2 (η' = 2η/(n·c),
    β = ηw, τ steps; ``engine.maths.flow.flow_rates``); None otherwise."""
    flow = flow_rates(spec, n, n_out)
    if flow is None or spec.epochs == 0 or mean_diag <= 0:
        return None
    eta, beta, per_epoch = flow
    steps = spec.epochs * per_epoch
    return (1.0 / (eta * steps) + beta / eta) / mean_diag
