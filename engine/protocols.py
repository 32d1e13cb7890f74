"""Protocol sensitivity: does a claim hold under each protocol choice the paper leaves open?

A claim is checked on a fixed grid of *cells*, each a base config with some protocol choices
replaced (``flip_variants``, ``kernel_variants``); each cell gets one verdict from a pure
function of its result's summary frame. Nothing is tuned toward the paper's numbers: grid and
rules are fixed in advance and every cell reports what came out. The rules (also ``RULES``):

Flip rates (``flip_verdict``), on one (attack, ε), a and r the mean flip rates of MLP-Attn
and 2L-ReLU over seeds, s_a and s_r their sds (one seed: sd counts as 0):
**uninformative** when either net's train accuracy is at chance (≤ 1/c + 0.05, c classes) or
both flip rates are ≥ 40 % (coin tosses); else **holds** when a − r > s_a + s_r and a ≥ 2 r;
else **fails**.

Kernel distance (``kernel_verdict``), the trained kernel's distance to K∞ in the sweep
summary: **holds** when at the largest width MLP-Attn's distance is ≥ 2× 2L-ReLU's and
2L-ReLU's is below its value at the smallest width; **fails** otherwise; **uninformative**
when the sweep lacks an architecture, a second width, or finite values.

Each cell (``Variant``) carries the dashboard page and the URL query parameters (widget key →
the value as the widget shows it) that reproduce it there, and ``unlinked``: settings that
page cannot take from its URL.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlencode

import pandas as pd

from .data import DataSpec
from .experiments import SweepConfig
from .malleability import MalleabilityConfig
from .plots import ARCH_LABELS
from .tables import pm
from .training import OPTIMIZERS

VERDICTS = ("holds", "fails", "uninformative")
FACTOR = 2.0            # the "far more" of both claims: at least twice
CHANCE_MARGIN = 0.05    # train accuracy ≤ 1/c + this counts as chance level
COIN_TOSS = 0.40        # both flip rates at or above this: the attack scrambles everything
GEOMETRIES = (("linf", "raw"), ("l2", "normalized"))   # attack norm × space: the two readings of ε
TARGETS = ("true", "sum")                             # label-aware and label-free influence
KERNEL_METRICS = {  # name -> (summary column, the NTK page's `ntk.metric` key)
    "frobenius": ("kernel_dist_trained", "kernel_dist"),
    "whitened": ("kernel_dist_whitened_trained", "kernel_dist_whitened"),
    "prediction": ("prediction_gap_trained", "prediction_gap"),
}
# The NTK page's `ntk.metric` selectbox shows (and puts in the URL) these labels; a test
# checks them against pages/ntk.py.
NTK_METRIC_LABELS = {
    "kernel_dist": "relative Frobenius ‖K_m − K∞‖_F / ‖K∞‖_F (blind to κ)",
    "kernel_dist_whitened": "whitened ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂ (what regression sees)",
    "prediction_gap": "kernel-regression prediction gap ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖",
}
CLAIMS = {"flip": "MLP-Attn's influences flip far more often than 2L-ReLU's",
          "kernel": "MLP-Attn's kernel stays far from K∞ at large width while 2L-ReLU's converges"}
RULES = {  # the verdict rules in words, for the page (the module docstring says the same)
    "flip": (f"**holds** when MLP-Attn's mean flip rate exceeds 2L-ReLU's by more than the sum of their sds "
             f"and is at least {FACTOR:g}× it; **uninformative** when either net's train accuracy is at chance "
             f"(≤ 1/c + {CHANCE_MARGIN:g}) or both flip rates are ≥ {COIN_TOSS:.0%}; **fails** otherwise."),
    "kernel": (f"**holds** when, at the largest width, MLP-Attn's distance to K∞ (trained kernel) is at least "
               f"{FACTOR:g}× 2L-ReLU's and 2L-ReLU's is below its value at the smallest width; **fails** "
               "otherwise."),
}


@dataclass(frozen=True)
class Variant:
    """One cell: a config, the choices that made it, and where on the dashboard it lives."""

    claim: str                    # "flip" or "kernel"
    choices: dict                 # the protocol choices of this cell, e.g. {"optimizer": "sgd"}
    config: MalleabilityConfig | SweepConfig
    page: str                     # the experiment (and so the page URL path): "malleability" or "ntk-sweep"
    params: dict                  # query parameters: widget key -> str or list[str]
    unlinked: dict = field(default_factory=dict)  # settings the page cannot take from its URL
    metric: str | None = None     # kernel claim: a key of KERNEL_METRICS

    @property
    def label(self) -> str:
        return " · ".join(str(v) for v in self.choices.values())

    def link(self) -> str:
        """Relative URL of the page with the query parameters, e.g. ``malleability?mall.norm=l2``."""
        return f"{self.page}?{urlencode(self.params, doseq=True)}"


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
                   "mall.seeds": str(len(cfg.seeds)), "mall.width": str(cfg.width), "mall.tau": str(cfg.tau),
                   "mall.perturb": cfg.perturb, "mall.optimizer": cfg.train.optimizer,
                   **{k: str(v).lower() for k, v in (("mall.retrain", cfg.retrain),
                   ("mall.adv", cfg.adversarial_training), ("mall.interventions", cfg.interventions))}})
    return params, unlinked


def _ntk_params(cfg: SweepConfig, metric: str) -> tuple[dict, dict]:
    params, unlinked = _sidebar(cfg.data, cfg.archs, cfg.attention, cfg.seeds)
    params.update({"widths": [str(w) for w in cfg.widths], "ntk.epochs": str(cfg.train.epochs),
                   "ntk.seeds": str(len(cfg.seeds)), "ntk.ridge": str(cfg.ridge),
                   "ntk.optimizer": cfg.train.optimizer,
                   "ntk.metric": NTK_METRIC_LABELS[KERNEL_METRICS[metric][1]]})
    return params, unlinked


def flip_variants(base: MalleabilityConfig) -> list[Variant]:
    """The 12 flip-rate cells: attack geometry (GEOMETRIES) × influence target (TARGETS) ×
    optimiser (adam with coupled L2 as reported, adamw, sgd). Attacks, ε, data and the rest
    are the base's. Raises ``BadInput`` (from the config) if the base cannot use normalized space."""
    out = []
    for (norm, space), target, opt in itertools.product(GEOMETRIES, TARGETS, OPTIMIZERS):
        cfg = replace(base, attack=replace(base.attack, norm=norm), space=space, target=target,
                      train=replace(base.train, optimizer=opt))
        out.append(Variant("flip", {"attack": f"{norm}, {space}", "target": target, "optimizer": opt},
                           cfg, "malleability", *_mall_params(cfg)))
    return out


def kernel_variants(base: SweepConfig) -> list[Variant]:
    """The 9 kernel-distance cells: optimiser × kernel metric. The metrics come from one sweep,
    so the cells share 3 configs (one per optimiser)."""
    out = []
    for opt in OPTIMIZERS:
        cfg = replace(base, train=replace(base.train, optimizer=opt))
        out += [Variant("kernel", {"optimizer": opt, "metric": m}, cfg, "ntk-sweep", *_ntk_params(cfg, m), m)
                for m in KERNEL_METRICS]
    return out


def _sd(v) -> float:  # one seed has no sd: counts as 0
    return 0.0 if v is None or not math.isfinite(float(v)) else float(v)


def _ratio(a: float, r: float) -> float:
    return a / r if r > 0 else (math.inf if a > 0 else math.nan)


def flip_verdict(summary: pd.DataFrame, n_classes: int, attack: str | None = None,
                 eps: float | None = None) -> dict:
    """The flip claim's verdict (module docstring) on a ``run_malleability`` summary, at one
    ``attack`` (default pgd if present, else the first) and ``eps`` (default the first).

    Returns verdict (in VERDICTS), why, numbers (text), attack, eps, chance, n_seeds, ratio,
    {relu,attn}_flip, _flip_sd and _train_acc (fractions in [0, 1])."""
    attacks = list(summary["attack"].unique()) if len(summary) else [None]
    attack = attack or ("pgd" if "pgd" in attacks else attacks[0])
    d = summary[summary["attack"] == attack]
    eps = (float(d["eps"].iloc[0]) if len(d) else math.nan) if eps is None else float(eps)
    d = d[(d["eps"].astype(float) - eps).abs() < 1e-9].set_index("arch")
    out = {"attack": attack, "eps": eps, "chance": 1.0 / n_classes + CHANCE_MARGIN}
    if not {"relu", "attn"} <= set(d.index):
        return {**out, "verdict": "uninformative", "why": "needs both architectures", "numbers": "—"}
    for arch in ("relu", "attn"):
        out[f"{arch}_flip"] = float(d.at[arch, "flip_rate_mean"])
        out[f"{arch}_flip_sd"] = _sd(d.at[arch, "flip_rate_sd"])
        out[f"{arch}_train_acc"] = float(d.at[arch, "train_acc_mean"])
    a, r = out["attn_flip"], out["relu_flip"]
    out.update(ratio=_ratio(a, r), n_seeds=int(d["n_seeds"].min()),
               numbers=(f"flip MLP-Attn {pm(a, out['attn_flip_sd'], 2, 100, '%')}, 2L-ReLU "
                        f"{pm(r, out['relu_flip_sd'], 2, 100, '%')}; train acc. MLP-Attn "
                        f"{out['attn_train_acc']:.0%}, 2L-ReLU {out['relu_train_acc']:.0%}"))
    if min(out["relu_train_acc"], out["attn_train_acc"]) <= out["chance"]:
        return {**out, "verdict": "uninformative", "why": f"a net trains only to chance (≤ {out['chance']:.0%})"}
    if a >= COIN_TOSS and r >= COIN_TOSS:
        return {**out, "verdict": "uninformative", "why": f"both flip ≥ {COIN_TOSS:.0%}: coin tosses"}
    times = "2L-ReLU never flips" if r == 0 else f"MLP-Attn flips {out['ratio']:.2g}× as often"
    if a - r > out["attn_flip_sd"] + out["relu_flip_sd"] and a >= FACTOR * r:
        return {**out, "verdict": "holds", "why": f"{times}, beyond the sds"}
    why = ("MLP-Attn flips no more than 2L-ReLU" if a <= r else "the gap is within the sds"
           if a - r <= out["attn_flip_sd"] + out["relu_flip_sd"] else f"{times}, under {FACTOR:g}×")
    return {**out, "verdict": "fails", "why": why}


def kernel_verdict(summary: pd.DataFrame, metric: str) -> dict:
    """The kernel claim's verdict (module docstring) on a ``run_ntk_sweep`` summary; metric: a
    key of KERNEL_METRICS. Returns verdict, why, numbers (text), metric, widths (smallest,
    largest), ratio (attn / relu at the largest), {relu,attn}_small, _large (means over seeds),
    _large_sd and _train_acc (at the largest width)."""
    col = KERNEL_METRICS[metric][0]
    out = {"metric": metric}
    by = {a: g.set_index("width").sort_index() for a, g in summary.groupby("arch")}
    if not {"relu", "attn"} <= set(by) or by["relu"].index.nunique() < 2:
        return {**out, "verdict": "uninformative", "why": "needs both architectures at two widths or more",
                "numbers": "—"}
    lo, hi = int(by["relu"].index.min()), int(by["relu"].index.max())
    out["widths"] = (lo, hi)
    for arch in ("relu", "attn"):
        g = by[arch]
        out[f"{arch}_small"] = float(g[f"{col}_mean"].get(lo, math.nan))
        out[f"{arch}_large"] = float(g[f"{col}_mean"].get(hi, math.nan))
        out[f"{arch}_large_sd"] = _sd(g[f"{col}_sd"].get(hi))
        out[f"{arch}_train_acc"] = float(g["train_acc_mean"].get(hi, math.nan))
    a, r, r0 = out["attn_large"], out["relu_large"], out["relu_small"]
    out["ratio"] = _ratio(a, r)
    out["numbers"] = (f"at m = {hi}: MLP-Attn {pm(a, out['attn_large_sd'])}, 2L-ReLU {pm(r, out['relu_large_sd'])}"
                      f"; 2L-ReLU at m = {lo}: {r0:.3g}")
    if not all(math.isfinite(v) for v in (a, r, r0)):
        return {**out, "verdict": "uninformative", "why": "non-finite distances"}
    far, falls = a >= FACTOR * r, r < r0
    if far and falls:
        return {**out, "verdict": "holds", "why": f"MLP-Attn is {out['ratio']:.2g}× as far and 2L-ReLU's distance falls"}
    why = [] if far else [f"MLP-Attn is only {out['ratio']:.2g}× as far"]
    why += [] if falls else ["2L-ReLU's distance does not fall with width"]
    return {**out, "verdict": "fails", "why": "; ".join(why)}


def cell(variant: Variant, summary: pd.DataFrame | None, n_classes: int | None = None) -> dict:
    """One table row: the cell's choices, its verdict, why and numbers ("not run" without a summary)."""
    row = {**variant.choices}
    if summary is None:
        return {**row, "verdict": "not run", "why": "", "numbers": ""}
    v = (flip_verdict(summary, int(n_classes)) if variant.claim == "flip"
         else kernel_verdict(summary, variant.metric))
    return {**row, "verdict": v["verdict"], "why": v["why"], "numbers": v["numbers"]}
