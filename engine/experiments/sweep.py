"""The ``ntk-sweep`` experiment: how far a trained net's empirical NTK lies from K∞, across widths.

Per seed, width and architecture: the kernel distance (Frobenius and whitened) at init and after
training, the ridge predictions' gap, and the net's accuracies beside the kernel-ridge
accuracy its own K_m reaches, so that a distance is read against a net that trained.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING

import pandas as pd
import torch

from ..maths.gates import passes_gate
from ..maths.kinf import infinite_ntk
from ..maths.metrics import summarize
from ..maths.models import Net
from ..maths.ntk import empirical_ntk, empirical_ntk_at
from ..maths.ridge import kernel_regression, prediction_gap, relative_distance, whitened_distance
from ..maths.training import accuracy, n_outputs, predict_labels, train_many
from ..runtime.cache import Result
from .columns import SWEEP_METRICS, KernelReading, SweepRow, row_frame
from .configs.sweep import SweepConfig
from .runs import Prepared, Progress, check_finite, experiment_run, prepare, resumable, shape, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir



def kernel_metrics(net: Net, p: Prepared, K_inf: torch.Tensor, K_inf_t: torch.Tensor, ridge: float) -> KernelReading:
    """A net's empirical NTK against K∞ on the prepared draw: the Frobenius and whitened
    distances, the prediction gap and the test accuracy of ridge regression with K_m. K_m is not
    kept: metrics only."""
    K = empirical_ntk(net, p.X)
    check_finite(K, f"the empirical kernel of {net.arch} at width {net.mlp.width}")
    K_t = empirical_ntk(net, p.Xt, p.X)
    f_m = kernel_regression(K, K_t, p.Y, ridge)
    return KernelReading(kernel_dist=relative_distance(K, K_inf),
                         kernel_dist_whitened=whitened_distance(K, K_inf, ridge),
                         prediction_gap=prediction_gap(K, K_t, K_inf, K_inf_t, p.Y, ridge),
                         test_acc_kernel=float((predict_labels(f_m) == p.yt).double().mean()))


def _sweep_group(cfg: SweepConfig, p: Prepared, ref: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                 arch: str, seed: int, at: tuple[int, int], progress: Progress | None,
                 cancel: CancelFlag | None) -> dict:
    """One architecture and seed of a width sweep, every width: the unit a cancelled sweep resumes
    from. ``ref`` holds each architecture's K∞, K∞(test, train) and f_NTK once computed; ``at`` is
    (this group's index, the number of groups) for progress. Returns lists of row dicts."""
    X, y, Xt, yt, c, Y = p.X, p.y, p.Xt, p.yt, p.c, p.Y
    (j, n_groups), stage = at, f"{arch} seed {seed}"
    tick(progress, cancel, j / n_groups, stage)
    rows, losses, trajectory = [], [], []
    t0 = time.perf_counter()
    nets = [Net(arch, X, w, n_outputs(c), seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                init=cfg.init).to(p.device)
            for w in cfg.widths]
    if arch not in ref:  # features, hence K∞ and f_NTK, do not depend on the seed
        with torch.no_grad():
            phi, phi_t = nets[0].features(X), nets[0].features(Xt)
            K_inf, K_inf_t = infinite_ntk(phi), infinite_ntk(phi_t, phi)
            f_ntk = kernel_regression(K_inf, K_inf_t, Y, cfg.ridge)
        check_finite(K_inf, f"the infinite-width kernel of {arch}")
        ref[arch] = K_inf, K_inf_t, f_ntk
    K_inf, K_inf_t, f_ntk = ref[arch]

    init = [kernel_metrics(net, p, K_inf, K_inf_t, cfg.ridge) for net in nets]  # metrics only: no K held across widths
    sub = None if progress is None else (
        lambda f, s, j=j: progress((j + 0.8 * f) / n_groups, f"{stage}: training all widths, {s}"))
    results = train_many(nets, X, y, c, cfg.train, seed, sub, cancel)
    tick(progress, cancel, (j + 0.8) / n_groups, f"{stage}: kernels after training")
    seconds = (time.perf_counter() - t0) / len(cfg.widths)
    for width, net, m0, tr in zip(cfg.widths, nets, init, results, strict=True):
        tick(progress, cancel, (j + 0.9) / n_groups, f"{stage}: kernels at width {width}")
        mt = kernel_metrics(net, p, K_inf, K_inf_t, cfg.ridge)
        with torch.no_grad():
            f_test = net(Xt).double()
        fdist = float(torch.linalg.norm(f_test - f_ntk))
        f_ntk_norm = float(torch.linalg.norm(f_ntk))
        W = net.mlp.W.detach()
        test_acc = accuracy(net, Xt, yt)
        rows.append(asdict(SweepRow(
            arch=arch, attention=cfg.attention if arch == "attn" else None, width=width, seed=seed,
            kernel_dist_init=m0.kernel_dist, kernel_dist_whitened_init=m0.kernel_dist_whitened,
            prediction_gap_init=m0.prediction_gap, test_acc_kernel_init=m0.test_acc_kernel,
            kernel_dist_trained=mt.kernel_dist, kernel_dist_whitened_trained=mt.kernel_dist_whitened,
            prediction_gap_trained=mt.prediction_gap, test_acc_kernel_trained=mt.test_acc_kernel,
            function_dist=fdist, function_dist_rel=fdist / f_ntk_norm if f_ntk_norm else math.nan,
            function_dist_rms=fdist / math.sqrt(Xt.shape[0]),
            f_norm=float(torch.linalg.norm(f_test)), f_ntk_norm=f_ntk_norm,
            test_acc=test_acc, train_acc=accuracy(net, X, y),
            test_acc_ntk=float((predict_labels(f_ntk) == yt).double().mean()),
            test_acc_kernel=mt.test_acc_kernel,
            trained=float(passes_gate(test_acc, mt.test_acc_kernel)) if cfg.train.epochs else math.nan,
            weight_movement=float(torch.linalg.norm(W - tr.W0) / torch.linalg.norm(tr.W0)),
            final_loss=tr.losses[-1], n_test=int(Xt.shape[0]), seconds=seconds)))
        losses += [{"arch": arch, "width": width, "seed": seed, "epoch": e, "loss": v}
                   for e, v in enumerate(tr.losses)]
        if net.fixed_features:  # snapshots hold W only; trainable attention moves too
            trajectory += [{"arch": arch, "width": width, "seed": seed, "epoch": e,
                            "kernel_dist": relative_distance(empirical_ntk_at(net, W_e, X), K_inf)}
                           for e, W_e in sorted(tr.snapshots.items())]
    return {"rows": rows, "losses": losses, "trajectory": trajectory}


@experiment_run("ntk-sweep")
def run_ntk_sweep(cfg: SweepConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                  cancel: CancelFlag | None) -> Result:
    """Kernel and function distances to the infinite-width NTK across widths, per seed.

    Frame ``rows``: one row per (arch, width, seed) with
      - kernel_dist_init / _trained: ‖K_m − K∞‖_F / ‖K∞‖_F on the training set;
      - kernel_dist_whitened_init / _trained: ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂, the
        distance as kernel regression sees it (κ-sensitive), λ = ridge · mean diag K∞;
      - prediction_gap_init / _trained: ‖f_KRR(K_m) − f_KRR(K∞)‖_F / ‖f_KRR(K∞)‖_F on the test points;
      - function_dist: ‖f_m(X_test) − f_NTK(X_test)‖_F (f_NTK: ridge regression on K∞ with
        the training targets), function_dist_rel = that / f_ntk_norm, function_dist_rms,
        f_norm = ‖f_m(X_test)‖_F and f_ntk_norm = ‖f_NTK(X_test)‖_F (the scales compared);
      - test_acc, train_acc of the net, test_acc_ntk of f_NTK (the K∞ ridge baseline),
        test_acc_kernel(_init) of ridge regression with the net's own K_m (trained; at init),
        trained (1/0: ``engine.maths.gates.passes_gate`` of test_acc against test_acc_kernel; NaN
        without training);
      - weight_movement ‖W_t − W_0‖_F / ‖W_0‖_F, final_loss, n_test, seconds.
    Frame ``summary``: mean and sd of each metric over seeds per (arch, width).
    Frame ``losses``: arch, width, seed, epoch, loss. Frame ``trajectory``: the kernel
    distance at each of ``cfg.train.snapshot_epochs`` (arch, width, seed, epoch, kernel_dist).
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample, Xt, c = p.sample, p.Xt, p.c
    ref: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    rows, losses, trajectory = [], [], []
    groups = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for j, (arch, seed) in enumerate(groups):
        # the unit ticks its own stage: one read back reports nothing, since it is not computed again
        unit = partial(_sweep_group, cfg, p, ref, arch, seed, (j, len(groups)), progress, cancel)
        part = resumable({"arch": arch, "seed": seed}, unit, shape(rows=list, losses=list, trajectory=list),
                         nan_ok=("trained", "function_dist_rel"))  # NaN by definition: no epochs, a zero norm
        rows += part["rows"]
        losses += part["losses"]
        trajectory += part["trajectory"]
    tick(progress, cancel, 1.0, "done")
    meta = {"n": sample.n, "n_test": int(Xt.shape[0]), "d": sample.d, "n_classes": c,
            "source": sample.source, "device": str(dev)}
    frame = row_frame(SweepRow, rows)
    frames = {"rows": frame, "summary": summarize(frame, ["arch", "attention", "width"], SWEEP_METRICS),
              "losses": pd.DataFrame(losses),
              "trajectory": pd.DataFrame(trajectory, columns=["arch", "width", "seed", "epoch", "kernel_dist"])}
    return Result("ntk-sweep", {}, frames, {}, meta)
