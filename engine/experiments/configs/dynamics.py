"""The ``dynamics`` experiment's config, presets and estimate; its run is
``engine.experiments.dynamics``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...data import DataSpec
from ...maths.specs import TrainSpec
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.settings import normalised, setting, validate
from .. import options


def attention_setting():
    """The attention of the experiments that linearise the head (dynamics, coord-check): no qkv."""
    return options.parameter_free_attention("the head's linearisation does not describe the net",
                                            only="parameter-free variants only (qkv trains its own parameters, "
                                                 "which the head's linearisation does not describe)")


@dataclass(frozen=True)
class DynamicsConfig:
    data: DataSpec = DataSpec(n=200, n_test=100)
    # plain SGD without decay: the setting of NTK theory (train.param picks ntk or μP)
    train: TrainSpec = TrainSpec(epochs=50, optimizer="sgd", lr=1.0, weight_decay=0.0)
    widths: tuple[int, ...] = options.widths((64, 256, 1024, 4096))
    archs: tuple[str, ...] = options.archs()
    attention: str = attention_setting()
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init()
    record_every: int = setting(5, "measure every K epochs (and at 0 and the last epoch)", unit="epochs",
                                lo=1, hi=20_000)

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
}


def record_epochs(cfg: DynamicsConfig) -> list[int]:
    """Epochs at which the net and its linearisation are compared: every ``record_every``, 0 and the last."""
    E = cfg.train.epochs
    return sorted({0, E, *range(0, E + 1, cfg.record_every)})


def estimate_dynamics(cfg: DynamicsConfig) -> Estimate:
    n, nt, d = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data)
    tr, groups, m = cfg.train, len(cfg.archs) * len(cfg.seeds), sum(cfg.widths)
    c_out = B.n_outputs(cfg.data)
    records = len(record_epochs(cfg))
    if B.in_span(n, d, tr):  # flow.train_pair in the features' span: the net, then its linearisation, one run
        # per width each; the weights formed at every recorded epoch
        steps = tr.epochs * math.ceil(n / tr.batch_size)
        train = 2 * (B.masked_train_s(n, d, m, tr, c_out) + steps * (len(cfg.widths) - 1) * B.STEP_OVERHEAD_S / 4
                     + records * B.gemm_s(m, d, n))
    else:
        train = B.train_s(n, d, 2 * m, tr.epochs, tr.batch_size, c_out)
    per_group = (train
                 + records * (2 * B.gemm_s(n + nt, m, d) + 2 * B.gemm_s(n + nt, m, c_out) + 4 * (n + nt) * m / B.FLOPS
                              + len(cfg.widths) * (B.gemm_s(nt, n, c_out, True) + 4 * n * n / B.FLOPS64)))
    reference = len(cfg.archs) * (B.attention_s(cfg.attention, n + nt, d) + B.gemm_s(n + nt, n, d, True)
                                  + B.eig_s(n) * 3 + B.gemm_s(nt, n, n, True))
    seconds = B.FIXED_S + reference + groups * per_group
    memory = (8 * (4 * n * n + 2 * nt * n) + 4 * 6 * m * d + 4 * 4 * (n + nt) * m
              + 2 * B.head_bytes(m, n + nt, c_out)       # the net's and its linearisation's heads
              + 8 * 3 * (n + nt) * c_out)                 # float64 targets and the K∞ flow's outputs
    return Estimate(seconds, int(memory))
