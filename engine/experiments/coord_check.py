"""The ``coord-check`` experiment: μP's coordinate check of the first optimiser steps.

Coordinate check (after Yang et al. 2022, "Tensor Programs V", and the ``mup`` package):
the RMS change of the outputs Δf and of the hidden pre-activations Δh = φ (W_t − W_0)ᵀ after
t = 1 … T steps, against width. Theory (``COORD_THEORY``, log-log slopes, no weight decay):
ntk + SGD: Δh ∝ m^-1/2 (lazy), Δf flat; ntk + Adam: Δh flat, Δf ∝ m^+1/2; μP: both flat.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd
import torch

from ..maths.flow import batch_steps, stack_heads
from ..maths.metrics import loglog_slope, summarize
from ..maths.models import Net
from ..maths.training import per_model_loss, resolve_loss
from ..runtime.cache import Result
from .configs.coord_check import CoordCheckConfig
from .runs import Progress, experiment_run, prepare, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

COORD_METRICS = ("delta_f", "delta_h", "f_rms")
COORD_THEORY = {  # (param, optimiser family) -> log-log slope against width of (Δf, Δh)
    ("ntk", "sgd"): {"delta_f": 0.0, "delta_h": -0.5},
    ("ntk", "adam"): {"delta_f": 0.5, "delta_h": 0.0},
    ("mup", "sgd"): {"delta_f": 0.0, "delta_h": 0.0},
    ("mup", "adam"): {"delta_f": 0.0, "delta_h": 0.0},
}


def theory_slopes(param: str, optimizer: str) -> dict[str, float]:
    """Log-log slopes against width of Δf and Δh for a parametrisation and optimiser."""
    return COORD_THEORY[(param, "sgd" if optimizer == "sgd" else "adam")]


def _stacked_loss_fn(phi: torch.Tensor, W: torch.Tensor, A: torch.Tensor, weights: torch.Tensor | None,
                     y: torch.Tensor, loss_name: str, c: int, k: int,
                     n_out: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``loss_of(idx)`` for ``batch_steps``: the summed (or ``weights``-weighted) loss of the k
    stacked heads relu(φ Wᵀ) A on the rows idx (φ (n, d), W (Σm, d), A (Σm, k · n_out))."""
    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        out = (torch.relu(phi[idx] @ W.T) @ A).reshape(-1, k, n_out)
        per = per_model_loss(out, y[idx], loss_name, c)
        return per.sum() if weights is None else (per * weights.to(per.dtype)).sum()

    return loss_of


@experiment_run("coord-check")
def run_coord_check(cfg: CoordCheckConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                    cancel: CancelFlag | None) -> Result:
    """μP's coordinate check for the head: sizes of the changes after t = 1 … T steps against width.

    Frame ``rows``: one row per (param, width, seed, step) with delta_f = RMS over test points
    and outputs of f_t − f_0, delta_h = RMS over test points and units of φ (W_t − W_0)ᵀ, and
    f_rms = RMS of f_t. Frame ``summary``: mean ± sd over seeds per (param, width, step).
    Frame ``fit``: per (param, step, quantity) the log-log slope of the mean against width
    beside ``theory`` (``COORD_THEORY``; it assumes no weight decay).
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    X, y, Xt, c = p.X, p.y, p.Xt, p.c
    loss_name = resolve_loss(cfg.train, c)
    rows = []
    runs = [(param, seed) for param in cfg.params for seed in cfg.seeds]
    units = np.cumsum([0, *cfg.widths])
    for j, (param, seed) in enumerate(runs):
        tick(progress, cancel, j / len(runs), f"{param} seed {seed}")
        spec = replace(cfg.train, snapshot_epochs=(), param=param)
        nets = [Net(cfg.arch, X, w, p.n_out, seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                    init=cfg.init).to(dev)
                for w in cfg.widths]
        with torch.no_grad():
            phi, phi_t = nets[0].features(X), nets[0].features(Xt)
        W0, A, weights = stack_heads(nets, spec)
        n_out = p.n_out
        W = torch.nn.Parameter(W0.clone())
        with torch.no_grad():
            H0_t = phi_t @ W0.T
            F0_t = torch.relu(H0_t) @ A
        loss_of = _stacked_loss_fn(phi, W, A, weights, y, loss_name, c, len(nets), n_out)
        for _, step, _ in batch_steps([W], loss_of, X.shape[0], spec, seed, dev, cancel):
            with torch.no_grad():
                dH = phi_t @ (W - W0).T
                F_t = torch.relu(phi_t @ W.T) @ A
            dF = (F_t - F0_t).double()
            for i, width in enumerate(cfg.widths):
                cols, seg = slice(i * n_out, (i + 1) * n_out), slice(int(units[i]), int(units[i + 1]))
                rows.append({"param": param, "optimizer": spec.optimizer, "train_precision": spec.train_precision,
                             "width": width, "seed": seed,
                             "step": step,
                             "delta_f": float(dF[:, cols].pow(2).mean().sqrt()),
                             "delta_h": float(dH[:, seg].double().pow(2).mean().sqrt()),
                             "f_rms": float(F_t[:, cols].double().pow(2).mean().sqrt())})
            if step >= cfg.steps:
                break
    tick(progress, cancel, 1.0, "done")
    frame = pd.DataFrame(rows)
    summary = summarize(frame, ["param", "optimizer", "width", "step"], COORD_METRICS)
    fit = []
    for (param, step), g in summary.groupby(["param", "step"], sort=False):
        theory = theory_slopes(param, cfg.train.optimizer)
        for q in ("delta_f", "delta_h"):
            slope = loglog_slope(g["width"], g[f"{q}_mean"])[0]
            fit.append({"param": param, "step": int(step), "quantity": q, "slope": slope,
                        "theory": theory[q]})
    meta = {"n": int(X.shape[0]), "n_test": int(Xt.shape[0]), "n_classes": c, "loss": loss_name,
            "optimizer": cfg.train.optimizer, "train_precision": cfg.train.train_precision, "source": p.sample.source, "device": str(dev)}
    return Result("coord-check", {}, {"rows": frame, "summary": summary, "fit": pd.DataFrame(fit)},
                  {}, meta)
