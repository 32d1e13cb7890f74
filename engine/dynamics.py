"""Kernel regime or not: real against linearised training, and μP's coordinate check.

Linearisation. The head f(x) = s_m Σ_r a_r relu(w_r·φ(x)) (s_m = m^-1/2, or m^-1 under μP)
is positively homogeneous in each w_r, so its first-order Taylor model around the
initialisation W0 freezes every unit's activation pattern at init:

    f_lin(x; W) = f(x; W0) + J(W0)(W − W0) = s_m Σ_r a_r 1[w_r⁰·φ(x) > 0] (w_r·φ(x)).

``train_pair`` trains a net and this linear model side by side from the same W0 with the
same optimiser, learning rate, mini-batches (engine.training's batch order for the seed)
and steps. The net stays in the kernel (lazy) regime when f_t − f_lin,t is small; theory
(NTK parametrisation, SGD) says it falls like m^-1/2, with the share of flipped activation
signs.

K∞ gradient flow. The engine's MSE is L = (1/(n c)) Σ_i Σ_k (f_ik − y_ik)² over n points and
c outputs, and each mini-batch step's gradient is in expectation the full-batch one (an
epoch of ⌈n/B⌉ steps weights every point equally). For small steps, τ = epoch·⌈n/B⌉ optimiser
steps of plain SGD with learning rate η and coupled L2 λ follow the linear ODE

    dF/dτ = −η' K (F − Y) − β F,   η' = 2η / (n c),   β = η λ,

for the training outputs F (n, c) and likewise dF'/dτ = −η' K' (F − Y) − β F' for test
outputs (K' = K(X_test, X)); the decay term is exact for the linear model because
f_lin(W) = J(W0) W. With K = U diag(μ) Uᵀ, a = η'μ + β, G = UᵀF, G_y = UᵀY:

    F'(τ) = e^{−βτ} F'_0 + η' K' U [ (1 − e^{−βτ})/a ⊙ G_y − τ e^{−βτ} φ₁(η'μτ) ⊙ (G_0 − (η'μ/a) ⊙ G_y) ],

φ₁(x) = (1 − e^{−x})/x. With λ = 0 this is the classic
F'(τ) = F'_0 + K' K⁻¹ (I − e^{−η' K τ}) (Y − F_0) (Jacot et al. 2018; Lee et al. 2019).
Putting K∞ for K gives f_K∞,t. Under μP the loss is weighted by m and the tangent kernel is
K_m/m, so the same η' holds. ``k_inf_gap`` = ‖f_t − f_K∞,t‖_F / ‖f_K∞,t‖_F on the test points,
for MSE and SGD only (other losses and optimisers follow no such closed form).

Coordinate check (after Yang et al. 2022, "Tensor Programs V", and the ``mup`` package):
the RMS change of the outputs Δf and of the hidden pre-activations Δh = φ (W_t − W_0)ᵀ after
t = 1 … T steps, against width. Theory (``COORD_THEORY``, log-log slopes, no weight decay):
ntk + SGD: Δh ∝ m^-1/2 (lazy), Δf flat; ntk + Adam: Δh flat, Δf ∝ m^+1/2; μP: both flat.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import torch

from . import budget as B
from . import options
from .budget import Estimate
from .cache import Result
from .data import DataSpec
from .errors import BadInput, Cancelled
from .models import PARAMS, Attention, Net, parse_attention
from .ntk import infinite_ntk
from .runs import Progress, check_finite, experiment_run, prepare, tick
from .settings import normalised, setting, validate
from .tables import loglog_slope, summarize
from .training import (BATCH_SEED_OFFSET, OPTIMIZER_FNS, TrainSpec, per_model_loss, loss_fn, loss_weights, predict_labels,
                       resolve_loss)

METRICS = ("lin_gap", "pattern_change", "train_loss", "train_loss_lin", "train_acc", "test_acc", "test_acc_lin",
           "k_inf_gap", "weight_movement")
COORD_METRICS = ("delta_f", "delta_h", "f_rms")
COORD_THEORY = {  # (param, optimiser family) -> log-log slope against width of (Δf, Δh)
    ("ntk", "sgd"): {"delta_f": 0.0, "delta_h": -0.5},
    ("ntk", "adam"): {"delta_f": 0.5, "delta_h": 0.0},
    ("mup", "sgd"): {"delta_f": 0.0, "delta_h": 0.0},
    ("mup", "adam"): {"delta_f": 0.0, "delta_h": 0.0},
}


def _check_attention(text: str) -> None:
    if parse_attention(text).kind is Attention.QKV:
        raise BadInput("attention 'qkv' trains its own parameters, so the head's linearisation does not "
                       "describe the net; use a parameter-free variant")


def _attention_setting():
    return options.attention(check=_check_attention, only="parameter-free variants only (qkv trains its own "
                             "parameters, which the head's linearisation does not describe)")


# ---------------------------------------------------------------- configs

@dataclass(frozen=True)
class DynamicsConfig:
    data: DataSpec = DataSpec(n=200, n_test=100)
    # plain SGD without decay: the setting of NTK theory (train.param picks ntk or μP)
    train: TrainSpec = TrainSpec(epochs=50, optimizer="sgd", lr=1.0, weight_decay=0.0)
    widths: tuple[int, ...] = options.widths((64, 256, 1024, 4096))
    archs: tuple[str, ...] = options.archs()
    attention: str = _attention_setting()
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init()
    record_every: int = setting(5, "measure every K epochs (and at 0 and the last epoch)", unit="epochs",
                                lo=1, hi=20_000)

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.widths)


@dataclass(frozen=True)
class CoordCheckConfig:
    data: DataSpec = DataSpec(n=256, n_test=64)
    # optimiser, lr, batch size and loss of the steps; its epochs and param are not used
    train: TrainSpec = TrainSpec(epochs=1, optimizer="sgd", lr=0.1, batch_size=64, weight_decay=0.0)
    arch: str = options.arch()
    attention: str = _attention_setting()
    widths: tuple[int, ...] = options.widths((64, 256, 1024, 4096))
    params: tuple[str, ...] = setting(PARAMS, "parametrisations compared", choices=PARAMS)
    steps: int = setting(5, "optimiser steps t = 1 … T measured", unit="steps", lo=1, hi=100)
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init()

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.widths)


PRESETS = {
    "dynamics": {
        "quick": DynamicsConfig(widths=(16, 64, 256, 1024, 4096)),
        # the paper's protocol (Adam, lr 1e-3, L2 1e-3): does it stay near its linearisation?
        "paper": DynamicsConfig(data=DataSpec(n=1000, n_test=500), train=TrainSpec(epochs=500),
                                widths=(16, 1024, 4096), record_every=25),
        # Why a binary MSE preset: on 10 classes with cross-entropy both nets' gaps fall near the lazy
        # m^-1/2 rate, so the default view hides the paper's point. On 3 vs 8 with MSE and plain SGD (the
        # README's set-up, where the closed-form K∞ gradient flow applies) 2L-ReLU's gap falls with slope
        # ≈ −0.66 while MLP-Attn's stays near −0.14 and 0.5 from the K∞ flow. One click on the Kernel
        # regime page sets it.
        "binary-mse": DynamicsConfig(data=DataSpec(dataset="mnist:3-8", n=200, n_test=100),
                                     # loss "auto" is MSE on ±1 for two classes, and the page's own setting
                                     train=TrainSpec(epochs=50, optimizer="sgd", lr=1.0, weight_decay=0.0),
                                     widths=(64, 256, 1024, 4096)),
    },
    "coord-check": {
        "quick": CoordCheckConfig(),
        "paper": CoordCheckConfig(data=DataSpec(n=512, n_test=128),  # the paper's Adam, without decay
                                  train=TrainSpec(epochs=1, lr=1e-3, batch_size=128, weight_decay=0.0)),
    },
}


# ---------------------------------------------------------------- the linearised head and the loop

def lin_gap(f: torch.Tensor, f_lin: torch.Tensor) -> float:
    """‖f − f_lin‖_F / ‖f_lin‖_F: how far the net's outputs (n_test, c) are from those of its
    linearisation at initialisation trained beside it (0 in the kernel regime); NaN when f_lin = 0."""
    f, f_lin = f.double(), f_lin.double()
    scale = float(torch.linalg.norm(f_lin))
    return float(torch.linalg.norm(f - f_lin)) / scale if scale else math.nan


def linearised_head(phi: torch.Tensor, W: torch.Tensor, mask0: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """f_lin = ((φ Wᵀ) ∘ 1[φ W0ᵀ > 0]) (s_m a): the head linearised around W0.

    phi (n, d) features; W (m, d) current weights; mask0 (n, m) bool, ``φ W0ᵀ > 0``;
    readout (m, n_out) = s_m · a (``TwoLayerReLU.readout``; block-diagonal for stacked widths).
    Returns (n, n_out) in phi's dtype. With W = W0 and mask0 from the same product this is
    bit for bit ``relu(φ W0ᵀ) readout`` (masked entries are +0, as relu's).
    """
    return (phi @ W.T).masked_fill(~mask0, 0.0) @ readout


def _steps(params, loss_of: Callable[[torch.Tensor], torch.Tensor], n: int, spec: TrainSpec, seed: int,
           device, cancel) -> Iterator[tuple[int, int, bool]]:
    """Mini-batch steps in engine.training's order for ``seed``; yields (epoch, step, end of epoch)
    after each step. ``loss_of(idx)`` returns the scalar to minimise on the rows idx."""
    opt = OPTIMIZER_FNS[spec.optimizer](params, lr=spec.lr, weight_decay=spec.weight_decay)
    g = torch.Generator().manual_seed(int(seed) + BATCH_SEED_OFFSET)
    step, epoch = 0, 0
    while True:
        epoch += 1
        if cancel is not None and cancel.is_set():
            raise Cancelled("training cancelled")
        order = torch.randperm(n, generator=g).to(device)
        for start in range(0, n, spec.batch_size):
            idx = order[start:start + spec.batch_size]
            opt.zero_grad(set_to_none=False)
            loss_of(idx).backward()
            opt.step()
            step += 1
            yield epoch, step, start + spec.batch_size >= n


def _stack(nets, spec: TrainSpec):
    """Stacked weights (Σm, d), block-diagonal readout (Σm, k·n_out) and the loss weights."""
    for net in nets:  # as engine.training does: the spec decides the head's parametrisation
        net.mlp.param = spec.param
    W0 = torch.cat([net.mlp.W.detach() for net in nets]).clone()
    A = torch.block_diag(*[net.mlp.readout() for net in nets])
    return W0, A, loss_weights(nets, spec)


def train_pair(nets, phi: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int = 0,
               record=(), on_record: Callable | None = None, progress: Progress | None = None,
               cancel=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train nets and their linearisations side by side (same init, optimiser, batches, steps).

    nets: heads of one arch and seed with fixed features (widths may differ), trained as
    one stacked model like ``engine.training.train_many``; phi (n, d) their features of the
    training set, y (n,) labels. ``on_record(epoch, W, W_lin)`` is called before training
    (epoch 0) and after each epoch listed in ``record``, with the stacked (Σm, d) weights.
    Returns (W, W_lin, W0), stacked. The nets' own weights are left at W0.
    """
    if not all(net.fixed_features for net in nets):
        raise BadInput("the linearised comparison needs fixed features (not qkv attention)")
    loss_name = resolve_loss(spec, n_classes)
    W0, A, weights = _stack(nets, spec)
    k, n_out = len(nets), nets[0].mlp.a.shape[1]
    mask0 = phi @ W0.T > 0
    W, W_lin = torch.nn.Parameter(W0.clone()), torch.nn.Parameter(W0.clone())

    def loss_of(idx):
        rows, yy = phi[idx], y[idx]
        real = per_model_loss((torch.relu(rows @ W.T) @ A).reshape(-1, k, n_out), yy, loss_name, n_classes)
        lin = per_model_loss(linearised_head(rows, W_lin, mask0[idx], A).reshape(-1, k, n_out), yy,
                              loss_name, n_classes)
        both = real + lin  # independent parameters: each gets its own gradient
        return both.sum() if weights is None else (both * weights.to(both.dtype)).sum()

    record = set(record)
    if on_record is not None and 0 in record:
        on_record(0, W.detach(), W_lin.detach())
    if spec.epochs == 0:
        return W.detach(), W_lin.detach(), W0
    for epoch, _, end in _steps([W, W_lin], loss_of, phi.shape[0], spec, seed, phi.device, cancel):
        if not end:
            continue
        if not (bool(torch.isfinite(W).all()) and bool(torch.isfinite(W_lin).all())):
            raise BadInput(f"training diverged at epoch {epoch}: the weights are not finite; lower the "
                           f"learning rate (now {spec.lr:g})")
        if on_record is not None and epoch in record:
            on_record(epoch, W.detach(), W_lin.detach())
        if progress is not None:
            progress(epoch / spec.epochs, f"epoch {epoch}/{spec.epochs}")
        if epoch >= spec.epochs:
            break
    return W.detach(), W_lin.detach(), W0


# ---------------------------------------------------------------- K∞ gradient flow

def flow_rates(spec: TrainSpec, n: int, n_out: int) -> tuple[float, float, int] | None:
    """(η', β, steps per epoch) of the MSE gradient flow the engine's SGD follows; None
    when the loss is not MSE or the optimiser not SGD. η' = 2η/(n·n_out), β = η·λ."""
    if spec.optimizer != "sgd":
        return None
    if resolve_loss(spec, 2 if n_out == 1 else n_out) != "mse":
        return None
    return 2.0 * spec.lr / (n * n_out), spec.lr * spec.weight_decay, math.ceil(n / spec.batch_size)


def _phi1(x: torch.Tensor) -> torch.Tensor:
    """(1 − e^{−x}) / x, 1 at x = 0, accurate for tiny x."""
    safe = torch.where(x > 0, x, torch.ones_like(x))
    return torch.where(x > 0, -torch.expm1(-safe) / safe, torch.ones_like(x))


class KernelFlow:
    """Gradient-flow predictions of kernel regression in closed form (module docstring).

    K (n, n) train kernel, K_t (n_t, n) test–train kernel, float64. The eigendecomposition
    is done once; ``predict`` is then O(n_t·n·c) per call.
    """

    def __init__(self, K: torch.Tensor, K_t: torch.Tensor):
        K = K.double()
        if not B.all_finite(K):  # eigh of a NaN kernel raises deep inside LAPACK
            raise BadInput(f"the K∞ gradient flow's {K.shape[0]} x {K.shape[0]} kernel holds NaN or infinite "
                           "values; check the data for non-finite or all-zero rows")
        mu, U = torch.linalg.eigh((K + K.T) / 2)
        self.mu, self.U = mu.clamp(min=0.0), U    # rounding can make tiny eigenvalues negative
        self.KtU = K_t.double() @ U

    def predict(self, Y, F0, F0_t, eta: float, beta: float, tau: float) -> torch.Tensor:
        """F'(τ) (n_t, c) float64 from targets Y (n, c), initial outputs F0 (n, c), F0_t (n_t, c)."""
        Gy, G0 = self.U.T @ Y.double(), self.U.T @ F0.double()
        em = eta * self.mu
        a = em + beta
        decay = math.exp(-beta * tau)
        ratio = torch.where(a > 0, em / torch.where(a > 0, a, torch.ones_like(a)), torch.ones_like(a))
        if beta > 0:
            c1 = -math.expm1(-beta * tau) / a  # a ≥ β > 0
        else:
            c1 = torch.zeros_like(a)
        inner = c1[:, None] * Gy - (tau * decay) * _phi1(em * tau)[:, None] * (G0 - ratio[:, None] * Gy)
        return decay * F0_t.double() + eta * (self.KtU @ inner)


# ---------------------------------------------------------------- real against linearised training

def _record_epochs(cfg: DynamicsConfig) -> list[int]:
    E = cfg.train.epochs
    return sorted({0, E, *range(0, E + 1, cfg.record_every)})


def estimate_dynamics(cfg: DynamicsConfig) -> Estimate:
    n, nt, d = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data)
    tr, groups, m = cfg.train, len(cfg.archs) * len(cfg.seeds), sum(cfg.widths)
    c_out = B.n_outputs(cfg.data)
    records = len(_record_epochs(cfg))
    per_group = (B.train_s(n, d, 2 * m, tr.epochs, tr.batch_size, c_out)
                 + records * (2 * B.gemm_s(n + nt, m, d) + 2 * B.gemm_s(n + nt, m, c_out) + 4 * (n + nt) * m / B.FLOPS
                              + len(cfg.widths) * (B.gemm_s(nt, n, c_out, True) + 4 * n * n / B.FLOPS64)))
    reference = len(cfg.archs) * (B.attention_s(cfg.attention, n + nt, d) + B.gemm_s(n + nt, n, d, True)
                                  + B.eig_s(n) * 3 + B.gemm_s(nt, n, n, True))
    seconds = B.FIXED_S + reference + groups * per_group
    memory = (8 * (4 * n * n + 2 * nt * n) + 4 * 6 * m * d + 4 * 4 * (n + nt) * m
              + 2 * B.head_bytes(m, n + nt, c_out)       # the net's and its linearisation's heads
              + 8 * 3 * (n + nt) * c_out)                 # float64 targets and the K∞ flow's outputs
    return Estimate(seconds, int(memory))


@experiment_run("dynamics")
def run_dynamics(cfg: DynamicsConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
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
    X, y, Xt, yt, c = p.X, p.y, p.Xt, p.yt, p.c
    n, n_out = X.shape[0], p.n_out
    Y = p.Y
    flow = flow_rates(cfg.train, n, n_out)
    loss_name = resolve_loss(cfg.train, c)
    epochs = _record_epochs(cfg)
    rows, ref = [], {}
    groups = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for j, (arch, seed) in enumerate(groups):
        stage = f"{arch} seed {seed}"
        tick(progress, cancel, j / len(groups), stage)
        t0 = time.perf_counter()
        nets = [Net(arch, X, w, n_out, seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                    init=cfg.init).to(dev)
                for w in cfg.widths]
        with torch.no_grad():
            phi, phi_t = nets[0].features(X), nets[0].features(Xt)
        if flow is not None and arch not in ref:  # K∞ depends on the features only
            K, K_t = infinite_ntk(phi), infinite_ntk(phi_t, phi)
            check_finite(K, f"the infinite-width kernel of {arch}")
            ref[arch] = KernelFlow(K, K_t)
        W0, A, _ = _stack(nets, cfg.train)
        mask0, mask0_t = phi @ W0.T > 0, phi_t @ W0.T > 0
        units = np.cumsum([0, *cfg.widths])
        state = {}

        def on_record(epoch, W, W_lin, arch=arch, seed=seed):
            with torch.no_grad():
                H, H_t = phi @ W.T, phi_t @ W.T
                F, F_t = torch.relu(H) @ A, torch.relu(H_t) @ A
                F_lin = linearised_head(phi, W_lin, mask0, A)
                F_lin_t = linearised_head(phi_t, W_lin, mask0_t, A)
                flips = ((H > 0) != mask0).double().mean(dim=0)  # (Σm,)
            if epoch == 0:
                state["F0"], state["F0_t"] = F.double(), F_t.double()
            for i, width in enumerate(cfg.widths):
                cols, seg = slice(i * n_out, (i + 1) * n_out), slice(int(units[i]), int(units[i + 1]))
                f_t, fl_t = F_t[:, cols].double(), F_lin_t[:, cols].double()
                row = {"arch": arch, "attention": cfg.attention if arch == "attn" else None, "width": width,
                       "seed": seed, "epoch": epoch, "step": epoch * math.ceil(n / cfg.train.batch_size),
                       "lin_gap": lin_gap(f_t, fl_t),
                       "pattern_change": float(flips[seg].mean()),
                       "train_loss": float(loss_fn(F[:, cols], y, loss_name, c)),
                       "train_loss_lin": float(loss_fn(F_lin[:, cols], y, loss_name, c)),
                       "train_acc": float((predict_labels(F[:, cols]) == y).double().mean()),
                       "test_acc": float((predict_labels(F_t[:, cols]) == yt).double().mean()),
                       "test_acc_lin": float((predict_labels(F_lin_t[:, cols]) == yt).double().mean()),
                       "weight_movement": float(torch.linalg.norm(W[seg] - W0[seg]) / torch.linalg.norm(W0[seg])),
                       "k_inf_gap": math.nan}
                if flow is not None:
                    eta, beta, per_epoch = flow
                    f_k = ref[arch].predict(Y, state["F0"][:, cols], state["F0_t"][:, cols], eta, beta,
                                            float(epoch * per_epoch))
                    k_norm = float(torch.linalg.norm(f_k))
                    row["k_inf_gap"] = float(torch.linalg.norm(f_t - f_k)) / k_norm if k_norm else math.nan
                rows.append(row)

        sub = None if progress is None else (
            lambda f, s, j=j: progress((j + f) / len(groups), f"{stage}: {s}"))
        train_pair(nets, phi, y, c, cfg.train, seed, epochs, on_record, sub, cancel)
        for r in rows[-len(epochs) * len(cfg.widths):]:
            r["seconds"] = (time.perf_counter() - t0) / len(cfg.widths)
    tick(progress, cancel, 1.0, "done")
    frame = pd.DataFrame(rows)
    summary = summarize(frame, ["arch", "attention", "width", "epoch"], METRICS)
    final = summary[summary["epoch"] == cfg.train.epochs].reset_index(drop=True)
    meta = {"n": n, "n_test": int(Xt.shape[0]), "d": p.sample.d, "n_classes": c, "param": cfg.train.param,
            "loss": loss_name, "flow": None if flow is None else list(flow), "source": p.sample.source,
            "device": str(dev)}
    return Result("dynamics", {}, {"rows": frame, "summary": summary, "final": final}, {}, meta)


def width_slopes(final: pd.DataFrame, metrics=("lin_gap", "pattern_change")) -> pd.DataFrame:
    """Log-log slope of each final metric's mean against width, per arch (NaN with < 2 widths
    or non-positive values). The lazy regime of NTK theory predicts −1/2 under ntk + SGD."""
    out = []
    for (arch, attention), g in final.groupby(["arch", final["attention"].fillna("")], sort=False):
        for m in metrics:
            slope = loglog_slope(g["width"], g[f"{m}_mean"])[0]
            out.append({"arch": arch, "attention": attention or None, "metric": m, "slope": slope})
    return pd.DataFrame(out, columns=["arch", "attention", "metric", "slope"])


# ---------------------------------------------------------------- coordinate check

def theory_slopes(param: str, optimizer: str) -> dict[str, float]:
    """Log-log slopes against width of Δf and Δh for a parametrisation and optimiser."""
    return COORD_THEORY[(param, "sgd" if optimizer == "sgd" else "adam")]


def estimate_coord_check(cfg: CoordCheckConfig) -> Estimate:
    nt, d, m = cfg.data.n_test, B.input_dim(cfg.data), sum(cfg.widths)
    b = min(cfg.train.batch_size, cfg.data.n)
    runs = len(cfg.params) * len(cfg.seeds)
    # each width steps on its own, and every step is measured on the test points (three small passes)
    per_step = 3 * B.gemm_s(b, m, d) + 2 * B.gemm_s(nt, m, d) + 2 * len(cfg.widths) * B.STEP_OVERHEAD_S \
        + 3 * nt * m / B.FLOPS
    seconds = B.FIXED_S + B.attention_s(cfg.attention, cfg.data.n + nt, d) + runs * (cfg.steps + 1) * per_step
    return Estimate(seconds, int(4 * (5 * m * d + 3 * nt * m) + B.head_bytes(m, b + nt, B.n_outputs(cfg.data))))


@experiment_run("coord-check")
def run_coord_check(cfg: CoordCheckConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
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
        spec = TrainSpec(epochs=cfg.train.epochs, lr=cfg.train.lr, batch_size=cfg.train.batch_size,
                         weight_decay=cfg.train.weight_decay, optimizer=cfg.train.optimizer,
                         loss=cfg.train.loss, param=param)
        nets = [Net(cfg.arch, X, w, p.n_out, seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                    init=cfg.init).to(dev)
                for w in cfg.widths]
        with torch.no_grad():
            phi, phi_t = nets[0].features(X), nets[0].features(Xt)
        W0, A, weights = _stack(nets, spec)
        k, n_out = len(nets), p.n_out
        W = torch.nn.Parameter(W0.clone())
        with torch.no_grad():
            H0_t = phi_t @ W0.T
            F0_t = torch.relu(H0_t) @ A

        def loss_of(idx):
            out = (torch.relu(phi[idx] @ W.T) @ A).reshape(-1, k, n_out)
            per = per_model_loss(out, y[idx], loss_name, c)
            return per.sum() if weights is None else (per * weights.to(per.dtype)).sum()

        for _, step, _ in _steps([W], loss_of, X.shape[0], spec, seed, dev, cancel):
            with torch.no_grad():
                dH = phi_t @ (W - W0).T
                F_t = torch.relu(phi_t @ W.T) @ A
            dF = (F_t - F0_t).double()
            for i, width in enumerate(cfg.widths):
                cols, seg = slice(i * n_out, (i + 1) * n_out), slice(int(units[i]), int(units[i + 1]))
                rows.append({"param": param, "optimizer": spec.optimizer, "width": width, "seed": seed,
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
            "optimizer": cfg.train.optimizer, "source": p.sample.source, "device": str(dev)}
    return Result("coord-check", {}, {"rows": frame, "summary": summary, "fit": pd.DataFrame(fit)},
                  {}, meta)
