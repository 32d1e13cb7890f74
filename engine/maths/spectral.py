"""Gram spectra, numerical rank, condition numbers and the paper's width thresholds.

Everything is float64. Eigenvalues come from ``eigvalsh`` of the smaller of the two Grams
``F Fᵀ`` (n x n) and ``Fᵀ F`` (d x d), which share their nonzero spectrum; the
numerical rank counts eigenvalues above ``rank_tol = rtol · λ_max`` with the default
``rtol = n · eps(float64)``, the size of the rounding error of a float64 Gram. Condition
numbers are ratios of eigenvalues over that rank and are never formed from cubed matrices
in low precision: ``κ(G³)`` is ``κ(G)³`` from the eigenvalues, and its measured value comes
from the Gram of the attention features themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..runtime import budget as B
from ..runtime.errors import BadInput
from .tiles import eig_threads

EPS64 = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class Spectrum:
    eigenvalues: np.ndarray  # (n,) float64, descending, negatives from rounding clipped to 0
    rank: int                # numerical rank: eigenvalues > rank_tol
    rank_tol: float          # absolute tolerance on eigenvalues
    kappa: float             # λ_1 / λ_rank

    def kappa_top(self, k: int) -> float | None:
        """λ_1 / λ_k over the rank-k truncation, or None if that truncation is singular."""
        if k < 1 or k > self.rank:
            return None
        return float(self.eigenvalues[0] / self.eigenvalues[k - 1])


def gram_spectrum(F: torch.Tensor | np.ndarray, rtol: float | None = None) -> Spectrum:
    """Spectrum of the Gram ``F Fᵀ`` of rows F (n, d), in float64.

    Returns all n eigenvalues (descending). The smaller Gram is decomposed: for n > d the
    d nonzero eigenvalues come from ``Fᵀ F`` (d x d, the same nonzero spectrum) and the
    other n − d are exact zeros. The rank tolerance is still that of the n x n Gram
    (default ``n · eps64 · λ_max``), so both routes give the same rank and κ.
    """
    F = torch.as_tensor(F)
    n, d = F.shape
    B.require(spectrum_bytes(n, d), F.device, f"the spectrum of a {n} x {d} Gram (float64)",
              lambda k: spectrum_bytes(k, d), n)
    F64 = F.double()
    if not B.all_finite(F64):  # eigvalsh would fail to converge, or return NaN
        raise BadInput(f"the spectrum of a {n} x {d} Gram: its rows hold NaN or infinite values; rescale the "
                       "data or use another attention variant")
    with eig_threads(min(n, d), F64.device.type):
        lam = torch.linalg.eigvalsh(F64.T @ F64 if n > d else F64 @ F64.T).cpu().numpy()
    if n > d:
        lam = np.concatenate([lam, np.zeros(n - d)])  # eig_spectrum's default rtol counts all n
    return eig_spectrum(lam, rtol)


def spectrum_bytes(n: int, d: int) -> int:
    """Peak bytes of ``gram_spectrum``: the float64 rows, the smaller Gram, and eigvalsh's copy
    of it with its workspace."""
    return 8 * (n * d + 4 * min(n, d) ** 2 + n)


def eig_spectrum(eigenvalues: np.ndarray, rtol: float | None = None) -> Spectrum:
    """Rank and κ from eigenvalues of a PSD matrix (any order)."""
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1].clip(min=0.0)
    n = lam.size
    rtol = n * EPS64 if rtol is None else float(rtol)
    tol = rtol * lam[0] if n else 0.0
    rank = int((lam > tol).sum())
    kappa = float(lam[0] / lam[rank - 1]) if rank else math.inf
    return Spectrum(lam, rank, tol, kappa)


def width_thresholds_log10(kappa: float, kappa_d: float | None, n: int, power: int = 6,
                           eps: float = 0.1) -> dict[str, float | None]:
    """The paper's widths for NTK convergence, as log10 of m.

    v1: ``m = κ^power / ε²``; v2: ``m = κ_d^power · n · ln n`` (None when κ_d is undefined).
    ``power = 6`` is the paper's attention bound (κ(G)⁶ = κ(G³)²); ``power = 2`` applies the
    same bound to the un-amplified Gram, the ReLU net's counterpart.
    """
    v1 = power * math.log10(kappa) - 2 * math.log10(eps)
    v2 = None if kappa_d is None else power * math.log10(kappa_d) + math.log10(n * math.log(n))
    return {"v1": v1, "v2": v2}
