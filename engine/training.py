"""Training the ReLU head with the paper's protocol (every knob an option).

Only W is trained. The features φ(X) do not depend on W, so they are computed once and the
head is trained on them (MLP-Attn's transductive attention is fixed by the clean training
set). Binary tasks use one output and targets ±1 with MSE; multi-class tasks use c outputs
with cross-entropy (``loss="auto"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .errors import BadInput, Cancelled

Progress = Callable[[float, str], None]
LOSSES = ("auto", "ce", "mse")


@dataclass(frozen=True)
class TrainSpec:
    epochs: int = 500            # paper: 500; 0 means no training
    lr: float = 1e-3             # Adam learning rate (paper)
    batch_size: int = 128        # paper
    weight_decay: float = 1e-3   # L2 penalty through Adam's weight_decay (paper)
    loss: str = "auto"           # "auto": MSE on ±1 for 2 classes, cross-entropy otherwise
    snapshot_epochs: tuple[int, ...] = ()  # epochs after which W is kept (kernel snapshots)

    def __post_init__(self):
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise BadInput(f"epochs must be an integer >= 0, got {self.epochs!r}")
        if not self.lr > 0:
            raise BadInput(f"lr must be > 0, got {self.lr!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise BadInput(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not self.weight_decay >= 0:
            raise BadInput(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.loss not in LOSSES:
            raise BadInput(f"unknown loss {self.loss!r}; allowed: {', '.join(LOSSES)}")


def n_outputs(n_classes: int) -> int:
    """One output (±1 targets) for binary tasks, one per class otherwise."""
    return 1 if n_classes == 2 else n_classes


def resolve_loss(spec: TrainSpec, n_classes: int) -> str:
    if spec.loss == "auto":
        return "mse" if n_classes == 2 else "ce"
    if spec.loss == "ce" and n_classes == 2:
        raise BadInput("loss 'ce' needs 3 or more classes here; binary tasks have one ±1 output")
    return spec.loss


def targets(y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Regression targets (n, n_out) float64: ±1 for binary, one-hot otherwise."""
    if n_classes == 2:
        return (2.0 * y.double() - 1.0)[:, None]
    return F.one_hot(y, n_classes).double()


def loss_fn(out: torch.Tensor, y: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """Mean training loss of outputs (n, n_out) against integer labels (n,)."""
    if loss == "ce":
        return F.cross_entropy(out, y)
    return F.mse_loss(out, targets(y, n_classes).to(out.dtype))


def predict_labels(out: torch.Tensor) -> torch.Tensor:
    """Class predictions from outputs (n, n_out): sign for one output, argmax otherwise."""
    return (out[:, 0] > 0).long() if out.shape[1] == 1 else out.argmax(dim=1)


@dataclass
class TrainResult:
    losses: list[float]  # [0]: full-batch loss at init; then the mean mini-batch loss of each epoch
    W0: torch.Tensor                       # (m, d) initial weights
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)  # epoch -> W


def _per_model_loss(out: torch.Tensor, y: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """Mean loss of each of k models, (k,), from outputs (B, k, n_out) and labels (B,)."""
    if loss == "ce":
        return F.cross_entropy(out.permute(0, 2, 1), y[:, None].expand(-1, out.shape[1]),
                               reduction="none").mean(dim=0)
    t = targets(y, n_classes).to(out.dtype)[:, None, :]
    return ((out - t) ** 2).mean(dim=(0, 2))


def train(net, X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int = 0,
          progress: Progress | None = None, cancel=None,
          epoch_features: Callable[[int], torch.Tensor] | None = None) -> TrainResult:
    """Train ``net.mlp.W`` in place on raw inputs X (n, d) and labels y (n,).

    Deterministic on CPU for a given seed (it seeds the batch order). ``cancel`` is any
    object with ``is_set()``; it is checked every epoch and raises ``Cancelled``.
    ``epoch_features(epoch)``, when given, returns the features (n, d) to train on in that
    epoch (adversarial training recomputes them from attacked inputs); otherwise the
    features of X are computed once.
    """
    return train_many([net], X, y, n_classes, spec, seed, progress, cancel, epoch_features)[0]


def train_many(nets, X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int = 0,
               progress: Progress | None = None, cancel=None,
               epoch_features: Callable[[int], torch.Tensor] | None = None) -> list[TrainResult]:
    """Train several nets on the same features as one batched model; same result as ``train`` each.

    The nets must share arch, attention and training set (so their features agree); widths
    may differ. Their weight matrices are stacked into one (Σm, d) parameter and each net's
    ``a / √m`` into a block-diagonal (Σm, k·n_out) readout, so a step is two GEMMs for all
    widths. The loss is the sum of the nets' mean losses: each block's gradient is its own
    net's, and Adam and weight decay act elementwise, so every net follows the trajectory
    it would follow alone (up to float rounding). Weights are written back in place.
    """
    if epoch_features is not None and len(nets) != 1:
        raise BadInput("epoch_features trains a single net")
    loss_name = resolve_loss(spec, n_classes)
    with torch.no_grad():
        phi = nets[0].features(X)
    y = y.to(phi.device)
    k, n_out = len(nets), nets[0].mlp.a.shape[1]
    sizes = [net.mlp.width for net in nets]
    W = torch.nn.Parameter(torch.cat([net.mlp.W.detach() for net in nets]))
    W0 = W.detach().clone()
    A = torch.block_diag(*[net.mlp.a / math.sqrt(net.mlp.width) for net in nets])
    opt = torch.optim.Adam([W], lr=spec.lr, weight_decay=spec.weight_decay, fused=True)  # one kernel per step
    g = torch.Generator().manual_seed(int(seed) + 7919)
    n = phi.shape[0]

    def per_model(phi_b, y_b):
        return _per_model_loss((torch.relu(phi_b @ W.T) @ A).reshape(-1, k, n_out), y_b, loss_name, n_classes)

    with torch.no_grad():
        losses = [per_model(phi, y)]
    snapshots = {0: W0.clone()} if 0 in spec.snapshot_epochs else {}
    for epoch in range(1, spec.epochs + 1):
        if cancel is not None and cancel.is_set():
            raise Cancelled("training cancelled")
        if epoch_features is not None:
            phi = epoch_features(epoch).detach()
        order = torch.randperm(n, generator=g).to(phi.device)
        total = torch.zeros(k, dtype=phi.dtype, device=phi.device)
        for start in range(0, n, spec.batch_size):
            idx = order[start:start + spec.batch_size]
            opt.zero_grad(set_to_none=False)  # reuse the gradient buffer: no page faults per step
            batch = per_model(phi[idx], y[idx])
            batch.sum().backward()
            opt.step()
            total += batch.detach() * idx.numel()
        losses.append(total / n)
        if epoch in spec.snapshot_epochs:
            snapshots[epoch] = W.detach().clone()
        if progress is not None:
            progress(epoch / spec.epochs, f"epoch {epoch}/{spec.epochs}")

    curves = torch.stack(losses).cpu().tolist()  # (epochs + 1, k): one transfer at the end
    results, offset = [], 0
    for j, (net, m) in enumerate(zip(nets, sizes)):
        seg = slice(offset, offset + m)
        offset += m
        with torch.no_grad():
            net.mlp.W.copy_(W[seg])
        results.append(TrainResult([row[j] for row in curves], W0[seg].clone(),
                                   {e: w[seg].clone() for e, w in snapshots.items()}))
    return results


def accuracy(net, X: torch.Tensor, y: torch.Tensor) -> float:
    """Share of X (n, d) whose predicted class equals y (n,)."""
    with torch.no_grad():
        return float((predict_labels(net(X)) == y.to(X.device)).double().mean())
