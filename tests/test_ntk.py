import math

import numpy as np
import pytest
import scipy.linalg
import torch

from conftest import (
    ATOL32_ONE_PASS,
    ATOL64,
    ATOL64_SAME,
    ATOL_MC_NTK,
    RTOL32_ONE_PASS,
    RTOL64,
    RTOL64_SAME,
    RTOL64_SOLVE,
)
from engine.maths.kinf import infinite_ntk
from engine.maths.models import Net, TwoLayerReLU
from engine.maths.ntk import NTKMethod, empirical_ntk, empirical_ntk_features
from engine.maths.ridge import kernel_regression, prediction_gap, relative_distance, whitened_distance
from engine.runtime.errors import BadInput


def _rand(n, d, seed=0):
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("width,n_out", [(8, 1), (64, 3)])
@pytest.mark.parametrize("chunk", [2, 1000])
def test_closed_form_equals_autograd_jacobians(arch, width, n_out, chunk):
    X, Xt = _rand(9, 5, seed=1), _rand(4, 5, seed=2)
    net = Net(arch, X, width, n_out, seed=3, dtype=torch.float64)
    for X2 in (None, Xt):
        K = empirical_ntk(net, X, X2, chunk=chunk)
        K_ref = empirical_ntk(net, X, X2, method=NTKMethod.AUTOGRAD)
        np.testing.assert_allclose(K.numpy(), K_ref.numpy(), rtol=RTOL64, atol=ATOL64)


def test_symmetric_kernel_is_symmetric_and_psd():
    X = _rand(12, 6)
    net = Net("relu", X, 128, 1, dtype=torch.float64)
    K = empirical_ntk(net, X, chunk=5).numpy()
    np.testing.assert_array_equal(K, K.T)
    assert np.linalg.eigvalsh(K).min() > -1e-12


def test_float32_net_kernel_matches_float64_reference():
    X = _rand(10, 7)
    net32 = Net("relu", X, 256, 2, seed=1)
    net64 = Net("relu", X, 256, 2, seed=1, dtype=torch.float64)
    K32, K64 = empirical_ntk(net32, X), empirical_ntk(net64, X, method="autograd")
    assert K32.dtype == torch.float64
    np.testing.assert_allclose(K32.numpy(), K64.numpy(), rtol=RTOL32_ONE_PASS, atol=ATOL32_ONE_PASS)


def test_infinite_ntk_matches_arccos_formula_elementwise():
    A, B = _rand(5, 4, seed=1) - 0.5, _rand(3, 4, seed=2) - 0.5
    K = infinite_ntk(A, B).numpy()
    a, b = A.numpy(), B.numpy()
    for i in range(5):
        for j in range(3):
            c = a[i] @ b[j] / (np.linalg.norm(a[i]) * np.linalg.norm(b[j]))
            expected = a[i] @ b[j] * (math.pi - math.acos(np.clip(c, -1, 1))) / (2 * math.pi)
            assert K[i, j] == pytest.approx(expected, rel=RTOL64_SAME, abs=ATOL64_SAME)
    np.testing.assert_allclose(np.diag(infinite_ntk(A).numpy()), (a**2).sum(1) / 2, rtol=RTOL64_SAME)


def _arccos_kernel(a, b):
    """The closed form in numpy, all at once (the simplest implementation)."""
    dots = a @ b.T
    norms = np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=1)[None, :]
    cos = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0).clip(-1, 1)
    return dots * (math.pi - np.arccos(cos)) / (2 * math.pi)


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_blocked_infinite_ntk_matches_the_closed_form(chunk):
    A, B = _rand(11, 6, seed=1) - 0.5, _rand(7, 6, seed=2) - 0.5
    A[4] = 0.0  # a zero row: zero kernel entries
    K = infinite_ntk(A, B, chunk=chunk).numpy()
    np.testing.assert_allclose(K, _arccos_kernel(A.numpy(), B.numpy()), rtol=RTOL64, atol=ATOL64)
    K = infinite_ntk(A, chunk=chunk).numpy()
    ref = _arccos_kernel(A.numpy(), A.numpy())
    off = ~np.eye(11, dtype=bool)
    np.testing.assert_allclose(K[off], ref[off], rtol=RTOL64, atol=ATOL64)
    np.testing.assert_array_equal(K, K.T)  # exactly symmetric
    np.testing.assert_array_equal(np.diag(K), (A * A).sum(1).numpy() / 2)  # exact diagonal
    assert not K[4].any()


def test_whitened_distance_matches_the_symmetric_square_root_form():
    Z = torch.nn.functional.normalize(_rand(15, 4, seed=5) - 0.5, dim=1)
    K_inf = infinite_ntk(Z)
    K_m = empirical_ntk_features(TwoLayerReLU(4, 64, 1, seed=0, dtype=torch.float64), Z)
    ridge = 1e-2
    Ki, Km = K_inf.numpy(), K_m.numpy()
    lam = ridge * np.mean(np.diag(Ki))
    S = np.real(scipy.linalg.sqrtm(np.linalg.inv(Ki + lam * np.eye(15))))  # (K∞ + λI)^-½
    expected = np.linalg.norm(S @ (Km - Ki) @ S, 2)
    assert whitened_distance(K_m, K_inf, ridge) == pytest.approx(expected, rel=RTOL64)
    w, V = np.linalg.eigh(Ki + lam * np.eye(15))
    S = (V / np.sqrt(w)) @ V.T
    assert whitened_distance(K_m, K_inf, ridge) == pytest.approx(np.linalg.norm(S @ (Km - Ki) @ S, 2), rel=RTOL64)
    assert whitened_distance(K_inf, K_inf) == 0.0
    with pytest.raises(BadInput, match="ridge"):
        whitened_distance(K_m, K_inf, 0.0)


def test_prediction_gap_matches_numpy_solves():
    Z = torch.nn.functional.normalize(_rand(14, 4, seed=6) - 0.5, dim=1)
    Zt = torch.nn.functional.normalize(_rand(5, 4, seed=7) - 0.5, dim=1)
    head = TwoLayerReLU(4, 32, 1, seed=1, dtype=torch.float64)
    K_m, K_mt = empirical_ntk_features(head, Z), empirical_ntk_features(head, Zt, Z)
    K_inf, K_inft = infinite_ntk(Z), infinite_ntk(Zt, Z)
    Y = _rand(14, 3, seed=8)

    def krr(K, Kt):  # ridge relative to each kernel's own mean diagonal
        lam = 1e-3 * np.mean(np.diag(K))
        return Kt @ np.linalg.solve(K + lam * np.eye(len(K)), Y.numpy())

    f_m, f_inf = krr(K_m.numpy(), K_mt.numpy()), krr(K_inf.numpy(), K_inft.numpy())
    expected = np.linalg.norm(f_m - f_inf) / np.linalg.norm(f_inf)
    assert prediction_gap(K_m, K_mt, K_inf, K_inft, Y) == pytest.approx(expected, rel=RTOL64)
    assert prediction_gap(K_inf, K_inft, K_inf, K_inft, Y) == 0.0


def test_infinite_ntk_is_the_monte_carlo_limit():
    """Average the exact empirical NTK over many random W: it converges to K∞."""
    Z = torch.nn.functional.normalize(_rand(6, 5, seed=4) - 0.3, dim=1)
    K_inf = infinite_ntk(Z)
    width, seeds = 4000, 40
    mc = sum(empirical_ntk_features(TwoLayerReLU(5, width, 1, seed=s, dtype=torch.float64), Z)
             for s in range(seeds)) / seeds
    # Each entry averages 160,000 Bernoulli products; its standard error is below 0.0013.
    np.testing.assert_allclose(mc.numpy(), K_inf.numpy(), atol=ATOL_MC_NTK)
    assert relative_distance(mc, K_inf) < 0.01


def test_init_std_does_not_change_the_limit():
    Z = torch.nn.functional.normalize(_rand(5, 4), dim=1)
    K1 = empirical_ntk_features(TwoLayerReLU(4, 20000, 1, seed=0, init_std=0.01, dtype=torch.float64), Z)
    assert relative_distance(K1, infinite_ntk(Z)) < 0.02


def test_kernel_regression_matches_numpy_solve():
    X = _rand(8, 3)
    K = infinite_ntk(X)
    Kt = infinite_ntk(_rand(2, 3, seed=1), X)
    Y = _rand(8, 2, seed=2)
    lam = 1e-3 * float(K.diagonal().mean())
    expected = Kt.numpy() @ np.linalg.solve(K.numpy() + lam * np.eye(8), Y.numpy())
    np.testing.assert_allclose(kernel_regression(K, Kt, Y, 1e-3).numpy(), expected, rtol=RTOL64_SOLVE)


def test_kernel_distance_falls_like_inverse_sqrt_width():
    Z = torch.nn.functional.normalize(_rand(40, 10) - 0.5, dim=1)
    K_inf = infinite_ntk(Z)
    widths = [16, 64, 256, 1024, 4096]
    dists = [np.mean([relative_distance(empirical_ntk_features(TwoLayerReLU(10, m, 1, seed=s), Z), K_inf)
                      for s in range(4)]) for m in widths]
    slope = np.polyfit(np.log(widths), np.log(dists), 1)[0]
    assert -0.6 < slope < -0.4, slope


@pytest.mark.parametrize("m", [1, 3, 4096, 70_000])
def test_low_precision_counts_are_exact(m):
    from engine.maths.counts import cpu_count_dtype, exact_counts

    g = torch.Generator().manual_seed(m)
    S1, S2 = torch.rand(37, m, generator=g) > 0.5, torch.rand(23, m, generator=g) > 0.3
    exact = S1.long() @ S2.long().T
    dtype = cpu_count_dtype()
    assert torch.equal(exact_counts(S1.to(dtype), S2.to(dtype)).long(), exact)
    assert torch.equal(exact_counts(S1.float(), S2.float()).long(), exact)


# ---------------------------------------------------------------- count paths and tiles

COUNT_PATHS = ("int8", "float32")  # the CPU paths; bf16 is CUDA's (tests/test_cuda.py)


def _numpy_closed_form(phi1, phi2, W):
    """(Φ1 Φ2ᵀ) ∘ (S1 S2ᵀ) / m in float64 numpy, all at once (the simplest implementation)."""
    S1, S2 = (phi1 @ W.T > 0).astype(np.float64), (phi2 @ W.T > 0).astype(np.float64)
    return (phi1 @ phi2.T) * (S1 @ S2.T) / W.shape[0]


@pytest.mark.parametrize("chunk", [7, 2048])
def test_closed_form_is_bit_for_bit_the_same_on_every_count_path(monkeypatch, chunk):
    from engine.maths.counts import COUNT_ENV, count_dtype

    phi = torch.nn.functional.normalize(torch.rand(300, 24, generator=torch.Generator().manual_seed(0)), dim=1)
    phi_t = phi[:37] + 0.01
    head = TwoLayerReLU(24, 520, 1, seed=2)  # m not a multiple of 8, several tiles for n = 300
    kernels = {}
    for path in COUNT_PATHS:
        monkeypatch.setenv(COUNT_ENV, path)
        assert count_dtype("cpu") == getattr(torch, path)
        kernels[path] = [empirical_ntk_features(head, phi, chunk=chunk),
                         empirical_ntk_features(head, phi_t, phi, chunk=chunk),
                         empirical_ntk_features(head, phi, chunk=chunk, storage="float32")]
    for a, b in zip(*kernels.values(), strict=True):
        assert torch.equal(a, b)
    K, K_t, K32 = kernels["int8"]
    assert torch.equal(K, K.T) and torch.equal(K32, K.float())
    ref = _numpy_closed_form(phi.double().numpy(), phi.double().numpy(), head.W.detach().double().numpy())
    # a float32 Gram against float64
    np.testing.assert_allclose(K.numpy(), ref, rtol=RTOL32_ONE_PASS, atol=ATOL32_ONE_PASS)


def test_tiled_closed_form_matches_numpy_in_float64():
    phi = _rand(300, 9, seed=3) - 0.5
    phi2 = _rand(41, 9, seed=4) - 0.5
    head = TwoLayerReLU(9, 64, 1, seed=5, dtype=torch.float64)
    W = head.W.detach().numpy()
    for chunk in (5, 2048):
        K = empirical_ntk_features(head, phi, chunk=chunk).numpy()
        np.testing.assert_allclose(K, _numpy_closed_form(phi.numpy(), phi.numpy(), W), rtol=RTOL64, atol=ATOL64)
        np.testing.assert_array_equal(K, K.T)
        K2 = empirical_ntk_features(head, phi2, phi, chunk=chunk).numpy()
        np.testing.assert_allclose(K2, _numpy_closed_form(phi2.numpy(), phi.numpy(), W), rtol=RTOL64, atol=ATOL64)


def test_count_path_report_says_what_runs_and_why(monkeypatch):
    from engine.maths.counts import COUNT_ENV, count_path_report

    monkeypatch.delenv(COUNT_ENV, raising=False)
    r = count_path_report("cpu")
    assert r["source"] == "measured" and r["count_dtype"] == r["fastest"] in r["rates_gops"]
    assert r["rates_gops"]["float32"] > 0 and r["device"] == "cpu"
    assert r["threads"] == 1  # timed on one thread: two on a busy machine time the barrier instead
    assert set(r["rates_gops"]) | set(r["unavailable"]) == set(COUNT_PATHS)
    monkeypatch.setenv(COUNT_ENV, "float32")
    r = count_path_report("cpu")
    assert r["source"] == COUNT_ENV and r["count_dtype"] == "float32"


@pytest.mark.parametrize("value,match", [("int4", "allowed: auto, int8, float32, bfloat16"),
                                         ("bfloat16", "needs CUDA")])
def test_a_bad_count_path_is_refused_in_one_line(monkeypatch, value, match):
    from engine.maths.counts import COUNT_ENV

    monkeypatch.setenv(COUNT_ENV, value)
    head = TwoLayerReLU(4, 16, 1)
    with pytest.raises(BadInput, match=match) as exc:
        empirical_ntk_features(head, torch.rand(5, 4))
    assert value in str(exc.value) and "\n" not in str(exc.value)


def test_exact_counts_agree_on_every_path_and_shape():
    from engine.maths.counts import exact_counts

    g = torch.Generator().manual_seed(9)
    for n1, m, n2 in ((1, 1, 1), (17, 7, 3), (40, 520, 24)):  # inner sizes below and above int8's minimum
        S1, S2 = torch.rand(n1, m, generator=g) > 0.5, torch.rand(n2, m, generator=g) > 0.4
        exact = S1.long() @ S2.long().T
        for dtype in (torch.int8, torch.float32, torch.float64):
            assert torch.equal(exact_counts(S1.to(dtype), S2.to(dtype)).long(), exact), (n1, m, n2, dtype)


@pytest.mark.parametrize("threads", [1, 2])
def test_tiled_infinite_ntk_matches_the_closed_form_and_keeps_threads(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        A, B = _rand(300, 6, seed=1) - 0.5, _rand(130, 6, seed=2) - 0.5
        A[7] = 0.0
        K = infinite_ntk(A)
        assert torch.get_num_threads() == threads  # the one-thread element-wise passes restore it
        ref = _arccos_kernel(A.numpy(), A.numpy())
        off = ~np.eye(300, dtype=bool)
        np.testing.assert_allclose(K.numpy()[off], ref[off], rtol=RTOL64, atol=ATOL64)
        np.testing.assert_array_equal(K.numpy(), K.numpy().T)
        np.testing.assert_array_equal(np.diag(K.numpy()), (A * A).sum(1).numpy() / 2)
        K2 = infinite_ntk(B, A)
        np.testing.assert_allclose(K2.numpy(), _arccos_kernel(B.numpy(), A.numpy()), rtol=RTOL64, atol=ATOL64)
        for X2, K64 in ((None, K), (A, K2)):  # float32 storage: each float64 entry rounded once
            assert torch.equal(infinite_ntk(A if X2 is None else B, X2, storage="float32"), K64.float())
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("n", [7, 300, 777])
def test_symmetric_float64_kernel_by_dsyrk_matches_the_closed_form_and_the_tiles(n):
    """The symmetric float64 CPU kernel (one BLAS dsyrk, then blocked passes and mirroring)
    against the numpy closed form and the tiled cross kernel K∞(A, A) (MKL's GEMM), with
    block counts from one to many and a zero row; bit for bit the same on 1 and 2 BLAS and
    torch threads, exactly symmetric, and scipy's BLAS thread count left as it was."""
    from threadpoolctl import threadpool_info

    A = _rand(n, 50, seed=n) - 0.5
    A[n // 2] = 0.0
    before = torch.get_num_threads()
    blas_before = [(i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    try:
        kernels = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            kernels.append(infinite_ntk(A))
    finally:
        torch.set_num_threads(before)
    K = kernels[0]
    torch.testing.assert_close(kernels[1], K, rtol=0, atol=0)
    assert [(i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"] == blas_before
    np.testing.assert_array_equal(K.numpy(), K.numpy().T)
    np.testing.assert_array_equal(np.diag(K.numpy()), (A * A).sum(1).numpy() / 2)
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(K.numpy()[off], _arccos_kernel(A.numpy(), A.numpy())[off], rtol=RTOL64, atol=ATOL64)
    # off the diagonal: the cross kernel takes arccos of a rounded 1 there (θ ~ 1e-8, not 0)
    np.testing.assert_allclose(K.numpy()[off], infinite_ntk(A, A).numpy()[off], rtol=RTOL64_SAME, atol=ATOL64_SAME)
    assert not K[n // 2].any()


def test_measured_count_paths_lists_only_devices_already_timed():
    from engine.maths.counts import count_path_report, measured_count_paths

    report = count_path_report("cpu")  # times the CPU paths if this process had not yet
    paths = measured_count_paths()
    assert paths["cpu"]["count_dtype"] == report["count_dtype"]
    if not torch.cuda.is_available():
        assert set(paths) == {"cpu"}  # nothing is timed that no kernel asked for
