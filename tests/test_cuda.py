"""CUDA code paths; every test here skips on a machine without a GPU (CI has none)."""

import numpy as np
import pytest
import torch

from conftest import requires_cuda
from engine.data import DataSpec
from engine.device import resolve_device
from engine.experiments import SweepConfig, run_ntk_sweep
from engine.malleability import MalleabilityConfig, run_malleability
from engine.models import Net, TwoLayerReLU, normalize_rows
from engine.ntk import _counts, empirical_ntk, empirical_ntk_features
from engine.training import TrainSpec

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
    got = _counts(S1.to(CUDA, torch.bfloat16), S2.to(CUDA, torch.bfloat16))
    assert torch.equal(got.cpu().long(), exact)


@pytest.mark.parametrize("arch", ["relu", "attn"])
def test_cuda_kernel_matches_the_cpu_float64_reference(arch):
    X = torch.rand(50, 30, dtype=torch.float64)
    net64 = Net(arch, X, 512, 2, seed=1, dtype=torch.float64)
    net = Net(arch, X, 512, 2, seed=1).to(CUDA)
    K = empirical_ntk(net, X.to(CUDA).float(), chunk=16).cpu()
    K_ref = empirical_ntk(net64, X, method="autograd")
    np.testing.assert_allclose(K.numpy(), K_ref.numpy(), rtol=1e-5, atol=1e-6)


def test_twenty_thousand_points_fit_and_agree_on_a_block():
    phi = normalize_rows(torch.rand(20_000, 784, device=CUDA))
    head = TwoLayerReLU(784, 4096, 1, seed=0).to(CUDA)
    K = empirical_ntk_features(head, phi)
    assert K.shape == (20_000, 20_000)
    block = empirical_ntk_features(head.double(), phi[:300].double())
    torch.testing.assert_close(K[:300, :300], block, rtol=1e-5, atol=1e-6)


def test_sweep_on_cuda_matches_cpu():
    cfg = SweepConfig(data=SYN, widths=(32, 256), train=TrainSpec(epochs=3, batch_size=32))
    cpu = run_ntk_sweep(cfg, device="cpu").frames["rows"]
    gpu = run_ntk_sweep(cfg, device="cuda").frames["rows"]
    assert gpu.shape == cpu.shape
    np.testing.assert_allclose(gpu.kernel_dist_init, cpu.kernel_dist_init, rtol=1e-3)
    np.testing.assert_allclose(gpu.kernel_dist_trained, cpu.kernel_dist_trained, rtol=1e-2)


def test_malleability_runs_on_cuda():
    cfg = MalleabilityConfig(data=SYN, width=64, train=TrainSpec(epochs=3), attacks=("fgsm", "pgd", "mim"),
                             eps=(0.1,), steps=3)
    rows = run_malleability(cfg, device="cuda").frames["rows"]
    assert len(rows) == 6 and rows.flip_rate.between(0, 1).all()
