"""Charts of the kernel-regime view (``engine.experiments.dynamics``): the gap to the linearised net and to
the K∞ flow against epochs and width, and the ntk / μP coordinate check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import ARCH_COLORS, arch_label, for_log_axis

__all__ = [
    "PARAM_COLORS", "REGIME_LABELS", "coord_data", "coord_fig", "regime_epoch_data", "regime_epoch_fig",
    "regime_width_data", "regime_width_fig"
]

REGIME_LABELS = {  # metric -> (chart title, axis title)
    "lin_gap": ("Distance to the linearised net ‖f_t − f_lin,t‖ / ‖f_lin,t‖", "relative gap (unitless)"),
    "pattern_change": ("Activation signs flipped since init", "share of signs flipped (fraction)"),
    "k_inf_gap": ("Distance to K∞ gradient flow ‖f_t − f_K∞,t‖ / ‖f_K∞,t‖", "relative gap (unitless)"),
    "weight_movement": ("Weight movement ‖W_t − W_0‖ / ‖W_0‖", "relative movement (unitless)"),
    "train_loss": ("Training loss of the net", "loss"),
    "test_acc": ("Test accuracy of the net", "test accuracy (fraction)"),
    "delta_f": ("Output change Δf after t steps (RMS)", "RMS of f_t − f_0 (output units)"),
    "delta_h": ("Pre-activation change Δh after t steps (RMS)", "RMS of φ(W_t − W_0)ᵀ (unitless)"),
}
PARAM_COLORS = {"ntk": "#1f77b4", "mup": "#ff7f0e"}


def _layout(fig: go.Figure, height: int = 400) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=60, r=20, t=70, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=1.04, x=0), hovermode="closest")
    return fig


def _legend_below(fig: go.Figure) -> go.Figure:
    """Legend under the x-axis titles: above the plot it would cover the subplot titles."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=40, b=120))
    return fig


def _shade(i: int, k: int) -> float:
    """Opacity from light (first) to dark (last) of k lines."""
    return 0.35 + 0.65 * (i / max(1, k - 1))


def regime_epoch_data(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    """arch, width, epoch, mean, sd of one metric: the table ``regime_epoch_fig`` draws."""
    out = summary[["arch", "width", "epoch", f"{metric}_mean", f"{metric}_sd"]].copy()
    return out.rename(columns={f"{metric}_mean": "mean", f"{metric}_sd": "sd"})


def regime_epoch_fig(data: pd.DataFrame, metric: str) -> go.Figure:
    """One panel per arch on one shared log y-axis (separate axes would make a curve 10× higher
    look the same): the metric against epochs, one line per width (darker = wider). Zeros
    (epoch 0 of a gap) leave gaps."""
    archs = [a for a in ARCH_COLORS if a in set(data["arch"])]
    fig = make_subplots(1, len(archs), subplot_titles=[arch_label(a) for a in archs], horizontal_spacing=0.06,
                        shared_yaxes=True)
    widths = sorted(data["width"].unique())
    for col, arch in enumerate(archs, start=1):
        for i, w in enumerate(widths):
            d = data[(data["arch"] == arch) & (data["width"] == w)].sort_values("epoch")
            fig.add_trace(go.Scatter(x=d["epoch"], y=for_log_axis(d["mean"]), mode="lines+markers", name=f"m = {w}",
                                     legendgroup=str(w), showlegend=col == 1, opacity=_shade(i, len(widths)),
                                     line=dict(color=ARCH_COLORS[arch]), marker=dict(size=4),
                                     hovertemplate=f"m = {w}<br>epoch %{{x}}<br>%{{y:.3g}}<extra></extra>"), 1, col)
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title_text=REGIME_LABELS[metric][1], row=1, col=1)
    return _legend_below(_layout(fig, 460))


def regime_width_data(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """arch, width, mean, sd at the last epoch and the m^-1/2 reference through the smallest width."""
    out = final[["arch", "width", f"{metric}_mean", f"{metric}_sd"]].copy()
    out = out.rename(columns={f"{metric}_mean": "mean", f"{metric}_sd": "sd"}).sort_values(["arch", "width"])
    ref = []
    for _, g in out.groupby("arch", sort=False):
        w0, v0 = float(g["width"].iloc[0]), float(g["mean"].iloc[0])
        ref += list(v0 * np.sqrt(w0 / g["width"].to_numpy(float)))
    out["reference_inv_sqrt_m"] = ref
    return out.reset_index(drop=True)


def regime_width_fig(data: pd.DataFrame, metric: str) -> go.Figure:
    """The final metric against width (log-log), mean ± sd, with a dotted m^-1/2 line per arch."""
    fig = go.Figure()
    for arch in [a for a in ARCH_COLORS if a in set(data["arch"])]:
        d = data[data["arch"] == arch]
        color = ARCH_COLORS[arch]
        fig.add_trace(go.Scatter(x=d["width"], y=for_log_axis(d["mean"]), mode="lines+markers", name=arch_label(arch),
                                 line=dict(color=color), error_y=dict(type="data", array=d["sd"].fillna(0)),
                                 hovertemplate="m = %{x}<br>%{y:.3g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=d["width"], y=for_log_axis(d["reference_inv_sqrt_m"]), mode="lines",
                                 name=f"{arch_label(arch)}: m^-1/2 reference", line=dict(color=color, dash="dot"),
                                 hovertemplate="m^-1/2 reference<br>%{y:.3g}<extra></extra>"))
    widths = sorted({int(w) for w in data["width"]})
    fig.update_xaxes(title_text="width m (hidden units)", type="log", tickvals=widths, ticktext=[str(w) for w in widths])
    fig.update_yaxes(title_text=REGIME_LABELS[metric][1], type="log", exponentformat="power")
    return _layout(fig)


def coord_data(summary: pd.DataFrame) -> pd.DataFrame:
    """param, width, step and the mean ± sd of Δf and Δh: the table ``coord_fig`` draws."""
    cols = ["param", "width", "step", "delta_f_mean", "delta_f_sd", "delta_h_mean", "delta_h_sd"]
    return summary[cols].sort_values(["param", "step", "width"]).reset_index(drop=True)


def coord_fig(data: pd.DataFrame) -> go.Figure:
    """Δf and Δh against width (log-log), one line per (param, step t), darker = later step."""
    fig = make_subplots(1, 2, subplot_titles=(REGIME_LABELS["delta_f"][0], REGIME_LABELS["delta_h"][0]))
    steps = sorted(data["step"].unique())
    for col, q in enumerate(("delta_f", "delta_h"), start=1):
        for param in [p for p in PARAM_COLORS if p in set(data["param"])]:
            for i, t in enumerate(steps):
                d = data[(data["param"] == param) & (data["step"] == t)].sort_values("width")
                fig.add_trace(go.Scatter(x=d["width"], y=for_log_axis(d[f"{q}_mean"]), mode="lines+markers",
                                         name=f"{param}, t = {t}", legendgroup=f"{param}{t}", showlegend=col == 1,
                                         opacity=_shade(i, len(steps)), line=dict(color=PARAM_COLORS[param]),
                                         hovertemplate=f"{param}, t = {t}<br>m = %{{x}}<br>%{{y:.3g}}<extra></extra>"),
                              1, col)
        fig.update_xaxes(title_text="width m (hidden units)", type="log", row=1, col=col)
        fig.update_yaxes(title_text=REGIME_LABELS[q][1], type="log", exponentformat="power", row=1, col=col)
    return _legend_below(_layout(fig, 480))
