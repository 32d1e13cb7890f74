"""Thread counts around K∞ (engine.maths.kinf, engine.maths.tiles): restored exactly whatever
runs beside them. Two K∞ computations at once must leave numpy's and scipy's BLAS and torch
on the counts they had, and a thread started while another is inside ``tiles.serial`` must get
the process's torch count, not the one-thread limit of its neighbour."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from conftest import ATOL64, RTOL64
from engine.maths import kinf, tiles
from engine.maths.kinf import infinite_ntk


def _blas_counts():
    import scipy.linalg  # noqa: F401  (scipy's own BLAS is listed once loaded)

    return sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")


@pytest.fixture
def two_threads():
    """torch and the BLAS libraries on two threads (a one-thread limit is then visible)."""
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    with threadpool_limits(limits=2, user_api="blas"):
        yield
    torch.set_num_threads(before)


def _arccos_kernel(A: np.ndarray) -> np.ndarray:
    """The closed form in numpy float64, independent of the engine's blocks and BLAS."""
    G = A @ A.T
    norms = np.linalg.norm(A, axis=1)
    cos = np.clip(G / np.outer(norms, norms), -1.0, 1.0)
    return G * (np.pi - np.arccos(cos)) / (2 * np.pi)


def test_two_kinf_computations_at_once_restore_blas_and_torch_threads(two_threads):
    """Two threads each compute several dsyrk kernels at once (a barrier starts each pair
    together), small ones whose BLAS limit is one thread: afterwards every BLAS library and
    torch are on the counts they had, and each kernel is bit for bit the one computed alone."""
    blas_before, torch_before = _blas_counts(), torch.get_num_threads()
    assert all(n == 2 for _, n in blas_before)
    g = torch.Generator().manual_seed(5)
    inputs = [torch.rand(n, 40, generator=g, dtype=torch.float64) - 0.5 for n in (150, 301, 150, 301)]
    alone = [infinite_ntk(X) for X in inputs]
    start = threading.Barrier(2)
    results: dict[int, list] = {0: [], 1: []}
    errors: list[BaseException] = []

    def work(w):
        try:
            for X in inputs:
                start.wait(timeout=60)
                results[w].append(infinite_ntk(X))
        except BaseException as e:  # noqa: BLE001  (raised in the test below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _blas_counts() == blas_before
    assert torch.get_num_threads() == torch_before
    for w in (0, 1):
        for K, K0 in zip(results[w], alone, strict=True):
            assert torch.equal(K, K0)
    off = ~np.eye(150, dtype=bool)  # the diagonal is |x|²/2 exactly, where arccos(1) is ill-conditioned
    np.testing.assert_allclose(alone[0].numpy()[off], _arccos_kernel(inputs[0].numpy())[off],
                               rtol=RTOL64, atol=ATOL64)


def test_overlapping_blas_limits_restore_exactly(two_threads):
    """The interleaving that lost the count, forced: the first limit is held until the second
    has entered (with the lock: until it has waited a second), and the second is left only
    after the first; the BLAS counts are then the ones found before, not the inner limit's
    one thread."""
    before = _blas_counts()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first():
        with kinf.blas_threads(1):
            first_in.set()
            second_in.wait(timeout=1.0)  # never set with the lock: the second waits for this one
        first_out.set()

    def second():
        first_in.wait()
        with kinf.blas_threads(1):
            second_in.set()
            first_out.wait(timeout=60)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _blas_counts() == before


def test_a_thread_started_inside_serial_gets_the_process_count(two_threads):
    """A thread started (and first asking torch) while another is inside ``tiles.one_thread``
    runs on the process's count, and the serial thread is back on its own count after."""
    inside, seen = threading.Event(), {}
    leave = threading.Event()

    def serial_thread():
        torch.get_num_threads()
        with tiles.one_thread():
            seen["inside"] = torch.get_num_threads()
            inside.set()
            leave.wait(timeout=60)
        seen["after"] = torch.get_num_threads()

    def newcomer():
        seen["newcomer"] = torch.get_num_threads()
        seen["newcomer_kernel"] = infinite_ntk(torch.eye(3, dtype=torch.float64))

    s = threading.Thread(target=serial_thread)
    s.start()
    inside.wait(timeout=60)
    n = threading.Thread(target=newcomer)
    n.start()
    n.join()
    leave.set()
    s.join()
    assert seen["inside"] == 1
    assert seen["newcomer"] == 2
    assert seen["after"] == 2
    assert torch.get_num_threads() == 2
    assert torch.equal(seen["newcomer_kernel"], torch.eye(3, dtype=torch.float64) / 2)


def test_serial_limits_torch_ops_in_its_own_thread_only(two_threads):
    """Inside ``serial`` this thread's torch runs on one thread while another existing thread
    keeps two (per-thread counts, no process-wide state)."""
    other_ready, check, seen = threading.Event(), threading.Event(), {}

    def other():
        torch.get_num_threads()
        other_ready.set()
        check.wait(timeout=60)
        seen["other"] = torch.get_num_threads()

    t = threading.Thread(target=other)
    t.start()
    other_ready.wait(timeout=60)
    with tiles.serial(2**20, "cpu"):
        seen["here"] = torch.get_num_threads()
        check.set()
        t.join()
    assert seen == {"here": 1, "other": 2}
    assert torch.get_num_threads() == 2


def test_small_eigendecompositions_run_on_one_thread_and_large_ones_on_all(two_threads):
    """``tiles.eig_threads``: one thread up to ``SERIAL_EIGH`` (LAPACK's many small parallel regions
    wait on each other there), every thread above it and off the CPU; the result is the same."""
    K = torch.randn(60, 80, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    K = K @ K.T
    with tiles.eig_threads(60, "cpu"):
        inside = torch.get_num_threads()
        mu, _ = torch.linalg.eigh(K)
    assert inside == 1 and torch.get_num_threads() == 2
    torch.testing.assert_close(mu, torch.linalg.eigvalsh(K), rtol=RTOL64, atol=ATOL64 * float(mu.max()))
    with tiles.eig_threads(tiles.SERIAL_EIGH + 1, "cpu"):
        assert torch.get_num_threads() == 2
    with tiles.eig_threads(60, "cuda"):
        assert torch.get_num_threads() == 2
