"""Memory honesty of the kernel steps, and float32 kernel storage with its accuracy cost.

Every kernel step checks its peak bytes against the free memory of its device before it
allocates, and refuses with one line: GiB needed, GiB free, the n that fits, and float32
storage where that would fit. Inputs here are real tensors; the huge ones are stride-0
views (``expand``), which hold one element, so the steps see the real sizes.

float32 storage: every block is accumulated in float64 and rounded once into the stored
kernel, so the result is bit for bit the float64 kernel cast to float32, and every solve
downstream reads it in float64. The accuracy cost is then that of one rounding of K
(relative 2⁻²⁴ per entry): leave-one-out influence moves by at most about κ(K + λI)·2⁻²⁴,
checked here on real MNIST digits against numpy's eigenvalues.
"""

from __future__ import annotations

import math
import re
import resource
from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import REL_MEMORY_REREAD_RAW, RTOL64_SAME
from engine.maths.influence import influence_matrix, loo_influence
from engine.maths.kinf import infinite_ntk
from engine.maths.models import Net, TwoLayerReLU
from engine.maths.ntk import NTKMethod, empirical_ntk, empirical_ntk_features
from engine.maths.ridge import kernel_regression, relative_distance, whitened_distance
from engine.maths.spectral import gram_spectrum
from engine.runtime import budget as B
from engine.runtime.errors import BadInput

U32 = 2.0**-24  # unit roundoff of float32
HUGE = 400_000  # points: a float64 kernel of 1.2 TiB, more than any machine this runs on


def _huge(n1: int, n2: int) -> torch.Tensor:
    return torch.ones(()).expand(n1, n2)  # one stored element


MESSAGE = re.compile(r"needs ([\d.]+) GiB on cpu but ([\d.]+) GiB is free; it fits up to n = (\d+)")


def _refusal(fn) -> tuple[str, float, float, int]:
    with pytest.raises(BadInput) as info:
        fn()
    text = str(info.value)
    assert "\n" not in text
    m = MESSAGE.search(text)
    assert m, text
    return text, float(m[1]), float(m[2]), int(m[3])


@pytest.mark.parametrize("step,fn,itemsize", [
    ("empirical NTK", lambda: empirical_ntk_features(TwoLayerReLU(1, 2, 1), torch.ones(HUGE, 1)), 8),
    ("empirical NTK, float32", lambda: empirical_ntk_features(TwoLayerReLU(1, 2, 1), torch.ones(HUGE, 1),
                                                              storage="float32"), 4),
    ("infinite-width NTK", lambda: infinite_ntk(torch.ones(1, 3).expand(HUGE, 3)), 8),
    ("leave-one-out factorisation", lambda: influence_matrix(_huge(HUGE, HUGE), _huge(5, HUGE), torch.ones(HUGE)), 8),
    ("per-class leave-one-out", lambda: loo_influence(_huge(HUGE, HUGE), _huge(5, HUGE), torch.ones(HUGE, 3)), 8),
    ("kernel ridge regression", lambda: kernel_regression(_huge(HUGE, HUGE), _huge(5, HUGE), torch.ones(HUGE), 1e-3),
     16),
    ("whitened distance", lambda: whitened_distance(_huge(HUGE, HUGE), _huge(HUGE, HUGE)), 48),
])
def test_every_kernel_step_refuses_what_cannot_fit_before_allocating(step, fn, itemsize):
    """One line with the GiB needed (at least the n² result), the GiB free, and an n that fits:
    its n x n arrays fit in what is free, and it is not far below what fits."""
    text, need, free, fits = _refusal(fn)
    assert need >= itemsize * HUGE**2 / B.GIB * 0.99, text
    assert need > free, text
    assert itemsize * fits**2 <= free * B.GIB * 1.01, text
    assert itemsize * (2 * fits) ** 2 > free * B.GIB, text  # not absurdly small


def test_the_spectrum_refuses_rows_that_cannot_fit():
    """n <= d: the n x n Gram; its float64 copy of the rows (n x d) dominates what fits."""
    d = 2 * HUGE
    text, need, free, fits = _refusal(lambda: gram_spectrum(_huge(HUGE, d)))
    assert need >= 8 * (HUGE * d + HUGE**2) / B.GIB, text
    assert 8 * fits * d <= free * B.GIB * 1.01 < 8 * 2 * fits * d, text


def test_a_float64_kernel_that_fits_in_float32_offers_float32_storage():
    """n chosen so that the float64 K∞ needs about 1.3x what is free and float32 about 0.65x.
    The address space is capped below the float64 kernel meanwhile, so a check that let the
    allocation through fails here with a RuntimeError instead of exhausting the machine."""
    limit = B.STEP_SHARE * B.free_bytes()
    n = int(math.sqrt(limit / 6))
    X = torch.ones(1, 3).expand(n, 3)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + int(6 * n * n), hard))
    try:
        with pytest.raises(BadInput) as info:
            infinite_ntk(X)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    text = str(info.value)
    m = re.search(r"stored in float32 it needs ([\d.]+) GiB \(storage float32\)", text)
    assert m, text
    assert abs(float(m[1]) - 4 * n * n / B.GIB) < 0.05 * float(m[1]) + 0.1, text


def test_per_class_influence_counts_its_output():
    """loo_influence's (n_test, n, c) result is part of its check: with many test points and
    classes the refusal names the whole."""
    n, nt, c = 20_000, 200_000, 10
    with pytest.raises(BadInput, match=r"for 200000 test points needs") as info:
        loo_influence(_huge(n, n), _huge(nt, n), torch.ones(()).expand(n, c))
    need = float(re.search(r"needs ([\d.]+) GiB", str(info.value))[1])
    assert need * B.GIB >= 8 * nt * n * c  # the output alone: 298 GiB


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def test_an_allocation_that_fails_anyway_is_one_line():
    """Free memory said yes, but the allocation failed (here: an address-space cap of 100 MiB
    more than the process has; the 6000 x 6000 kernel needs 275 MiB): the empirical NTK still
    ends in one BadInput line naming the kernel and what to change, not a traceback."""
    phi, head = torch.randn(6000, 3), TwoLayerReLU(3, 8, 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + 100 * 2**20, hard))
    try:
        with pytest.raises(BadInput, match=r"^out of memory for a 6000 x 6000 kernel at width 8 on cpu with chunk "
                                           r"2048: use a smaller n \(the kernel alone needs 0\.3 GiB\)"):
            empirical_ntk_features(head, phi)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_budget_limits_follow_the_devices_free_memory():
    assert B.free_bytes("cpu") == pytest.approx(B.available_bytes(), rel=REL_MEMORY_REREAD_RAW)
    assert B.Budget().limit_bytes("cpu") == pytest.approx(0.8 * B.available_bytes(), rel=REL_MEMORY_REREAD_RAW)
    assert B.largest(lambda k: k * k, 100, 50) == 10
    assert B.largest(lambda k: k * k, 0, 50) == 0
    B.require(1, "cpu", "one byte")  # fits: no error


# ---------------------------------------------------------------- float32 storage

def _net(arch, n=37, d=6, m=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    return Net(arch, X, m, 3, seed, 1.0, "linear", True), X


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("chunk", [7, 2048])
def test_float32_empirical_ntk_is_the_float64_kernel_rounded_once(arch, chunk):
    net, X = _net(arch)
    Xt = X[:11] + 0.1
    for args in [(X,), (Xt, X)]:
        K64 = empirical_ntk(net, *args, chunk=chunk)
        K32 = empirical_ntk(net, *args, chunk=chunk, storage="float32")
        assert K64.dtype == torch.float64 and K32.dtype == torch.float32
        assert torch.equal(K32, K64.float())
    K64 = empirical_ntk(net, X, method=NTKMethod.AUTOGRAD)
    assert torch.equal(empirical_ntk(net, X, method=NTKMethod.AUTOGRAD, storage="float32"), K64.float())


@pytest.mark.parametrize("chunk", [5, None])
def test_float32_infinite_ntk_is_the_float64_kernel_rounded_once(chunk):
    g = torch.Generator().manual_seed(1)
    X, Xt = torch.randn(40, 7, generator=g, dtype=torch.float64), torch.randn(9, 7, generator=g, dtype=torch.float64)
    for args in [(X,), (Xt, X)]:
        K64 = infinite_ntk(*args, chunk=chunk)
        K32 = infinite_ntk(*args, chunk=chunk, storage="float32")
        assert K32.dtype == torch.float32 and torch.equal(K32, K64.float())
    K32 = infinite_ntk(X, chunk=chunk, storage="float32")
    assert torch.equal(K32, K32.T)  # exactly symmetric in either storage
    np.testing.assert_array_equal(K32.diagonal().numpy(), ((X * X).sum(1) / 2).float().numpy())


def test_unknown_storage_is_one_line_naming_the_choices():
    with pytest.raises(BadInput, match=r"unknown kernel storage 'float16'; allowed: float64, float32"):
        infinite_ntk(torch.ones(3, 2), storage="float16")


def test_solves_on_float32_kernels_run_in_float64():
    """Each downstream step gives bit for bit what it gives on the same kernel cast to
    float64: nothing is solved or accumulated in float32 (that would differ by ~1e-7)."""
    g = torch.Generator().manual_seed(2)
    X = torch.rand(60, 5, generator=g, dtype=torch.float64)
    K32, Kt32 = infinite_ntk(X[:48], storage="float32"), infinite_ntk(X[48:], X[:48], storage="float32")
    Kr = infinite_ntk(X[:48] + 0.01)
    Y = torch.nn.functional.one_hot(torch.arange(48) % 3, 3).double()
    y_test = torch.arange(12) % 3
    assert torch.equal(kernel_regression(K32, Kt32, Y, 1e-3), kernel_regression(K32.double(), Kt32.double(), Y, 1e-3))
    for target in ("true", "margin", "sum"):
        assert torch.equal(influence_matrix(K32, Kt32, Y, 1e-3, target=target, y_test=y_test),
                           influence_matrix(K32.double(), Kt32.double(), Y, 1e-3, target=target, y_test=y_test))
    assert whitened_distance(K32, Kr) == whitened_distance(K32.double(), Kr)
    a, b = K32.double().numpy(), Kr.numpy()
    assert relative_distance(K32, Kr, block=7) == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b),
                                                                rel=RTOL64_SAME)


@pytest.mark.slow
def test_float32_storage_costs_at_most_kappa_times_one_rounding_on_mnist(mnist_dir):
    """The documented accuracy cost on real digits: influence from float32-stored kernels
    differs from float64 by at most κ(K + λI)·2⁻²⁴ (κ from numpy), and MLP-Attn, whose
    kernel is far worse conditioned (κ³), pays far more than 2L-ReLU."""
    from engine.data import DataSpec, load_sample
    from engine.maths.specs import TrainSpec
    from engine.maths.training import n_outputs, train

    sample = load_sample(DataSpec(n=400, n_test=50), mnist_dir)
    X, y, Xt, yt = sample.X.float(), sample.y, sample.X_test.float(), sample.y_test
    Y = torch.nn.functional.one_hot(y, 10).double()
    rel = {}
    for arch in ("relu", "attn"):
        net = Net(arch, X, 512, n_outputs(10), 0, 1.0, "linear", True)
        train(net, X, y, 10, TrainSpec(epochs=3), 0)
        K64, Kt64 = empirical_ntk(net, X), empirical_ntk(net, Xt, X)
        K32, Kt32 = empirical_ntk(net, X, storage="float32"), empirical_ntk(net, Xt, X, storage="float32")
        np.testing.assert_array_less(np.abs(K32.double().numpy() - K64.numpy()), U32 * np.abs(K64.numpy()) + 1e-300)
        lam = 1e-3 * np.mean(np.diag(K64.numpy()))
        ev = np.linalg.eigvalsh(K64.numpy())
        kappa = (ev[-1] + lam) / (max(ev[0], 0.0) + lam)
        I64 = influence_matrix(K64, Kt64, Y, 1e-3, target="true", y_test=yt)
        I32 = influence_matrix(K32, Kt32, Y, 1e-3, target="true", y_test=yt)
        rel[arch] = float(torch.linalg.norm(I32 - I64) / torch.linalg.norm(I64))
        assert 0 < rel[arch] <= kappa * U32, (arch, rel[arch], kappa)
    assert rel["attn"] > 10 * rel["relu"], rel


def test_runs_take_storage_from_their_config(cache, tmp_path):
    """float32 storage is part of the config (and so of the cache key), halves the kernels'
    memory in the estimate, stores the kernel views in float32, and the influence run agrees
    with its float64 twin to the documented cost."""
    from engine.data import DataSpec
    from engine.experiments.configs.influence import InfluenceConfig, estimate_influence
    from engine.experiments.configs.kernels import KernelConfig, estimate_kernels
    from engine.experiments.influence import run_influence
    from engine.experiments.kernels import run_kernels
    from engine.maths.specs import TrainSpec
    from engine.runtime.cache import config_key

    data = DataSpec("synthetic", n=60, n_test=20, synthetic_d=8)
    kc = KernelConfig(data=data, train=TrainSpec(epochs=2), width=32)
    kc32 = replace(kc, storage="float32")
    assert estimate_kernels(kc32).bytes < 0.6 * estimate_kernels(kc).bytes
    r64, r32 = run_kernels(kc, cache), run_kernels(kc32, cache)
    for name in ("K_init", "K_trained", "K_inf"):
        assert r64.arrays[name].dtype == np.float64 and r32.arrays[name].dtype == np.float32
        np.testing.assert_array_equal(r32.arrays[name], r64.arrays[name].astype(np.float32))

    ic = InfluenceConfig(data=data, train=TrainSpec(epochs=2), width=32, seeds=(0,), archs=("relu",))
    ic32 = replace(ic, storage="float32")
    assert estimate_influence(ic32).bytes < estimate_influence(ic).bytes
    a, b = run_influence(ic, cache), run_influence(ic32, cache)
    assert not b.cached and config_key("influence", ic) != config_key("influence", ic32)
    assert b.config["storage"] == "float32" and b.meta["storage"] == "float32" and a.meta["storage"] == "float64"
    I64, I32 = a.arrays["relu_I"], b.arrays["relu_I"]
    assert np.linalg.norm(I32 - I64) <= 1e-3 * np.linalg.norm(I64)
    assert 0 < np.abs(I32 - I64).max()  # the float32 run really stored float32 kernels


# ---------------------------------------------------------------- the counts against measured peaks

PEAK_SCRIPT = r"""
import gc, json, sys
import torch
torch.set_num_threads(1)
from engine.maths import counts, influence, kinf, ntk, ridge, spectral
from engine.maths.models import Net, TwoLayerReLU

step, n = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
d, nt, c, m = 20, 200, 10, 256
f64, f32 = torch.float64, torch.float32


def case(n):
    if step in ("closed", "closed32"):
        phi, head = torch.randn(n, d, generator=g), TwoLayerReLU(d, m, 1, seed=0)
        size = 4 if step == "closed32" else 8
        return (lambda: ntk.empirical_ntk_features(head, phi, storage={4: "float32", 8: "float64"}[size]),
                ntk.closed_ntk_bytes(n, n, m, 2048, True, counts.cpu_count_dtype().itemsize, size))
    if step == "kinf":
        X = torch.randn(n, d, generator=g, dtype=f64)
        return lambda: kinf.infinite_ntk(X), kinf.kinf_bytes(n, n, d, max(1, min(n, 2**21 // n)), True, 8)
    X = torch.randn(n + nt, d, generator=g, dtype=f64)
    Y = torch.randn(n, c, generator=g, dtype=f64)
    if step in ("factor", "factor32"):
        K = kinf.infinite_ntk(X[:n], storage="float32" if step == "factor32" else "float64")
        Kt = kinf.infinite_ntk(X[n:], X[:n])
        return lambda: influence.influence_matrix(K, Kt, Y, 1e-3), influence.factor_bytes(n, nt, c)
    if step == "ridge":
        K, Kt = kinf.infinite_ntk(X[:n]), kinf.infinite_ntk(X[n:], X[:n])
        return lambda: ridge.kernel_regression(K, Kt, Y, 1e-3), ridge.ridge_bytes(n, nt, c)
    if step in ("whitened", "whitened32"):
        K1 = kinf.infinite_ntk(X[:n], storage="float32" if step == "whitened32" else "float64")
        K2 = kinf.infinite_ntk(X[:n] + 0.01)
        return lambda: ridge.whitened_distance(K1, K2), ridge.whitened_bytes(n)
    if step == "spectrum":
        F = torch.randn(n, 2 * n, generator=g)
        return lambda: spectral.gram_spectrum(F), spectral.spectrum_bytes(n, 2 * n)
    if step == "jacobian":
        Xq = torch.rand(n, 12, generator=g)
        net = Net("attn", Xq[:10], 64, 3, attention="qkv")
        P = sum(p.numel() for p in net.parameters())
        return lambda: ntk.empirical_ntk(net, Xq), ntk.jacobian_bytes(n, None, 3, P, 4)


warm, _ = case(64)
warm()  # first calls load kernels and libraries: not the step's own memory
del warm
run, counted = case(n)
gc.collect()


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


try:  # reset the peak (VmHWM) to the current size; ru_maxrss would carry the parent's size over exec
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    reset = True
except OSError:
    reset = False
base, before = status("VmRSS"), status("VmHWM")
run()
after = status("VmHWM")
print(json.dumps({"measured": after - base, "clean": reset or after > before, "counted": counted}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("step,n", [("closed", 4000), ("closed32", 4000), ("kinf", 4000), ("factor", 3000),
                                    ("factor32", 3000), ("ridge", 3000), ("whitened", 2000), ("whitened32", 2000),
                                    ("spectrum", 1500), ("jacobian", 1500)])
def test_each_steps_count_covers_its_measured_peak(step, n):
    """The bytes a step checks against free memory, against the growth of the peak resident
    memory of a fresh process while it runs (one thread, after a warm-up call): never below
    it by more than the library workspace the check keeps free beside every count (MKL's own
    buffers, up to 20 MiB at these sizes on some instruction sets), so what the check lets through
    fits, and not wildly above it, so what fits is not refused."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, step, str(n)], capture_output=True, text=True,
                         cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["clean"], r  # the step's peak is above anything before it, so the growth is its own
    assert r["measured"] <= r["counted"] + B.LIBRARY_WORKSPACE, r
    assert r["counted"] <= 2.5 * r["measured"] + 64 * 2**20, r
