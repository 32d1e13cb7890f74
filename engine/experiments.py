"""Whole experiments from frozen configs: spectra, width sweeps, kernel views.

Each ``run_*`` takes a config dataclass (its canonical form, with fingerprints of the data
and the engine's code, is the cache key and is stored with the result), returns a
``cache.Result`` of DataFrames and arrays, reports progress as ``progress(fraction, stage)``
and stops with ``Cancelled`` when ``cancel.is_set()``. ``estimate(cfg)`` beside each run
gives its time and memory from all parameters; a run over its ``Budget`` is refused before
it starts. The device is not part of the key: CPU and CUDA compute the same quantities.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd
import torch

from . import budget as B
from . import options, spectral
from .budget import Estimate
from .cache import Result
from .data import DataSpec, load_sample
from .errors import BadInput
from .models import Attention, Net, attention_features, features, parse_attention
from .ntk import (empirical_ntk, infinite_ntk, kernel_regression, prediction_gap, relative_distance,
                  whitened_distance)
from .paper import passes_gate
from .runs import Progress, check_finite, experiment_run, prepare, tick
from .settings import normalised, setting, validate
from .tables import summarize
from .training import TrainSpec, accuracy, n_outputs, predict_labels, train, train_many

# ---------------------------------------------------------------- configs

@dataclass(frozen=True)
class SpectrumConfig:
    data: DataSpec = DataSpec(n=400, n_test=1)
    attention: str = options.attention()  # whose feature Gram is measured
    rtol: float | None = setting(None, "numerical-rank tolerance relative to λ_max (none: n·eps64)",
                                 flag="--rank-rtol", lo=0, lo_open=True, hi=1.0)
    eps: float = setting(0.1, "ε of the paper's v1 width threshold κ⁶/ε²", lo=0, lo_open=True, hi=1.0)
    growth_ns: tuple[int, ...] = setting((), "prefix sizes of the draw for κ against n (each ≤ n)",
                                         unit="points", flag="--growth", lo=2, hi=60_000, max_len=20)

    def __post_init__(self):
        normalised(self)
        validate(self)
        too_big = [g for g in self.growth_ns if g > self.data.n]
        if too_big:
            raise BadInput(f"growth sizes {too_big} exceed n = {self.data.n}")


@dataclass(frozen=True)
class SweepConfig:
    data: DataSpec = DataSpec()
    train: TrainSpec = TrainSpec()
    widths: tuple[int, ...] = options.widths((16, 64, 256, 1024, 4096))
    archs: tuple[str, ...] = options.archs()
    attention: str = options.attention()
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init()
    ridge: float = options.ridge()  # of K∞ ridge regression and of the whitened distances

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.widths)


@dataclass(frozen=True)
class KernelConfig:
    data: DataSpec = DataSpec()
    train: TrainSpec = TrainSpec()
    arch: str = options.arch()
    width: int = options.width()
    attention: str = options.attention()
    seed: int = options.seed()
    init_std: float = options.init_std()
    init: str = options.init()
    storage: str = options.storage()

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.width)


PRESETS = {  # named instances of the same dataclasses: the dashboard's quick runs and the paper's
    "spectrum": {"quick": SpectrumConfig(data=DataSpec(n=200, n_test=1)),
                 "paper": SpectrumConfig(data=DataSpec(n=1000, n_test=1))},
    "ntk-sweep": {"quick": SweepConfig(data=DataSpec(n=200, n_test=100), train=TrainSpec(epochs=20),
                                   widths=(16, 64, 256, 1024)),
              "paper": SweepConfig(data=DataSpec(n=1000, n_test=500), train=TrainSpec(epochs=500),
                                   widths=(16, 1024, 4096)),
              # nets that train to their K_m baseline (engine.malleability.TRAINED): Adam without decay,
              # centred attention features for MLP-Attn
              "trained": SweepConfig(data=DataSpec(n=500, n_test=100),
                                     train=TrainSpec(epochs=500, lr=1e-3, weight_decay=0.0),
                                     widths=(256, 1024, 4096), attention="centered")},
    "kernels": {"quick": KernelConfig(data=DataSpec(n=200, n_test=1), train=TrainSpec(epochs=20)),
                "paper": KernelConfig(data=DataSpec(n=1000, n_test=1), train=TrainSpec(epochs=500))},
}


# ---------------------------------------------------------------- helpers

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
    return None  # softmax, qkv: no closed form


def theory_formula(attention: str) -> str | None:
    """The formula behind ``theory_kappa`` in words, for labels: κ³, κ⁵, (λ₁/λ_r)³."""
    att = parse_attention(attention)
    if att.kind is Attention.LINEAR:
        return "κ(G)^3"
    if att.kind is Attention.STACKED:
        return f"κ(G)^{2 * int(att.param) + 1}"
    if att.kind is Attention.TRUNCATED:
        return f"(λ_1/λ_{int(att.param)})^3"
    return None


# ---------------------------------------------------------------- spectrum

def _spectrum_row(Z: torch.Tensor, X_raw: torch.Tensor, cfg: SpectrumConfig) -> tuple[dict, object, object]:
    n, d = Z.shape
    spec = spectral.gram_spectrum(Z, cfg.rtol)
    kappa_d = spec.kappa_top(min(n, d))
    A = attention_features(X_raw, X_raw, cfg.attention, cfg.data.normalize)
    att = spectral.gram_spectrum(A, cfg.rtol)
    theory = theory_kappa(cfg.attention, spec)
    rtol = n * spectral.EPS64 if cfg.rtol is None else cfg.rtol
    thr_attn = spectral.width_thresholds_log10(spec.kappa, kappa_d, n, power=6, eps=cfg.eps)
    thr_relu = spectral.width_thresholds_log10(spec.kappa, kappa_d, n, power=2, eps=cfg.eps)
    return {
        "n": n, "d": d, "numerical_rank": spec.rank, "rank_tol": spec.rank_tol,
        "kappa": spec.kappa, "kappa_d": kappa_d, "kappa_d_singular": kappa_d is None,
        "attention": cfg.attention, "attention_rank": att.rank,
        "kappa_attention": att.kappa, "kappa_attention_theory": theory,
        "kappa_attention_formula": theory_formula(cfg.attention),
        # eigenvalues below rtol·λ_max count as zero, so no measured κ exceeds 1/rtol: near or past
        # that limit the measured value saturates instead of following the theory
        "kappa_attention_saturated": bool(theory is not None and theory > 0.5 / rtol),
        "kappa_resolvable": 1.0 / rtol,
        "width_threshold_log10": {"attn_v1": thr_attn["v1"], "attn_v2": thr_attn["v2"],
                                  "relu_v1": thr_relu["v1"], "relu_v2": thr_relu["v2"]},
    }, spec, att


def estimate_spectrum(cfg: SpectrumConfig) -> Estimate:
    n, d = cfg.data.n, B.input_dim(cfg.data)
    one = lambda k: B.eig_s(min(k, d)) * 2 + B.gemm_s(k, d, min(k, d), True) * 2 + B.attention_s(cfg.attention, k, d)
    seconds = B.FIXED_S + one(n) + sum(one(g) for g in cfg.growth_ns)
    return Estimate(seconds, 8 * (3 * n * d + 2 * min(n, d) ** 2 + 2 * n))


@experiment_run("spectrum")
def run_spectrum(cfg: SpectrumConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
    """Spectrum of G = Z Zᵀ (Z: the normalised training rows) and of the attention features.

    Result: meta["summary"] (the CLI's object), arrays ``eig_G`` and ``eig_attention``
    (descending float64), frame ``growth`` (κ, κ_d, κ_att against prefix size n).
    """
    tick(progress, cancel, 0.0, "loading data")
    sample = load_sample(cfg.data, data_dir)
    X = sample.X.to(dev, torch.float64)
    Z = features(X, None, "relu", normalize=cfg.data.normalize)
    tick(progress, cancel, 0.3, "eigenvalues of G and of the attention features")
    summary, spec, att = _spectrum_row(Z, X, cfg)
    rows = []
    for i, n in enumerate(cfg.growth_ns):
        tick(progress, cancel, 0.5 + 0.5 * i / len(cfg.growth_ns), f"κ at n = {n}")
        row, _, _ = _spectrum_row(Z[:n], X[:n], cfg)
        row.pop("width_threshold_log10")
        rows.append(row)
    summary["dataset"] = cfg.data.dataset
    summary["source"] = sample.source
    return Result("spectrum", {}, {"growth": pd.DataFrame(rows)},
                  {"eig_G": spec.eigenvalues, "eig_attention": att.eigenvalues},
                  {"summary": summary})


# ---------------------------------------------------------------- width sweep

SWEEP_METRICS = ("kernel_dist_init", "kernel_dist_trained", "kernel_dist_whitened_init",
                 "kernel_dist_whitened_trained", "prediction_gap_init", "prediction_gap_trained",
                 "function_dist", "function_dist_rel", "function_dist_rms", "f_norm", "f_ntk_norm",
                 "test_acc", "train_acc", "test_acc_ntk", "test_acc_kernel", "trained", "weight_movement",
                 "final_loss")


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


def estimate_sweep(cfg: SweepConfig) -> Estimate:
    n, nt, d = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data)
    tr, groups = cfg.train, len(cfg.archs) * len(cfg.seeds)
    c_out = B.n_outputs(cfg.data)
    reference = len(cfg.archs) * (B.attention_s(cfg.attention, n + nt, d) + B.gemm_s(n + nt, n, d, True)
                                  + 2 * B.chol_s(n) + B.eig_s(n))
    per_group = B.train_s(n, d, sum(cfg.widths), tr.epochs, tr.batch_size, c_out)
    snaps = len(tr.snapshot_epochs)
    for w in cfg.widths:
        per_group += (3 + snaps) * B.ntk_s(n, n, d, w) + B.ntk_s(nt, n, d, w) * 2 + 2 * B.eig_s(n) + 4 * B.chol_s(n)
    if cfg.attention == "qkv" and "attn" in cfg.archs:
        per_group *= B.QKV_SLOWDOWN
    seconds = B.FIXED_S + reference + groups * per_group
    memory = (8 * (8 * n * n + 2 * nt * n) + 16 * sum(cfg.widths) * d + 2 * (n + nt) * max(cfg.widths) * 4
              + B.head_bytes(sum(cfg.widths), n + nt, c_out) + 8 * 4 * (n + nt) * c_out)  # f_NTK, solves
    return Estimate(seconds, int(memory))


@experiment_run("ntk-sweep")
def run_ntk_sweep(cfg: SweepConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
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
        trained (1/0: ``engine.paper.passes_gate`` of test_acc against test_acc_kernel; NaN
        without training);
      - weight_movement ‖W_t − W_0‖_F / ‖W_0‖_F, final_loss, n_test, seconds.
    Frame ``summary``: mean and sd of each metric over seeds per (arch, width).
    Frame ``losses``: arch, width, seed, epoch, loss. Frame ``trajectory``: the kernel
    distance at each of ``cfg.train.snapshot_epochs`` (arch, width, seed, epoch, kernel_dist).
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample, X, y, Xt, yt, c, Y = p.sample, p.X, p.y, p.Xt, p.yt, p.c, p.Y
    rows, losses, trajectory, ref = [], [], [], {}
    groups = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for j, (arch, seed) in enumerate(groups):
        stage = f"{arch} seed {seed}"
        tick(progress, cancel, j / len(groups), stage)
        t0 = time.perf_counter()
        nets = [Net(arch, X, w, n_outputs(c), seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                    init=cfg.init).to(dev)
                for w in cfg.widths]
        if arch not in ref:  # features, hence K∞ and f_NTK, do not depend on the seed
            with torch.no_grad():
                phi, phi_t = nets[0].features(X), nets[0].features(Xt)
                K_inf, K_inf_t = infinite_ntk(phi), infinite_ntk(phi_t, phi)
                f_ntk = kernel_regression(K_inf, K_inf_t, Y, cfg.ridge)
            check_finite(K_inf, f"the infinite-width kernel of {arch}")
            ref[arch] = K_inf, K_inf_t, f_ntk
        K_inf, K_inf_t, f_ntk = ref[arch]

        def kernel_metrics(net, suffix):
            K = empirical_ntk(net, X)
            check_finite(K, f"the empirical kernel of {arch} at width {net.mlp.width}")
            K_t = empirical_ntk(net, Xt, X)
            f_m = kernel_regression(K, K_t, Y, cfg.ridge)
            return {f"kernel_dist_{suffix}": relative_distance(K, K_inf),
                    f"kernel_dist_whitened_{suffix}": whitened_distance(K, K_inf, cfg.ridge),
                    f"prediction_gap_{suffix}": prediction_gap(K, K_t, K_inf, K_inf_t, Y, cfg.ridge),
                    f"test_acc_kernel_{suffix}": float((predict_labels(f_m) == yt).double().mean())}

        init = [kernel_metrics(net, "init") for net in nets]  # metrics only: no K held across widths
        sub = None if progress is None else (
            lambda f, s, j=j: progress((j + 0.8 * f) / len(groups), f"{stage}: training all widths, {s}"))
        results = train_many(nets, X, y, c, cfg.train, seed, sub, cancel)
        tick(progress, cancel, (j + 0.8) / len(groups), f"{stage}: kernels after training")
        seconds = (time.perf_counter() - t0) / len(cfg.widths)
        for width, net, m0, tr in zip(cfg.widths, nets, init, results):
            tick(progress, cancel, (j + 0.9) / len(groups), f"{stage}: kernels at width {width}")
            mt = kernel_metrics(net, "trained")
            with torch.no_grad():
                f_test = net(Xt).double()
            fdist = float(torch.linalg.norm(f_test - f_ntk))
            f_ntk_norm = float(torch.linalg.norm(f_ntk))
            W = net.mlp.W.detach()
            test_acc = accuracy(net, Xt, yt)
            rows.append({
                "arch": arch, "attention": cfg.attention if arch == "attn" else None,
                "width": width, "seed": seed, **m0, **mt,
                "function_dist": fdist, "function_dist_rel": fdist / f_ntk_norm if f_ntk_norm else math.nan,
                "function_dist_rms": fdist / math.sqrt(Xt.shape[0]),
                "f_norm": float(torch.linalg.norm(f_test)), "f_ntk_norm": f_ntk_norm,
                "test_acc": test_acc, "train_acc": accuracy(net, X, y),
                "test_acc_ntk": float((predict_labels(f_ntk) == yt).double().mean()),
                "test_acc_kernel": mt["test_acc_kernel_trained"],
                "trained": float(passes_gate(test_acc, mt["test_acc_kernel_trained"])) if cfg.train.epochs else math.nan,
                "weight_movement": float(torch.linalg.norm(W - tr.W0) / torch.linalg.norm(tr.W0)),
                "final_loss": tr.losses[-1], "n_test": int(Xt.shape[0]), "seconds": seconds,
            })
            losses += [{"arch": arch, "width": width, "seed": seed, "epoch": e, "loss": v}
                       for e, v in enumerate(tr.losses)]
            if net.fixed_features:  # snapshots hold W only; trainable attention moves too
                trajectory += [{"arch": arch, "width": width, "seed": seed, "epoch": e,
                                "kernel_dist": relative_distance(_kernel_with(net, W_e, X), K_inf)}
                               for e, W_e in sorted(tr.snapshots.items())]
    tick(progress, cancel, 1.0, "done")
    meta = {"n": sample.n, "n_test": int(Xt.shape[0]), "d": sample.d, "n_classes": c,
            "source": sample.source, "device": str(dev)}
    frame = pd.DataFrame(rows)
    frames = {"rows": frame, "summary": summarize(frame, ["arch", "attention", "width"], SWEEP_METRICS),
              "losses": pd.DataFrame(losses),
              "trajectory": pd.DataFrame(trajectory, columns=["arch", "width", "seed", "epoch", "kernel_dist"])}
    return Result("ntk-sweep", {}, frames, {}, meta)


# ---------------------------------------------------------------- kernel views

def estimate_kernels(cfg: KernelConfig) -> Estimate:
    n, d, w = cfg.data.n, B.input_dim(cfg.data), cfg.width
    seconds = (B.FIXED_S + B.attention_s(cfg.attention, n, d) + 2 * B.ntk_s(n, n, d, w)
               + B.train_s(n, d, w, cfg.train.epochs, cfg.train.batch_size, B.n_outputs(cfg.data)))
    if cfg.attention == "qkv" and cfg.arch == "attn":
        seconds *= B.QKV_SLOWDOWN
    size = 4 if cfg.storage == "float32" else 8
    return Estimate(seconds, int(size * 5 * n * n + 16 * w * d + B.head_bytes(w, n, B.n_outputs(cfg.data))))


@experiment_run("kernels")
def run_kernels(cfg: KernelConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
    """K_m at init, K_m after training and K∞ on the training set, for one net.

    Arrays ``K_init``, ``K_trained``, ``K_inf`` (n, n) in ``cfg.storage`` and ``y`` (n,), the
    training points sorted by label so that class blocks show in heatmaps.
    """
    tick(progress, cancel, 0.0, "loading data")
    sample = load_sample(cfg.data, data_dir)
    order = torch.argsort(sample.y, stable=True)
    X, y = sample.X[order].to(dev, torch.float32), sample.y[order].to(dev)
    net = Net(cfg.arch, X, cfg.width, n_outputs(sample.n_classes), cfg.seed, cfg.init_std,
              cfg.attention, cfg.data.normalize, init=cfg.init).to(dev)
    with torch.no_grad():
        K_inf = infinite_ntk(net.features(X), storage=cfg.storage)
    K0 = empirical_ntk(net, X, storage=cfg.storage)
    train(net, X, y, sample.n_classes, cfg.train, cfg.seed,
          None if progress is None else (lambda f, s: progress(0.05 + 0.9 * f, s)), cancel)
    Kt = empirical_ntk(net, X, storage=cfg.storage)
    arrays = {"K_init": K0.cpu().numpy(), "K_trained": Kt.cpu().numpy(),
              "K_inf": K_inf.cpu().numpy(), "y": y.cpu().numpy()}
    return Result("kernels", {}, {}, arrays, {"class_names": list(sample.class_names)})
