"""Plain SGD of many masked two-layer heads in the span of their features, the gradient in closed form.

``engine.maths.loo.train_masked`` trains k heads (a full run and its leave-one-out copies) as one
batched model. For plain SGD with coupled decay λ every step moves W by −η(δᵀφ_b + λW), δ = ∂L/∂H on
the batch b, so W = s·W₀ + Cᵀφ with s = (1 − ηλ)^t and C (n, m) per head, and a batch's
pre-activations are H_b = s·(φW₀ᵀ)_b + G_b C with the features' Gram G = φφᵀ: one (B, n)·(n, m)
product per head instead of weight space's two (B, d)·(d, m), 2d/n times fewer FLOPs.

The heads come in runs of copies of one head (same W₀, readout and width), each run one batched
product over (copies, B, m) with φW₀ᵀ computed once. The head's outputs are ``TwoLayerReLU.forward``'s
operations (antisymmetric twins subtracted before the readout, so f₀ stays exactly 0, then divided
by the output scale) and ∂L/∂H is written in closed form instead of by autograd:

    out = relu(H)·a / s_div,   ∂L/∂out = w_j·keep_b·(2(out − T)/(B·c) | (softmax − onehot)/B),
    ∂L/∂H = (∂L/∂out·aᵀ / s_div) ⊙ 1[relu(H) > 0]

(antisymmetric: a = [a₁; −a₁], the readout's own, so aᵀ writes both twins' gradients), which are
autograd's operations on the same loss (``engine.maths.loo.masked_losses``). A linearised head
(``frozen``) replaces relu's pattern by the fixed one at W₀. The autograd weight-space trainer is the
reference it is tested against (``tests/test_retrain.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from ..runtime.errors import BadInput, Cancelled
from .heads import BATCH_SEED_OFFSET, CancelFlag, Progress, TrainResult, loss_weights, targets, write_back
from .models import Net, TwoLayerReLU
from .specs import TrainSpec


@dataclass
class _Run:
    """``copies`` consecutive copies of one head: their C side by side, (n, copies·m), one GEMM per step."""

    head: TwoLayerReLU
    copies: int
    rows: slice                  # their rows among the k heads
    P0: torch.Tensor             # (n, m): φ W₀ᵀ, shared by the copies
    C: torch.Tensor              # (n, copies·m): W = s·W₀ + Cᵀφ, copy j in columns j·m:(j + 1)·m
    frozen: torch.Tensor | None  # (n, copies·m) bool: the fixed activation pattern of a linearised head
    bufs: dict = field(default_factory=dict)  # the step's activations, allocated once at the largest batch

    def buf(self, name: str, rows: int, *shape: int) -> torch.Tensor:
        """A reused (rows, *shape) buffer: a step's 10-100 MB activations allocated afresh each time
        fault their pages in again (at 44 MB, above what glibc keeps, 2-3x a pass's own time)."""
        b = self.bufs.get(name)
        if b is None or b.shape[0] < rows:
            b = self.bufs[name] = torch.empty(rows, *shape, dtype=self.C.dtype, device=self.C.device)
        return b[:rows]

    @property
    def divisor(self) -> float:  # the output scale as TwoLayerReLU.forward applies it
        return math.sqrt(self.head.width) if self.head.param == "ntk" else float(self.head.width)


def _runs(phi: torch.Tensor, heads: Sequence[TwoLayerReLU], frozen: torch.Tensor | None) -> list[_Run]:
    groups: list[list] = []  # [head, copies]: consecutive copies of one head object
    for h in heads:
        if groups and groups[-1][0] is h:
            groups[-1][1] += 1
        else:
            groups.append([h, 1])
    out, row, col, n = [], 0, 0, phi.shape[0]
    for head, c in groups:
        cols = c * head.width
        out.append(_Run(head, c, slice(row, row + c), phi @ head.W.detach().to(phi.dtype).T,
                        torch.zeros(n, cols, dtype=phi.dtype, device=phi.device),
                        None if frozen is None else frozen[:, col:col + cols].contiguous()))
        row, col = row + c, col + cols
    return out


def _step(run: _Run, Gb: torch.Tensor, idx: torch.Tensor, scale: float, y: torch.Tensor, t: torch.Tensor,
          keep: torch.Tensor, w: torch.Tensor | None, loss: str, grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One run's mean losses (copies,) on the batch idx (B,) and, with ``grad``, ∂L/∂H (B, copies·m)."""
    c, B, m = run.copies, idx.numel(), run.head.width
    H = torch.mm(Gb, run.C, out=run.buf("H", B, c * m)).view(B, c, m)
    H.add_(run.P0[idx][:, None, :], alpha=scale)                       # s·φ_b W₀ᵀ + G_b C
    fb = None if run.frozen is None else run.frozen[idx].view(B, c, m)
    R = H.clamp_min_(0.0) if fb is None else H.mul_(fb)
    a = run.head.a.to(R.dtype)
    if run.head.init == "antisymmetric":
        h = m // 2
        out = torch.sub(R[..., :h], R[..., h:], out=run.buf("D", B, c, h)) @ a[:h]
    else:
        out = R @ a
    out = out / run.divisor                                              # (B, c, n_out)
    kb = keep[run.rows][:, idx].T[:, :, None]                            # (B, c, 1)
    yb = y[idx]
    if loss == "ce":
        lsm = torch.log_softmax(out, dim=2)
        per = -(kb[..., 0] * lsm.gather(2, yb[:, None, None].expand(-1, c, 1))[..., 0]).sum(dim=0) / B
        dout = (torch.exp(lsm) - F.one_hot(yb, out.shape[2]).to(out.dtype)[:, None, :]) * (kb / B) if grad else None
    else:
        diff = out - t[idx][:, None, :]
        per = (kb * diff ** 2).sum(dim=(0, 2)) / (B * out.shape[2])
        dout = diff * (kb * (2.0 / (B * out.shape[2]))) if grad else None
    if dout is None:
        return per, None
    if w is not None:  # μP: head j's loss weighted by its width
        dout = dout * w[run.rows][None, :, None]
    dR = torch.matmul(dout / run.divisor, a.T, out=run.buf("dR", B, c, m))  # (B, c, m)
    if fb is not None:
        dR.mul_(fb)
    else:  # relu's backward, in place
        torch.ops.aten.threshold_backward.grad_input(dR, R, 0, grad_input=dR)
    return per, dR.view(B, c * m)


def sgd_in_span(phi: torch.Tensor, y: torch.Tensor, n_classes: int, heads: Sequence[TwoLayerReLU], keep: torch.Tensor,
                spec: TrainSpec, seed: int, progress: Callable[[float, str], None] | None, cancel: CancelFlag | None,
                frozen: torch.Tensor | None, weights: torch.Tensor | None, loss: str,
                snapshots: Iterable[int] = ()) -> SpanRun:
    """``train_masked`` for plain SGD: heads (k) trained on the points ``keep`` (k, n) in phi's dtype
    marks, in ``engine.maths.training``'s batch order for ``seed``; ``weights`` (k,) μP's loss weights
    or None; ``frozen`` (n, Σm) bool, the linearised heads' pattern. Returns the trained weights
    (Σm, d), the initial ones and the loss curves ((epochs + 1) rows of k, as ``training.optimise``'s)
    as a ``SpanRun``, with the weights after each epoch in ``snapshots`` (``SpanRun.W_at``; 0: W₀)."""
    if spec.optimizer != "sgd" or spec.train_precision != "float32":
        raise BadInput(f"training in the features' span is plain SGD's in float32; optimizer {spec.optimizer!r} "
                       f"with train precision {spec.train_precision!r} is not")
    n = phi.shape[0]
    runs = _runs(phi, heads, frozen)
    G = phi @ phi.T
    t = targets(y, n_classes).to(phi.dtype)
    w = None if weights is None else weights.to(phi.dtype)
    scale, decay = 1.0, 1.0 - spec.lr * spec.weight_decay
    wanted = set(snapshots)
    snaps = {0: (1.0, [torch.zeros_like(r.C) for r in runs])} if 0 in wanted else {}

    def losses(idx: torch.Tensor, grad: bool) -> tuple[torch.Tensor, list]:
        Gb = G[idx]
        parts = [_step(r, Gb, idx, scale, y, t, keep, w, loss, grad) for r in runs]
        return torch.cat([p for p, _ in parts]), [d for _, d in parts]

    with torch.no_grad():
        curve = [losses(torch.arange(n, device=phi.device), False)[0]]
        g = torch.Generator().manual_seed(int(seed) + BATCH_SEED_OFFSET)  # training.optimise's batch order
        for epoch in range(1, spec.epochs + 1):
            if cancel is not None and cancel.is_set():
                raise Cancelled("training cancelled")
            order = torch.randperm(n, generator=g).to(y.device)
            total = torch.zeros(len(heads), dtype=phi.dtype, device=phi.device)
            for start in range(0, n, spec.batch_size):
                idx = order[start:start + spec.batch_size]
                batch, deltas = losses(idx, True)
                if decay != 1.0:
                    scale *= decay
                for r, delta in zip(runs, deltas, strict=True):
                    if decay != 1.0:
                        r.C.mul_(decay)
                    r.C.index_add_(0, idx, delta, alpha=-spec.lr)  # a batch's rows are distinct: one update each
                total += batch * idx.numel()
            curve.append(total / n)
            if not bool(torch.isfinite(curve[-1]).all()):
                raise BadInput(f"training diverged at epoch {epoch}: the loss is not finite; lower the learning "
                               f"rate (now {spec.lr:g}) or the weight decay")
            if epoch in wanted:
                snaps[epoch] = (scale, [r.C.clone() for r in runs])
            if progress is not None:
                progress(epoch / spec.epochs, f"epoch {epoch}/{spec.epochs}")
    return SpanRun(phi, runs, scale, torch.stack(curve).cpu().tolist(), snaps)


class SpanRun:
    """``sgd_in_span``'s heads, kept as W = s·W₀ + Cᵀφ: the weights (Σm, d) are formed only when asked
    for (at 21 copies of m = 4096 on MNIST that is 270 MB and more time than a few epochs), while the
    pre-activations of new rows take (rows, n)·(n, Σm), as in training."""

    def __init__(self, phi: torch.Tensor, runs: list[_Run], scale: float, losses: list,
                 snapshots: dict[int, tuple[float, list[torch.Tensor]]] | None = None):
        self.phi, self.runs, self.scale, self.losses = phi, runs, scale, losses
        self.snapshots = snapshots or {}  # epoch -> (s, each run's C) after it

    def _w0(self, r: _Run) -> torch.Tensor:
        return r.head.W.detach().to(self.phi.dtype)

    @functools.cached_property
    def W0(self) -> torch.Tensor:
        """(Σm, d) initial weights, the heads' in order."""
        return torch.cat([self._w0(r).repeat(r.copies, 1) for r in self.runs])

    @torch.no_grad()
    def _weights(self, scale: float, Cs: list[torch.Tensor]) -> torch.Tensor:
        Ws = [torch.addmm(self._w0(r).repeat(r.copies, 1), C.T, self.phi, beta=scale)
              for r, C in zip(self.runs, Cs, strict=True)]
        return Ws[0] if len(Ws) == 1 else torch.cat(Ws)

    @functools.cached_property
    def W(self) -> torch.Tensor:
        """(Σm, d) trained weights; copy j of a run in its rows j·m:(j + 1)·m."""
        return self._weights(self.scale, [r.C for r in self.runs])

    def W_at(self, epoch: int) -> torch.Tensor:
        """(Σm, d) weights after ``epoch`` (one of the run's ``snapshots``)."""
        if epoch not in self.snapshots:
            raise BadInput(f"no snapshot at epoch {epoch}; kept: {sorted(self.snapshots)}")
        return self._weights(*self.snapshots[epoch])

    @torch.no_grad()
    def pre_activations(self, feats: torch.Tensor) -> torch.Tensor:
        """feats Wᵀ (rows, Σm) for feature rows (rows, d), without forming W: s·feats W₀ᵀ + (feats φᵀ) C."""
        Gf, parts = feats @ self.phi.T, []
        for r in self.runs:
            m = r.head.width
            parts.append((Gf @ r.C).view(-1, r.copies, m).add_((feats @ self._w0(r).T)[:, None, :], alpha=self.scale)
                         .view(-1, r.copies * m))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def train_in_span(nets: list[Net], phi: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int,
                   progress: Progress | None, cancel: CancelFlag | None, loss_name: str) -> list[TrainResult]:
    """``engine.maths.training.train_many`` for float32 plain SGD with n < 2d, in the features' span
    (``sgd_in_span``: the same steps summed in another order, 2d/n times fewer FLOPs; the weight-space
    closed form is its tested reference). The nets' weights are written back, as there."""
    keep = torch.ones(len(nets), phi.shape[0], dtype=phi.dtype, device=phi.device)
    run = sgd_in_span(phi, y, n_classes, [net.mlp for net in nets], keep, spec, seed, progress, cancel, None,
                      loss_weights(nets, spec), loss_name, spec.snapshot_epochs)
    return write_back(nets, run.W, run.W0, run.losses,
                      {e: run.W_at(e) for e in spec.snapshot_epochs if e <= spec.epochs})
