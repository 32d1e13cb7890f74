"""The ``ntk-sweep`` experiment's config, presets and estimate; its run is
``engine.experiments.sweep``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...data import DataSpec
from ...maths.specs import TrainSpec, attention_slowdown, quarters
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.settings import normalised, validate
from .. import options
from .influence import QUICK_TRAINED


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


PRESETS = {"ntk-sweep": {  # named instances of the config: the dashboard's quick run and the paper's
    # nets that reach their kernel baseline (influence.QUICK_TRAINED: the paper's 20 epochs with decay
    # left every net near chance, so the distances described untrained predictors)
    "quick": SweepConfig(data=DataSpec(n=200, n_test=100), train=QUICK_TRAINED, widths=(16, 64, 256, 1024)),
    "paper": SweepConfig(data=DataSpec(n=1000, n_test=500), train=TrainSpec(epochs=500),  # the paper's protocol
                         widths=(16, 1024, 4096)),
    # nets that train to their K_m baseline (engine.experiments.configs.influence.TRAINED): Adam without decay,
    # centred attention features for MLP-Attn
    "trained": SweepConfig(data=DataSpec(n=500, n_test=100), train=TrainSpec(epochs=500, lr=1e-3, weight_decay=0.0),
                           widths=(256, 1024, 4096), attention="centered"),
}}


def sweep_view(cfg: SweepConfig) -> SweepConfig:
    """The settings the NTK convergence page derives from the others (``Experiment.view``): the kernel at
    each quarter of training."""
    return replace(cfg, train=replace(cfg.train, snapshot_epochs=quarters(cfg.train.epochs)))


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
    per_group *= attention_slowdown(cfg.attention, cfg.archs)
    seconds = B.FIXED_S + reference + groups * per_group
    memory = (8 * (8 * n * n + 2 * nt * n) + 16 * sum(cfg.widths) * d + 2 * (n + nt) * max(cfg.widths) * 4
              + B.head_bytes(sum(cfg.widths), n + nt, c_out) + 8 * 4 * (n + nt) * c_out)  # f_NTK, solves
    return Estimate(seconds, int(memory))
