"""The ``malleability`` experiment's config, presets and estimate; its run is
``engine.experiments.malleability``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...data import DataSpec
from ...maths.specs import AttackMethod, AttackSpec, TrainSpec
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.errors import BadInput
from ...runtime.settings import setting
from .. import options
from .influence import QUICK_TRAINED, TRAINED, InfluenceConfig, influence_bytes, kernel_seconds


PERTURB = ("top", "all")
SPACES = ("raw", "normalized")
METHODS = tuple(m.value for m in AttackMethod)


@dataclass(frozen=True)
class MalleabilityConfig(InfluenceConfig):
    data: DataSpec = DataSpec(n=500, n_test=100)
    attack: AttackSpec = AttackSpec()     # norm, steps, step size, random start, momentum
    attacks: tuple[str, ...] = setting(("pgd",), "attacks on the training data: fgsm, pgd, mim",
                                       flag="--attack", choices=METHODS)
    eps: tuple[float, ...] = setting((0.05,), "attack radii ε in the attack space's units (raw: pixels "
                                     "in [0, 1]; normalized: fractions of a unit row); several make an ε sweep",
                                     lo=0, hi=100.0, max_len=20)
    space: str = setting("raw", "where the perturbation lives: raw pixels, or the ℓ2-normalised rows the "
                         "networks see", choices=SPACES)
    tau: float = setting(0.1, "share of training points tracked (top by |aggregate influence|)",
                         lo=0, lo_open=True, hi=1.0)
    perturb: str = setting("top", "which training points move: top (the top-τ) or all", choices=PERTURB)
    retrain: bool = setting(False, "retrain on the perturbed data before re-measuring (default: re-evaluate "
                            "the trained net's kernel on the perturbed inputs)")
    adversarial_training: bool = setting(False, "train on the attack's examples (every epoch, first ε, PGD) "
                                         "instead of clean data")
    interventions: bool = setting(False, "also run Curated / Transformed / Adversarial retraining")
    nulls: bool = setting(True, "null baselines beside every flip rate: another network seed without attack, "
                          "and a random perturbation of the same per-row ℓ2 norm (about doubles the run)")
    data_seeds: tuple[int, ...] = options.data_seeds()

    def __post_init__(self):
        super().__post_init__()
        if self.space == "normalized" and not self.data.normalize:
            raise BadInput("space 'normalized' needs normalised rows; drop --no-normalize or use space raw")


PRESETS = {
    "malleability": {
        # nets that reach their kernel baseline (QUICK_TRAINED) and a small attack: ℓ2 0.3 on the unit
        # rows the nets see moves each row by 30 % of its norm (ℓ∞ 0.3 on raw pixels moved 60-70 %,
        # a wrecked digit); FGSM and PGD keep it under the 30 s a run may start without a click
        "quick": MalleabilityConfig(data=DataSpec(n=200, n_test=100), train=QUICK_TRAINED,
                                    attack=AttackSpec(steps=10, norm="l2"), space="normalized",
                                    attacks=("fgsm", "pgd"), eps=(0.3,), seeds=(0, 1, 2)),
        "paper": MalleabilityConfig(data=DataSpec(n=1000, n_test=100), train=TrainSpec(epochs=500),
                                    attacks=("fgsm", "pgd", "mim"), eps=(0.3,)),
        "trained": MalleabilityConfig(data=DataSpec(n=500, n_test=100), train=TRAINED, attention="centered",
                                      attacks=("pgd",), eps=(0.3,), attack=AttackSpec(norm="l2"),
                                      space="normalized"),
    },
}


def estimate_malleability(cfg: MalleabilityConfig) -> Estimate:
    n, nt, d, m = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data), cfg.width
    tr = cfg.train
    kernel = kernel_seconds(cfg, n, nt, d, m)
    grad_step = (3 * B.gemm_s(n, m, d, cfg.precision == "float64") + B.attention_s(cfg.attention, n, d)
                 + B.STEP_OVERHEAD_S)
    steps = sum(1 if a == "fgsm" else cfg.attack.steps for a in cfg.attacks) * len(cfg.eps)
    fit = B.train_s(n, d, m, tr.epochs, tr.batch_size)
    if cfg.adversarial_training:
        fit += tr.epochs * cfg.attack.steps * grad_step
    measured = len(cfg.attacks) * len(cfg.eps) * (2 if cfg.nulls else 1)  # the random null: once more
    per = fit + kernel * (2 + measured) + steps * grad_step + B.chol_s(n)  # + the K_m ridge baseline
    if cfg.retrain:
        per += measured * B.train_s(n, d, m, tr.epochs, tr.batch_size)
    if cfg.interventions:
        per += 3 * (B.train_s(n, d, m, tr.epochs, tr.batch_size) + kernel) + cfg.attack.steps * grad_step
    slow = B.QKV_SLOWDOWN if cfg.attention == "qkv" and "attn" in cfg.archs else 1
    draws = max(1, len(cfg.data_seeds))
    return Estimate(B.FIXED_S + draws * slow * len(cfg.archs) * len(cfg.seeds) * per,
                    int(influence_bytes(cfg) + 8 * n * n + 16 * m * d + 8 * n * m))
