"""CUDA code paths; every test here skips on a machine without a GPU (CI has none)."""

import functools

import numpy as np
import pytest
import torch

from conftest import (
    ATOL32_ONE_PASS,
    ATOL64,
    RTOL32,
    RTOL32_ONE_PASS,
    RTOL64,
    RTOL_DEVICES_INIT,
    RTOL_DEVICES_TRAINED,
    requires_cuda,
)
from engine.data import DataSpec
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.malleability import example_key, run_malleability
from engine.experiments.sweep import run_ntk_sweep
from engine.maths.attacks import attack
from engine.maths.counts import exact_counts
from engine.maths.models import Net, TwoLayerReLU, normalize_rows
from engine.maths.ntk import empirical_ntk, empirical_ntk_features
from engine.maths.specs import AttackSpec, TrainSpec
from engine.runtime.device import resolve_device

pytestmark = [requires_cuda, pytest.mark.cuda]
CUDA = torch.device("cuda")
SYN = DataSpec("synthetic", n=80, n_test=20, synthetic_d=16, synthetic_kappa=10.0, synthetic_classes=3)


def test_auto_picks_cuda():
    assert resolve_device("auto").type == "cuda"


@pytest.mark.parametrize("m", [1, 4096, 70_000])
def test_bf16_activation_counts_are_exact(m):
    g = torch.Generator().manual_seed(m)
    S1 = (torch.rand(37, m, generator=g) > 0.5)
    S2 = (torch.rand(23, m, generator=g) > 0.3)
    exact = S1.long() @ S2.long().T
    got = exact_counts(S1.to(CUDA, torch.bfloat16), S2.to(CUDA, torch.bfloat16))
    assert torch.equal(got.cpu().long(), exact)


@pytest.mark.parametrize("arch", ["relu", "attn"])
def test_cuda_kernel_matches_the_cpu_float64_reference(arch):
    X = torch.rand(50, 30, dtype=torch.float64)
    net64 = Net(arch, X, 512, 2, seed=1, dtype=torch.float64)
    net = Net(arch, X, 512, 2, seed=1).to(CUDA)
    K = empirical_ntk(net, X.to(CUDA).float(), chunk=16).cpu()
    K_ref = empirical_ntk(net64, X, method="autograd")
    np.testing.assert_allclose(K.numpy(), K_ref.numpy(), rtol=RTOL32_ONE_PASS, atol=ATOL32_ONE_PASS)


def test_twenty_thousand_points_fit_and_agree_on_a_block():
    phi = normalize_rows(torch.rand(20_000, 784, device=CUDA))
    head = TwoLayerReLU(784, 4096, 1, seed=0).to(CUDA)
    K = empirical_ntk_features(head, phi)
    assert K.shape == (20_000, 20_000)
    block = empirical_ntk_features(head.double(), phi[:300].double())
    torch.testing.assert_close(K[:300, :300], block, rtol=RTOL32_ONE_PASS, atol=ATOL32_ONE_PASS)


def test_sweep_on_cuda_matches_cpu():
    cfg = SweepConfig(data=SYN, widths=(32, 256), train=TrainSpec(epochs=3, batch_size=32))
    cpu = run_ntk_sweep(cfg, device="cpu").frames["rows"]
    gpu = run_ntk_sweep(cfg, device="cuda").frames["rows"]
    assert gpu.shape == cpu.shape
    np.testing.assert_allclose(gpu.kernel_dist_init, cpu.kernel_dist_init, rtol=RTOL_DEVICES_INIT)
    np.testing.assert_allclose(gpu.kernel_dist_trained, cpu.kernel_dist_trained, rtol=RTOL_DEVICES_TRAINED)


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("method", ["fgsm", "pgd", "mim"])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_attacks_on_cuda_match_the_cpu_float64_reference(arch, method, norm):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 12, generator=g, dtype=torch.float64)
    y = torch.arange(40) % 3
    net = Net(arch, X, 64, 3, seed=1, dtype=torch.float64)
    spec = AttackSpec(method, 0.1, steps=4, random_start=True, norm=norm)
    mask = torch.arange(40) < 10
    ref = attack(net, X, y, 3, spec, "ce", mask=mask)
    got = attack(net.to(CUDA), X.to(CUDA), y.to(CUDA), 3, spec, "ce", mask=mask.to(CUDA))
    assert got.device.type == "cuda"
    np.testing.assert_allclose(got.cpu().numpy(), ref.numpy(), rtol=RTOL64, atol=ATOL64)
    assert torch.equal(got[10:].cpu(), X[10:]) and not torch.equal(ref[:10], X[:10])


def _malleability_against(device: str, reference: str = "cpu"):
    """Untrained nets (no training noise to amplify): clean influences agree between devices,
    and each device's rows follow from its own stored influences."""
    cfg = MalleabilityConfig(data=SYN, widths=(64,), seeds=(0,), train=TrainSpec(epochs=0), tau=0.25,
                             attacks=("fgsm", "pgd", "mim"), eps=(0.1,), attack=AttackSpec(steps=3))
    got = run_malleability(cfg, device=device)
    ref = run_malleability(cfg, device=reference)
    rows, ref_rows = got.frames["rows"], ref.frames["rows"]
    assert len(rows) == 6 and list(rows.test_acc) == list(ref_rows.test_acc)
    for r in rows.itertuples():
        key = functools.partial(example_key, r.arch, r.attack, r.eps)   # bound to this row, no closure over r
        before, after, top = (got.arrays[key(w)] for w in ("infl_before", "infl_after", "top_idx"))
        scale = np.abs(ref.arrays[key("infl_before")]).max()
        np.testing.assert_allclose(before, ref.arrays[key("infl_before")], rtol=RTOL_DEVICES_INIT,
                                   atol=RTOL_DEVICES_INIT * scale)
        assert r.flip_rate == np.mean(np.sign(before[top]) != np.sign(after[top]))
        assert np.abs(got.arrays[key("X_pert")] - got.arrays[key("X_clean")]).max() <= 0.1 * (1 + RTOL32)


def test_malleability_on_cuda_matches_cpu():
    _malleability_against("cuda")


def test_torch_device_passes_through():
    assert resolve_device(torch.device("cuda", 0)) == torch.device("cuda", 0)


def test_kernel_steps_on_cuda_refuse_by_the_gpus_free_memory():
    from engine.maths.kinf import infinite_ntk
    from engine.runtime.errors import BadInput

    X = torch.ones(1, 3, device=CUDA).expand(400_000, 3)
    with pytest.raises(BadInput, match=r"needs [\d.]+ GiB on cuda but [\d.]+ GiB is free; it fits up to n = \d+"):
        infinite_ntk(X)


@pytest.mark.parametrize("arch", ["relu", "attn"])
def test_float32_storage_on_cuda_is_the_float64_kernel_rounded_once(arch):
    X = torch.rand(300, 30)
    net = Net(arch, X, 512, 2, seed=1).to(CUDA)
    Xc = X.to(CUDA)
    assert torch.equal(empirical_ntk(net, Xc, chunk=64, storage="float32"), empirical_ntk(net, Xc, chunk=64).float())
