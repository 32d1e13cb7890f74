"""Where a protocol cell lives on the dashboard: its page and the URL query parameters (widget
key → the value as the widget shows it) that reproduce it there.

``engine.reporting.protocols`` decides which cells a claim is checked on; the widget keys are the pages'
business, so they are written here, once, beside the labels the NTK page's metric selectbox
shows. ``of(variant)`` gives the cell's ``Link``: its parameters, its relative URL, and
``unlinked``, the settings the page cannot take from its URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from engine.data import DataSpec
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.registry import preset
from engine.reporting.protocols import KERNEL_METRICS, Variant
from ui.common import ARCH_LABELS

# What "distance to K∞" means on the NTK page: the choice changes the verdict, so it is visible.
# Its `ntk.metric` selectbox shows (and puts in the URL) these labels, the default first: what
# kernel regression with K_m predicts against K∞'s (the paper's claim is about that).
NTK_METRIC_LABELS = {
    "prediction_gap": "kernel-regression prediction gap ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖",
    "kernel_dist_whitened": "whitened ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂ (what regression sees)",
    "kernel_dist": "relative Frobenius ‖K_m − K∞‖_F / ‖K∞‖_F (blind to κ: can rank the nets the other way)",
}


@dataclass(frozen=True)
class Link:
    """A cell on its page: ``params`` (widget key -> str or list[str]), ``unlinked`` (settings
    the page cannot take from its URL) and ``url``, e.g. ``malleability?mall.norm=l2``."""

    page: str
    params: dict
    unlinked: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.page}?{urlencode(self.params, doseq=True)}"


def of(variant: Variant) -> Link:
    """The ``Link`` of a protocol cell (``engine.reporting.protocols.flip_variants`` / ``kernel_variants``)."""
    if variant.claim == "flip":
        return Link(variant.page, *_mall_params(variant.config))
    return Link(variant.page, *_ntk_params(variant.config, variant.metric))


def _sidebar(data: DataSpec, archs, attention: str, seeds) -> tuple[dict, dict]:
    """Query parameters of app.py's sidebar for a data spec, and what they cannot express."""
    base, _, classes = data.dataset.partition(":")
    params = {"data": Path(base).name, "classes": classes or "all", "n": str(data.n),
              "n_test": str(data.n_test), "seed": str(data.seed), "archs": [ARCH_LABELS[a] for a in archs],
              "attention": attention}
    unlinked = {}
    if data != DataSpec(dataset=data.dataset, n=data.n, n_test=data.n_test, seed=data.seed):
        unlinked["data"] = "fields beyond data set, n, test points and seed"
    if tuple(seeds) != tuple(range(data.seed, data.seed + len(seeds))):  # pages count up from the seed
        unlinked["seeds"] = list(seeds)
    return params, unlinked


def _mall_params(cfg: MalleabilityConfig) -> tuple[dict, dict]:
    params, unlinked = _sidebar(cfg.data, cfg.archs, cfg.attention, cfg.seeds)
    params.update({"mall.attacks": [a.upper() for a in cfg.attacks], "mall.eps": [str(float(e)) for e in cfg.eps],
                   "mall.norm": cfg.attack.norm, "mall.space": cfg.space, "mall.target": cfg.target,
                   "mall.steps": str(cfg.attack.steps), "mall.epochs": str(cfg.train.epochs),
                   "mall.seeds": str(len(cfg.seeds)), "mall.widths": [str(w) for w in cfg.widths],
                   "mall.readings": list(cfg.readings), "mall.tau": str(cfg.tau),
                   "mall.perturb": cfg.perturb, "mall.optimizer": cfg.train.optimizer,
                   "mall.lr": str(cfg.train.lr), "mall.decay": str(cfg.train.weight_decay),
                   "mall.ridge": str(cfg.ridge), "mall.kernel": cfg.influence_kernel, "mall.init": cfg.init,
                   **{k: str(v).lower() for k, v in (("mall.retrain", cfg.retrain),
                   ("mall.adv", cfg.adversarial_training), ("mall.interventions", cfg.interventions))}})
    return params, unlinked


def _ntk_params(cfg: SweepConfig, metric: str) -> tuple[dict, dict]:
    params, unlinked = _sidebar(cfg.data, cfg.archs, cfg.attention, cfg.seeds)
    params.update({"widths": [str(w) for w in cfg.widths], "ntk.epochs": str(cfg.train.epochs),
                   "ntk.seeds": str(len(cfg.seeds)), "ntk.ridge": str(cfg.ridge),
                   "ntk.optimizer": cfg.train.optimizer, "ntk.lr": str(cfg.train.lr),
                   "ntk.metric": NTK_METRIC_LABELS[KERNEL_METRICS[metric][1]]})
    q = preset("ntk-sweep").train  # the NTK page has no weight-decay control: it uses the quick preset's
    if cfg.train.weight_decay != q.weight_decay:
        unlinked["train"] = f"weight decay {cfg.train.weight_decay:g}"
    return params, unlinked

