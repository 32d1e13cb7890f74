"""Bounded work: every run's estimated time and memory, and the budget it must fit.

Each experiment module has ``estimate(cfg) -> Estimate`` beside its run function, built from
all of the config's parameters (n, d, widths, seeds, epochs, attention k or r, attack steps,
ε values). The run refuses, before it starts, work whose estimate exceeds its ``Budget``,
with one line naming what to change. ``python -m engine`` takes ``--max-seconds`` /
``--max-gib`` for deliberate big runs; the dashboard starts runs under ``QUICK_SECONDS`` by
itself and the rest only on a click, never above ``DASHBOARD_SECONDS``.

The rates are calibrated against measured runs on a 2-core CPU (``python -m engine bench
--estimates`` prints estimate / measured side by side); on a GPU the estimate is an upper
bound.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .errors import BadInput
from .memory import GIB, available_bytes, cgroup_free_bytes, free_bytes  # noqa: F401 (re-exported for B.*)

if TYPE_CHECKING:  # annotations only: an estimate loads no torch
    import torch

    from ..data import DataSpec

    Device = str | torch.device | None

FLOPS = 6.0e10          # effective float32 rate of GEMM-bound steps (2 cores, measured by bench --estimates)
FLOPS64 = 2.0e10        # float64 GEMMs, eigendecompositions, Cholesky (2 cores, measured)
STEP_OVERHEAD_S = 1.2e-3 # fixed cost of one optimiser or attack step (Python, autograd, kernel launches)
TRAIN_FLOPS, TRAIN_STEP_S = 1.3e11, 6e-4  # training's GEMM rate and cost per step (fitted: benchmarks/RESULTS.md)
ELEMENT_S = 2e-9        # one activation's elementwise passes per epoch (relu, mask, loss, update; 2 cores, measured)
FIXED_S = 0.1           # loading a cached draw, building the result
SIDE_BY_SIDE = 0.79     # two nets trained side by side on a core each, over the same two in turn on both cores
#                         (the malleability quick preset's pair, 2-core Zen 4 EPYC, 2026-12-07: cores.side_by_side)
QUICK_SECONDS = 30.0    # the dashboard starts runs below this without a click
DASHBOARD_SECONDS = 3600.0  # the dashboard never starts a run above this
DEFAULT_SECONDS = 6 * 3600.0  # the engine's own limit; the CLI can raise it

INPUT_DIMS = {"mnist": 784, "fashion-mnist": 784, "cifar10": 3072}
TORCHVISION_DECODES = ("cifar10",)  # the data sets a run imports torchvision for (MNIST's IDX files are read directly)


@dataclass(frozen=True)
class Estimate:
    seconds: float   # wall time on the reference 2-core CPU
    bytes: int       # peak memory of the largest arrays the run holds at once

    def __add__(self, other: "Estimate") -> "Estimate":
        return Estimate(self.seconds + other.seconds, max(self.bytes, other.bytes))

    def describe(self) -> str:
        return f"about {duration(self.seconds)} and {self.bytes / GIB:.2f} GiB"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Budget:
    seconds: float = DEFAULT_SECONDS
    bytes: int | None = None  # None: 80 % of the memory free on the run's device when it starts

    def limit_bytes(self, device: Device = None) -> int:
        """The bytes a run may use: ``bytes``, else 80 % of the free host memory, and on CUDA
        of the GPU's too (a GPU run still keeps its data and results on the host)."""
        if self.bytes is not None:
            return int(self.bytes)
        free = free_bytes(None)
        if device is not None:  # the host's memory again for cpu; the GPU's for cuda
            free = min(free, free_bytes(device))
        return int(0.8 * free)


DEFAULT_BUDGET = Budget()
UNLIMITED = Budget(seconds=math.inf, bytes=2**62)
MAX_GIB = 1e6  # a --max-gib above a million GiB (an exbibyte) is a typo, not a machine


def _number(value: Any, what: str, allowed: str) -> float:
    if isinstance(value, (bool, bytes)) or value is None:
        raise BadInput(f"{what} must be {allowed}, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise BadInput(f"{what} must be {allowed}, got {value!r}") from None


def gib_limit(value: object, what: str = "--max-gib") -> int:
    """A memory limit given in GiB (``--max-gib``) as bytes: finite, > 0 and at most
    ``MAX_GIB``; one-line ``BadInput`` naming the value otherwise (NaN, inf, 1e300, text)."""
    allowed = f"a number of GiB > 0 and <= {MAX_GIB:g}"
    gib = _number(value, what, allowed)
    if not (math.isfinite(gib) and 0 < gib <= MAX_GIB):
        raise BadInput(f"{what} must be {allowed}, got {value!r}")
    return max(1, int(gib * GIB))


def seconds_limit(value: object, what: str = "--max-seconds") -> float:
    """A time limit in seconds (``--max-seconds``): > 0, ``inf`` meaning no limit; one-line
    ``BadInput`` for NaN (which would compare false with every estimate), zero or less, or text."""
    allowed = "a number of seconds > 0 (inf: no limit)"
    s = _number(value, what, allowed)
    if not s > 0:  # NaN too
        raise BadInput(f"{what} must be {allowed}, got {value!r}")
    return s


def check(est: Estimate, budget: Budget | None, what: str, hint: str = "", device: Device = None) -> None:
    """Refuse work over budget with one line: what it needs, the limit, and what to change.
    ``device``: where the run's arrays live (its free memory is the default limit)."""
    budget = DEFAULT_BUDGET if budget is None else budget
    limit = budget.limit_bytes(device)
    if est.bytes > limit:
        raise BadInput(f"{what} needs about {est.bytes / GIB:.1f} GiB, more than the {limit / GIB:.1f} GiB "
                       f"that fit here; {hint or 'use a smaller n or width'}")
    if est.seconds > budget.seconds:
        raise BadInput(f"{what} would take {duration(est.seconds)}, over the budget of "
                       f"{duration(budget.seconds)}; {hint or 'use fewer widths, seeds or epochs'}"
                       " (the CLI's --max-seconds raises the budget)")


def input_dim(data: DataSpec) -> int:
    """The input dimension a ``DataSpec`` will have, without loading it (784 for unknown files)."""
    base = str(data.dataset).split(":")[0].strip().lower()
    if base == "synthetic":
        return int(data.synthetic_d)
    return INPUT_DIMS[base] if base in INPUT_DIMS else _npz_dim(str(data.dataset))  # a file's header only when asked


def n_classes(data: DataSpec) -> int:
    """Classes a ``DataSpec`` will have, without loading it: 2 for a pair ``NAME:a-b``, the
    synthetic teacher's, 10 for MNIST, Fashion-MNIST and CIFAR-10, and a user ``.npz``'s
    distinct labels (read from its ``y``; 10 when it cannot be read, and loading says why)."""
    base, _, pair = str(data.dataset).partition(":")
    base = base.strip().lower()
    if pair:
        return 2
    if base == "synthetic":
        return int(data.synthetic_classes)
    if base in INPUT_DIMS:
        return 10
    return _npz_classes(str(data.dataset))


def n_outputs(data: DataSpec) -> int:
    """Network outputs for a ``DataSpec``: one (±1 targets) for two classes, one per class otherwise."""
    c = n_classes(data)
    return 1 if c == 2 else c


def head_bytes(m_total: float, n_rows: float, c_out: int) -> int:
    """float32 bytes of the readouts of total width m_total and their outputs on n_rows points:
    weights, gradients and two Adam moments (4 m c), outputs, targets and output gradients (3 n c)."""
    return int(4 * (4 * m_total * c_out + 3 * n_rows * c_out))


def _npz_classes(path: str) -> int:
    import zipfile

    import numpy as np

    try:
        with zipfile.ZipFile(os.path.expanduser(path)) as z:
            info = z.getinfo("y.npy")
            if info.file_size > 64 * 2**20:  # labels of a data set that fits here are far smaller
                return 10
            with z.open(info) as f:
                y = np.lib.format.read_array(f, allow_pickle=False)
        return max(2, int(np.unique(y).size))
    except Exception:  # a missing or odd file fails later, with its own clear error
        return 10


def _npz_dim(path: str) -> int:
    """d of a user .npz's X from its header (no data read); 784 when it cannot be read."""
    import zipfile

    import numpy as np

    try:
        with zipfile.ZipFile(os.path.expanduser(path)) as z, z.open("X.npy") as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape = read(f)[0]
        return int(math.prod(shape[1:])) if len(shape) > 1 else 1
    except Exception:  # a missing or odd file fails later, with its own clear error
        return 784


# ---------------------------------------------------------------- building blocks (seconds)

def gemm_s(m: float, n: float, k: float, double: bool = False) -> float:
    return 2.0 * m * n * k / (FLOPS64 if double else FLOPS)


def eig_s(n: float) -> float:
    """A symmetric eigendecomposition (values only) of an n×n float64 matrix."""
    return 4.0 * n ** 3 / FLOPS64 + 1e-3


def chol_s(n: float) -> float:
    """A Cholesky factor and inverse of an n×n float64 matrix."""
    return 1.5 * n ** 3 / FLOPS64 + 1e-4


def attention_s(attention: str, n: float, d: float) -> float:
    """Attention features over n rows of dimension d for a variant string (``"stacked:3"``): its
    record's FLOP count (``engine.maths.specs.AttentionVariant.flops``) at the float64 GEMM rate."""
    from ..maths.specs import parse_attention  # the records sit above this layer; torch-free

    spec = parse_attention(attention)
    return spec.variant.flops(spec.param, n, d) / FLOPS64


def ntk_s(n1: float, n2: float, d: float, m: float) -> float:
    """Closed-form empirical NTK: sign GEMMs, the count GEMM and the feature Gram."""
    return gemm_s(n1 + n2, m, d) + 0.5 * gemm_s(n1, n2, m) + gemm_s(n1, n2, d) + 3 * n1 * n2 / FLOPS64


def train_s(n: float, d: float, m_total: float, epochs: int, batch: int, n_out: int = 10, nets: int = 1) -> float:
    """Batched training of ``nets`` heads of total width m_total: forward, block-diagonal readout and
    weight-gradient GEMMs at training's rates, and ``ELEMENT_S`` per activation for the relu, mask and
    loss passes (the larger share where d is small: at d = 32 they took twice the GEMMs' time)."""
    steps = epochs * math.ceil(n / batch)
    return (epochs * n * m_total * (2 * (3 * d + 2 * nets * n_out) / TRAIN_FLOPS + ELEMENT_S)
            + steps * TRAIN_STEP_S)


def in_span(n: float, d: float, tr: Any) -> bool:
    """Whether plain SGD on n points of d features trains in their span (``engine.maths.span``): float32
    SGD with n < 2d, where a step's one (B, n)·(n, m) product beats weight space's two (B, d)·(d, m).
    The one rule ``train_masked``, ``train_many``, ``train_pair`` and the estimates follow."""
    return tr.optimizer == "sgd" and getattr(tr, "train_precision", "float32") == "float32" and n < 2 * d


def masked_train_s(n: float, d: float, m_total: float, tr: Any, n_out: int = 10) -> float:
    """``engine.maths.loo.train_masked``'s batched heads: in the features' span (``in_span``) per epoch
    one (n, n)·(n, Σm) product and the readout's at training's GEMM rate, and ``ELEMENT_S`` per activation for the relu, mask and
    update passes (the weights are never formed for the heads' outputs), else ``train_s``."""
    if not in_span(n, d, tr):
        return train_s(n, d, m_total, tr.epochs, tr.batch_size, n_out)
    steps = tr.epochs * math.ceil(n / tr.batch_size)  # a span step is ~15 tensor ops, no autograd
    return tr.epochs * (2 * n * m_total * (n + n_out) / TRAIN_FLOPS + ELEMENT_S * n * m_total) \
        + steps * STEP_OVERHEAD_S / 4


def kernel_bytes(n1: float, n2: float, itemsize: int = 8) -> int:
    return int(itemsize * n1 * n2)


# ---------------------------------------------------------------- one kernel step's memory

STEP_SHARE = 0.95  # share of the free memory one kernel step may allocate
# Kept free beside every step's own count: BLAS/LAPACK's internal buffers and the allocator's
# rounding, which no count sees. A fresh process's peak rose up to 20 MiB above the count of the
# n = 3000 solves (MKL's AVX-512 code path; tests/test_memory.py measures every step against it).
LIBRARY_WORKSPACE = 32 * 2**20

FINITE_BLOCK = 2**20  # elements per block of all_finite: a 1 MiB bool temporary, not one of n x n


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of tensor ``t`` is finite, checked in row blocks of about
    ``FINITE_BLOCK`` elements, so the check allocates at most that many bools rather than one
    per entry (an n x n kernel at n = 3000 would need 9 MB more than its step's count).
    One device sync at the end, not one per block."""
    import torch

    if t.numel() <= FINITE_BLOCK or t.ndim == 0:
        return bool(torch.isfinite(t).all())
    rows = max(1, FINITE_BLOCK // max(1, t[0].numel()))
    ok = torch.ones((), dtype=torch.bool, device=t.device)
    for i in range(0, t.shape[0], rows):
        ok &= torch.isfinite(t[i:i + rows]).all()
    return bool(ok)


def require(need: int, device: Device, what: str, bytes_at: Callable[[int], int] | None = None,
            n: int | None = None, alternative: str = "", alternative_bytes: int | None = None) -> None:
    """Refuse, before it allocates, a kernel step that cannot fit in the free memory of ``device``.

    need: the step's peak bytes, beside which ``LIBRARY_WORKSPACE`` stays free. bytes_at(k): its
    bytes with k points in place of ``n``, to say what fits; ``alternative``: another way out
    (e.g. float32 storage), named only when its ``alternative_bytes`` (if given) fit. One line.
    """
    free = max(0, int(STEP_SHARE * free_bytes(device)) - LIBRARY_WORKSPACE)
    if need <= free:
        return
    if alternative_bytes is not None and alternative_bytes > free:
        alternative = ""
    import torch

    where = torch.device(device).type if device is not None else "cpu"
    ways = []
    if bytes_at is not None and n:
        k = largest(bytes_at, free, n)
        ways.append(f"it fits up to n = {k}" if k else "no n fits")
    if alternative:
        ways.append(alternative)
    raise BadInput(f"{what} needs {need / GIB:.1f} GiB on {where} but {free / GIB:.1f} GiB is free"
                   + (f"; {', or '.join(ways)}" if ways else ""))


def largest(bytes_at: Callable[[int], int], limit: int, n: int) -> int:
    """The largest k <= n with bytes_at(k) <= limit (0 if none); bytes_at must grow with k."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bytes_at(mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo
