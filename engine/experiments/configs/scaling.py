"""The ``scaling`` experiment's config, presets and estimate; its run is
``engine.experiments.scaling``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...data import DECAYS
from ...maths.specs import MAX_WIDTH, TrainSpec, parse_attention
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.errors import BadInput
from ...runtime.settings import normalised, setting, validate
from .. import options

MEASURES = ("trained", "init", "movement")
METRICS = ("frobenius", "whitened")


@dataclass(frozen=True)
class ScalingConfig:
    train: TrainSpec = TrainSpec(epochs=50)
    n: int = setting(64, "training points of each synthetic draw", unit="points", lo=4, hi=2000)
    d: int = setting(32, "input dimension of the synthetic data", lo=2, hi=1024)
    kappas: tuple[float, ...] = setting((2.0, 4.0, 8.0, 16.0, 32.0), "dialled condition numbers κ(G) of "
                                        "the raw Gram", lo=1.0, hi=1e6, max_len=12)
    decay: str = setting("geometric", "eigenvalue profile of the synthetic Gram", choices=DECAYS)
    classes: int = setting(2, "classes of the synthetic teacher", lo=2, hi=20)
    normalize: bool = setting(False, "ℓ2-normalise rows (changes κ; off so that κ is the dialled one)")
    archs: tuple[str, ...] = options.archs()
    attentions: tuple[str, ...] = setting(("linear",), "attention variants tried for attn, e.g. "
                                          "linear,stacked:2,truncated:8", check=parse_attention, max_len=6)
    target: float = setting(0.1, "kernel distance to stay within", lo=0, lo_open=True, hi=10.0)
    measure: str = setting("trained", "trained: K_t vs K∞; init: K_0 vs K∞; movement: K_t vs K_0 "
                           "(training drift alone)", choices=MEASURES)
    metric: str = setting("frobenius", "kernel distance: frobenius = ‖ΔK‖_F/‖K_ref‖_F; whitened = "
                          "‖(K_ref+λI)^-½ ΔK (K_ref+λI)^-½‖₂ (κ-sensitive)", choices=METRICS)
    min_width: int = setting(16, "smallest grid width", unit="units", lo=1, hi=MAX_WIDTH)
    max_width: int = setting(4096, "largest grid width", unit="units", lo=2, hi=MAX_WIDTH)
    per_octave: int = setting(2, "grid widths per doubling (grid: 2^(j/per_octave))", lo=1, hi=8)
    seeds: tuple[int, ...] = options.seeds()  # distances averaged over them, bootstrapped for the interval
    seed: int = setting(0, "data draw seed", flag="--data-seed", lo=0, hi=2**31 - 1)
    ridge: float = options.ridge()  # of the whitened metric

    def __post_init__(self):
        normalised(self)
        validate(self)
        if self.min_width >= self.max_width:
            raise BadInput(f"min_width ({self.min_width}) must be smaller than max_width ({self.max_width})")


PRESETS = {"scaling": {
    "quick": ScalingConfig(train=TrainSpec(epochs=100, lr=1e-2), kappas=(2.0, 4.0, 8.0, 16.0),
                           measure="movement", target=0.05, max_width=4096, per_octave=1),
    "paper": ScalingConfig(train=TrainSpec(epochs=200, lr=1e-2), kappas=(2.0, 4.0, 8.0, 16.0, 32.0),
                           measure="movement", target=0.05, max_width=16384),
}}


def width_grid(min_width: int, max_width: int, per_octave: int) -> list[int]:
    """Grid widths round(2^(j/per_octave)) within [min_width, max_width], ascending, distinct."""
    lo = math.ceil(math.log2(min_width) * per_octave - 1e-9)
    hi = math.floor(math.log2(max_width) * per_octave + 1e-9)
    return sorted({int(round(2 ** (j / per_octave))) for j in range(lo, hi + 1)})


def measured_models(cfg: ScalingConfig) -> list[tuple[str, str]]:
    """The (architecture, attention) pairs a run measures: 2L-ReLU once, MLP-Attn per attention variant."""
    return [("relu", "linear")] * ("relu" in cfg.archs) + [("attn", a) for a in cfg.attentions
                                                           if "attn" in cfg.archs]


def estimate_scaling(cfg: ScalingConfig) -> Estimate:
    grid = width_grid(cfg.min_width, cfg.max_width, cfg.per_octave)
    epochs = 0 if cfg.measure == "init" else cfg.train.epochs
    c_out, k = (1 if cfg.classes == 2 else cfg.classes), len(cfg.seeds)
    # training.train_seeds: every width and seed one batched model when an epoch is one batch, else one per seed
    models = 1 if cfg.n <= cfg.train.batch_size else k
    per_kappa_model = models * B.train_s(cfg.n, cfg.d, k * sum(grid) / models, epochs, cfg.train.batch_size, c_out,
                                         nets=k * len(grid) // models)
    for w in grid:
        per_kappa_model += k * (2 * B.ntk_s(cfg.n, cfg.n, cfg.d, w) + 2 * B.eig_s(cfg.n))
    attention = sum(B.attention_s(a, cfg.n, cfg.d) for a in cfg.attentions)
    seconds = B.FIXED_S + len(cfg.kappas) * (len(measured_models(cfg)) * per_kappa_model + attention)
    return Estimate(seconds, int(8 * 6 * cfg.n ** 2 + 16 * max(grid) * cfg.d + 8 * cfg.n * max(grid)))
