import math

import numpy as np
import pytest
import torch

from conftest import ATOL64, ATOL64_CHAIN, ATOL64_POWER, RTOL64, RTOL64_CHAIN, RTOL64_POWER
from engine.maths.models import Net, TwoLayerReLU, attention_features, features
from engine.maths.specs import parse_attention
from engine.runtime.errors import BadInput


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


# ---------------------------------------------------------------- initialisation

@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("n_out,param", [(1, "ntk"), (10, "ntk"), (3, "mup")])
def test_antisymmetric_init_gives_f0_exactly_zero(arch, n_out, param):
    X = _rand(40, 12).float()
    net = Net(arch, X, 256, n_out, seed=4, init="antisymmetric", param=param)
    out = net(X).detach()
    assert out.shape == (40, n_out) and torch.count_nonzero(out) == 0
    gauss = Net(arch, X, 256, n_out, seed=4, param=param)
    assert torch.count_nonzero(gauss(X).detach()) == out.numel()   # the gaussian head is not zero


def test_antisymmetric_init_mirrors_the_gaussian_net_of_half_the_width():
    X = _rand(9, 5)
    anti = TwoLayerReLU(5, 64, 3, seed=7, init="antisymmetric", dtype=torch.float64)
    half = TwoLayerReLU(5, 32, 3, seed=7, dtype=torch.float64)
    W, a = anti.W.detach(), anti.a
    assert torch.equal(W[:32], half.W.detach()) and torch.equal(W[32:], half.W.detach())
    assert torch.equal(a[:32], half.a) and torch.equal(a[32:], -half.a)
    W_np, a_np = W.numpy(), a.numpy()  # the formula of the gaussian head, with its own weights
    np.testing.assert_allclose(anti(X).detach().numpy(), np.maximum(X.numpy() @ W_np.T, 0) @ a_np / math.sqrt(64),
                               atol=ATOL64)
    with torch.no_grad():  # once the twins differ, forward is the same formula as the gaussian head's
        anti.W[32:] += 0.1 * torch.randn(32, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    W_np = anti.W.detach().numpy()
    np.testing.assert_allclose(anti(X).detach().numpy(), np.maximum(X.numpy() @ W_np.T, 0) @ a_np / math.sqrt(64),
                               rtol=RTOL64, atol=ATOL64)


def test_antisymmetric_init_has_the_entk_law_of_the_gaussian_init():
    """Same K∞ in the mean (Monte-Carlo over seeds, against the arc-cosine kernel), and the
    antisymmetric eNTK at width m is exactly the gaussian eNTK at width m/2 of the same seed."""
    from conftest import ATOL_CHANGED, MC_SIGMAS
    from engine.maths.ntk import empirical_ntk
    from reference import arccos_ntk

    X = _rand(6, 4)
    P = _unit(X)
    K_inf = arccos_ntk(P, P)
    m, seeds = 256, 40
    mean = {"gaussian": 0.0, "antisymmetric": 0.0}
    for s in range(seeds):
        for init in mean:
            mean[init] = mean[init] + empirical_ntk(Net("relu", X, m, 1, seed=s, init=init,
                                                        dtype=torch.float64), X).numpy() / seeds
        half = empirical_ntk(Net("relu", X, m // 2, 1, seed=s, dtype=torch.float64), X).numpy()
        anti = empirical_ntk(Net("relu", X, m, 1, seed=s, init="antisymmetric", dtype=torch.float64), X).numpy()
        np.testing.assert_allclose(anti, half, rtol=RTOL64, atol=ATOL64)
    # each entry is ⟨p, q⟩ times a mean of Bernoulli indicators (sd ≤ 1/2 each) over the independent units
    units = {"gaussian": m * seeds, "antisymmetric": m // 2 * seeds}
    for init, K in mean.items():
        tol = MC_SIGMAS * 0.5 / math.sqrt(units[init]) * np.abs(P @ P.T)
        assert np.all(np.abs(K - K_inf) <= tol), init
    assert not np.allclose(mean["gaussian"], K_inf, rtol=0, atol=ATOL_CHANGED)  # a real Monte-Carlo estimate


@pytest.mark.parametrize("width,init,match", [(33, "antisymmetric", "even"), (32, "zero", "init")])
def test_bad_init(width, init, match):
    with pytest.raises(BadInput, match=match):
        Net("relu", _rand(3, 2), width, 1, init=init)


# ---------------------------------------------------------------- centred attention

def test_centered_attention_is_C_times_the_centred_rows_then_normalised():
    X, Xt = _rand(15, 6, seed=1), _rand(4, 6, seed=2)
    Z, Zt = _unit(X), _unit(Xt)
    C, mean = Z.T @ Z, Z.mean(axis=0)
    want = (Z - mean) @ C
    np.testing.assert_allclose(attention_features(X, X, "centered").numpy(), want, rtol=RTOL64_CHAIN,
                               atol=ATOL64_CHAIN)
    np.testing.assert_allclose(want.mean(axis=0), 0.0, atol=ATOL64_CHAIN)  # centred over the training set
    for A, rows in ((X, Z), (Xt, Zt)):  # test points: the training set's C and mean
        ref = (rows - mean) @ C
        ref /= np.linalg.norm(ref, axis=1, keepdims=True)
        np.testing.assert_allclose(features(A, X, "attn", "centered").numpy(), ref, rtol=RTOL64_CHAIN,
                                   atol=ATOL64_CHAIN)
    linear = features(X, X, "attn", "linear").numpy()
    assert np.abs(linear - features(X, X, "attn", "centered").numpy()).max() > 0.1  # another model
    assert str(parse_attention("centered")) == "centered"
    with pytest.raises(BadInput, match="no parameter"):
        parse_attention("centered:2")
