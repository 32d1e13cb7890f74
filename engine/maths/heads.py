"""What every trainer of ReLU heads shares: ``engine.maths.training``'s mini-batch loop, ``span``'s
closed form in the features' span and ``loo``'s masked heads.

The heads of one run are trained side by side as one stacked model, with one regression target
per class (``targets``), each net's loss weighted as its parametrisation asks (``loss_weights``),
batches in an order drawn from the network seed (``BATCH_SEED_OFFSET``); at the end each net gets
its rows of the stacked weights back with its ``TrainResult`` (``write_back``). Long loops report
through ``Progress`` and stop on a ``CancelFlag``. Kept here, below both trainers, so that
``training`` can hand a run to ``span`` without the two importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import torch
import torch.nn.functional as F

from .specs import TrainSpec

if TYPE_CHECKING:
    from .models import Net

Progress = Callable[[float, str], None]


class CancelFlag(Protocol):
    """What a ``cancel`` argument is: anything with ``is_set()`` (a ``threading.Event``)."""

    def is_set(self) -> bool: ...


# The batch order is drawn from its own generator, seeded with the network seed plus this prime, so
# that it differs from the initialisation's stream and two runs with one seed see the same batches.
BATCH_SEED_OFFSET = 7919


@dataclass
class TrainResult:
    losses: list[float]  # [0]: full-batch loss at init; then the mean mini-batch loss of each epoch
    W0: torch.Tensor                       # (m, d) initial weights
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)  # epoch -> W


def targets(y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Regression targets (n, n_out) float64: ±1 for binary, one-hot otherwise."""
    if n_classes == 2:
        return (2.0 * y.double() - 1.0)[:, None]
    return F.one_hot(y, n_classes).double()


def loss_weights(nets: list[Net], spec: TrainSpec) -> torch.Tensor | None:
    """Weights of the k nets' losses in the optimised sum: None for ``ntk`` (plain sum),
    the widths m_j for ``mup`` (μP's learning-rate scaling, see ``engine.maths.training``)."""
    if spec.param == "ntk":
        return None
    return torch.tensor([float(net.mlp.width) for net in nets], device=nets[0].mlp.W.device)


def write_back(nets: list[Net], W: torch.Tensor, W0: torch.Tensor, curves: list,
               snapshots: dict[int, torch.Tensor]) -> list[TrainResult]:
    """Each net's rows of the stacked trained weights W (Σm, d) copied into it, and its ``TrainResult``:
    its column of the loss curves ((epochs + 1) rows of k), its rows of W0 and of each snapshot."""
    results, offset = [], 0
    for j, net in enumerate(nets):
        seg = slice(offset, offset + net.mlp.width)
        offset += net.mlp.width
        with torch.no_grad():
            net.mlp.W.copy_(W[seg])
        results.append(TrainResult([row[j] for row in curves], W0[seg].clone(),
                                   {e: w[seg].clone() for e, w in snapshots.items()}))
    return results
