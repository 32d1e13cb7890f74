"""The ``dynamics`` experiment (the Kernel regime page): real against linearised training across widths.

Per seed, width and architecture, a net and its linearisation around W0 (``engine.maths.flow``)
train side by side on the same mini-batches; ``lin_gap`` is how far apart their outputs end,
``pattern_change`` the share of activation signs flipped, and ``k_inf_gap`` the distance to the
closed-form K∞ gradient flow (MSE and SGD only). Theory (NTK parametrisation, SGD): the gap
falls like m^-1/2 while the net stays in the kernel regime. ``width_slopes`` fits that slope.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
import torch

from ..maths.flow import KernelFlow, flow_rates, lin_gap, linearised_head, stack_heads, train_pair
from ..maths.kinf import infinite_ntk
from ..maths.metrics import loglog_slope, summarize
from ..maths.models import Net
from ..maths.training import loss_fn, predict_labels, resolve_loss
from ..runtime.cache import Result
from .configs.dynamics import DynamicsConfig, record_epochs
from .runs import Prepared, Progress, check_finite, experiment_run, prepare, resumable, shape, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

METRICS = ("lin_gap", "pattern_change", "train_loss", "train_loss_lin", "train_acc", "test_acc", "test_acc_lin",
           "k_inf_gap", "weight_movement")


# ---------------------------------------------------------------- real against linearised training

@dataclass
class _Pair:
    """One architecture and seed of the comparison: features, the stacked initial weights W0 and
    block readout A of every width, the activation patterns at init, and f_0 once recorded."""

    arch: str
    seed: int
    phi: torch.Tensor      # (n, d) training features
    phi_t: torch.Tensor    # (n_test, d)
    W0: torch.Tensor       # (Σm, d)
    A: torch.Tensor        # (Σm, widths · n_out)
    mask0: torch.Tensor    # (n, Σm) bool, φ W0ᵀ > 0
    mask0_t: torch.Tensor  # (n_test, Σm)
    F0: torch.Tensor | None = None    # (n, widths · n_out) outputs at epoch 0, float64
    F0_t: torch.Tensor | None = None


def measure_pair(cfg: DynamicsConfig, p: Prepared, pair: _Pair, flow: tuple[float, float, int] | None,
                 K_flow: KernelFlow | None, epoch: int, W: torch.Tensor, W_lin: torch.Tensor) -> list[dict]:
    """The rows of every width of ``pair`` at one recorded epoch: the net (weights W, stacked)
    against its linearisation (W_lin) and, with ``flow`` (η', β, steps per epoch), against the
    K∞ gradient flow ``K_flow``. Columns as ``run_dynamics`` lists them, without ``seconds``."""
    loss_name, c, n_out, n = resolve_loss(cfg.train, p.c), p.c, p.n_out, p.X.shape[0]
    with torch.no_grad():
        H, H_t = pair.phi @ W.T, pair.phi_t @ W.T
        F, F_t = torch.relu(H) @ pair.A, torch.relu(H_t) @ pair.A
        F_lin = linearised_head(pair.phi, W_lin, pair.mask0, pair.A)
        F_lin_t = linearised_head(pair.phi_t, W_lin, pair.mask0_t, pair.A)
        flips = ((H > 0) != pair.mask0).double().mean(dim=0)  # (Σm,)
    if epoch == 0:
        pair.F0, pair.F0_t = F.double(), F_t.double()
    units = np.cumsum([0, *cfg.widths])
    rows = []
    for i, width in enumerate(cfg.widths):
        cols, seg = slice(i * n_out, (i + 1) * n_out), slice(int(units[i]), int(units[i + 1]))
        f_t, fl_t = F_t[:, cols].double(), F_lin_t[:, cols].double()
        row = {"arch": pair.arch, "attention": cfg.attention if pair.arch == "attn" else None, "width": width,
               "seed": pair.seed, "epoch": epoch, "step": epoch * math.ceil(n / cfg.train.batch_size),
               "lin_gap": lin_gap(f_t, fl_t),
               "pattern_change": float(flips[seg].mean()),
               "train_loss": float(loss_fn(F[:, cols], p.y, loss_name, c)),
               "train_loss_lin": float(loss_fn(F_lin[:, cols], p.y, loss_name, c)),
               "train_acc": float((predict_labels(F[:, cols]) == p.y).double().mean()),
               "test_acc": float((predict_labels(F_t[:, cols]) == p.yt).double().mean()),
               "test_acc_lin": float((predict_labels(F_lin_t[:, cols]) == p.yt).double().mean()),
               "weight_movement": float(torch.linalg.norm(W[seg] - pair.W0[seg]) / torch.linalg.norm(pair.W0[seg])),
               "k_inf_gap": math.nan}
        if flow is not None:
            eta, beta, per_epoch = flow
            assert K_flow is not None and pair.F0 is not None and pair.F0_t is not None  # with flow: both set
            f_k = K_flow.predict(p.Y, pair.F0[:, cols], pair.F0_t[:, cols], eta, beta, float(epoch * per_epoch))
            k_norm = float(torch.linalg.norm(f_k))
            row["k_inf_gap"] = float(torch.linalg.norm(f_t - f_k)) / k_norm if k_norm else math.nan
        rows.append(row)
    return rows


def _dynamics_group(cfg: DynamicsConfig, p: Prepared, ref: dict[str, KernelFlow], arch: str, seed: int,
                    at: tuple[int, int], progress: Progress | None, cancel: CancelFlag | None) -> dict:
    """One architecture and seed, every width, trained beside its linearisation: the unit a
    cancelled comparison resumes from. ``ref`` holds each architecture's ``KernelFlow``."""
    (j, n_groups), stage = at, f"{arch} seed {seed}"
    tick(progress, cancel, j / n_groups, stage)
    flow = flow_rates(cfg.train, p.X.shape[0], p.n_out)
    t0 = time.perf_counter()
    nets = [Net(arch, p.X, w, p.n_out, seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                init=cfg.init).to(p.device)
            for w in cfg.widths]
    with torch.no_grad():
        phi, phi_t = nets[0].features(p.X), nets[0].features(p.Xt)
    if flow is not None and arch not in ref:  # K∞ depends on the features only
        K, K_t = infinite_ntk(phi), infinite_ntk(phi_t, phi)
        check_finite(K, f"the infinite-width kernel of {arch}")
        ref[arch] = KernelFlow(K, K_t)
    W0, A, _ = stack_heads(nets, cfg.train)
    pair = _Pair(arch, seed, phi, phi_t, W0, A, phi @ W0.T > 0, phi_t @ W0.T > 0)
    rows = []
    sub = None if progress is None else (lambda f, s: progress((j + f) / n_groups, f"{stage}: {s}"))
    train_pair(nets, phi, p.y, p.c, cfg.train, seed, record_epochs(cfg),
               lambda epoch, W, W_lin: rows.extend(measure_pair(cfg, p, pair, flow, ref.get(arch), epoch, W, W_lin)),
               sub, cancel)
    for r in rows:
        r["seconds"] = (time.perf_counter() - t0) / len(cfg.widths)
    return {"rows": rows}


@experiment_run("dynamics")
def run_dynamics(cfg: DynamicsConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                 cancel: CancelFlag | None) -> Result:
    """Real against linearised training per (arch, width, seed), measured every few epochs.

    Frame ``rows``: one row per (arch, width, seed, epoch) with step (optimiser steps so far) and
      - lin_gap: ‖f_t − f_lin,t‖_F / ‖f_lin,t‖_F on the test points (0 at epoch 0, exactly);
      - pattern_change: share of the training set's activation signs 1[w_r·φ(x_i) > 0] that
        differ from init (n·m signs);
      - train_loss, train_loss_lin: full-batch training loss of the net and of f_lin;
      - train_acc (the net's, on the training set), test_acc, test_acc_lin;
        weight_movement ‖W_t − W_0‖_F / ‖W_0‖_F;
      - k_inf_gap: ‖f_t − f_K∞,t‖_F / ‖f_K∞,t‖_F on the test points (MSE and SGD; else NaN).
    Frame ``summary``: mean and sd over seeds per (arch, attention, width, epoch).
    Frame ``final``: the summary at the last epoch. Meta: n, n_test, d, n_classes, param,
    flow (η', β, steps per epoch, or None), source, device.
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    n, c, Xt = p.X.shape[0], p.c, p.Xt
    flow = flow_rates(cfg.train, n, p.n_out)
    loss_name = resolve_loss(cfg.train, c)
    ref: dict[str, KernelFlow] = {}
    rows = []
    groups = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for j, (arch, seed) in enumerate(groups):
        # the unit ticks its own stage: one read back reports nothing, since it is not computed again
        unit = partial(_dynamics_group, cfg, p, ref, arch, seed, (j, len(groups)), progress, cancel)
        rows += resumable({"arch": arch, "seed": seed}, unit, shape(rows=list),
                          nan_ok=("k_inf_gap",))["rows"]  # NaN by definition where K∞'s prediction is zero
    tick(progress, cancel, 1.0, "done")
    frame = pd.DataFrame(rows)
    summary = summarize(frame, ["arch", "attention", "width", "epoch"], METRICS)
    final = summary[summary["epoch"] == cfg.train.epochs].reset_index(drop=True)
    meta = {"n": n, "n_test": int(Xt.shape[0]), "d": p.sample.d, "n_classes": c, "param": cfg.train.param,
            "train_precision": cfg.train.train_precision,
            "loss": loss_name, "flow": None if flow is None else list(flow), "source": p.sample.source,
            "device": str(dev)}
    return Result("dynamics", {}, {"rows": frame, "summary": summary, "final": final}, {}, meta)


def width_slopes(final: pd.DataFrame, metrics: Sequence[str] = ("lin_gap", "pattern_change")) -> pd.DataFrame:
    """Log-log slope of each final metric's mean against width, per arch (NaN with < 2 widths
    or non-positive values). The lazy regime of NTK theory predicts −1/2 under ntk + SGD."""
    out = []
    for (arch, attention), g in final.groupby(["arch", final["attention"].fillna("")], sort=False):
        for m in metrics:
            slope = loglog_slope(g["width"], g[f"{m}_mean"])[0]
            out.append({"arch": arch, "attention": attention or None, "metric": m, "slope": slope})
    return pd.DataFrame(out, columns=["arch", "attention", "metric", "slope"])


# ---------------------------------------------------------------- coordinate check

