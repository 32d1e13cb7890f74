"""The width sweep's and the alignment experiment's columns are declared once
(``engine.experiments.columns``): the frames a run makes are exactly the typed rows' fields, the
summaries summarise exactly the charted ones, the chart titles come from the same declaration, and
the per-row numbers agree with an independent recomputation from the kernels."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.data import DataSpec
from engine.experiments.columns import (
    ALIGNMENT_METRICS,
    SWEEP_METRICS,
    AlignmentRow,
    KinfRow,
    SweepRow,
    row_frame,
    titles,
)
from engine.maths.specs import TrainSpec

ROOT = Path(__file__).resolve().parents[1]
SYN = DataSpec(dataset="synthetic", n=40, n_test=20, synthetic_d=16, synthetic_kappa=10.0)


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def test_a_row_with_an_unknown_or_missing_column_fails_where_it_is_made():
    with pytest.raises(TypeError, match="kernel_distance"):
        row_frame(KinfRow, [{"data_seed": 0, "arch": "relu", "align": 0.1, "k90": 3.0, "auc": 0.5,
                             "test_acc_kernel": 0.9, "kernel_distance": 1.0}])
    with pytest.raises(TypeError, match="test_acc_kernel"):
        row_frame(KinfRow, [{"data_seed": 0, "arch": "relu", "align": 0.1, "k90": 3.0, "auc": 0.5}])
    assert list(row_frame(KinfRow, []).columns) == _names(KinfRow)  # an empty frame keeps its columns


def test_the_sweep_frames_are_its_declared_rows():
    # the numbers themselves against numpy: tests/test_experiments.py::test_sweep_rows_match_an_independent_numpy_computation
    from engine.experiments.configs.sweep import SweepConfig
    from engine.experiments.sweep import run_ntk_sweep

    cfg = SweepConfig(data=SYN, widths=(16, 32), seeds=(0,), train=TrainSpec(epochs=0))
    res = run_ntk_sweep.compute(cfg, None, torch.device("cpu"), None, None)
    rows, summary = res.frames["rows"], res.frames["summary"]
    assert list(rows.columns) == _names(SweepRow)
    assert {f"{m}_mean" for m in SWEEP_METRICS} <= set(summary.columns)
    assert not {"n_test_mean", "seconds_mean"} & set(summary.columns)  # bookkeeping is not summarised
    # zero epochs: each "after training" column is its "at init" twin, name for name
    for name in _names(SweepRow):
        if name.endswith("_init"):
            np.testing.assert_array_equal(rows[name], rows[name.replace("_init", "_trained")])
    assert (rows["test_acc_kernel"] == rows["test_acc_kernel_trained"]).all()


def test_the_alignment_rows_are_declared_and_their_summary_is_the_charted_columns():
    from engine.experiments.alignment import run_alignment
    from engine.experiments.configs.alignment import AlignmentConfig

    cfg = AlignmentConfig(data=SYN, train=TrainSpec(epochs=2, snapshot_epochs=(0, 2)), widths=(32,),
                          seeds=(0,), curve_ns=(10, 20), curve_trials=2)
    res = run_alignment.compute(cfg, None, torch.device("cpu"), None, None)
    assert list(res.frames["rows"].columns) == _names(AlignmentRow)
    assert list(res.frames["kinf"].columns) == _names(KinfRow)
    assert {f"{m}_mean" for m in ALIGNMENT_METRICS} <= set(res.frames["summary"].columns)
    assert "final_loss_mean" not in res.frames["summary"].columns


def test_every_column_a_page_or_figure_names_is_declared_with_its_title():
    # the style's titles are the declarations' (plots.style.METRICS = columns.titles()); what can go
    # wrong is a page or a protocol naming a column that no row declares, or one without a title
    from engine.reporting.plots.style import METRICS
    from engine.reporting.protocols import KERNEL_METRICS
    from ui.links import NTK_COLUMNS

    assert METRICS == titles()
    named = {c for pair in NTK_COLUMNS.values() for c in pair} | {col for col, _ in KERNEL_METRICS.values()}
    named |= {"train_acc", "test_acc", "function_dist_rel"}  # the NTK page's other charts
    assert named <= set(_names(SweepRow)) and named <= set(METRICS)
    assert all(title and axis for title, axis in METRICS.values())


def test_no_engine_module_assembles_a_declared_column_name():
    # a column made by an f-string (f"kernel_dist_{suffix}") cannot be found by grep: the declared
    # rows name every column in full, and their builders pass them as keywords
    stems = {re.sub(r"_(init|trained)$", "", n) for cls in (SweepRow, AlignmentRow) for n in _names(cls)
             if n.endswith(("_init", "_trained"))}
    pattern = re.compile(r'f"(%s)_\{' % "|".join(sorted(stems)))
    for path in sorted((ROOT / "engine").rglob("*.py")):
        hits = pattern.findall(path.read_text())
        assert not hits, f"{path.relative_to(ROOT)} assembles {hits}"
