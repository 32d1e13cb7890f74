"""Whole experiments from frozen configs: spectra, width sweeps, kernel views.

Each ``run_*`` takes a config dataclass (its canonical form is the cache key and is stored
with the result), returns a ``cache.Result`` of DataFrames and arrays, reports progress as
``progress(fraction, stage)`` and stops with ``Cancelled`` when ``cancel.is_set()``.
The device is not part of the key: CPU and CUDA compute the same quantities.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch

from . import spectral
from .cache import Cache, Result, cached_run
from .data import DataSpec, Sample, load_sample
from .device import resolve_device
from .errors import BadInput, Cancelled
from .models import ARCHS, Attention, Net, attention_features, check_width, features, parse_attention
from .ntk import empirical_ntk, infinite_ntk, kernel_regression, relative_distance
from .training import TrainSpec, accuracy, n_outputs, targets, train, train_many

Progress = Callable[[float, str], None]


# ---------------------------------------------------------------- configs

@dataclass(frozen=True)
class SpectrumConfig:
    data: DataSpec = DataSpec(n=400, n_test=1)
    attention: str = "linear"        # attention variant whose feature Gram is measured
    rtol: float | None = None        # numerical-rank tolerance relative to λ_max; None: n·eps
    eps: float = 0.1                 # ε in the v1 threshold κ⁶/ε²
    growth_ns: tuple[int, ...] = ()  # prefixes of the draw for "κ against n" (each ≤ n)


@dataclass(frozen=True)
class SweepConfig:
    data: DataSpec = DataSpec()
    widths: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    archs: tuple[str, ...] = ARCHS
    attention: str = "linear"        # variant used by the attn arch
    seeds: tuple[int, ...] = (0,)    # network init seeds (data seed is data.seed)
    train: TrainSpec = TrainSpec()
    init_std: float = 1.0            # W ~ N(0, init_std²); the arc-cosine K∞ does not depend on it
    ridge: float = 1e-3              # ridge of the NTK regression f_NTK, relative to mean diag K∞


@dataclass(frozen=True)
class KernelConfig:
    data: DataSpec = DataSpec()
    arch: str = "relu"
    width: int = 1024
    attention: str = "linear"
    seed: int = 0
    train: TrainSpec = TrainSpec()
    init_std: float = 1.0


# ---------------------------------------------------------------- helpers

def check_positive_ints(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise BadInput(f"{name} must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise BadInput(f"{name} must be positive integers, got {v!r}")
    return tuple(int(v) for v in values)


def _check_archs(archs) -> tuple[str, ...]:
    for a in archs:
        if a not in ARCHS:
            raise BadInput(f"unknown arch {a!r}; allowed: {', '.join(ARCHS)}")
    return tuple(archs)


def _tick(progress: Progress | None, cancel, frac: float, stage: str) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"cancelled during: {stage}")
    if progress is not None:
        progress(min(max(frac, 0.0), 1.0), stage)


def to_device(sample: Sample, device: torch.device, dtype=torch.float32):
    """Training and test inputs and labels moved once to the device."""
    return (sample.X.to(device, dtype), sample.y.to(device),
            sample.X_test.to(device, dtype), sample.y_test.to(device))


@dataclass
class Prepared:
    """A drawn sample on the device: the preamble every experiment shares."""

    device: torch.device
    sample: Sample
    X: torch.Tensor    # (n, d) float32 training inputs
    y: torch.Tensor    # (n,) labels
    Xt: torch.Tensor   # (n_test, d) float32 test inputs
    yt: torch.Tensor   # (n_test,)
    c: int             # classes
    Y: torch.Tensor    # (n, n_out) float64 regression targets


def prepare(data: DataSpec, data_dir, device: str, progress: Progress | None, cancel) -> Prepared:
    """Load the draw once and move it to the device once."""
    dev = resolve_device(device)
    _tick(progress, cancel, 0.0, "loading data")
    sample = load_sample(data, data_dir)
    X, y, Xt, yt = to_device(sample, dev)
    return Prepared(dev, sample, X, y, Xt, yt, sample.n_classes, targets(y, sample.n_classes))


def theory_kappa(attention: str, spec: spectral.Spectrum) -> float | None:
    """κ of the attention features' Gram predicted from the input Gram's eigenvalues."""
    att = parse_attention(attention)
    if att.kind is Attention.LINEAR:
        return spec.kappa ** 3
    if att.kind is Attention.STACKED:
        return spec.kappa ** (2 * int(att.param) + 1)
    if att.kind is Attention.TRUNCATED:
        k = spec.kappa_top(int(att.param))
        return None if k is None else k ** 3
    return None  # softmax: no closed form


# ---------------------------------------------------------------- spectrum

def _spectrum_row(Z: torch.Tensor, X_raw: torch.Tensor, cfg: SpectrumConfig) -> dict:
    n, d = Z.shape
    spec = spectral.gram_spectrum(Z, cfg.rtol)
    k = min(n, d)
    kappa_d = spec.kappa_top(k)
    A = attention_features(X_raw, X_raw, cfg.attention, cfg.data.normalize)
    att = spectral.gram_spectrum(A, cfg.rtol)
    thr_attn = spectral.width_thresholds_log10(spec.kappa, kappa_d, n, power=6, eps=cfg.eps)
    thr_relu = spectral.width_thresholds_log10(spec.kappa, kappa_d, n, power=2, eps=cfg.eps)
    return {
        "n": n, "d": d, "numerical_rank": spec.rank, "rank_tol": spec.rank_tol,
        "kappa": spec.kappa, "kappa_d": kappa_d, "kappa_d_singular": kappa_d is None,
        "attention": cfg.attention, "attention_rank": att.rank,
        "kappa_attention": att.kappa, "kappa_attention_theory": theory_kappa(cfg.attention, spec),
        "width_threshold_log10": {"attn_v1": thr_attn["v1"], "attn_v2": thr_attn["v2"],
                                  "relu_v1": thr_relu["v1"], "relu_v2": thr_relu["v2"]},
    }, spec, att


def run_spectrum(cfg: SpectrumConfig, cache: Cache | None = None, data_dir=None, device: str = "cpu",
                 progress: Progress | None = None, cancel=None) -> Result:
    """Spectrum of G = Z Zᵀ (Z: the normalised training rows) and of the attention features.

    Result: meta["summary"] (the CLI's object), arrays ``eig_G`` and ``eig_attention``
    (descending float64), frame ``growth`` (κ, κ_d, κ_att against prefix size n).
    """
    parse_attention(cfg.attention)
    for n in cfg.growth_ns:
        if not 2 <= n <= cfg.data.n:
            raise BadInput(f"growth size {n} must lie in [2, n={cfg.data.n}]")

    def compute() -> Result:
        _tick(progress, cancel, 0.0, "loading data")
        sample = load_sample(cfg.data, data_dir)
        X = sample.X.to(resolve_device(device), torch.float64)
        Z = features(X, None, "relu", normalize=cfg.data.normalize)
        _tick(progress, cancel, 0.3, "eigenvalues of G and of the attention features")
        summary, spec, att = _spectrum_row(Z, X, cfg)
        rows = []
        for i, n in enumerate(cfg.growth_ns):
            _tick(progress, cancel, 0.5 + 0.5 * i / len(cfg.growth_ns), f"κ at n = {n}")
            row, _, _ = _spectrum_row(Z[:n], X[:n], cfg)
            row.pop("width_threshold_log10")
            rows.append(row)
        summary["dataset"] = cfg.data.dataset
        summary["source"] = sample.source
        return Result("spectrum", {}, {"growth": pd.DataFrame(rows)},
                      {"eig_G": spec.eigenvalues, "eig_attention": att.eigenvalues},
                      {"summary": summary})

    return cached_run("spectrum", cfg, compute, cache)


# ---------------------------------------------------------------- width sweep

def _ntk_reference(phi_tr: torch.Tensor, phi_te: torch.Tensor, Y: torch.Tensor, ridge: float):
    """K∞ on the training features and the NTK-regression predictions f_NTK(X_test)."""
    K_inf = infinite_ntk(phi_tr)
    f_ntk = kernel_regression(K_inf, infinite_ntk(phi_te, phi_tr), Y, ridge)
    return K_inf, f_ntk


def _kernel_with(net: Net, W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """The net's empirical NTK on X with weights W put in place for the call."""
    current = net.mlp.W.detach().clone()
    with torch.no_grad():
        net.mlp.W.copy_(W)
    try:
        return empirical_ntk(net, X)
    finally:
        with torch.no_grad():
            net.mlp.W.copy_(current)


def run_ntk_sweep(cfg: SweepConfig, cache: Cache | None = None, data_dir=None, device: str = "cpu",
                  progress: Progress | None = None, cancel=None) -> Result:
    """Kernel and function distances to the infinite-width NTK across widths.

    Frame ``rows``: one row per (arch, width, seed) with kernel_dist_init,
    kernel_dist_trained (‖K_m − K∞‖_F/‖K∞‖_F on the training set), function_dist
    (‖f_m(X_test) − f_NTK(X_test)‖_F), function_dist_rms (that over √n_test), test_acc,
    train_acc, weight_movement (‖W_t − W_0‖_F/‖W_0‖_F), final_loss, seconds (per width: all
    widths of one (arch, seed) train together as one batched model).
    Frame ``losses``: arch, width, seed, epoch, loss. Frame ``trajectory``: the kernel
    distance at each of ``cfg.train.snapshot_epochs`` (arch, width, seed, epoch, kernel_dist).
    """
    widths = check_positive_ints("widths", cfg.widths)
    seeds = tuple(cfg.seeds)
    if not seeds:
        raise BadInput("seeds must not be empty")
    archs = _check_archs(cfg.archs)
    parse_attention(cfg.attention)
    if not cfg.ridge > 0:
        raise BadInput(f"ridge must be > 0, got {cfg.ridge!r}")

    def compute() -> Result:
        p = prepare(cfg.data, data_dir, device, progress, cancel)
        dev, sample, X, y, Xt, yt, c, Y = p.device, p.sample, p.X, p.y, p.Xt, p.yt, p.c, p.Y
        rows, losses, trajectory, ref = [], [], [], {}
        groups = [(a, s) for a in archs for s in seeds]
        for j, (arch, seed) in enumerate(groups):
            stage = f"{arch} seed {seed}"
            _tick(progress, cancel, j / len(groups), stage)
            t0 = time.perf_counter()
            nets = [Net(arch, X, w, n_outputs(c), seed, cfg.init_std, cfg.attention, cfg.data.normalize).to(dev)
                    for w in widths]
            if arch not in ref:  # features, hence K∞ and f_NTK, do not depend on the seed
                with torch.no_grad():
                    ref[arch] = _ntk_reference(nets[0].features(X), nets[0].features(Xt), Y, cfg.ridge)
            K_inf, f_ntk = ref[arch]
            K0 = [empirical_ntk(net, X) for net in nets]
            sub = None if progress is None else (
                lambda f, s, j=j: progress((j + 0.9 * f) / len(groups), f"{stage}: training all widths, {s}"))
            results = train_many(nets, X, y, c, cfg.train, seed, sub, cancel)
            _tick(progress, cancel, (j + 0.9) / len(groups), f"{stage}: kernels after training")
            seconds = (time.perf_counter() - t0) / len(widths)
            for width, net, k0, tr in zip(widths, nets, K0, results):
                Kt = empirical_ntk(net, X)
                with torch.no_grad():
                    f_test = net(Xt).double()
                fdist = float(torch.linalg.norm(f_test - f_ntk))
                W = net.mlp.W.detach()
                rows.append({
                    "arch": arch, "attention": cfg.attention if arch == "attn" else None,
                    "width": width, "seed": seed,
                    "kernel_dist_init": relative_distance(k0, K_inf),
                    "kernel_dist_trained": relative_distance(Kt, K_inf),
                    "function_dist": fdist, "function_dist_rms": fdist / math.sqrt(Xt.shape[0]),
                    "test_acc": accuracy(net, Xt, yt), "train_acc": accuracy(net, X, y),
                    "weight_movement": float(torch.linalg.norm(W - tr.W0) / torch.linalg.norm(tr.W0)),
                    "final_loss": tr.losses[-1], "seconds": seconds,
                })
                losses += [{"arch": arch, "width": width, "seed": seed, "epoch": e, "loss": v}
                           for e, v in enumerate(tr.losses)]
                if net.fixed_features:  # snapshots hold W only; trainable attention moves too
                    trajectory += [{"arch": arch, "width": width, "seed": seed, "epoch": e,
                                    "kernel_dist": relative_distance(_kernel_with(net, W_e, X), K_inf)}
                                   for e, W_e in sorted(tr.snapshots.items())]
        _tick(progress, cancel, 1.0, "done")
        meta = {"n": sample.n, "n_test": int(Xt.shape[0]), "d": sample.d, "n_classes": c,
                "source": sample.source, "device": str(dev)}
        frames = {"rows": pd.DataFrame(rows), "losses": pd.DataFrame(losses),
                  "trajectory": pd.DataFrame(trajectory, columns=["arch", "width", "seed", "epoch", "kernel_dist"])}
        return Result("ntk_sweep", {}, frames, {}, meta)

    return cached_run("ntk_sweep", cfg, compute, cache)


def run_kernels(cfg: KernelConfig, cache: Cache | None = None, data_dir=None, device: str = "cpu",
                progress: Progress | None = None, cancel=None) -> Result:
    """K_m at init, K_m after training and K∞ on the training set, for one net.

    Arrays ``K_init``, ``K_trained``, ``K_inf`` (n, n) float64 and ``y`` (n,), the
    training points sorted by label so that class blocks show in heatmaps.
    """
    check_width(cfg.width)
    _check_archs([cfg.arch])

    def compute() -> Result:
        dev = resolve_device(device)
        _tick(progress, cancel, 0.0, "loading data")
        sample = load_sample(cfg.data, data_dir)
        order = torch.argsort(sample.y, stable=True)
        X, y = sample.X[order].to(dev, torch.float32), sample.y[order].to(dev)
        net = Net(cfg.arch, X, cfg.width, n_outputs(sample.n_classes), cfg.seed, cfg.init_std,
                  cfg.attention, cfg.data.normalize).to(dev)
        with torch.no_grad():
            K_inf = infinite_ntk(net.features(X))
        K0 = empirical_ntk(net, X)
        train(net, X, y, sample.n_classes, cfg.train, cfg.seed,
              None if progress is None else (lambda f, s: progress(0.05 + 0.9 * f, s)), cancel)
        Kt = empirical_ntk(net, X)
        arrays = {"K_init": K0.cpu().numpy(), "K_trained": Kt.cpu().numpy(),
                  "K_inf": K_inf.cpu().numpy(), "y": y.cpu().numpy()}
        return Result("kernels", {}, {}, arrays, {"class_names": list(sample.class_names)})

    return cached_run("kernels", cfg, compute, cache)
