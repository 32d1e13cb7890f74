"""The ``spectrum`` experiment: eigenvalues of the input Gram G and of the attention features' Gram.

κ(G) and κ of the attention features stand beside their prediction from G alone
(``theory_kappa``: κ³ for linear attention, κ^(2L+1) stacked, (λ₁/λ_r)³ truncated), with the
width thresholds they imply and κ's growth with n.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..runtime import budget as B
from . import options
from ..maths import spectral
from ..runtime.budget import Estimate
from ..runtime.cache import Result
from ..data import DataSpec, load_sample
from ..runtime.errors import BadInput
from ..maths.models import Attention, attention_features, features, parse_attention
from .runs import Progress, experiment_run, tick
from ..runtime.settings import normalised, setting, validate


@dataclass(frozen=True)
class SpectrumConfig:
    data: DataSpec = DataSpec(n=400, n_test=1)
    attention: str = options.attention()  # whose feature Gram is measured
    rtol: float | None = setting(None, "numerical-rank tolerance relative to λ_max (none: n·eps64)",
                                 flag="--rank-rtol", lo=0, lo_open=True, hi=1.0)
    eps: float = setting(0.1, "ε of the paper's v1 width threshold κ⁶/ε²", lo=0, lo_open=True, hi=1.0)
    growth_ns: tuple[int, ...] = setting((), "prefix sizes of the draw for κ against n (each ≤ n)",
                                         unit="points", flag="--growth", lo=2, hi=60_000, max_len=20)

    def __post_init__(self):
        normalised(self)
        validate(self)
        too_big = [g for g in self.growth_ns if g > self.data.n]
        if too_big:
            raise BadInput(f"growth sizes {too_big} exceed n = {self.data.n}")


# ---------------------------------------------------------------- helpers

PRESETS = {"spectrum": {  # named instances of the config: the dashboard's quick run and the paper's
    "quick": SpectrumConfig(data=DataSpec(n=200, n_test=1)),   # n_test = 1: the spectrum reads no test set
    "paper": SpectrumConfig(data=DataSpec(n=1000, n_test=1)),  # the paper's n = 1000 training rows
}}


def theory_kappa(attention: str, spec: spectral.Spectrum) -> float | None:
    """κ of the attention features' Gram predicted from the input Gram's eigenvalues."""
    att = parse_attention(attention)
    if att.kind is Attention.LINEAR:
        return spec.kappa ** 3
    if att.kind is Attention.STACKED:
        return spec.kappa ** (2 * int(att.param) + 1)
    if att.kind is Attention.TRUNCATED:
        k = spec.kappa_top(int(att.param))
        return None if k is None else k ** 3
    return None  # softmax, qkv: no closed form


def theory_formula(attention: str) -> str | None:
    """The formula behind ``theory_kappa`` in words, for labels: κ³, κ⁵, (λ₁/λ_r)³."""
    att = parse_attention(attention)
    if att.kind is Attention.LINEAR:
        return "κ(G)^3"
    if att.kind is Attention.STACKED:
        return f"κ(G)^{2 * int(att.param) + 1}"
    if att.kind is Attention.TRUNCATED:
        return f"(λ_1/λ_{int(att.param)})^3"
    return None


# ---------------------------------------------------------------- spectrum

def _spectrum_row(Z: torch.Tensor, X_raw: torch.Tensor, cfg: SpectrumConfig) -> tuple[dict, object, object]:
    n, d = Z.shape
    spec = spectral.gram_spectrum(Z, cfg.rtol)
    kappa_d = spec.kappa_top(min(n, d))
    A = attention_features(X_raw, X_raw, cfg.attention, cfg.data.normalize)
    att = spectral.gram_spectrum(A, cfg.rtol)
    theory = theory_kappa(cfg.attention, spec)
    rtol = n * spectral.EPS64 if cfg.rtol is None else cfg.rtol
    thr_attn = spectral.width_thresholds_log10(spec.kappa, kappa_d, n, power=6, eps=cfg.eps)
    thr_relu = spectral.width_thresholds_log10(spec.kappa, kappa_d, n, power=2, eps=cfg.eps)
    return {
        "n": n, "d": d, "numerical_rank": spec.rank, "rank_tol": spec.rank_tol,
        "kappa": spec.kappa, "kappa_d": kappa_d, "kappa_d_singular": kappa_d is None,
        "attention": cfg.attention, "attention_rank": att.rank,
        "kappa_attention": att.kappa, "kappa_attention_theory": theory,
        "kappa_attention_formula": theory_formula(cfg.attention),
        # eigenvalues below rtol·λ_max count as zero, so no measured κ exceeds 1/rtol: near or past
        # that limit the measured value saturates instead of following the theory
        "kappa_attention_saturated": bool(theory is not None and theory > 0.5 / rtol),
        "kappa_resolvable": 1.0 / rtol,
        "width_threshold_log10": {"attn_v1": thr_attn["v1"], "attn_v2": thr_attn["v2"],
                                  "relu_v1": thr_relu["v1"], "relu_v2": thr_relu["v2"]},
    }, spec, att


def estimate_spectrum(cfg: SpectrumConfig) -> Estimate:
    n, d = cfg.data.n, B.input_dim(cfg.data)
    one = lambda k: B.eig_s(min(k, d)) * 2 + B.gemm_s(k, d, min(k, d), True) * 2 + B.attention_s(cfg.attention, k, d)
    seconds = B.FIXED_S + one(n) + sum(one(g) for g in cfg.growth_ns)
    return Estimate(seconds, 8 * (3 * n * d + 2 * min(n, d) ** 2 + 2 * n))


@experiment_run("spectrum")
def run_spectrum(cfg: SpectrumConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
    """Spectrum of G = Z Zᵀ (Z: the normalised training rows) and of the attention features.

    Result: meta["summary"] (the CLI's object), arrays ``eig_G`` and ``eig_attention``
    (descending float64), frame ``growth`` (κ, κ_d, κ_att against prefix size n).
    """
    tick(progress, cancel, 0.0, "loading data")
    sample = load_sample(cfg.data, data_dir)
    X = sample.X.to(dev, torch.float64)
    Z = features(X, None, "relu", normalize=cfg.data.normalize)
    tick(progress, cancel, 0.3, "eigenvalues of G and of the attention features")
    summary, spec, att = _spectrum_row(Z, X, cfg)
    rows = []
    for i, n in enumerate(cfg.growth_ns):
        tick(progress, cancel, 0.5 + 0.5 * i / len(cfg.growth_ns), f"κ at n = {n}")
        row, _, _ = _spectrum_row(Z[:n], X[:n], cfg)
        row.pop("width_threshold_log10")
        rows.append(row)
    summary["dataset"] = cfg.data.dataset
    summary["source"] = sample.source
    return Result("spectrum", {}, {"growth": pd.DataFrame(rows)},
                  {"eig_G": spec.eigenvalues, "eig_attention": att.eigenvalues},
                  {"summary": summary})
