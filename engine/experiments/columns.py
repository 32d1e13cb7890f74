"""The width sweep's and the alignment experiment's rows, declared once.

Each frame a page, ``report`` or the README reads is made of one of these typed rows: a field is a
column, in frame order, and its comment (or, for a charted column, its ``title`` and ``axis``
metadata) says what it is and which function computes it. A page's number is therefore two hops
from its code: the column name (found by grep here) and the function named beside it. The
malleability experiment's rows are ``engine.experiments.flips.FlipRow``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from .._lazy import LazyModule

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows


KERNEL_DIST = "relative kernel distance (unitless)"
WHITENED = "whitened distance (unitless, κ-sensitive)"
GAP = "relative prediction gap (unitless)"
ACC = "test accuracy (% of test points)"


def charted(title: str, axis: str) -> dict[str, str]:
    """The metadata of a field the charts title: its chart title and axis title with units
    (``plots.style.METRICS``)."""
    return {"title": title, "axis": axis}


@dataclass
class KernelReading:
    """One kernel K_m against K∞ on one draw (``engine.experiments.sweep.kernel_metrics``)."""

    kernel_dist: float           # ‖K_m − K∞‖_F / ‖K∞‖_F: engine.maths.ridge.relative_distance
    kernel_dist_whitened: float  # ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂: engine.maths.ridge.whitened_distance
    prediction_gap: float        # ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖: engine.maths.ridge.prediction_gap
    test_acc_kernel: float       # ridge regression with K_m on the test points: engine.maths.ridge.kernel_regression


@dataclass
class SweepRow:
    """One (arch, width, seed) of ``ntk-sweep`` (``engine.experiments.sweep._sweep_group``)."""

    arch: str
    attention: str | None
    width: int
    seed: int
    kernel_dist_init: float = field(metadata=charted(
        "Kernel distance at initialisation: ‖K_m − K∞‖_F / ‖K∞‖_F", KERNEL_DIST))
    kernel_dist_whitened_init: float = field(metadata=charted(
        "Whitened kernel distance at init: ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂", WHITENED))
    prediction_gap_init: float = field(metadata=charted(
        "Kernel-regression prediction gap at init: ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖", GAP))
    test_acc_kernel_init: float = field(metadata=charted("Test accuracy of ridge regression with K_m at init", ACC))
    kernel_dist_trained: float = field(metadata=charted(
        "Kernel distance after training: ‖K_m − K∞‖_F / ‖K∞‖_F", KERNEL_DIST))
    kernel_dist_whitened_trained: float = field(metadata=charted("Whitened kernel distance after training", WHITENED))
    prediction_gap_trained: float = field(metadata=charted("Kernel-regression prediction gap after training", GAP))
    test_acc_kernel_trained: float = field(metadata=charted(
        "Test accuracy of ridge regression with the trained K_m", ACC))
    function_dist: float = field(metadata=charted(
        "Function distance: ‖f_m − f_NTK‖_F on the test points", "function distance (output units)"))
    function_dist_rel: float = field(metadata=charted(  # NaN where ‖f_NTK‖ = 0
        "Relative function distance ‖f_m − f_NTK‖_F / ‖f_NTK‖_F", "relative distance (unitless)"))
    function_dist_rms: float = field(metadata=charted(
        "Function distance per test point (RMS)", "RMS distance (output units)"))
    f_norm: float = field(metadata=charted("Norm of the net's test outputs ‖f_m‖_F", "norm (output units)"))
    f_ntk_norm: float = field(metadata=charted(
        "Norm of the K∞ ridge predictor's test outputs ‖f_NTK‖_F", "norm (output units)"))
    test_acc: float = field(metadata=charted("Test accuracy", ACC))
    train_acc: float = field(metadata=charted("Train accuracy", "train accuracy (% of training points)"))
    test_acc_ntk: float = field(metadata=charted("Test accuracy of K∞ ridge regression", ACC))
    test_acc_kernel: float = field(metadata=charted(
        "Test accuracy of ridge regression with the trained K_m", ACC))  # = _trained
    trained: float = field(metadata=charted("Share of nets that trained (the training gate)", "share of nets"))
    #                            1/0: engine.maths.gates.passes_gate(test_acc, test_acc_kernel); NaN without epochs
    weight_movement: float = field(metadata=charted(
        "Weight movement ‖W_t − W_0‖_F / ‖W_0‖_F", "relative movement (unitless)"))
    final_loss: float = field(metadata=charted("Training loss at the last epoch", "loss"))
    n_test: int                  # test points the function distance is over
    seconds: float               # wall time per width of this (arch, seed) group


SWEEP_METRICS = tuple(f.name for f in fields(SweepRow) if "title" in f.metadata)  # summarised over seeds


@dataclass
class SpectralReading:
    """How one kernel aligns with the targets (``engine.experiments.alignment.kernel_reading``)."""

    align: float  # centred kernel–target alignment A(K, YYᵀ): engine.maths.alignment.centered_alignment
    k90: float    # smallest k with C(k) ≥ 0.9: engine.maths.alignment.power_summary
    auc: float    # area under C(k) against log k over log n: engine.maths.alignment.power_summary


@dataclass
class AlignmentRow:
    """One (draw, arch, width, seed) of ``alignment`` (``engine.experiments.alignment._group``)."""

    data_seed: int
    arch: str
    attention: str | None
    width: int
    seed: int
    align_init: float = field(metadata=charted(
        "Centred kernel–target alignment of K_m at init", "alignment A(K, YYᵀ)"))
    k90_init: float = field(metadata=charted("k at which C(k) reaches 0.9, K_m at init", "k (eigenvectors)"))
    auc_init: float = field(metadata=charted("Area under C(k) against log k, K_m at init", "area (unitless)"))
    test_acc_kernel_init: float = field(metadata=charted("Test accuracy of ridge regression with K_m at init", ACC))
    align_trained: float = field(metadata=charted(
        "Centred kernel–target alignment of the trained K_m", "alignment A(K, YYᵀ)"))
    k90_trained: float = field(metadata=charted("k at which C(k) reaches 0.9, trained K_m", "k (eigenvectors)"))
    auc_trained: float = field(metadata=charted("Area under C(k) against log k, trained K_m", "area (unitless)"))
    test_acc_kernel_trained: float = field(metadata=charted(
        "Test accuracy of ridge regression with the trained K_m", ACC))
    test_acc: float = field(metadata=charted("Test accuracy", ACC))
    train_acc: float = field(metadata=charted("Train accuracy", "train accuracy (% of training points)"))
    kernel_dist_trained: float = field(metadata=charted(
        "Kernel distance after training: ‖K_m − K∞‖_F / ‖K∞‖_F", KERNEL_DIST))
    final_loss: float            # training loss at the last epoch (not summarised)


ALIGNMENT_METRICS = tuple(f.name for f in fields(AlignmentRow) if "title" in f.metadata)


@dataclass
class KinfRow:
    """K∞ of one architecture on one draw (``engine.experiments.alignment._kinf_unit``)."""

    data_seed: int
    arch: str
    align: float
    k90: float
    auc: float
    test_acc_kernel: float


def row_frame(cls: type, rows: list[dict]) -> pd.DataFrame:
    """The frame of typed rows stored as dicts (checkpoints keep dicts): columns in field order; a
    row with a missing or unknown column fails here, where it is made, not on a page."""
    return pd.DataFrame([asdict(cls(**r)) for r in rows], columns=[f.name for f in fields(cls)])


def titles() -> dict[str, tuple[str, str]]:
    """Every charted column's (chart title, axis title), sweep columns first: ``plots.style.METRICS``."""
    out: dict[str, tuple[str, str]] = {}
    for cls in (SweepRow, AlignmentRow):
        for f in fields(cls):
            if "title" in f.metadata:
                out.setdefault(f.name, (f.metadata["title"], f.metadata["axis"]))
    return out
