"""The infinite-width NTK of the two-layer ReLU head (the arc-cosine kernel of degree 1).

K∞(x, x') = xᵀx' · (π − θ) / (2π) with θ the angle between x and x'. A symmetric float64
kernel on CPU is one BLAS ``dsyrk`` (half of X Xᵀ, at the GEMM rate; scipy's BLAS, with as
many threads as torch has) into K's own memory, then the element-wise passes over
cache-sized square blocks of its lower triangle, each mirrored while in the cache, one torch
thread per Python thread. Other kernels (float32 storage, X1 ≠ X2, CUDA) are computed by
row tiles sized for the cache, the symmetric half once, with their element-wise passes on
one thread for small tiles (``engine.maths.tiles.serial``): a busy machine's thread barrier
costs more than the work there.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import torch

from ..runtime.errors import BadInput
from .ntk import require_kernel, storage_dtype
from .tiles import SERIAL_WORK, one_thread, row_blocks, serial, tile_ranges

_KINF_BLOCK = {"cpu": 2**21, "cuda": 2**26}  # entries per block at most: cache-sized on CPU, large on GPU
_KINF_TILE = 512        # CPU tile rows at most, and _KINF_COLS columns: few GEMM calls (each one waits
_KINF_COLS = 2048       # for every thread on a busy machine), buffers of 8 MiB at most
_KINF_SPLIT = 4         # blocks of rows at least, once tiles of _KINF_MIN_TILE allow it: the symmetric
_KINF_MIN_TILE = 64     # half then skips 3/8 of the GEMM from n = 256 up


def kinf_bytes(n1: int, n2: int, d: int, rows: int, same: bool, itemsize: int) -> int:
    """Peak bytes of ``infinite_ntk``: K, float64 copies of the inputs (and the halved rows), and
    three blocks of at most ``rows`` x n2 (two buffers and a float64 scratch; CPU tiles are
    smaller)."""
    return itemsize * n1 * n2 + 8 * (2 * n1 if same else 2 * n1 + n2) * (d + 1) + 3 * 8 * min(rows, n1) * n2


def _kinf_tiles(n1: int, n2: int, rows: int, device_type: str) -> tuple[int, int]:
    """(rows, columns) per tile of ``infinite_ntk`` with at most ``rows`` rows."""
    if device_type == "cuda":
        return rows, max(1, n2)
    r = max(1, min(rows, _KINF_TILE, max(_KINF_MIN_TILE, -(-max(n1, n2) // _KINF_SPLIT))))
    return r, max(r, _KINF_COLS)


def infinite_ntk(X1: torch.Tensor, X2: torch.Tensor | None = None, chunk: int | None = None,
                 storage: str = "float64") -> torch.Tensor:
    """Infinite-width NTK of the head w.r.t. W, w ~ N(0, σ²I) (independent of σ):

        K∞(x, x') = xᵀx' · (π − θ) / (2π),   θ = arccos(xᵀx' / (|x| |x'|)).

    X1: (n1, d) features (already normalised if the net normalises), X2 likewise or None.
    Returns (n1, n2) in ``storage`` (float64 by default; float32 rounds each float64 entry
    once). Zero rows give zero kernel entries. For X2 = None the result is
    exactly symmetric and its diagonal is exactly ``|x|² / 2`` (θ = 0 there; arccos is
    ill-conditioned at 1, where rounding would cost 1e-8). A symmetric float64 CPU kernel is
    one ``dsyrk`` (``_syrk_kernel``); the others are tiled, ``chunk`` rows per tile at most
    (default: about 2²¹ entries per block on CPU, 2²⁶ on CUDA; CPU tiles are cache-sized
    below that). Besides the output only three tiles (one cache-sized block after
    ``dsyrk``) are held, never a temporary the size of K. The two GEMMs may differ in the
    last bit, so float32 storage is the float64 entries of the tiles rounded once: within a
    float32 ulp of float64 storage's. Not differentiable: inputs are detached.
    """
    dtype = storage_dtype(storage)
    same = X2 is None
    n1, n2, d = X1.shape[0], (X1 if X2 is None else X2).shape[0], X1.shape[1]
    dev = X1.device
    budget = _KINF_BLOCK["cuda" if dev.type == "cuda" else "cpu"]
    if chunk is not None and chunk < 1:
        raise BadInput(f"chunk must be >= 1, got {chunk}")
    rows = max(1, min(n1, budget // max(n2, 1) if chunk is None else chunk))
    require_kernel("infinite-width NTK", n1, n2, dtype, dev,
                    lambda k, size: kinf_bytes(k, k if same else n2, d, rows, same, size))
    A = X1.detach().double()
    B_ = A if X2 is None else X2.detach().double()
    if n1 == 0 or n2 == 0:
        return torch.empty(n1, n2, dtype=dtype, device=dev)
    rA2 = _inverse_norms(A).mul_(2)  # 2/|a|: scales the halved Gram below to the cosine exactly
    rB = rA2 / 2 if same else _inverse_norms(B_)
    if same and dtype == torch.float64 and dev.type == "cpu":
        with serial(n1 * n1 * d, dev.type, SERIAL_WORK, 0):
            return _syrk_kernel(A, rA2, rB)
    K = torch.empty(n1, n2, dtype=dtype, device=dev)
    r, c = _kinf_tiles(n1, n2, rows, dev.type)
    G_buf = torch.empty(r * min(max(r, c), n2), dtype=torch.float64, device=dev)  # the largest tile
    C_buf = torch.empty_like(G_buf)
    S_buf = None if dtype == torch.float64 else torch.empty_like(G_buf)  # float64 diagonal tiles
    # Symmetric case: only the tiles on and right of the diagonal are computed (about half the
    # GEMM and half the arccos) and mirrored below it. Five passes over each tile after its
    # GEMM, in place: cosine (two scalings), clamp, arccos, then xᵀx'/2 · (1 − θ/π). The GEMM
    # halves its own output (alpha = 1/2, exact), so (π − θ)/(2π) needs no pass of its own.
    with serial(n1 * n2 * d, dev.type, SERIAL_WORK, 0):  # small kernels: one thread whole
        for i, i2, j, j2 in tile_ranges(n1, n2, r, c, same):
            G = G_buf[:(i2 - i) * (j2 - j)].view(i2 - i, j2 - j)
            G.addmm_(A[i:i2], B_[j:j2].T, beta=0, alpha=0.5)  # xᵀx'/2; beta = 0: G's old bytes are not read
            C = C_buf[:G.numel()].view_as(G)
            diagonal = same and i == j
            T = S_buf[:G.numel()].view_as(G) if S_buf is not None and diagonal else K[i:i2, j:j2]
            with serial(G.numel(), dev.type):
                _from_gram(G, rA2[i:i2], rB[j:j2], C, out=T)  # float32 K: rounded once here
                if diagonal:
                    C.copy_(T.T)
                    T.add_(C).div_(2)  # the diagonal tile's GEMM is a hair asymmetric
                    _exact_diagonal(T, A[i:i2])
                    if S_buf is not None:
                        K[i:i2, j:j2] = T
                else:
                    if same:
                        K[j:j2, i:i2] = K[i:i2, j:j2].T
    return K


_SYRK_MIN, _SYRK_MAX = 64, 256  # rows of the square blocks of the passes after dsyrk: n / 8 within these
                                # (a diagonal block's upper half is wasted work; 256² entries is 512 KiB)


def _from_gram(G: torch.Tensor, ra: torch.Tensor, rb: torch.Tensor, C: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
    """K∞ of a block from its halved Gram G = xᵀx'/2: ``out`` = G · (1 − θ/π), with the cosine
    G · ra (2/|x|, per row) · rb (1/|x'|, per column) and θ in the scratch C, in five passes
    (``out`` may be G itself)."""
    torch.mul(G, ra[:, None], out=C).mul_(rb).clamp_(-1.0, 1.0).arccos_()  # θ
    return torch.addcmul(G, G, C, value=-1 / math.pi, out=out)


def _exact_diagonal(T: torch.Tensor, rows: torch.Tensor) -> None:
    """Set a diagonal block's diagonal to |x|²/2 exactly (θ = 0 there; arccos of a rounded 1
    would give 1e-8)."""
    T.diagonal().copy_((rows * rows).sum(dim=1) / 2)


@functools.cache
def _blas_controller():
    """scipy's BLAS libraries, found once (threadpoolctl takes milliseconds to list them)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


_BLAS_LOCK = threading.Lock()  # threadpoolctl's limit is process-wide: two overlapping limits would
                               # restore each other's values, leaving BLAS on the inner one's count


@contextlib.contextmanager
def blas_threads(threads: int) -> Iterator[None]:
    """A context in which scipy's BLAS runs on ``threads`` threads (threadpoolctl), as torch's
    own ops do: its default is every core, which beside torch's threads would oversubscribe a
    worker given a share of the machine. One such context at a time in the process, so that
    each restores exactly the counts it found."""
    with _BLAS_LOCK, _blas_controller().limit(limits=threads, user_api="blas"):
        yield


def _syrk_kernel(A: torch.Tensor, rA2: torch.Tensor, rB: torch.Tensor) -> torch.Tensor:
    """The symmetric float64 CPU kernel: ``dsyrk`` writes xᵀx'/2 into K's lower triangle (K is
    C-ordered, so the Fortran upper triangle of K.numpy().T) in one call, the element-wise
    passes run over square blocks of that triangle in the cache, and each block is mirrored
    into the strict upper triangle (exactly symmetric)."""
    from scipy.linalg import blas

    n = A.shape[0]
    K = torch.empty(n, n, dtype=torch.float64)
    An, F = A.contiguous().numpy(), K.numpy().T
    with blas_threads(torch.get_num_threads()):
        out = blas.dsyrk(0.5, An.T, trans=1, lower=0, c=F, beta=0.0, overwrite_c=1)
    if out is not F:  # f2py copied (it does not for a Fortran-ordered float64 c): keep its result
        F[...] = out
    b = max(_SYRK_MIN, min(_SYRK_MAX, n // 8))
    blocks = row_blocks(n, b)
    pairs = [(i, i2, j, j2) for bi, (i, i2) in enumerate(blocks) for j, j2 in blocks[:bi + 1]]
    workers = max(1, min(torch.get_num_threads(), len(pairs) // 4))

    def finish(share):  # the square blocks of the lower triangle, each while it is in the cache
        with one_thread():  # this thread's own count: a pool thread starts with the process's
            _finish(share)

    def _finish(share):
        C_buf = torch.empty(b * b + b, dtype=torch.float64)
        for i, i2, j, j2 in share:
            G = K[i:i2, j:j2]  # a diagonal block's upper part is unused (dsyrk leaves it)
            _from_gram(G, rA2[i:i2], rB[j:j2], C_buf[:G.numel()].view_as(G), out=G)
            if j < i:  # mirrored while in the cache (a strided copy of the whole triangle
                K[j:j2, i:i2] = G.T  # afterwards ran at 15 ns an entry)
            else:
                G.copy_(G.tril() + G.tril(-1).T)
                _exact_diagonal(G, A[i:i2])

    # The passes run on one torch thread each (a barrier per small op costs more than the
    # work), in as many Python threads as torch has, over interleaved shares of the blocks
    # (torch releases the GIL in each op): every block is computed alike whichever thread
    # takes it, so K is bit for bit the same on any thread count.
    with ThreadPoolExecutor(max_workers=max(1, workers - 1)) as pool:
        others = [pool.submit(finish, pairs[w::workers]) for w in range(1, workers)]
        finish(pairs[0::workers])
        for f in others:
            f.result()  # a worker's exception is raised here
    return K


def _inverse_norms(A: torch.Tensor) -> torch.Tensor:
    """1 / |a| per row (n,), 0 for zero rows (their cosine is then 0 and K entries 0)."""
    r = A.norm(dim=1)
    return torch.where(r > 0, 1 / r.clamp_min(1e-300), torch.zeros_like(r))
