"""Page settings -> engine configs, and a rough run-time estimate that decides auto vs button.

Pages and the Overview/Reproduction summaries build their configs here, so that the same
settings give the same cache key everywhere (a result computed on one page is reused by
the others).
"""

from __future__ import annotations

from engine.experiments import KernelConfig, SpectrumConfig, SweepConfig
from engine.malleability import InfluenceConfig, MalleabilityConfig
from engine.training import TrainSpec
from ui.common import Shared

NTK_EPOCHS = 20        # quick default; the paper trains 500 epochs
NTK_SEEDS = 3          # network seeds per width, drawn as seed, seed+1, ...
PAPER_WIDTHS = (16, 1024, 4096)
AUTO_SECONDS = 30.0    # runs estimated below this start without a click
INPUT_DIM = {"mnist": 784, "fashion-mnist": 784, "cifar10": 3072}
FLOPS = 6e9           # effective CPU rate of the estimates (measured: 2 cores, float32)


def input_dim(s: Shared) -> int:
    return INPUT_DIM.get(s.base, 64)


def growth_sizes(n: int) -> tuple[int, ...]:
    """Prefix sizes for "κ against n": n/8, n/4, n/2, n (at least 2)."""
    return tuple(sorted({max(2, n // k) for k in (8, 4, 2, 1)}))


def spectrum_config(s: Shared, rtol: float | None = None, eps: float = 0.1,
                    attention: str | None = None) -> SpectrumConfig:
    return SpectrumConfig(data=s.data(n_test=1), attention=attention or s.attention, rtol=rtol, eps=eps,
                          growth_ns=growth_sizes(int(s.n)))


def spectrum_seconds(s: Shared) -> float:
    n, d = int(s.n), input_dim(s)
    return 2 * 4 * (n ** 3 + n * n * d) / FLOPS + 0.5


def sweep_config(s: Shared, epochs: int = NTK_EPOCHS, n_seeds: int = NTK_SEEDS, ridge: float = 1e-3,
                 widths: tuple[int, ...] | None = None) -> SweepConfig:
    seeds = tuple(int(s.seed) + i for i in range(int(n_seeds)))
    snapshots = tuple(sorted({int(epochs) * k // 4 for k in range(5)})) if epochs > 0 else ()
    return SweepConfig(data=s.data(), widths=tuple(sorted(widths or s.widths)), archs=tuple(s.archs),
                       attention=s.attention, seeds=seeds,
                       train=TrainSpec(epochs=int(epochs), snapshot_epochs=snapshots), ridge=ridge)


def sweep_seconds(cfg: SweepConfig, d: int) -> float:
    n, nets = cfg.data.n, len(cfg.archs) * len(cfg.seeds)
    per_width = sum(4 * n * d * w * (1 + cfg.train.epochs) + 2 * n * n * (d + w) for w in cfg.widths)
    return nets * per_width / FLOPS + 0.5


def kernel_config(s: Shared, arch: str, width: int, epochs: int = NTK_EPOCHS) -> KernelConfig:
    return KernelConfig(data=s.data(), arch=arch, width=int(width), attention=s.attention,
                        seed=int(s.seed), train=TrainSpec(epochs=int(epochs)))


# ---------------------------------------------------------------- influence and malleability

INFL_EPOCHS = 20       # quick default; the paper trains 500
INFL_WIDTH = 1024      # the paper's m for influence
MALL_EPOCHS = 20
MALL_STEPS = 10        # PGD / MIM iterations (the NOTES' prototype: 20)
MALL_EPS = (0.05, 0.3)  # the prototype's ε and the paper's


def influence_config(s: Shared, width: int = INFL_WIDTH, epochs: int = INFL_EPOCHS, ridge: float = 1e-3):
    return InfluenceConfig(data=s.data(), archs=tuple(s.archs), width=int(width), attention=s.attention,
                           seed=int(s.seed), train=TrainSpec(epochs=int(epochs)), ridge=ridge)


def influence_seconds(cfg, d: int) -> float:
    n, nt, m = cfg.data.n, cfg.data.n_test, cfg.width
    per_arch = 4 * n * d * m * (1 + cfg.train.epochs) + 2 * (n + nt) * n * (d + m) + 4 * n ** 3
    return len(cfg.archs) * per_arch / FLOPS + 0.5


def malleability_config(s: Shared, attacks=("fgsm", "pgd", "mim"), eps=MALL_EPS, epochs: int = MALL_EPOCHS,
                        steps: int = MALL_STEPS, width: int = INFL_WIDTH, tau: float = 0.1, perturb: str = "top",
                        retrain: bool = False, adversarial_training: bool = False, interventions: bool = False,
                        ridge: float = 1e-3):
    return MalleabilityConfig(data=s.data(), archs=tuple(s.archs), width=int(width), attention=s.attention,
                              seed=int(s.seed), train=TrainSpec(epochs=int(epochs)), attacks=tuple(attacks),
                              eps=tuple(float(e) for e in eps), steps=int(steps), tau=float(tau),
                              ridge=ridge, perturb=perturb, retrain=bool(retrain),
                              adversarial_training=bool(adversarial_training), interventions=bool(interventions))


def malleability_seconds(cfg, d: int) -> float:
    n, m = cfg.data.n, cfg.width
    kernel = 2 * n * n * (d + m) + 4 * n ** 3            # one kernel and its inverse
    grad_steps = sum(1 if a == "fgsm" else cfg.steps for a in cfg.attacks) * len(cfg.eps)
    per_arch = (4 * n * d * m * (1 + cfg.train.epochs) + kernel * (1 + grad_steps * 3)
                + (4 * n * d * m * cfg.train.epochs if cfg.retrain else 0))
    return len(cfg.archs) * per_arch / FLOPS + 0.5


# ---------------------------------------------------------------- scaling law

def scaling_config(kappas, archs, attentions, target: float, measure: str, epochs: int, lr: float,
                   max_width: int, n: int = 64, d: int = 32, seed: int = 0):
    from engine.scaling import ScalingConfig

    return ScalingConfig(n=int(n), d=int(d), kappas=tuple(float(k) for k in kappas), archs=tuple(archs),
                         attentions=tuple(attentions), target=float(target), measure=measure,
                         max_width=int(max_width), seed=int(seed),
                         train=TrainSpec(epochs=int(epochs), lr=float(lr)))


def scaling_seconds(cfg) -> float:
    """About ten bisection steps per (κ, model); each trains a net of up to max_width."""
    models = ("relu" in cfg.archs) + len(cfg.attentions) * ("attn" in cfg.archs)
    per_eval = 4 * cfg.n * cfg.d * cfg.max_width / 4 * (1 + (cfg.train.epochs if cfg.measure != "init" else 0))
    return len(cfg.kappas) * models * 10 * per_eval / FLOPS + 0.5
