"""The ``kernels`` experiment: one net's K_m at init and after training, and K∞, as arrays.

The NTK page draws them as heatmaps; ``python -m engine kernels`` caches them as arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..data import load_sample
from ..maths.kinf import infinite_ntk
from ..maths.models import Net
from ..maths.ntk import empirical_ntk
from ..maths.training import n_outputs, train
from ..runtime.cache import Result
from .configs.kernels import KernelConfig
from .runs import Progress, experiment_run, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

# ---------------------------------------------------------------- kernel views

@experiment_run("kernels")
def run_kernels(cfg: KernelConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                cancel: CancelFlag | None) -> Result:
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
