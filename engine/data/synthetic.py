"""A synthetic data set whose Gram matrix has a chosen spectrum, labelled by a linear teacher.

The ranges of ``synthetic_d``, ``synthetic_kappa``, ``synthetic_decay`` and
``synthetic_classes`` are checked by ``DataSpec`` itself; what depends on several settings
at once (size, rank, the class pair) is checked here.
"""

from __future__ import annotations

import numpy as np
import torch

from ..runtime.errors import BadInput
from .spec import DataSpec, Sample

MAX_SYNTHETIC_ENTRIES = 50_000_000  # n * d and n_test * d: 400 MB of float64 each


def eigen_profile(decay: str, r: int, kappa: float) -> np.ndarray:
    """r eigenvalues from 1 down to 1/kappa (exactly at both ends), shaped by `decay`."""
    t = np.arange(r) / max(r - 1, 1)
    if decay == "geometric":
        lam = kappa ** -t
    elif decay == "linear":
        lam = 1.0 - (1.0 - 1.0 / kappa) * t
    else:  # power: (i+1)^-p with r^-p = 1/kappa
        lam = (1.0 + np.arange(r)) ** (-np.log(kappa) / np.log(r)) if r > 1 else np.ones(1)
    lam[0], lam[-1] = 1.0, 1.0 / kappa
    return lam


def _orthonormal(rng: np.random.Generator, m: int, r: int) -> np.ndarray:
    q, rr = np.linalg.qr(rng.standard_normal((m, r)))
    return q * np.sign(np.diag(rr))  # Haar-distributed and independent of LAPACK's sign choice


def load_synthetic(spec: DataSpec, pair: tuple[str, str] | None) -> Sample:
    """X = U diag(sqrt(lam)) Vᵀ scaled to mean row norm 1, so G = X Xᵀ has exactly
    r = min(n, d) nonzero eigenvalues with max/min = kappa. Test rows are V diag(sqrt(lam/n)) z,
    z ~ N(0, I_r), at the same scale: same subspace and spread as the training rows.
    Labels: argmax over `synthetic_classes` random teacher directions; for a pair a-b, the
    argmax over directions a and b only, so every point is kept and the Gram stays exact."""
    d, kappa, k = spec.synthetic_d, spec.synthetic_kappa, spec.synthetic_classes
    if max(spec.n, spec.n_test) * d > MAX_SYNTHETIC_ENTRIES:
        raise BadInput(f"synthetic data of {max(spec.n, spec.n_test)} x {d} is too large; "
                       f"keep n * d and n_test * d <= {MAX_SYNTHETIC_ENTRIES}")
    r = min(spec.n, d)
    if r == 1 and kappa != 1:
        raise BadInput("with min(n, synthetic_d) = 1 the Gram has one nonzero eigenvalue: "
                       "synthetic_kappa must be 1")
    classes = list(range(k)) if pair is None else [int(t) for t in pair]
    if max(classes) >= k:
        raise BadInput(f"unknown class {max(classes)} for synthetic: allowed are 0-{k - 1}")
    # one stream per part, so that n_test never changes the training set or its labels
    rng_u, rng_v, rng_t, rng_z = (np.random.default_rng([spec.seed, 2, p]) for p in range(4))
    lam = eigen_profile(spec.synthetic_decay, r, float(kappa))
    U, V = _orthonormal(rng_u, spec.n, r), _orthonormal(rng_v, d, r)
    X = (U * np.sqrt(lam)) @ V.T                                       # (n, d)
    scale = 1.0 / np.linalg.norm(X, axis=1).mean()
    Z = rng_z.standard_normal((spec.n_test, r))
    X_test = (Z * np.sqrt(lam / spec.n)) @ V.T                         # (n_test, d)
    teacher = rng_t.standard_normal((k, d))[classes]                   # (c, d)
    X, X_test = X * scale, X_test * scale

    def label(A: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.argmax(A @ teacher.T, axis=1).astype(np.int64))

    return Sample(torch.from_numpy(X), label(X), torch.from_numpy(X_test), label(X_test),
                  tuple(str(c) for c in classes), None, None, "generated", spec)
