import numpy as np
import pytest
import torch

from conftest import ATOL64, RTOL64
from engine.errors import BadInput
from engine.influence import aggregate, influence_matrix, loo_influence, net_influence, top_indices
from engine.models import Net
from engine.ntk import empirical_ntk, infinite_ntk


def _problem(n=12, n_test=5, d=4, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n + n_test, d, generator=g, dtype=torch.float64)
    K_all = infinite_ntk(X)
    Y = torch.randn(n, c, generator=g, dtype=torch.float64)
    return K_all[:n, :n], K_all[n:, :n], Y


def _refit_predictions(K, K_test, Y, lam_abs):
    return K_test @ np.linalg.solve(K + lam_abs * np.eye(len(K)), Y)


@pytest.mark.parametrize("ridge", [1e-3, 1e-1])
@pytest.mark.parametrize("c", [1, 3])
def test_loo_influence_equals_brute_force_refits(ridge, c):
    K, K_test, Y = _problem(c=c)
    infl = loo_influence(K, K_test, Y, ridge).numpy()  # (n_test, n, c)
    Kn, Ktn, Yn = K.numpy(), K_test.numpy(), Y.numpy()
    lam = ridge * np.mean(np.diag(Kn))  # the same absolute λ for the full and the reduced fits
    full = _refit_predictions(Kn, Ktn, Yn, lam)
    for i in range(len(Kn)):
        keep = np.arange(len(Kn)) != i
        without = _refit_predictions(Kn[np.ix_(keep, keep)], Ktn[:, keep], Yn[keep], lam)
        np.testing.assert_allclose(infl[:, i, :], full - without, rtol=1e-8, atol=1e-10)


def test_matrix_sums_classes():
    K, K_test, Y = _problem()
    np.testing.assert_allclose(influence_matrix(K, K_test, Y).numpy(), loo_influence(K, K_test, Y).sum(2).numpy(),
                               rtol=RTOL64, atol=ATOL64)


def test_net_influence_uses_the_empirical_kernel():
    g = torch.Generator().manual_seed(1)
    X, Xt = torch.rand(10, 5, generator=g, dtype=torch.float64), torch.rand(3, 5, generator=g, dtype=torch.float64)
    Y = torch.randn(10, 2, generator=g, dtype=torch.float64)
    net = Net("attn", X, 64, 2, dtype=torch.float64)
    expected = influence_matrix(empirical_ntk(net, X, method="autograd"),
                                empirical_ntk(net, Xt, X, method="autograd"), Y)
    np.testing.assert_allclose(net_influence(net, X, Y, Xt).numpy(), expected.numpy(), rtol=1e-9, atol=1e-12)


def test_top_indices_and_aggregate():
    agg = aggregate(torch.tensor([[1.0, -5.0, 0.5, 3.0], [1.0, -3.0, 0.5, 1.0]]))
    assert agg.tolist() == [1.0, -4.0, 0.5, 2.0]
    assert top_indices(agg, 0.5).tolist() == [1, 3]
    assert top_indices(agg, 0.01).tolist() == [1]
    with pytest.raises(BadInput, match="tau"):
        top_indices(agg, 0.0)


def test_bad_ridge():
    K, K_test, Y = _problem()
    with pytest.raises(BadInput, match="ridge"):
        loo_influence(K, K_test, Y, 0.0)
