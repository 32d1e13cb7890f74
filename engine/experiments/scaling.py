"""The width–conditioning scaling law, measured on a fixed width grid.

The paper's bound says the width needed to stay in the kernel regime grows like κ(G)⁶ for
linearised attention (κ^(2(2k+1)) for k stacked layers), against κ² for the same bound on
the un-amplified Gram of the ReLU net. Here κ is dialled with the ``synthetic`` data set
(prescribed Gram spectrum). For each κ and model the kernel distance is measured on a fixed,
log-spaced width grid (anchored at powers of two, so a smaller range's grid is part of a
larger one's) and averaged over network seeds. The *width needed* is the smallest grid width
from which the mean distance stays within ``target`` at every larger grid width; where the
criterion holds at a smaller width and fails again above it, the row says it is not
monotone. The exponent of width against κ is fitted on log-log axes over the uncensored κ
values, with a 95 % interval from a bootstrap over seeds.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
import torch

from ..data import DataSpec, load_sample
from ..maths.kinf import infinite_ntk
from ..maths.metrics import loglog_slope
from ..maths.models import Net
from ..maths.ntk import empirical_ntk
from ..maths.ridge import relative_distance, whitened_distance
from ..maths.specs import parse_attention
from ..maths.training import n_outputs, train_seeds
from ..runtime.cache import Result
from ..runtime.errors import BadInput
from .configs.scaling import ScalingConfig, measured_models, width_grid
from .runs import Progress, experiment_run, resumable, shape, tick, to_device

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

BOOTSTRAP = 400   # resamples of the seeds for the exponent's interval


def theory_exponent(arch: str, attention: str) -> float | None:
    """Exponent p of m ∝ κ^p from the paper's bound (ReLU: the same bound on G, p = 2)."""
    if arch == "relu":
        return 2.0
    att = parse_attention(attention)  # the bound squares κ of the features' Gram, κ(G)^p (not λ₁/λ_r: κ dials G)
    p = att.kappa_exponent
    return None if p is None or att.variant.kappa_top else 2.0 * p


def width_needed(widths: Sequence[int] | np.ndarray, dists: Sequence[float] | np.ndarray,
                 target: float) -> tuple[int | None, bool]:
    """Smallest width from which every larger width has dist ≤ target, and whether the
    criterion is monotone (never holds below that width). None when the largest fails."""
    ok = np.asarray(dists) <= target
    i = len(ok)
    while i > 0 and ok[i - 1]:
        i -= 1                     # ok[i:] is the run of passing widths at the top of the grid
    if i == len(ok):
        return None, not ok.any()
    return int(widths[i]), not ok[:i].any()


def fit_exponent(kappas: Sequence[float], widths: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Slope and intercept of log width against log κ over the found widths (None: < 2 κ).

    A width of None or NaN (how a pandas column holds None) is censored and left out."""
    pts = [(k, w) for k, w in zip(kappas, widths, strict=True) if w is not None and not pd.isna(w)]
    if len({k for k, _ in pts}) < 2:
        return None, None
    return loglog_slope([k for k, _ in pts], [w for _, w in pts])


def exponent_resolution(kappas: Sequence[float | None], per_octave: int) -> float | None:
    """The smallest change of a fitted exponent the width grid can show: one grid step (a
    factor 2^(1/per_octave) in width) at one end of the κ range moves the slope by
    log 2^(1/per_octave) / log(κ_max / κ_min). A bootstrap interval narrower than this (say
    [0.30, 0.30]) is the grid's artefact, not a measurement that exact. None for < 2 κ values."""
    ks = [float(k) for k in kappas if k is not None and not pd.isna(k)]
    if len(set(ks)) < 2:
        return None
    return math.log(2.0) / per_octave / math.log(max(ks) / min(ks))


def _distance(cfg: ScalingConfig, K: torch.Tensor, K_ref: torch.Tensor) -> float:
    if cfg.metric == "whitened":
        return whitened_distance(K, K_ref, cfg.ridge)
    return relative_distance(K, K_ref)


def _distances(cfg: ScalingConfig, arch: str, attention: str, grid: list[int], X: torch.Tensor, y: torch.Tensor,
               c: int, dev: torch.device, K_inf: torch.Tensor, cancel: CancelFlag | None,
               report: tuple[Progress | None, float, float, str]) -> dict[str, list]:
    """One resumable unit: ``distances``, per grid width the distance of each seed's net (``report``:
    progress, fraction, share of the run, stage). Every width and seed trains as one batched model
    where the batch orders allow it (``train_seeds``)."""
    progress, lo, share, stage = report
    tick(progress, cancel, lo, stage)
    nets = [Net(arch, X, w, n_outputs(c), seed, 1.0, attention, cfg.normalize).to(dev)
            for w in grid for seed in cfg.seeds]
    K0 = [empirical_ntk(net, X) for net in nets]
    if cfg.measure == "init":
        flat = [_distance(cfg, K, K_inf) for K in K0]
    else:
        sub = None if progress is None else (lambda f, msg: progress(lo + 0.9 * share * f, f"{stage}: {msg}"))
        train_seeds(nets, [seed for _ in grid for seed in cfg.seeds], X, y, c, cfg.train, sub, cancel)
        flat = [_distance(cfg, empirical_ntk(net, X), K_inf if cfg.measure == "trained" else K)
                for net, K in zip(nets, K0, strict=True)]
    k = len(cfg.seeds)
    return {"distances": [flat[i * k:(i + 1) * k] for i in range(len(grid))]}


@experiment_run("scaling")
def run_scaling(cfg: ScalingConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                cancel: CancelFlag | None) -> Result:
    """Width needed against κ, and the fitted exponent with its interval, per (arch, attention).

    Frames: ``widths`` (arch, attention, kappa, kappa_measured, width_needed, censored,
    monotone), ``evaluations`` (arch, attention, kappa, width, seed, distance) and ``curve``
    (the same averaged over seeds, with sd), ``fit`` (arch, attention, exponent,
    exponent_low, exponent_high, intercept, points, theory_exponent).
    """
    grid = width_grid(cfg.min_width, cfg.max_width, cfg.per_octave)
    models = measured_models(cfg)
    total = len(models) * len(cfg.kappas)
    rows, evals, done = [], [], 0
    w: int | None  # a grid width in the loop below; then each row's width needed (None: censored)
    for kappa in cfg.kappas:
        spec = DataSpec("synthetic", n=cfg.n, n_test=1, seed=cfg.seed, normalize=cfg.normalize,
                        synthetic_d=cfg.d, synthetic_kappa=float(kappa), synthetic_decay=cfg.decay,
                        synthetic_classes=cfg.classes)
        sample = load_sample(spec, data_dir)
        X, y, _, _ = to_device(sample, dev)
        c = sample.n_classes
        lam = torch.linalg.eigvalsh(sample.X @ sample.X.T).clamp_min(0)
        lam = lam[lam > lam.max() * cfg.n * 2.2e-16]
        for arch, attention in models:
            probe = Net(arch, X, 1, n_outputs(c), 0, 1.0, attention, cfg.normalize).to(dev)
            with torch.no_grad():
                K_inf = infinite_ntk(probe.features(X))
            label = attention if arch == "attn" else None
            unit, frac, done = f"κ = {kappa:g}, {arch} {label or ''}", done / total, done + 1
            key = {"kappa": float(kappa), "arch": arch, "attention": label, "widths": grid}  # exact: κ's repr
            table = resumable(key, partial(_distances, cfg, arch, attention, grid, X, y, c, dev, K_inf, cancel,
                                           (progress, frac, 1 / total, unit)), shape(distances=list))["distances"]
            if len(table) != len(grid) or not all(len(ds) == len(cfg.seeds) and all(isinstance(d, float) for d in ds)
                                                  for ds in table):
                raise BadInput(f"unit {unit} holds distances for {len(table)} widths; expected {len(grid)} widths "
                               f"of {len(cfg.seeds)} seeds each")
            for w, dists in zip(grid, table, strict=True):
                for seed, dist in zip(cfg.seeds, dists, strict=True):
                    evals.append({"arch": arch, "attention": label, "kappa": float(kappa), "width": w,
                                  "seed": seed, "distance": dist})
            rows.append({"arch": arch, "attention": label, "kappa": float(kappa),
                         "kappa_measured": float(lam.max() / lam.min())})
    ev = pd.DataFrame(evals)
    curve = (ev.assign(attention=ev.attention.fillna(""))
             .groupby(["arch", "attention", "kappa", "width"], sort=False)["distance"]
             .agg(mean="mean", sd="std").reset_index())
    curve["attention"] = curve["attention"].replace("", None)
    for row in rows:
        g = curve[(curve.arch == row["arch"]) & (curve.kappa == row["kappa"])
                  & (curve.attention.fillna("") == (row["attention"] or ""))].sort_values("width")
        w, mono = width_needed(g.width.to_numpy(), g["mean"].to_numpy(), cfg.target)
        row.update(width_needed=w, censored=w is None, monotone=mono)
    widths = pd.DataFrame(rows)
    fits = [_fit_row(cfg, arch, attention, widths, ev, grid) for arch, attention in models]
    tick(progress, cancel, 1.0, "done")
    return Result("scaling", {}, {"widths": widths, "evaluations": ev, "curve": curve,
                                         "fit": pd.DataFrame(fits)}, {}, {"grid": grid})


def _fit_row(cfg: ScalingConfig, arch: str, attention: str, widths: pd.DataFrame, ev: pd.DataFrame,
             grid: list[int]) -> dict:
    label = attention if arch == "attn" else None
    mine = widths[(widths.arch == arch) & (widths.attention.fillna("") == (label or ""))]
    slope, icpt = fit_exponent(mine.kappa.tolist(), mine.width_needed.tolist())
    low = high = None
    seeds = list(cfg.seeds)
    if slope is not None and len(seeds) > 1:
        e = ev[(ev.arch == arch) & (ev.attention.fillna("") == (label or ""))]
        # D[κ, width, seed]: the distances as one array, so that a resample is one fancy index
        D = (e.pivot_table(index=["kappa", "width"], columns="seed", values="distance")
             .reindex(index=pd.MultiIndex.from_product([list(mine.kappa), list(grid)]), columns=seeds)
             .to_numpy().reshape(len(mine), len(grid), len(seeds)))
        rng = np.random.default_rng(12345)
        slopes = []
        for _ in range(BOOTSTRAP):
            means = D[:, :, rng.choice(len(seeds), size=len(seeds), replace=True)].mean(axis=2)  # (κ, width)
            found = [width_needed(grid, row, cfg.target)[0] for row in means]
            s, _ = fit_exponent(mine.kappa.tolist(), found)
            if s is not None:
                slopes.append(s)
        if slopes:
            low, high = (float(v) for v in np.percentile(slopes, [2.5, 97.5]))
    return {"arch": arch, "attention": label, "points": int((~mine.censored).sum()), "exponent": slope,
            "exponent_low": low, "exponent_high": high, "intercept": icpt,
            "resolution": exponent_resolution(mine.kappa[~mine.censored].tolist(), cfg.per_octave),
            "theory_exponent": theory_exponent(arch, attention)}
