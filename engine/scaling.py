"""The width–conditioning scaling law, measured.

The paper's bound says the width needed to stay in the kernel regime grows like κ(G)⁶ for
linearised attention (κ^(2(2k+1)) for k stacked layers), against κ² for the same bound on
the un-amplified Gram of the ReLU net. Here κ is dialled with the ``synthetic`` data set
(prescribed Gram spectrum), and for each κ and architecture the smallest width whose
trained kernel stays within ``target`` relative Frobenius distance of K∞ is found by
bisection over log2(width). The exponent of width against κ is then fitted on log-log
axes over the κ values whose width was found below ``max_width`` (the others are
censored and reported as such).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch

from .cache import Cache, Result, cached_run
from .data import DataSpec, load_sample
from .device import resolve_device
from .errors import BadInput
from .experiments import _check_archs, _tick, to_device
from .models import Attention, Net, parse_attention
from .ntk import empirical_ntk, infinite_ntk, relative_distance
from .training import TrainSpec, n_outputs, train

Progress = Callable[[float, str], None]
MEASURES = ("trained", "init", "movement")


@dataclass(frozen=True)
class ScalingConfig:
    n: int = 64                               # training points of each synthetic draw
    d: int = 32                               # input dimension
    kappas: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 32.0)  # target κ(G) of the raw Gram
    decay: str = "geometric"                  # eigenvalue profile of the synthetic Gram
    classes: int = 2                          # synthetic teacher classes
    normalize: bool = False                   # row normalisation changes κ; off so κ is the dialled one
    archs: tuple[str, ...] = ("relu", "attn")
    attentions: tuple[str, ...] = ("linear",)  # variants tried for the attn arch
    target: float = 0.1                       # kernel distance ‖K_m − K∞‖_F/‖K∞‖_F to stay within
    measure: str = "trained"                  # "trained": ‖K_t − K∞‖/‖K∞‖; "init": ‖K_0 − K∞‖/‖K∞‖;
                                              # "movement": ‖K_t − K_0‖/‖K_0‖ (training drift alone)
    min_width: int = 16
    max_width: int = 2**15
    seeds: tuple[int, ...] = (0,)             # distances are averaged over these network seeds
    seed: int = 0                             # data seed
    train: TrainSpec = TrainSpec(epochs=50, lr=1e-3, batch_size=128)


def theory_exponent(arch: str, attention: str) -> float | None:
    """Exponent p of m ∝ κ^p from the paper's bound (ReLU: the same bound on G, p = 2)."""
    if arch == "relu":
        return 2.0
    att = parse_attention(attention)
    if att.kind is Attention.LINEAR:
        return 6.0
    if att.kind is Attention.STACKED:
        return 2.0 * (2 * int(att.param) + 1)
    return None


def _validate(cfg: ScalingConfig) -> None:
    _check_archs(cfg.archs)
    for a in cfg.attentions:
        parse_attention(a)
    if not cfg.kappas or min(cfg.kappas) < 1:
        raise BadInput(f"kappas must be numbers >= 1, got {cfg.kappas!r}")
    if not 0 < cfg.target < 1:
        raise BadInput(f"target kernel distance must lie in (0, 1), got {cfg.target!r}")
    if cfg.measure not in MEASURES:
        raise BadInput(f"measure must be one of {', '.join(MEASURES)}, got {cfg.measure!r}")
    if not 1 <= cfg.min_width < cfg.max_width:
        raise BadInput(f"need 1 <= min_width < max_width, got {cfg.min_width}, {cfg.max_width}")


def _distance(cfg, arch, attention, width, X, y, c, dev, K_inf, cancel) -> float:
    dists = []
    for seed in cfg.seeds:
        net = Net(arch, X, width, n_outputs(c), seed, 1.0, attention, cfg.normalize).to(dev)
        K0 = empirical_ntk(net, X)
        if cfg.measure == "init":
            dists.append(relative_distance(K0, K_inf))
            continue
        train(net, X, y, c, cfg.train, seed, cancel=cancel)
        Kt = empirical_ntk(net, X)
        dists.append(relative_distance(Kt, K_inf if cfg.measure == "trained" else K0))
    return float(np.mean(dists))


def _smallest_width(dist_at: Callable[[int], float], lo: int, hi: int, target: float):
    """Bisection on log2 width for the smallest power-of-two-grid width with dist ≤ target.

    Returns (width or None if even ``hi`` misses, evaluations as (width, dist) pairs).
    """
    evals = {}

    def ok(e):
        w = int(round(2**e))
        if w not in evals:
            evals[w] = dist_at(w)
        return evals[w] <= target

    a, b = math.log2(lo), math.log2(hi)
    if ok(a):
        return lo, evals
    if not ok(b):
        return None, evals
    while b - a > 0.25:  # quarter-octave resolution
        mid = (a + b) / 2
        a, b = (a, mid) if ok(mid) else (mid, b)
    return int(round(2**b)), evals


def run_scaling(cfg: ScalingConfig, cache: Cache | None = None, data_dir=None, device: str = "cpu",
                progress: Progress | None = None, cancel=None) -> Result:
    """Width needed against κ, and the fitted exponent, per (arch, attention).

    Frames: ``widths`` (arch, attention, kappa, kappa_measured, width_needed, censored),
    ``evaluations`` (arch, attention, kappa, width, distance), ``fit`` (arch, attention,
    exponent, intercept, points, theory_exponent).
    """
    _validate(cfg)

    def compute() -> Result:
        dev = resolve_device(device)
        models = [("relu", "linear")] * ("relu" in cfg.archs) + [("attn", a) for a in cfg.attentions
                                                                  if "attn" in cfg.archs]
        total = len(models) * len(cfg.kappas)
        rows, evals = [], []
        for i, kappa in enumerate(cfg.kappas):
            spec = DataSpec("synthetic", n=cfg.n, n_test=1, seed=cfg.seed, normalize=cfg.normalize,
                            synthetic_d=cfg.d, synthetic_kappa=float(kappa), synthetic_decay=cfg.decay,
                            synthetic_classes=cfg.classes)
            sample = load_sample(spec, data_dir)
            X, y, _, _ = to_device(sample, dev)
            c = sample.n_classes
            G = sample.X @ sample.X.T
            lam = torch.linalg.eigvalsh(G).clamp_min(0)
            lam = lam[lam > lam.max() * cfg.n * 2.2e-16]
            for j, (arch, attention) in enumerate(models):
                k = i * len(models) + j
                _tick(progress, cancel, k / total, f"κ = {kappa:g}, {arch} {attention if arch == 'attn' else ''}")
                probe = Net(arch, X, 1, n_outputs(c), 0, 1.0, attention, cfg.normalize).to(dev)
                with torch.no_grad():
                    K_inf = infinite_ntk(probe.features(X))
                width, ev = _smallest_width(
                    lambda w: _distance(cfg, arch, attention, w, X, y, c, dev, K_inf, cancel),
                    cfg.min_width, cfg.max_width, cfg.target)
                label = attention if arch == "attn" else None
                rows.append({"arch": arch, "attention": label, "kappa": float(kappa),
                             "kappa_measured": float(lam.max() / lam.min()),
                             "width_needed": width, "censored": width is None})
                evals += [{"arch": arch, "attention": label, "kappa": float(kappa), "width": w, "distance": dd}
                          for w, dd in sorted(ev.items())]
        widths = pd.DataFrame(rows)
        fits = []
        for (arch, attention), g in widths.groupby(["arch", "attention"], dropna=False, sort=False):
            ok = g[~g.censored]
            att = attention if isinstance(attention, str) else "linear"
            fit = {"arch": arch, "attention": attention if isinstance(attention, str) else None,
                   "points": len(ok), "exponent": None, "intercept": None,
                   "theory_exponent": theory_exponent(arch, att)}
            if len(ok) >= 2 and ok.kappa.nunique() >= 2:
                slope, icpt = np.polyfit(np.log(ok.kappa.astype(float)), np.log(ok.width_needed.astype(float)), 1)
                fit.update(exponent=float(slope), intercept=float(icpt))
            fits.append(fit)
        _tick(progress, cancel, 1.0, "done")
        return Result("scaling", {}, {"widths": widths, "evaluations": pd.DataFrame(evals),
                                      "fit": pd.DataFrame(fits)}, {}, {})

    return cached_run("scaling", cfg, compute, cache)
