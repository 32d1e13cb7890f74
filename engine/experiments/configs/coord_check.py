"""The ``coord-check`` experiment's config, presets and estimate; its run is
``engine.experiments.coord_check``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...data import DataSpec
from ...maths.specs import PARAMS, TrainSpec
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.settings import normalised, setting, validate
from .. import options
from .dynamics import attention_setting


@dataclass(frozen=True)
class CoordCheckConfig:
    data: DataSpec = DataSpec(n=256, n_test=64)
    # optimiser, lr, batch size and loss of the steps; its epochs and param are not used
    train: TrainSpec = TrainSpec(epochs=1, optimizer="sgd", lr=0.1, batch_size=64, weight_decay=0.0)
    arch: str = options.arch()
    attention: str = attention_setting()
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
    "coord-check": {
        "quick": CoordCheckConfig(),
        "paper": CoordCheckConfig(data=DataSpec(n=512, n_test=128),  # the paper's Adam, without decay
                                  train=TrainSpec(epochs=1, lr=1e-3, batch_size=128, weight_decay=0.0)),
    },
}


def estimate_coord_check(cfg: CoordCheckConfig) -> Estimate:
    nt, d, m = cfg.data.n_test, B.input_dim(cfg.data), sum(cfg.widths)
    b = min(cfg.train.batch_size, cfg.data.n)
    runs = len(cfg.params) * len(cfg.seeds)
    # each width steps on its own, and every step is measured on the test points (three small passes)
    per_step = 3 * B.gemm_s(b, m, d) + 2 * B.gemm_s(nt, m, d) + 2 * len(cfg.widths) * B.STEP_OVERHEAD_S \
        + 3 * nt * m / B.FLOPS
    seconds = B.FIXED_S + B.attention_s(cfg.attention, cfg.data.n + nt, d) + runs * (cfg.steps + 1) * per_step
    return Estimate(seconds, int(4 * (5 * m * d + 3 * nt * m) + B.head_bytes(m, b + nt, B.n_outputs(cfg.data))))
