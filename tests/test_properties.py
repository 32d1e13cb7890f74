"""Properties rather than values (kronfluence's habit): influence is equivariant to reordering the
training set; the flip excess's interval covers the true excess at its nominal rate; with one net
its bootstrap is scipy's percentile bootstrap of the paired per-point flips."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from conftest import MC_SIGMAS, REL_MOVED, RTOL64_SOLVE
from engine.data import DataSpec, load_sample
from engine.maths.influence import influence_matrix, loo_influence
from engine.maths.kinf import infinite_ntk
from engine.maths.metrics import LEVEL, excess_interval
from engine.maths.models import Net, features
from engine.maths.ntk import empirical_ntk
from engine.maths.training import targets

# ---------------------------------------------------------------- influence and the training order


def _kernels(kernel: str, X: torch.Tensor, X_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K (n, n), K_test (n_test, n)) of real digits, built from X in the order given (the attention
    features of MLP-Attn attend over that same X); the nets' weights do not depend on that order."""
    if kernel == "kinf":
        phi, phi_t = features(X, X, "attn"), features(X_test, X, "attn")
        return infinite_ntk(phi), infinite_ntk(phi_t, phi)
    net = Net(kernel.removeprefix("entk-"), X, 128, 1, seed=3, dtype=torch.float64)
    return empirical_ntk(net, X, X_ref=X), empirical_ntk(net, X_test, X, X_ref=X)


@pytest.mark.parametrize("kernel", ["entk-relu", "entk-attn", "kinf"])
def test_influence_is_equivariant_to_reordering_the_training_set(mnist_dir, kernel):
    """Training on the points in another order (the kernels rebuilt from the reordered digits, the
    targets reordered with them) reorders the influence's training columns and changes nothing
    else: I'[:, j] = I[:, π(j)] for every target and for the per-class LOO influence."""
    s = load_sample(DataSpec(n=40, n_test=10, seed=1), mnist_dir)
    X, X_test = s.X.double(), s.X_test.double()
    Y, y_test = targets(s.y, 10), s.y_test
    perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(0))
    K, K_test = _kernels(kernel, X, X_test)
    Kp, Kp_test = _kernels(kernel, X[perm], X_test)
    torch.testing.assert_close(Kp, K[perm][:, perm], rtol=RTOL64_SOLVE, atol=RTOL64_SOLVE * float(K.abs().max()))

    for target in ("sum", "true", "margin"):
        I = influence_matrix(K, K_test, Y, target=target, y_test=y_test)
        Ip = influence_matrix(Kp, Kp_test, Y[perm], target=target, y_test=y_test)
        assert Ip.shape == I.shape == (10, 40) and Ip.dtype == torch.float64
        scale = float(I.abs().max())
        torch.testing.assert_close(Ip, I[:, perm], rtol=RTOL64_SOLVE, atol=RTOL64_SOLVE * scale)
        assert not torch.allclose(I[:, perm], I, atol=REL_MOVED * scale)  # the reordering moved the columns
    L, Lp = loo_influence(K, K_test, Y), loo_influence(Kp, Kp_test, Y[perm])
    torch.testing.assert_close(Lp, L[:, perm, :], rtol=RTOL64_SOLVE, atol=RTOL64_SOLVE * float(L.abs().max()))


# ---------------------------------------------------------------- the flip excess's interval

P_ATTACK, P_SEED, P_RANDOM = 0.5, 0.05, 0.2   # per-point flip probabilities of the simulated net
TRUE_EXCESS = P_ATTACK - max(P_SEED, P_RANDOM)


def _flips(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One net's per-point sign flips (attack, seed null, random null), k points. The random null
    flips a subset of the points the attack flips (one latent fragility per point), so the three
    are paired as real ones are: a bootstrap that resampled them apart would be far too wide."""
    u = rng.random(k)
    return u < P_ATTACK, rng.random(k) < P_SEED, u < P_RANDOM


def test_the_excess_interval_covers_the_true_excess_at_its_nominal_rate():
    """1000 simulated nets of 200 points each: the share of their intervals that contain the true
    excess 0.3 lies within MC_SIGMAS binomial standard errors of LEVEL (0.95): [0.916, 0.984].
    Measured outside that band: the same simulation's 80 % interval (0.80), and a bootstrap that
    resamples the three arrays independently (0.997)."""
    reps, k = 1000, 200
    rng = np.random.default_rng(1)
    covered = 0
    for i in range(reps):
        e = excess_interval([_flips(rng, k)], n_boot=1000, seed=i)
        covered += e.low <= TRUE_EXCESS <= e.high
    band = MC_SIGMAS * np.sqrt(LEVEL * (1 - LEVEL) / reps)
    assert abs(covered / reps - LEVEL) <= band, (covered / reps, LEVEL, band)


def _excess_of(a: np.ndarray, s: np.ndarray, r: np.ndarray, axis: int = -1) -> np.ndarray:
    """The per-net statistic on (resampled) per-point flips: attack minus the larger null."""
    return a.mean(axis=axis) - np.maximum(s.mean(axis=axis), r.mean(axis=axis))


def test_one_nets_bootstrap_is_scipys_percentile_bootstrap_of_the_paired_points():
    """With one net the replicates resample its points, the three arrays together: scipy's
    percentile bootstrap with paired=True over the same statistic, independently seeded, gives
    the same interval within Monte-Carlo error. That error: each end is a quantile of B
    replicates, which lies (at MC_SIGMAS) between the replicate distribution's quantiles
    q ± MC_SIGMAS·√(q(1−q)/B); the two ends may differ by that band's width plus one step of
    the statistic's grid (1/k), between whose values the quantile interpolates."""
    k, B = 400, 20_000
    a, s, r = _flips(np.random.default_rng(7), k)
    mine = excess_interval([(a, s, r)], n_boot=B, level=LEVEL, seed=3)
    ref = scipy.stats.bootstrap((a, s, r), _excess_of, paired=True, vectorized=True, n_resamples=B,
                                confidence_level=LEVEL, method="percentile", rng=np.random.default_rng(11))
    assert mine.value == _excess_of(a, s, r)
    q = np.array([(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    spread = MC_SIGMAS * np.sqrt(q * (1 - q) / B)
    dist = ref.bootstrap_distribution
    tol = np.quantile(dist, q + spread) - np.quantile(dist, q - spread) + 1 / k
    got = np.array([mine.low, mine.high])
    want = np.array([ref.confidence_interval.low, ref.confidence_interval.high])
    assert np.all(np.abs(got - want) <= tol), (got, want, tol)
    assert np.all(tol < 0.25 * (want[1] - want[0]))  # the tolerance is far below the interval's width
