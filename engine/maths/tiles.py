"""Row and column tiles of a kernel, and when its element-wise passes run on one thread.

A kernel is computed tile by tile (the symmetric half once when both sides are the same
set). On a busy machine an element-wise pass over a small tile costs more in the OpenMP
thread barrier than in work, so passes over fewer than ``_SERIAL_BELOW`` entries, and whole
kernels under ``SERIAL_WORK`` multiply-adds, run on one thread (``serial``). That limit is the
calling thread's own (OpenMP's and MKL's per-thread counts): ``torch.set_num_threads`` would
also set the count every thread started meanwhile takes for its lifetime.
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..runtime.cores import limit_own_threads, restore_own_threads

_SERIAL_BELOW = 2**21  # element-wise passes over fewer entries run on one thread: every CPU tile (serial)
_GRAIN = 32768         # torch's own grain: smaller element-wise ops run on one thread anyway
SERIAL_WORK = 2**29   # kernels with fewer GEMM multiply-adds (~30 ms on one core) run on one thread whole
# Symmetric eigendecompositions up to this order run on one thread: LAPACK's tridiagonal reduction is a
# long chain of small parallel regions, and with passive waits each wakes the other thread. Measured
# (2-core Zen 4, idle, float64 eigh): n = 199 one thread 3.2 ms, two 13.0 ms; n = 500 32 ms, 53 ms;
# n = 1000 187 ms, 194 ms; n = 2000 1.33 s, 0.88 s (benchmarks/RESULTS.md, "Eigendecompositions").
SERIAL_EIGH = 1000


def row_blocks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) blocks of near-equal sizes <= ``size`` covering range(n)."""
    if n <= 0:
        return []
    k = -(-n // max(1, size))
    step = -(-n // k)
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def tile_ranges(n1: int, n2: int, rows: int, cols: int, same: bool) -> Iterator[tuple[int, int, int, int]]:
    """(i, i2, j, j2) tiles of an (n1, n2) kernel: row blocks of <= ``rows``, each cut into
    column blocks of <= ``cols``. ``same`` (a symmetric kernel): per row block the square
    diagonal tile, then only the columns right of it; the rest is mirrored."""
    for i, i2 in row_blocks(n1, rows):
        if same:
            yield i, i2, i, i2
            yield from ((i, i2, i2 + j, i2 + j2) for j, j2 in row_blocks(n2 - i2, cols))
        else:
            yield from ((i, i2, j, j2) for j, j2 in row_blocks(n2, cols))


class serial:
    """Run the enclosed ops on one thread when ``entries`` < _SERIAL_BELOW (then restored;
    below torch's grain they run on one anyway).

    An element-wise pass over a cache-sized tile takes microseconds; split over OpenMP
    threads on a busy machine it waits at the barrier for a thread the OS has not scheduled
    (measured: 0.97 s against 1.4 ms for K∞'s passes at n = 300 with two threads). Per tile
    only element-wise passes go inside, whose results do not depend on the thread count;
    GEMMs stay on every thread, except in a kernel whose GEMMs are small in all
    (< ``SERIAL_WORK`` multiply-adds, ~30 ms on one core): a small GEMM split over two
    threads waits at the same barrier (K∞ at n = 300: 0.01 of the GEMM rate with two
    threads on a busy machine, 0.24 with one), so such a kernel runs on one thread whole."""

    def __init__(self, entries: int, device_type: str, below: int = _SERIAL_BELOW, grain: int = _GRAIN):
        self.off = (device_type != "cpu" or not grain <= entries < below
                    or torch.get_num_threads() == 1)

    def __enter__(self):
        if not self.off:
            self.saved = limit_own_threads(1)

    def __exit__(self, *exc):
        if not self.off:
            restore_own_threads(self.saved)


def one_thread() -> serial:
    """The enclosed CPU ops run on one thread (the thread count is restored after)."""
    return serial(0, "cpu", below=1, grain=0)


def eig_threads(n: int, device_type: str) -> serial:
    """The enclosed eigendecomposition of an (n, n) matrix runs on one thread when n <= ``SERIAL_EIGH``."""
    return serial(n, device_type, below=SERIAL_EIGH + 1, grain=0)
