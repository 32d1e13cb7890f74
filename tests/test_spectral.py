import math

import numpy as np
import pytest
import scipy.linalg
import torch

from conftest import ATOL64_EIG, ATOL64_EIG_ATTENTION, RTOL64, RTOL64_EIG, RTOL64_EIG_ATTENTION
from engine.data import DataSpec, load_sample
from engine.maths.models import attention_features, normalize_rows
from engine.maths.spectral import EPS64, eig_spectrum, gram_spectrum, width_thresholds_log10


def _low_rank(n, d, r, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, r)) @ rng.standard_normal((r, d))


@pytest.mark.parametrize("n,d,r", [(30, 10, 10), (12, 40, 5), (20, 20, 20)])
def test_gram_spectrum_matches_scipy(n, d, r):
    X = _low_rank(n, d, r)
    s = gram_spectrum(X)
    ref = scipy.linalg.eigvalsh(X @ X.T)[::-1]
    np.testing.assert_allclose(s.eigenvalues, ref.clip(min=0), rtol=RTOL64, atol=ATOL64_EIG * ref[0])
    assert s.rank == np.linalg.matrix_rank(X) == r
    assert s.rank_tol == pytest.approx(n * EPS64 * ref[0])
    assert s.kappa == pytest.approx(ref[0] / ref[r - 1], rel=RTOL64_EIG)


@pytest.mark.parametrize("n,d,r", [(1000, 50, 50), (1000, 50, 20), (40, 200, 40), (40, 200, 15)])
def test_both_gram_routes_match_the_full_n_by_n_eigvalsh(n, d, r):
    """n > d decomposes Fᵀ F (d x d) and pads zeros; n <= d decomposes F Fᵀ: both must
    give the spectrum, rank and κ of numpy's eigvalsh of the full n x n Gram."""
    X = _low_rank(n, d, r, seed=n + r)
    s = gram_spectrum(torch.from_numpy(X))
    ref = np.linalg.eigvalsh(X @ X.T)[::-1]
    tol = n * EPS64 * ref[0]  # the rounding scale of a float64 n x n Gram, the rank tolerance
    assert s.eigenvalues.shape == (n,) and np.all(np.diff(s.eigenvalues) <= 0)
    np.testing.assert_allclose(s.eigenvalues, ref.clip(min=0), rtol=RTOL64, atol=tol)
    assert s.rank_tol == pytest.approx(tol, rel=RTOL64)
    assert s.rank == int((ref > tol).sum()) == r
    kappa = ref[0] / ref[r - 1]
    assert s.kappa == pytest.approx(kappa, rel=max(RTOL64, tol / ref[r - 1]))
    if n > d:
        assert np.count_nonzero(s.eigenvalues[d:]) == 0  # the padding is exact zeros


def test_kappa_top_reports_singular_truncations_as_none():
    s = eig_spectrum(np.array([4.0, 2.0, 1.0, 0.0, 1e-20]))
    assert s.rank == 3 and s.kappa == 4.0
    assert s.kappa_top(2) == 2.0
    assert s.kappa_top(4) is None


def test_explicit_rtol_is_used():
    s = eig_spectrum(np.array([1.0, 1e-3, 1e-9]), rtol=1e-6)
    assert s.rank == 2 and s.rank_tol == 1e-6 and s.kappa == pytest.approx(1e3)


def test_thresholds_formula():
    t = width_thresholds_log10(1e3, 2e3, 1000, power=6, eps=0.1)
    assert t["v1"] == pytest.approx(18 + 2)
    assert t["v2"] == pytest.approx(6 * math.log10(2e3) + math.log10(1000 * math.log(1000)))
    assert width_thresholds_log10(10.0, None, 5)["v2"] is None


def test_attention_gram_condition_is_cubed_on_real_digits(mnist_dir):
    """κ(G̃) measured from the attention features equals κ(G)³ where float64 resolves it."""
    s = load_sample(DataSpec("mnist", n=40, n_test=1, seed=1), mnist_dir)
    Z = normalize_rows(s.X)
    G = gram_spectrum(Z)
    A = gram_spectrum(attention_features(s.X, s.X, "linear"))
    assert G.rank == A.rank == 40
    # Rounding in the smallest eigenvalue of G³ is about n·eps·κ³ relative.
    tol = 40 * EPS64 * G.kappa**3 * 10
    assert A.kappa == pytest.approx(G.kappa**3, rel=max(tol, RTOL64))
    np.testing.assert_allclose(A.eigenvalues, G.eigenvalues**3, rtol=RTOL64_EIG_ATTENTION,
                               atol=ATOL64_EIG_ATTENTION * A.eigenvalues[0])


def test_mnist_rank_deficiency_makes_kappa_d_singular(mnist_dir):
    """Border pixels are always zero, so rank(X) < 784 and the rank-784 truncation is singular."""
    s = load_sample(DataSpec("mnist", n=900, n_test=1), mnist_dir)
    spec = gram_spectrum(normalize_rows(s.X))
    Z = normalize_rows(s.X).numpy()
    assert spec.rank <= int((s.X.numpy().sum(0) > 0).sum()) < 784  # at most the number of live pixels
    assert np.linalg.matrix_rank(Z @ Z.T, tol=spec.rank_tol, hermitian=True) == spec.rank
    assert spec.kappa_top(784) is None
