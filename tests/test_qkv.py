"""Trainable QKV attention: features, autograd NTK against a per-sample gradient loop, training."""

import math

import numpy as np
import pytest
import torch

from conftest import ATOL64, RTOL32, RTOL64
from engine.data import DataSpec, load_sample
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.spectrum import SpectrumConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.malleability import example_key, run_malleability
from engine.experiments.spectrum import run_spectrum
from engine.experiments.sweep import run_ntk_sweep
from engine.maths.models import Net, QKVAttention
from engine.maths.ntk import empirical_ntk
from engine.maths.specs import AttackSpec, TrainSpec
from engine.maths.training import train

SYN = DataSpec("synthetic", n=24, n_test=8, synthetic_d=6, synthetic_kappa=5.0, synthetic_classes=3)


def _data(n=10, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g, dtype=torch.float64), torch.arange(n) % 3


def test_qkv_features_match_a_direct_computation():
    X, _ = _data()
    net = Net("attn", X, 16, 3, attention="qkv", dtype=torch.float64)
    Z = X.numpy() / np.linalg.norm(X.numpy(), axis=1, keepdims=True)
    Q, K, V = (Z @ p.detach().numpy() for p in (net.attn.W_Q, net.attn.W_K, net.attn.W_V))
    out = np.zeros_like(Z)
    for i in range(len(Z)):
        s = np.array([Q[i] @ K[j] / math.sqrt(5) for j in range(len(Z))])
        w = np.exp(s - s.max())
        out[i] = (w / w.sum()) @ V
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    np.testing.assert_allclose(net.features(X).detach().numpy(), out, rtol=RTOL64, atol=ATOL64)
    assert {n for n, _ in net.named_parameters()} == {"mlp.W", "attn.W_Q", "attn.W_K", "attn.W_V"}


def test_qkv_ntk_equals_a_loop_of_per_sample_gradients():
    X, _ = _data(6, 4)
    net = Net("attn", X, 8, 2, attention="qkv", dtype=torch.float64)
    params = list(net.parameters())
    rows = []
    for i in range(6):
        per_out = []
        for c in range(2):
            g = torch.autograd.grad(net(X[i:i + 1])[0, c], params)
            per_out.append(torch.cat([t.flatten() for t in g]))
        rows.append(torch.stack(per_out))
    J = torch.stack(rows)  # (n, c, P)
    K_ref = torch.einsum("icp,jcp->ij", J, J) / 2
    np.testing.assert_allclose(empirical_ntk(net, X).numpy(), K_ref.numpy(), rtol=RTOL64, atol=ATOL64)


def test_qkv_attention_parameters_train_and_training_is_deterministic():
    X, y = _data(30, 5)
    nets = [Net("attn", X, 32, 3, seed=1, attention="qkv") for _ in range(2)]
    before = nets[0].attn.W_K.detach().clone()
    res = [train(net, X, y, 3, TrainSpec(epochs=15, lr=1e-2, batch_size=10), seed=2) for net in nets]
    assert not torch.equal(nets[0].attn.W_K.detach(), before)
    assert torch.equal(nets[0].attn.W_V, nets[1].attn.W_V) and res[0].losses == res[1].losses
    assert res[0].losses[-1] < res[0].losses[0]


def _np_qkv(Z, W_Q, W_K, W_V):
    """softmax((Z W_Q)(Z W_K)ᵀ / √d_k)(Z W_V), row by row."""
    Q, K, V = Z @ W_Q, Z @ W_K, Z @ W_V
    out = np.zeros_like(V)
    for i in range(len(Z)):
        s = Q[i] @ K.T / math.sqrt(W_Q.shape[1])
        w = np.exp(s - s.max())
        out[i] = (w / w.sum()) @ V
    return out


def test_qkv_sweep_trains_the_attention():
    rows = run_ntk_sweep(SweepConfig(data=SYN, widths=(8, 16), archs=("attn",), attention="qkv", seeds=(0,),
                                     train=TrainSpec(epochs=2))).frames["rows"]
    assert list(rows.attention) == ["qkv", "qkv"] and (rows.weight_movement > 0).all()


def test_qkv_spectrum_is_that_of_the_seed_zero_attention():
    """κ of the attention Gram equals numpy's (σ₁/σ_d)² of the QKV output at its seed-0 init."""
    res = run_spectrum(SpectrumConfig(data=SYN, attention="qkv"))
    s = res.meta["summary"]
    X = load_sample(SYN).X.double().numpy()
    Z = X / np.linalg.norm(X, axis=1, keepdims=True)
    att = QKVAttention(X.shape[1], seed=0, dtype=torch.float64)
    A = _np_qkv(Z, *(p.detach().numpy() for p in (att.W_Q, att.W_K, att.W_V)))
    sv = np.linalg.svd(A, compute_uv=False)
    assert s["kappa_attention_theory"] is None  # no closed form for softmax attention
    assert s["attention_rank"] == X.shape[1]
    assert s["kappa_attention"] == pytest.approx((sv[0] / sv[-1]) ** 2, rel=RTOL64)
    np.testing.assert_allclose(res.arrays["eig_attention"][:len(sv)], sv**2, rtol=RTOL64, atol=ATOL64)


def test_qkv_malleability_rows_follow_the_stored_influences():
    """The flip rate is the share of top-τ points whose stored influence changed sign."""
    cfg = MalleabilityConfig(data=SYN, archs=("attn",), attention="qkv", widths=(8,), seeds=(0,), tau=0.5,
                             eps=(0.3,), train=TrainSpec(epochs=2), attack=AttackSpec(steps=2))
    res = run_malleability(cfg)
    row = res.frames["rows"].iloc[0]
    key = lambda what: example_key("attn", "pgd", 0.3, what)  # noqa: E731
    top, before, after = (res.arrays[key(w)] for w in ("top_idx", "infl_before", "infl_after"))
    assert len(top) == row.n_top == 12 and set(top) == set(np.argsort(-np.abs(before))[:12])
    assert row.flip_rate == np.mean(np.sign(before[top]) != np.sign(after[top]))
    assert 0 < row.flip_rate < 1  # the comparison is not between two constants
    moved = np.abs(res.arrays[key("X_pert")] - res.arrays[key("X_clean")]).max()
    assert 0 < moved <= 0.3 * (1 + RTOL32)  # stored in float32


def test_autograd_memory_guard():
    from engine.runtime.errors import BadInput

    X = torch.rand(3000, 784)
    net = Net("attn", X[:10], 4096, 10, attention="qkv")
    with pytest.raises(BadInput, match=r"Jacobians \(3000 samples x 10 outputs x \d+ parameters\) needs [\d.]+ GiB "
                                       r"on cpu but [\d.]+ GiB is free; it fits up to n = \d+, or a smaller width"):
        empirical_ntk(net, X)
