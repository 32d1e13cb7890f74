"""The ``influence`` experiment's config, presets and estimate; its run is
``engine.experiments.influence``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...data import DataSpec
from ...maths.specs import TrainSpec, attention_slowdown, factor_bytes
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.errors import BadInput
from ...runtime.settings import normalised, setting, validate
from .. import options

INFLUENCE_KERNELS = options.INFLUENCE_KERNELS


@dataclass(frozen=True)
class InfluenceConfig:
    data: DataSpec = DataSpec(n=300, n_test=100)
    train: TrainSpec = TrainSpec(epochs=100)
    archs: tuple[str, ...] = options.archs()
    width: int = options.width(1024)  # the paper's influence runs
    attention: str = options.attention()
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init()
    ridge: float = options.ridge()  # of the influence's kernel regression and of the K∞ baseline
    target: str = options.influence_target()
    influence_kernel: str = options.influence_kernel()
    readings: tuple[str, ...] = options.readings()
    read_points: int = setting(20, "training points the flow and retrain readings read: the top by |ridge "
                               "influence| (retrain trains one more head per point)", flag="--read-points",
                               lo=1, hi=2000)
    storage: str = options.storage()
    precision: str = options.precision()

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.width)
        options.check_readings(self)
        if self.read_points > self.data.n:
            raise BadInput(f"--read-points {self.read_points} exceeds the {self.data.n} training points")


# ``trained``: nets that train to their kernel baseline on the README's MNIST setting (n = 500,
# 100 test points, m = 1024): Adam 1e-3 without decay for 500 epochs, and MLP-Attn on centred
# attention features (``centered``: a different model from the paper's linear attention, which
# no option here trains past ~83 % train accuracy). Measured on real MNIST (seed 0): 2L-ReLU
# 100 % train, 83 % test against 87 % for ridge with its own K_m; centred MLP-Attn 98 % train,
# 82 % test against 79 %. ``paper`` stays the literal reading.
TRAINED = TrainSpec(epochs=500, lr=1e-3, weight_decay=0.0)

# ``quick``: the same recipe at the dashboard's n = 200 in 200 epochs. Measured on real MNIST
# (seeds 0-2, m = 1024): 2L-ReLU 100 % train, 73 % test against 81 % for ridge with its own K_m
# (passes the gate); centred MLP-Attn 96 % train, 69 % against 71 %; linear MLP-Attn 52 % train,
# 45 % against 70 % (fails it: its flip rates are then shown greyed, as "did not train"). The
# paper's 20 epochs with decay 1e-3 left every net near chance (8-25 % test).
QUICK_TRAINED = TrainSpec(epochs=200, lr=1e-3, weight_decay=0.0)
PRESETS = {
    "influence": {"quick": InfluenceConfig(data=DataSpec(n=200, n_test=100), train=QUICK_TRAINED, seeds=(0,)),
                  "paper": InfluenceConfig(data=DataSpec(n=1000, n_test=100), train=TrainSpec(epochs=500)),
                  "trained": InfluenceConfig(data=DataSpec(n=500, n_test=100), train=TRAINED,
                                             attention="centered")},
}


def influence_bytes(cfg: InfluenceConfig) -> int:
    """K and K_test in their storage (K_m and K∞ both with the K∞ kernel), the float64 factor
    and solves beside them."""
    n, nt = cfg.data.n, cfg.data.n_test
    size = 4 if cfg.storage == "float32" else 8
    kernels = 2 if cfg.influence_kernel == "kinf" else 1
    c_out = B.n_outputs(cfg.data)
    return (kernels * size * (n * n + nt * n) + factor_bytes(n, nt, c_out)
            + B.head_bytes(cfg.width, n + nt, c_out))


def kernel_seconds(cfg: Any, n: int, nt: int, d: int, m: int) -> float:  # cfg: Influence- or MalleabilityConfig
    """One influence: its kernels, the leave-one-out factor (and K∞'s GEMMs for ``kinf``)."""
    s = B.ntk_s(n, n, d, m) + B.ntk_s(nt, n, d, m) + B.chol_s(n)
    if cfg.influence_kernel == "kinf":
        s += B.gemm_s(n + nt, n, d, True) + B.chol_s(n)
    return s * (2.0 if cfg.precision == "float64" else 1.0)


def retrain_seconds(n: int, d: int, m: int, heads: int, tr: TrainSpec, c_out: int) -> float:
    """``heads`` heads of width m trained as one batched model; in weight space each step reads out
    head by head (in the span the copies of a head read out together)."""
    steps = tr.epochs * math.ceil(n / tr.batch_size)
    per_head = 0.0 if B.in_span(n, d, tr) else steps * heads * B.STEP_OVERHEAD_S / 5
    return B.masked_train_s(n, d, heads * m, tr, c_out) + per_head


def flow_seconds(n: int, nt: int, points: int) -> float:
    """The flow reading at ``points`` training points: an eigendecomposition of K without each."""
    return points * (B.eig_s(n) + B.gemm_s(nt, n, n, True))


def estimate_influence(cfg: InfluenceConfig) -> Estimate:
    n, nt, d, m = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data), cfg.width
    per = (B.train_s(n, d, m, cfg.train.epochs, cfg.train.batch_size) + kernel_seconds(cfg, n, nt, d, m)
           + B.chol_s(n) + B.attention_s(cfg.attention, n + nt, d))
    if "flow" in cfg.readings:
        per += flow_seconds(n, nt, cfg.read_points)
    if "retrain" in cfg.readings:
        per += retrain_seconds(n, d, m, 1 + cfg.read_points, cfg.train, B.n_outputs(cfg.data))
    slow = attention_slowdown(cfg.attention, cfg.archs)
    heads = 1 + cfg.read_points if "retrain" in cfg.readings else 0  # the batched retraining's weights and activations
    return Estimate(B.FIXED_S + slow * len(cfg.archs) * len(cfg.seeds) * per,
                    int(influence_bytes(cfg) + 16 * m * d + 12 * heads * m * (d + max(cfg.train.batch_size, nt))))
