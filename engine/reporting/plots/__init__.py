"""Plotly figures of experiment results; no streamlit here, so scripts can use them too.

Each chart comes as a pair: ``*_data(...)`` returns the exact table the chart shows (the
dashboard offers it as CSV) and ``*_fig(data)`` draws it. Figures carry axis titles with
units and hover values. Heatmaps never ship more than ``MAX_SIDE`` x ``MAX_SIDE`` cells:
larger matrices are block-averaged (``block_average``) and sent as float32 arrays, which
plotly encodes as binary, not as lists.

One module per family of charts (``kernels``, ``influence``, ``nulls``, ``readings``, ``scaling``, ``regime``,
``retrain``, ``alignment``) over
the shared labels and layout of ``style``; every public name is re-exported here, so callers
write ``plots.spectrum_fig``.
"""

from .alignment import (
    KERNEL_DASH,
    alignment_width_data,
    alignment_width_fig,
    curve_data,
    curve_fig,
    power_data,
    power_fig,
    training_data,
    training_fig,
)
from .influence import (
    before_after_fig,
    compare_bars_fig,
    eps_sweep_fig,
    flip_bars_fig,
    image_grid_fig,
    influence_bar_fig,
    influence_extremes,
    influence_grid_data,
    influence_grid_fig,
    influence_hist_data,
    influence_hist_fig,
    influence_shift_fig,
    interventions_fig,
    spread,
)
from .kernels import (
    block_average,
    class_boundaries,
    distance_data,
    distance_fig,
    kappa_growth_data,
    kappa_growth_fig,
    kernel_diff_data,
    kernel_heatmaps_fig,
    largest_width_log10,
    loss_data,
    loss_fig,
    matrix_data,
    paper_trend_data,
    paper_trend_fig,
    spectrum_data,
    spectrum_fig,
    trajectory_data,
    trajectory_fig,
    width_needed_data,
    width_needed_fig,
)
from .nulls import excess_fig, nulls_fig
from .readings import READING_LABELS, against_ridge_data, against_ridge_fig, excess_width_data, excess_width_fig
from .regime import (
    PARAM_COLORS,
    REGIME_LABELS,
    coord_data,
    coord_fig,
    regime_epoch_data,
    regime_epoch_fig,
    regime_width_data,
    regime_width_fig,
)
from .retrain import KERNEL_LABELS, LOO_LABELS, RETRAIN_LABELS, retrain_width_data, retrain_width_fig
from .scaling import model_label, scaling_data, scaling_fig
from .style import (
    ARCH_COLORS,
    ARCH_LABELS,
    ATTACK_DASH,
    HEIGHT,
    LARGEST_LOG10,
    LARGEST_PARAMS_LOG10,
    MAX_SIDE,
    METRICS,
    PRACTICAL_LOG10,
    SUPERSCRIPTS,
    arch_label,
    eps_label,
    pretty_formula,
)

__all__ = [
    "ARCH_COLORS", "arch_label", "ARCH_LABELS", "ATTACK_DASH", "before_after_fig", "block_average", "class_boundaries",
    "compare_bars_fig", "coord_data", "coord_fig", "distance_data", "distance_fig", "eps_label", "eps_sweep_fig",
    "flip_bars_fig", "HEIGHT", "image_grid_fig", "influence_bar_fig", "influence_extremes",
    "influence_grid_data", "influence_grid_fig", "influence_hist_data", "influence_hist_fig",
    "influence_shift_fig", "interventions_fig", "kappa_growth_data", "kappa_growth_fig",
    "kernel_diff_data", "kernel_heatmaps_fig", "LARGEST_LOG10", "LARGEST_PARAMS_LOG10", "largest_width_log10",
    "loss_data", "loss_fig",
    "matrix_data", "MAX_SIDE", "METRICS", "model_label", "paper_trend_data", "paper_trend_fig",
    "PARAM_COLORS", "PRACTICAL_LOG10", "pretty_formula", "regime_epoch_data", "regime_epoch_fig",
    "REGIME_LABELS", "regime_width_data", "regime_width_fig", "KERNEL_LABELS", "LOO_LABELS", "RETRAIN_LABELS",
    "retrain_width_data", "retrain_width_fig", "READING_LABELS", "against_ridge_data", "against_ridge_fig", "excess_width_data", "excess_width_fig",
    "scaling_data", "scaling_fig",
    "spectrum_data", "spectrum_fig", "spread", "SUPERSCRIPTS", "trajectory_data", "trajectory_fig",
    "width_needed_data", "width_needed_fig",
    "KERNEL_DASH", "alignment_width_data", "alignment_width_fig", "curve_data", "curve_fig", "power_data",
    "power_fig", "training_data", "training_fig", "nulls_fig", "excess_fig",
]
