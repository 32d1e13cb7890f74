"""The ``kernels`` experiment: one net's K_m at init and after training, and K∞, as arrays.

The NTK page draws them as heatmaps; ``python -m engine kernels`` caches them as arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime import budget as B
from . import options
from ..runtime.budget import Estimate
from ..runtime.cache import Result
from ..data import DataSpec, load_sample
from ..maths.models import Net
from ..maths.ntk import empirical_ntk
from ..maths.kinf import infinite_ntk
from .runs import Progress, experiment_run, tick
from ..runtime.settings import normalised, validate
from ..maths.training import TrainSpec, n_outputs, train

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
