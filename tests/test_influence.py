import numpy as np
import pytest
import torch

from conftest import ATOL64, ATOL64_REFIT, RTOL64, RTOL64_REFIT, RTOL64_SOLVE, RTOL_CHANGED
from engine.maths.influence import aggregate, influence_matrix, loo_influence, net_influence, top_indices
from engine.maths.kinf import infinite_ntk
from engine.maths.models import Net
from engine.maths.ntk import empirical_ntk
from engine.maths.specs import DEFAULT_TARGET, INFLUENCE_TARGETS
from engine.runtime.errors import BadInput
from reference import loo_changes, ridge_predict


def _problem(n=12, n_test=5, d=4, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n + n_test, d, generator=g, dtype=torch.float64)
    K_all = infinite_ntk(X)
    Y = torch.randn(n, c, generator=g, dtype=torch.float64)
    return K_all[:n, :n], K_all[n:, :n], Y


@pytest.mark.parametrize("ridge", [1e-3, 1e-1])
@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("block", [5, None])  # diag M by blocks of L⁻¹ columns: several, or one
def test_loo_influence_equals_brute_force_refits(ridge, c, block, monkeypatch):
    if block:
        monkeypatch.setattr("engine.maths.influence._INVERSE_BLOCK", block)
    K, K_test, Y = _problem(c=c)
    infl = loo_influence(K, K_test, Y, ridge).numpy()  # (n_test, n, c)
    Kn, Ktn, Yn = K.numpy(), K_test.numpy(), Y.numpy()
    lam = ridge * np.mean(np.diag(Kn))  # the same absolute λ for the full and the reduced fits
    full = ridge_predict(Kn, Ktn, Yn, lam)
    for i in range(len(Kn)):
        keep = np.arange(len(Kn)) != i
        without = ridge_predict(Kn[np.ix_(keep, keep)], Ktn[:, keep], Yn[keep], lam)
        np.testing.assert_allclose(infl[:, i, :], full - without, rtol=RTOL64_REFIT, atol=ATOL64_REFIT)


def test_matrix_sums_classes():
    K, K_test, Y = _problem()
    np.testing.assert_allclose(influence_matrix(K, K_test, Y).numpy(), loo_influence(K, K_test, Y).sum(2).numpy(),
                               rtol=RTOL64, atol=ATOL64)


def _brute_force_changes(K, K_test, Y, ridge):
    """full − without_i predictions (n, n_test, c) by refitting n times, and the full fit."""
    return loo_changes(K.numpy(), K_test.numpy(), Y.numpy(), ridge)


@pytest.mark.parametrize("one_hot", [True, False])
def test_true_and_margin_targets_equal_brute_force_refits(one_hot):
    K, K_test, Y = _problem(n=12, c=3)
    g = torch.Generator().manual_seed(3)
    y_test = torch.randint(0, 3, (5,), generator=g)
    if one_hot:
        Y = torch.nn.functional.one_hot(torch.randint(0, 3, (12,), generator=g), 3).double()
    changes, full = _brute_force_changes(K, K_test, Y, 1e-3)   # (n, n_test, c), (n_test, c)
    t = np.arange(5)
    true = changes[:, t, y_test.numpy()].T                     # (n_test, n)
    other = full.copy()
    other[t, y_test.numpy()] = -np.inf
    j = other.argmax(1)                                        # best class other than the label
    margin = (changes[:, t, y_test.numpy()] - changes[:, t, j]).T
    np.testing.assert_allclose(influence_matrix(K, K_test, Y, target="true", y_test=y_test).numpy(), true,
                               rtol=RTOL64_REFIT, atol=ATOL64_REFIT)
    np.testing.assert_allclose(influence_matrix(K, K_test, Y, target="margin", y_test=y_test).numpy(), margin,
                               rtol=RTOL64_REFIT, atol=ATOL64_REFIT)
    np.testing.assert_allclose(influence_matrix(K, K_test, Y, target="sum").numpy(), changes.sum(2).T,
                               rtol=RTOL64_REFIT, atol=ATOL64_REFIT)


def test_single_output_is_the_same_for_every_target():
    K, K_test, Y = _problem(c=1)
    ref = loo_influence(K, K_test, Y)[:, :, 0].numpy()
    for target in INFLUENCE_TARGETS:  # no labels needed with one output
        np.testing.assert_allclose(influence_matrix(K, K_test, Y, target=target).numpy(), ref,
                                   rtol=RTOL64, atol=ATOL64)


def test_true_influence_depends_on_one_hot_labels_and_the_sum_does_not():
    """The bug being fixed: with one-hot targets, the sum over outputs is label-free."""
    K, K_test, _ = _problem(n=12, c=3)
    y = torch.arange(12) % 3
    y_test = torch.tensor([0, 1, 2, 0, 1])
    perm = torch.tensor([1, 2, 0, 4, 5, 3, 7, 8, 6, 10, 11, 9])  # every label changes
    assert (y[perm] != y).all()
    Y, Y_perm = (torch.nn.functional.one_hot(v, 3).double() for v in (y, y[perm]))
    kw = {"target": "true", "y_test": y_test}
    assert not np.allclose(influence_matrix(K, K_test, Y, **kw).numpy(),
                           influence_matrix(K, K_test, Y_perm, **kw).numpy(), rtol=RTOL_CHANGED, atol=0)
    np.testing.assert_allclose(influence_matrix(K, K_test, Y, target="sum").numpy(),
                               influence_matrix(K, K_test, Y_perm, target="sum").numpy(), rtol=RTOL64, atol=ATOL64)
    assert DEFAULT_TARGET == "true" and DEFAULT_TARGET in INFLUENCE_TARGETS


def test_bad_target_and_labels_are_one_line_errors():
    K, K_test, Y = _problem(c=3)
    with pytest.raises(BadInput, match=r"unknown influence target 'own'; allowed: true, margin, sum"):
        influence_matrix(K, K_test, Y, target="own")
    with pytest.raises(BadInput, match="need y_test"):
        influence_matrix(K, K_test, Y, target="margin")
    with pytest.raises(BadInput, match="y_test must be 5 integer labels in 0..2"):
        influence_matrix(K, K_test, Y, target="true", y_test=torch.tensor([0, 1, 2, 3, 0]))
    with pytest.raises(BadInput, match="y_test must be 5 integer labels"):
        influence_matrix(K, K_test, Y, target="true", y_test=torch.zeros(4, dtype=torch.long))


def test_net_influence_uses_the_empirical_kernel():
    g = torch.Generator().manual_seed(1)
    X, Xt = torch.rand(10, 5, generator=g, dtype=torch.float64), torch.rand(3, 5, generator=g, dtype=torch.float64)
    Y = torch.randn(10, 2, generator=g, dtype=torch.float64)
    net = Net("attn", X, 64, 2, dtype=torch.float64)
    expected = influence_matrix(empirical_ntk(net, X, method="autograd"),
                                empirical_ntk(net, Xt, X, method="autograd"), Y)
    np.testing.assert_allclose(net_influence(net, X, Y, Xt).numpy(), expected.numpy(), rtol=RTOL64_SOLVE, atol=ATOL64)
    y_test = torch.tensor([1, 0, 1])
    expected = influence_matrix(empirical_ntk(net, X, method="autograd"), empirical_ntk(net, Xt, X, method="autograd"),
                                Y, target="margin", y_test=y_test)
    np.testing.assert_allclose(net_influence(net, X, Y, Xt, target="margin", y_test=y_test).numpy(),
                               expected.numpy(), rtol=RTOL64_SOLVE, atol=ATOL64)
    with pytest.raises(BadInput, match="unknown influence target"):
        net_influence(net, X, Y, Xt, target="max")


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
