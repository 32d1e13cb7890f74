import math

import numpy as np
import pytest
import torch

from conftest import ATOL64, ATOL64_CHAIN, ATOL64_POWER, RTOL64, RTOL64_CHAIN, RTOL64_POWER
from engine.errors import BadInput
from engine.models import Net, TwoLayerReLU, attention_features, features, parse_attention


def _rand(n, d, seed=0):
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _unit(X):
    X = X.numpy()
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def test_two_layer_relu_matches_formula():
    X = _rand(7, 5)
    net = TwoLayerReLU(5, 32, 3, seed=1, dtype=torch.float64)
    W, a = net.W.detach().numpy(), net.a.numpy()
    expected = np.maximum(X.numpy() @ W.T, 0) @ a / math.sqrt(32)
    np.testing.assert_allclose(net(X).detach().numpy(), expected, rtol=RTOL64, atol=ATOL64)
    assert set(np.unique(a)) <= {-1.0, 1.0}
    assert [n for n, _ in net.named_parameters()] == ["W"]


def test_same_seed_same_net_and_init_std():
    a = TwoLayerReLU(4, 8, 2, seed=3, init_std=0.01)
    b = TwoLayerReLU(4, 8, 2, seed=3, init_std=0.01)
    assert torch.equal(a.W, b.W) and torch.equal(a.a, b.a)
    assert float(a.W.detach().std()) < 0.05


@pytest.mark.parametrize("width", [0, -3, 2.5, True])
def test_bad_width(width):
    with pytest.raises(BadInput, match="width"):
        TwoLayerReLU(4, width, 1)


def test_linear_attention_is_ZZtZ_and_gram_is_G_cubed():
    X = _rand(9, 6)
    Z = _unit(X)
    A = attention_features(X, X, "linear").numpy()
    np.testing.assert_allclose(A, Z @ Z.T @ Z, rtol=RTOL64, atol=ATOL64)
    G = Z @ Z.T
    np.testing.assert_allclose(A @ A.T, np.linalg.matrix_power(G, 3), rtol=RTOL64_CHAIN, atol=ATOL64_CHAIN)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_stacked_attention_matches_matrix_power(k):
    X = _rand(8, 5, seed=k)
    Z = _unit(X)
    C = Z.T @ Z
    A = attention_features(X, X, f"stacked:{k}").numpy()
    np.testing.assert_allclose(A, Z @ np.linalg.matrix_power(C, k), rtol=RTOL64_CHAIN, atol=ATOL64_CHAIN)
    G = Z @ Z.T
    np.testing.assert_allclose(A @ A.T, np.linalg.matrix_power(G, 2 * k + 1),
                               rtol=RTOL64_POWER, atol=ATOL64_POWER)


@pytest.mark.parametrize("r", [1, 3, 5])
def test_truncated_attention_matches_eigendecomposition(r):
    X = _rand(10, 5, seed=r)
    Z = _unit(X)
    lam, V = np.linalg.eigh(Z.T @ Z)  # ascending
    Vr, lr = V[:, ::-1][:, :r], lam[::-1][:r]
    Cr = Vr @ np.diag(lr) @ Vr.T
    np.testing.assert_allclose(attention_features(X, X, f"truncated:{r}").numpy(), Z @ Cr.T,
                               rtol=RTOL64_CHAIN, atol=ATOL64_CHAIN)


def test_truncated_full_rank_equals_linear():
    X = _rand(10, 4)
    np.testing.assert_allclose(attention_features(X, X, "truncated:4"), attention_features(X, X, "linear"),
                               rtol=RTOL64_CHAIN, atol=ATOL64_CHAIN)


def test_softmax_attention_matches_loop():
    X, R = _rand(4, 3, seed=1), _rand(6, 3, seed=2)
    Z, Zr = _unit(X), _unit(R)
    T = 0.5
    expected = np.zeros_like(Z)
    for i in range(len(Z)):
        s = np.array([np.exp(Z[i] @ Zr[j] / T) for j in range(len(Zr))])
        expected[i] = sum(s[j] / s.sum() * Zr[j] for j in range(len(Zr)))
    np.testing.assert_allclose(attention_features(X, R, "softmax:0.5").numpy(), expected,
                               rtol=RTOL64, atol=ATOL64)


def test_attention_uses_training_set_for_test_points():
    X, Xt = _rand(8, 5, seed=1), _rand(3, 5, seed=2)
    Z, Zt = _unit(X), _unit(Xt)
    phi = features(Xt, X, "attn").numpy()
    raw = Zt @ (Z.T @ Z)
    np.testing.assert_allclose(phi, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=RTOL64, atol=ATOL64)


def test_net_forward_composes_features_and_head():
    X = _rand(6, 4)
    net = Net("attn", X, 16, 2, seed=0, dtype=torch.float64)
    np.testing.assert_allclose(net(X).detach(), net.head(features(X, X, "attn")).detach(), rtol=RTOL64)


@pytest.mark.parametrize("text", ["cosine", "stacked:0", "stacked:1.5", "truncated:-1", "softmax:0",
                                  "linear:2", "stacked:x"])
def test_bad_attention(text):
    with pytest.raises(BadInput):
        parse_attention(text)


def test_attention_parsing_defaults():
    assert str(parse_attention("stacked")) == "stacked:1"
    assert str(parse_attention("truncated:10")) == "truncated:10"
    assert str(parse_attention("softmax:0.25")) == "softmax:0.25"


def test_truncated_rank_too_large():
    X = _rand(3, 5)
    with pytest.raises(BadInput, match="truncated:4"):
        attention_features(X, X, "truncated:4")


def test_unknown_arch():
    with pytest.raises(BadInput, match="arch"):
        Net("cnn", _rand(3, 2), 4, 1)
