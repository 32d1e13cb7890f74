"""engine.maths.counts: exact counts and their float64 product on every path, bit for bit against
numpy, and the probe that picks the path at a kernel's tile shape."""

import numpy as np
import pytest
import torch

from engine.maths import counts
from engine.maths.counts import COUNT_ENV, count_dtype, count_path_report, count_product, exact_counts, gemm_counts

PATHS = (torch.int8, torch.float32, torch.float64)  # the CPU count dtypes (bf16 is CUDA's: tests/test_cuda.py)
# (n1, m, n2): one entry; inner sizes below int8's minimum and not a multiple of 8; more rows than
# one GEMM block of exact_counts (256) with a remainder; tiles whose product runs in several passes
# (more than 2¹⁸ entries)
SHAPES = ((1, 1, 1), (17, 7, 3), (40, 520, 24), (601, 33, 45), (300, 100, 1100), (700, 9, 390))


def _signs(n, m, seed, p=0.5):
    return torch.rand(n, m, generator=torch.Generator().manual_seed(seed)) > p


def _numpy_counts(S1, S2):
    """S1 S2ᵀ in int64 numpy: the reference, integer maths."""
    return S1.numpy().astype(np.int64) @ S2.numpy().astype(np.int64).T


@pytest.mark.parametrize("n1,m,n2", SHAPES)
def test_exact_counts_are_numpys_integers_on_every_path(n1, m, n2):
    S1, S2 = _signs(n1, m, n1), _signs(n2, m, n2 + 1, 0.3)
    ref = _numpy_counts(S1, S2).astype(np.float64)
    for dtype in PATHS:
        C = exact_counts(S1.to(dtype), S2.to(dtype))
        assert C.dtype == torch.float64
        np.testing.assert_array_equal(C.numpy(), ref, err_msg=str(dtype))
        K = torch.full((n1 + 3, n2 + 5), -1.0, dtype=torch.float64)  # into a strided view, nothing else touched
        exact_counts(S1.to(dtype), S2.to(dtype), out=K[2:n1 + 2, 1:n2 + 1])
        np.testing.assert_array_equal(K[2:n1 + 2, 1:n2 + 1].numpy(), ref)
        assert (K[:2] == -1).all() and (K[n1 + 2:] == -1).all() and (K[:, :1] == -1).all() and (K[:, n2 + 1:] == -1).all()


@pytest.mark.parametrize("n1,m,n2", SHAPES)
def test_count_product_is_numpys_float64_product_bit_for_bit(n1, m, n2):
    """float64(G) · float64(count) / m, each operation rounded once, as numpy's float64 does."""
    S1, S2 = _signs(n1, m, 2 * n1), _signs(n2, m, 2 * n2 + 1)
    counts_ref = _numpy_counts(S1, S2).astype(np.float64)
    for gdtype in (torch.float32, torch.float64):
        G = torch.randn(n1, n2, generator=torch.Generator().manual_seed(m), dtype=gdtype)
        ref = G.numpy().astype(np.float64) * counts_ref / m
        for dtype in PATHS:
            out = torch.empty(n1, n2, dtype=torch.float64)
            assert count_product(G, S1.to(dtype), S2.to(dtype), out) is out
            np.testing.assert_array_equal(out.numpy(), ref, err_msg=f"{dtype}, G {gdtype}")


def test_count_product_reuses_its_buffers_across_tiles_of_a_kernel():
    """Tiles of several sizes through one work dict into views of one K: the numpy kernel."""
    n, m = 530, 77
    S = _signs(n, m, 5)
    G = torch.randn(n, n, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    ref = G.numpy() * _numpy_counts(S, S).astype(np.float64) / m
    for dtype in PATHS:
        K, work = torch.empty(n, n, dtype=torch.float64), {}
        for i, i2, j, j2 in ((0, 10, 0, n), (10, 400, 0, 17), (10, 400, 17, n), (400, n, 0, n)):
            count_product(G[i:i2, j:j2], S[i:i2].to(dtype), S[j:j2].to(dtype), K[i:i2, j:j2], work)
        np.testing.assert_array_equal(K.numpy(), ref, err_msg=str(dtype))
        assert set(work) == {"counts", "float64"}


def test_gemm_counts_writes_into_a_buffer_of_its_dtype_only():
    S1, S2 = _signs(9, 64, 1).to(torch.int8), _signs(5, 64, 2).to(torch.int8)
    ref = _numpy_counts(S1, S2)
    buf = torch.empty(9, 5, dtype=torch.int32)
    assert gemm_counts(S1, S2, buf).data_ptr() == buf.data_ptr()
    np.testing.assert_array_equal(buf.numpy(), ref)
    wrong = torch.empty(9, 5, dtype=torch.float32)  # not int8's counts: a fresh result, the buffer untouched
    wrong.fill_(-1)
    np.testing.assert_array_equal(gemm_counts(S1, S2, wrong).numpy(), ref)
    assert (wrong == -1).all()


def test_the_probe_times_a_block_of_the_tile_and_keeps_float32_unless_another_path_wins(monkeypatch):
    monkeypatch.delenv(COUNT_ENV, raising=False)
    tile = (300, 1536, 700)
    dtype = count_dtype("cpu", tile)
    report = count_path_report("cpu")
    block = counts._label(counts._probe_block(tile))
    assert block == "128 x 1536 @ 1536 x 512 0/1"  # the tile's width; rows and columns scaled to powers of 2
    shape = report["shapes"][block]
    rates = shape["rates_gops"]
    assert set(rates) == set(report["rates_gops"]) and all(r > 0 for r in rates.values())
    assert str(dtype).removeprefix("torch.") == shape["fastest"]
    best = max(rates, key=lambda k: rates[k])
    assert shape["fastest"] == (best if rates[best] >= counts._MARGIN * rates["float32"] else "float32")
    assert count_dtype("cpu", tile) == dtype and count_path_report("cpu")["shapes"][block] == shape  # timed once
    assert counts._probe_block((512, 70_000, 4000)) == (128, 8192, 1024)  # a bounded block however large
    assert counts._probe_block((10, 5, 3)) == (8, 5, 2)
    monkeypatch.setenv(COUNT_ENV, "float32")
    assert count_dtype("cpu", (64, 99, 64)) == torch.float32  # a forced path whatever the tile
    assert "64 x 99 @ 99 x 64 0/1" not in count_path_report("cpu")["shapes"]  # and nothing timed for it
