"""The small typed records a run unit takes instead of a whole config: how one net is made and
trained (``NetRecipe``), how influence is read (``Reading``), and what each reading is exact for.

Torch-free (the configs build these, and the command line imports the configs without torch).
A unit reads only the fields it needs from these; ``net_recipe`` and ``reading_of`` build them
from any config that has the usual fields (``engine.experiments.options``).

Influence readings (``READINGS``), each a column of every malleability row:

- ``ridge``: the exact leave-one-out of kernel ridge regression on the chosen kernel (the trained
  net's eNTK K_m, or K∞ of its features) at the config's ridge: the engine's and the paper's
  influence. Exact for a net that trains to kernel ridge regression: MSE, lazy, converged.
- ``flow``: the leave-one-out of kernel gradient descent on the same kernel, run for the net's own
  SGD steps and learning rate (``engine.maths.loo.flow_loo``): the kernel regime's prediction of this
  very training, early stopping included. Exact for lazy SGD on MSE with one output; with several,
  the per-output kernel leaves out the cross-output coupling of a finite-width head (of order m^-½).
- ``retrain``: the network's own leave-one-out: the head retrained from the same initialisation
  and batch order without each tracked point (``engine.maths.loo.train_masked``). Exact for the
  training the net had, whatever its loss and optimiser (on CPU, up to float rounding of the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..maths.specs import TrainSpec

READINGS = ("ridge", "flow", "retrain")
SEED_FREE = "seed-free"   # a reading whose clean influence no network seed changes (K∞ of fixed features)


@dataclass(frozen=True)
class NetRecipe:
    """One net: architecture, attention over the training set, width, initialisation, training, seed."""

    arch: str
    attention: str
    width: int
    init: str
    init_std: float
    normalize: bool
    train: TrainSpec
    seed: int


@dataclass(frozen=True)
class Reading:
    """How an influence is read: ``name`` in READINGS, on ``kernel`` (entk or kinf) at ``ridge``,
    scored on ``target``; kernels stored in ``storage``, computed in ``precision``."""

    name: str
    kernel: str
    target: str
    ridge: float
    storage: str
    precision: str

    def exact_for(self) -> str:
        """The training this reading is exact for, in words (every row carries it)."""
        return {"ridge": "kernel ridge regression on MSE: plain SGD without decay trained to convergence",
                "flow": "lazy SGD on MSE for the net's own steps",
                "retrain": "the net's own training, any loss and optimiser"}[self.name]

    def matches(self, train: TrainSpec, loss: str, converged: bool = False) -> bool:
        """Whether the net's training is the one this reading is exact for (``loss``: the resolved
        loss): the loss, the optimiser, the steps and the decay. ``flow`` follows the net's own SGD
        steps (batches, decay and early stopping included) on MSE; ``ridge`` is the limit of plain SGD
        on MSE without decay run to convergence, so it matches only a net that got there
        (``converged``: the caller's check, e.g. every training point fitted). Laziness is not checked
        here: rows carry the weight movement and the K_m baseline."""
        if self.name == "retrain":
            return True
        if self.name == "flow":
            return train.optimizer == "sgd" and loss == "mse"
        return loss == "mse" and train.optimizer == "sgd" and train.weight_decay == 0 and bool(converged)


def net_recipe(cfg: Any, arch: str, width: int, seed: int) -> NetRecipe:
    """The recipe of one (arch, width, seed) of a config with the usual fields."""
    return NetRecipe(arch, cfg.attention, int(width), cfg.init, cfg.init_std, cfg.data.normalize, cfg.train,
                     int(seed))


def reading_of(cfg: Any, name: str = "ridge") -> Reading:
    """The reading ``name`` with a config's kernel, target, ridge, storage and precision."""
    return Reading(name, cfg.influence_kernel, cfg.target, cfg.ridge, cfg.storage, cfg.precision)
