"""Protocol sensitivity: does a claim hold under each protocol choice the paper leaves open?

A claim is checked on a fixed grid of *cells*, each a base config with some protocol choices
replaced (``flip_variants``, ``kernel_variants``); each cell gets one verdict from a pure
function of its result's summary frame. Nothing is tuned toward the paper's numbers: grid and
rules are fixed in advance and every cell reports what came out. The rules (also ``RULES``):

Flip rates (``flip_verdict``): ``engine.reporting.rule.flip_rule``, the rule the Reproduction page's
verdicts and the README use too. On one (attack, ε): **holds** when MLP-Attn's flip excess
over the larger null (seed null, random null) is at least 2× 2L-ReLU's and the lower end of
its bootstrap interval is above zero; **did not train** when any seed of either net fails
the per-seed training gate (test accuracy more than 10 points below its own K_m kernel
ridge's); **uninformative** without both architectures, the nulls or two network seeds;
**fails** otherwise.

Kernel distance (``kernel_verdict``), the trained kernel's distance to K∞ in the sweep
summary: **did not train** when a seed of either net fails the training gate at the smallest
or the largest width; **holds** when at the largest width MLP-Attn's distance is ≥ 2×
2L-ReLU's and 2L-ReLU's is below its value at the smallest width; **fails** otherwise;
**uninformative** when the sweep lacks an architecture, a second width, or finite values.

Optimisers come with their own learning rate and decay (``OPTIMIZER_PRESETS``), never
Adam's: a cell "optimizer sgd" trains with SGD's preset. Ridge and kernel cells
(``ridge_variants``, ``kernel_choice_variants``) vary the influence's ridge and its kernel
(the trained eNTK or K∞) on the base protocol.

Each cell (``Variant``) names the dashboard page that shows it; the URL query parameters that
reproduce it there (widget keys, a UI matter) are built by ``ui.links``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, cast

import pandas as pd

from ..experiments.configs.influence import INFLUENCE_KERNELS
from ..experiments.configs.malleability import MalleabilityConfig
from ..experiments.configs.sweep import SweepConfig
from ..maths.specs import OPTIMIZERS, TrainSpec
from .plots import ARCH_LABELS
from .rule import FLIP_FACTOR, FLIP_OUTCOMES, RULE_WORDS, flip_rule
from .tables import pm

VERDICTS = FLIP_OUTCOMES  # holds, fails, did not train, uninformative
FACTOR = FLIP_FACTOR    # the "far more" of both claims: at least twice
# Each optimiser's own learning rate and decay (the adam cell keeps the base's, the paper's
# 1e-3 with coupled L2 1e-3). adamw: decoupled decay 0.1 shrinks W by lr·wd = 1e-4 per step,
# a decay that acts (1e-6 would be none). sgd: no decay and a step near the lazy limit n·c/λ₁
# of MNIST's kernels (engine.maths.training.sgd_lr_limit estimates 2·n·c/λ₁ per row).
OPTIMIZER_PRESETS: dict[str, dict[str, Any] | None] = {"adam": None, "adamw": {"lr": 1e-3, "weight_decay": 0.1},
                                                       "sgd": {"lr": 10.0, "weight_decay": 0.0}}
RIDGES = (1e-3, 1e-2, 1e-1)   # the ridge row of the flip table: near-interpolating to smooth
GEOMETRIES = (("linf", "raw"), ("l2", "normalized"))   # attack norm × space: the two readings of ε
TARGETS = ("true", "sum")                             # label-aware and label-free influence
KERNEL_METRICS = {  # name -> (summary column, its sweep-row stem: the NTK page's metric)
    "frobenius": ("kernel_dist_trained", "kernel_dist"),
    "whitened": ("kernel_dist_whitened_trained", "kernel_dist_whitened"),
    "prediction": ("prediction_gap_trained", "prediction_gap"),
}
CLAIMS = {"flip": "MLP-Attn's influences flip far more often than 2L-ReLU's",
          "kernel": "MLP-Attn's kernel stays far from K∞ at large width while 2L-ReLU's converges"}
RULES = {  # the verdict rules in words, for the page (the module docstring says the same)
    "flip": RULE_WORDS,
    "kernel": (f"**did not train** when a seed of either net fails the training gate at the smallest or largest "
               f"width; **holds** when, at the largest width, MLP-Attn's distance to K∞ (trained kernel) is at "
               f"least {FACTOR:g}× 2L-ReLU's and 2L-ReLU's is below its value at the smallest width; **fails** "
               "otherwise."),
}


@dataclass(frozen=True)
class Variant:
    """One cell: a config, the choices that made it, and where on the dashboard it lives."""

    claim: str                    # "flip" or "kernel"
    choices: dict                 # the protocol choices of this cell, e.g. {"optimizer": "sgd"}
    config: MalleabilityConfig | SweepConfig
    page: str                     # the experiment (and so the page URL path): "malleability" or "ntk-sweep"
    metric: str | None = None     # kernel claim: a key of KERNEL_METRICS

    @property
    def label(self) -> str:
        return " · ".join(str(v) for v in self.choices.values())


def with_optimizer(train: TrainSpec, optimizer: str) -> TrainSpec:
    """``train`` (a TrainSpec) with ``optimizer`` and that optimiser's own lr and decay
    (``OPTIMIZER_PRESETS``; adam keeps the base's)."""
    preset = OPTIMIZER_PRESETS[optimizer]
    return replace(train, optimizer=optimizer, **(preset or {}))


def _flip_cell(cfg: MalleabilityConfig) -> Variant:
    choices = {"attack": f"{cfg.attack.norm}, {cfg.space}", "target": cfg.target, "optimizer": cfg.train.optimizer,
               "ridge": f"{cfg.ridge:g}", "kernel": cfg.influence_kernel}
    return Variant("flip", choices, cfg, "malleability")


def flip_variants(base: MalleabilityConfig) -> list[Variant]:
    """The flip-rate cells. First the 12 of attack geometry (GEOMETRIES) × influence target
    (TARGETS) × optimiser (adam with coupled L2 as reported, adamw and sgd each with its own
    preset, ``with_optimizer``); then the ridge row (the base with each other ridge of RIDGES)
    and the kernel row (the base with each other influence kernel). Attacks, ε, data and the
    rest are the base's. Raises ``BadInput`` (from the config) if the base cannot use
    normalized space."""
    out = []
    for (norm, space), target, opt in itertools.product(GEOMETRIES, TARGETS, OPTIMIZERS):
        out.append(_flip_cell(replace(base, attack=replace(base.attack, norm=norm), space=space, target=target,
                                      train=with_optimizer(base.train, opt) if opt != base.train.optimizer
                                      else base.train)))
    out += [_flip_cell(replace(base, ridge=r)) for r in RIDGES if r != base.ridge]
    out += [_flip_cell(replace(base, influence_kernel=k)) for k in INFLUENCE_KERNELS if k != base.influence_kernel]
    return out


def kernel_variants(base: SweepConfig) -> list[Variant]:
    """The 9 kernel-distance cells: optimiser (each with its own preset) × kernel metric. The
    metrics come from one sweep, so the cells share 3 configs (one per optimiser)."""
    out = []
    for opt in OPTIMIZERS:
        cfg = replace(base, train=with_optimizer(base.train, opt) if opt != base.train.optimizer else base.train)
        out += [Variant("kernel", {"optimizer": opt, "metric": m}, cfg, "ntk-sweep", m) for m in KERNEL_METRICS]
    return out


def _sd(v: float | None) -> float:  # one seed has no sd: counts as 0
    return 0.0 if v is None or not math.isfinite(float(v)) else float(v)


def _ratio(a: float, r: float) -> float:
    return a / r if r > 0 else (math.inf if a > 0 else math.nan)


def flip_verdict(summary: pd.DataFrame, attack: str | None = None, eps: float | None = None) -> dict:
    """The flip claim's verdict on a ``run_malleability`` summary: ``engine.reporting.rule.flip_rule``
    (module docstring) at one ``attack`` (default pgd if present, else the first) and ``eps``
    (default the first). Returns verdict (in VERDICTS) and everything ``flip_rule`` returns."""
    rule = flip_rule(summary, attack, eps)
    return {**rule, "verdict": rule["outcome"]}


@dataclass(frozen=True)
class KernelSide:
    """One architecture's numbers in a kernel verdict (``kernel_verdict``'s ``relu`` and ``attn``), read
    from the width sweep's summary (``engine.experiments.sweep``): the metric's seed mean at the smallest
    and the largest width, its sd and the train accuracy at the largest, and the share of seeds through
    the training gate at each of the two (NaN: no training, or no such column)."""

    small: float
    large: float
    large_sd: float
    train_acc: float
    trained: dict[int, float]

    @classmethod
    def of(cls, g: pd.DataFrame, col: str, lo: int, hi: int) -> KernelSide:
        """From one architecture's summary rows indexed by width."""
        return cls(small=float(g[f"{col}_mean"].get(lo, math.nan)), large=float(g[f"{col}_mean"].get(hi, math.nan)),
                   large_sd=_sd(g[f"{col}_sd"].get(hi)), train_acc=float(g["train_acc_mean"].get(hi, math.nan)),
                   trained={w: float(g["trained_mean"].get(w, math.nan)) if "trained_mean" in g else math.nan
                            for w in (lo, hi)})


def kernel_verdict(summary: pd.DataFrame, metric: str) -> dict:
    """The kernel claim's verdict (module docstring) on a ``run_ntk_sweep`` summary; metric: a
    key of KERNEL_METRICS. Returns verdict, why, numbers (text), metric, widths (smallest,
    largest), ratio (attn / relu at the largest), and ``relu`` and ``attn`` (``KernelSide``)."""
    col = KERNEL_METRICS[metric][0]
    out: dict[str, Any] = {"metric": metric}
    by = {a: g.set_index("width").sort_index() for a, g in summary.groupby("arch")}
    if not {"relu", "attn"} <= set(by) or by["relu"].index.nunique() < 2:
        return {**out, "verdict": "uninformative", "why": "needs both architectures at two widths or more",
                "numbers": "—"}
    lo, hi = int(by["relu"].index.min()), int(by["relu"].index.max())
    out["widths"] = (lo, hi)
    relu, attn = out["relu"], out["attn"] = KernelSide.of(by["relu"], col, lo, hi), KernelSide.of(by["attn"], col, lo, hi)
    a, r, r0 = attn.large, relu.large, relu.small
    out["ratio"] = _ratio(a, r)
    out["numbers"] = (f"at m = {hi}: MLP-Attn {pm(a, attn.large_sd)}, 2L-ReLU {pm(r, relu.large_sd)}"
                      f"; 2L-ReLU at m = {lo}: {r0:.3g}")
    untrained = [f"{ARCH_LABELS[arch]} at m = {w}" for arch, side in (("attn", attn), ("relu", relu)) for w in (lo, hi)
                 if side.trained[w] < 1]  # NaN compares False: untrained sweeps (epochs 0) pass
    if untrained:
        return {**out, "verdict": "did not train",
                "why": f"a seed fails the training gate: {', '.join(untrained)}"}
    if not all(math.isfinite(v) for v in (a, r, r0)):
        return {**out, "verdict": "uninformative", "why": "non-finite distances"}
    far, falls = a >= FACTOR * r, r < r0
    if far and falls:
        return {**out, "verdict": "holds", "why": f"MLP-Attn is {out['ratio']:.2g}× as far and 2L-ReLU's distance falls"}
    why = [] if far else [f"MLP-Attn is only {out['ratio']:.2g}× as far"]
    why += [] if falls else ["2L-ReLU's distance does not fall with width"]
    return {**out, "verdict": "fails", "why": "; ".join(why)}


def cell(variant: Variant, summary: pd.DataFrame | None) -> dict:
    """One table row: the cell's choices, its verdict, why and numbers ("not run" without a summary)."""
    row = {**variant.choices}
    if summary is None:
        return {**row, "verdict": "not run", "why": "", "numbers": ""}
    v = flip_verdict(summary) if variant.claim == "flip" else kernel_verdict(summary, cast(str, variant.metric))
    return {**row, "verdict": v["verdict"], "why": v["why"], "numbers": v["numbers"]}
