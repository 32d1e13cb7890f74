"""When a trained net's numbers can be read: against its own kernel, and against chance level.

``passes_gate``: a net trained when its test accuracy is within ``TRAIN_GATE`` of ridge regression
with its own trained K_m (the Reproduction page's and the README's gate). ``untrained``: the
pages' near-chance banner.

A net that trains only to about chance has not learned the task, so its kernel distances,
influences and flip rates describe an untrained predictor. The gate is per seed: a group of
nets (an architecture at a width) fails it when its *worst* seed's train accuracy lies within
``CHANCE_POINTS`` of chance, 1/c for c classes (a binary task on one ±1 output: 1/2), so a
mean cannot hide one net that never trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._lazy import LazyModule

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows

TRAIN_GATE = 0.10       # a net trained when its test accuracy is within this of its own K_m ridge's
GATE_SHARE = 0.80       # a cell "did not train" when fewer of an architecture's nets than this pass the gate;
#                         above it, the nets below the gate are left out of the cell's estimate (and named)
CHANCE_POINTS = 0.10  # train accuracy up to 1/c + 10 points counts as "at chance": the task is not learned


def chance_level(n_classes: int) -> float:
    """Accuracy of guessing, 1/c, for c >= 2 classes."""
    c = int(n_classes)
    if c < 2:
        raise ValueError(f"chance level needs at least 2 classes, got {n_classes!r}")
    return 1.0 / c


def near_chance(train_acc: float, n_classes: int) -> bool:
    """True when a train accuracy (fraction in [0, 1]) is within ``CHANCE_POINTS`` of chance."""
    return float(train_acc) <= chance_level(n_classes) + CHANCE_POINTS


def untrained(rows: pd.DataFrame, n_classes: int, by: tuple[str, ...] = ("arch", "width"),
              acc: str = "train_acc") -> pd.DataFrame:
    """The groups of ``rows`` (one row per net, e.g. per seed) whose worst net is near chance.

    rows: a frame with the ``by`` columns (those present are used) and ``acc`` (fractions).
    Returns one row per failing group: the ``by`` columns, ``worst`` and ``mean`` train
    accuracy, ``nets`` and ``chance`` (1/c); empty (same columns) when every group passes.
    """
    keys = [k for k in by if k in rows]
    cols = keys + ["worst", "mean", "nets", "chance"]
    if rows.empty or acc not in rows:
        return pd.DataFrame(columns=cols)
    grouped = rows.groupby(keys, sort=False)[acc] if keys else rows[acc].groupby(lambda _: 0)
    out = grouped.agg(worst="min", mean="mean", nets="count").reset_index()
    if not keys:
        out = out.drop(columns=out.columns[0])
    out["chance"] = chance_level(n_classes)
    failing = out[out["worst"] <= out["chance"] + CHANCE_POINTS]
    return failing[cols].reset_index(drop=True)


def passes_gate(test_acc, test_acc_kernel):
    """The training gate, per net: test accuracy ≥ its own K_m kernel-ridge test accuracy −
    ``TRAIN_GATE``. Elementwise on arrays (bool array); ``numpy.bool_`` on scalars.

    K_m is the trained net's empirical NTK: a net that trained in its kernel regime classifies
    about as well as ridge regression with that kernel, while one whose weights barely moved
    (or that diverged) sits far below it and fails the gate."""
    return np.asarray(test_acc, dtype=float) >= np.asarray(test_acc_kernel, dtype=float) - TRAIN_GATE
