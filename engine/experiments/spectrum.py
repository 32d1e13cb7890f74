"""The ``spectrum`` experiment: eigenvalues of the input Gram G and of the attention features' Gram.

κ(G) and κ of the attention features stand beside their prediction from G alone
(``theory_kappa``: κ³ for linear attention, κ^(2L+1) stacked, (λ₁/λ_r)³ truncated), with the
width thresholds they imply and κ's growth with n.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch

from ..data import load_sample
from ..maths import spectral
from ..maths.models import attention_features, features
from ..maths.specs import parse_attention
from ..runtime.cache import Result
from .configs.spectrum import SpectrumConfig
from .runs import Progress, experiment_run, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

# ---------------------------------------------------------------- helpers

def theory_kappa(attention: str, spec: spectral.Spectrum) -> float | None:
    """κ of the attention features' Gram predicted from the input Gram's eigenvalues: base^p with
    the variant's κ theory (``AttentionVariant``), None where it has none or λ_r is zero."""
    att = parse_attention(attention)
    p = att.kappa_exponent
    if p is None:
        return None  # centered, softmax, qkv: no closed form
    base = spec.kappa_top(int(att.param or 0)) if att.variant.kappa_top else spec.kappa
    return None if base is None else base ** p


def theory_formula(attention: str) -> str | None:
    """The formula behind ``theory_kappa`` in words, for labels: κ³, κ⁵, (λ₁/λ_r)³."""
    att = parse_attention(attention)
    p = att.kappa_exponent
    if p is None:
        return None
    base = f"(λ_1/λ_{int(att.param or 0)})" if att.variant.kappa_top else "κ(G)"
    return f"{base}^{p}"


# ---------------------------------------------------------------- spectrum

def _spectrum_row(Z: torch.Tensor, X_raw: torch.Tensor, cfg: SpectrumConfig
                  ) -> tuple[dict, spectral.Spectrum, spectral.Spectrum]:
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


@experiment_run("spectrum")
def run_spectrum(cfg: SpectrumConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                 cancel: CancelFlag | None) -> Result:
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
