"""The ``retrain-loo`` experiment's config, presets and estimate; its run is
``engine.experiments.retrain``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...data import DataSpec
from ...maths.specs import TrainSpec, factor_bytes
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.errors import BadInput
from ...runtime.settings import normalised, setting, validate
from .. import options

KERNELS = ("entk", "kinf")   # the trained net's empirical NTK (what the engine reports), K∞
LOOS = ("ridge", "flow")     # kernel ridge regression's exact leave-one-out; kernel gradient descent's
MAX_K = 200                  # points per pick: 2k + 1 heads per width are trained in one batched model


# Lazy SGD on MSE, the NTK setting: no decay; η = 16 lies below SGD's lazy limit n·c/λ₁ (about 30 on MNIST,
# engine.maths.training.sgd_lr_limit) and trains 16x further per epoch than η = 1, so 20 epochs (40 steps) fit in minutes.
LAZY_SGD = TrainSpec(epochs=20, optimizer="sgd", lr=16.0, weight_decay=0.0, loss="mse")


@dataclass(frozen=True)
class RetrainConfig:
    data: DataSpec = DataSpec(n=200, n_test=100)
    train: TrainSpec = LAZY_SGD
    widths: tuple[int, ...] = options.widths((64, 1024, 4096))
    archs: tuple[str, ...] = options.archs()
    attention: str = options.parameter_free_attention("the retrainings cannot share one set of features",
                                                      only="parameter-free variants only (qkv's features move "
                                                           "with training)")
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init("antisymmetric")  # f₀ ≡ 0: the kernel's LOO has no f₀ term (module notes)
    ridge: float = options.ridge()  # of the kernels' leave-one-out (the engine's influence)
    target: str = options.influence_target()
    k: int = setting(10, "training points left out one at a time, per pick (the top-|influence| ones and as many "
                     "drawn at random): up to 2k + 1 heads per width, trained as one batched model", unit="points",
                     lo=1, hi=MAX_K)
    kernels: tuple[str, ...] = setting(KERNELS, "kernels whose leave-one-out predicts the change: entk (the trained "
                                       "net's empirical NTK, what the engine reports) and kinf (K∞)", choices=KERNELS)
    loo: tuple[str, ...] = setting(LOOS, "the kernels' leave-one-out: ridge (exact, of kernel ridge regression at "
                                   "the ridge; the engine's influence) and flow (of kernel gradient descent run for "
                                   "the net's own SGD steps: the kernel regime's prediction of this training; needs "
                                   "sgd and MSE)", choices=LOOS)

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.widths)
        if self.k > self.data.n:
            raise BadInput(f"k = {self.k} points cannot be left out of n = {self.data.n}; use k <= n")
        if "flow" in self.loo and (self.train.optimizer != "sgd" or self.train.loss == "ce"):
            raise BadInput(f"loo 'flow' follows plain SGD on MSE, not {self.train.optimizer} with loss "
                           f"{self.train.loss}: use --optimizer sgd --loss mse, or --loo ridge")


PRESETS = {"retrain-loo": {
    "quick": RetrainConfig(),
    "paper": RetrainConfig(
        data=DataSpec(n=1000, n_test=200),   # the paper's n; 200 test points keep the k × n_test pairs at 5000
        # 5x the epochs at 8 batches of 1/5 the per-point rate: 4x the SGD time η'τ, a 4x smaller stopping ridge
        train=replace(LAZY_SGD, epochs=100),
        widths=(64, 256, 1024, 4096),        # four widths, an octave pair apart: the m^-1/2 trend needs more than three
        k=25,                                # 25 of 1000 points per pick, 2.5 %: near the share malleability's τ tracks
    ),
}}


def _heads_per_width(cfg: RetrainConfig) -> int:
    return 1 + 2 * cfg.k  # the full run's copy and at most 2k left-out points


def estimate_retrain(cfg: RetrainConfig) -> Estimate:
    n, nt, d = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data)
    tr, groups, m = cfg.train, len(cfg.archs) * len(cfg.seeds), sum(cfg.widths)
    c_out, h = B.n_outputs(cfg.data), _heads_per_width(cfg)
    steps = tr.epochs * math.ceil(n / tr.batch_size)
    heads = h * len(cfg.widths)
    # the head-by-head readout: a few small ops per head and step, forward and backward
    readout = steps * heads * 8 * B.STEP_OVERHEAD_S / 40
    per_group = (B.masked_train_s(n, d, m, tr, c_out) + B.masked_train_s(n, d, h * m, tr, c_out) + readout
                 + B.gemm_s(n + nt, h * m, d))  # both trainings are train_masked's
    for w in cfg.widths:  # the trained net's eNTK and its leave-one-out
        per_group += B.ntk_s(n, n, d, w) + B.ntk_s(nt, n, d, w) + 2 * B.chol_s(n) + B.gemm_s(nt, n, n, True)
    if "flow" in cfg.loo:  # an eigendecomposition of K without each point, per width and kernel
        per_group += len(cfg.widths) * len(cfg.kernels) * (h - 1) * (B.eig_s(n) + B.gemm_s(nt, n, n, True))
    reference = 0.0
    if "kinf" in cfg.kernels:
        reference = len(cfg.archs) * (B.gemm_s(n + nt, n, d, True) + 2 * B.chol_s(n) + B.gemm_s(nt, n, n, True))
    reference += len(cfg.archs) * B.attention_s(cfg.attention, n + nt, d)
    seconds = B.FIXED_S + reference + groups * per_group
    units = h * m
    state = 4 if tr.optimizer.startswith("adam") else 2   # W and its gradient, plus Adam's two moments
    memory = (4 * units * d * (state + 1) + 4 * 4 * max(tr.batch_size, nt) * units
              + 8 * 3 * nt * n * c_out + 8 * 4 * n * n + factor_bytes(n, nt, c_out)
              + B.head_bytes(units, n + nt, c_out))
    return Estimate(seconds, int(memory))
