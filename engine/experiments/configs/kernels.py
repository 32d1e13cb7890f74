"""The ``kernels`` experiment's config, presets and estimate; its run is
``engine.experiments.kernels``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...data import DataSpec
from ...maths.specs import TrainSpec, attention_slowdown
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.settings import normalised, validate
from .. import options


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


PRESETS = {"kernels": {  # named instances of the config: the dashboard's quick run and the paper's
    "quick": KernelConfig(data=DataSpec(n=200, n_test=1), train=TrainSpec(epochs=20)),  # n_test = 1: no test set
    "paper": KernelConfig(data=DataSpec(n=1000, n_test=1), train=TrainSpec(epochs=500)),  # the paper's n, epochs
}}


def estimate_kernels(cfg: KernelConfig) -> Estimate:
    n, d, w = cfg.data.n, B.input_dim(cfg.data), cfg.width
    seconds = (B.FIXED_S + B.attention_s(cfg.attention, n, d) + 2 * B.ntk_s(n, n, d, w)
               + B.train_s(n, d, w, cfg.train.epochs, cfg.train.batch_size, B.n_outputs(cfg.data)))
    seconds *= attention_slowdown(cfg.attention, cfg.arch)
    size = 4 if cfg.storage == "float32" else 8
    return Estimate(seconds, int(size * 5 * n * n + 16 * w * d + B.head_bytes(w, n, B.n_outputs(cfg.data))))
