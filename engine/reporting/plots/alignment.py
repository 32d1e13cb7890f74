"""Charts of the task-alignment view (``engine.experiments.alignment``): centred kernel–target
alignment against width, the cumulative power C(k) with the spectrum beside it, learning curves
measured against the spectral theory, alignment along training beside the distance to K∞, and
both halves along training: alignment beside the flip excess at the same snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import ARCH_COLORS, arch_label, for_log_axis

if TYPE_CHECKING:
    from ...runtime.cache import Result

__all__ = [
    "KERNEL_DASH", "alignment_width_data", "alignment_width_fig", "curve_data", "curve_fig", "power_data",
    "power_fig", "training_data", "training_fig"
]

KERNEL_DASH = {"K∞": "dot", "K_m init": "dash", "K_m trained": "solid"}


def _layout(fig: go.Figure, height: int = 420) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=60, r=20, t=50, b=120),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), hovermode="closest")
    return fig


def alignment_width_data(summary: pd.DataFrame, kinf: pd.DataFrame) -> pd.DataFrame:
    """Alignment against width, one row per (arch, kernel, width): mean and sd over (seed, draw).
    K∞ (no width) is repeated at every width, its spread taken over draws."""
    rows = []
    for _, r in summary.iterrows():
        for kernel, col in (("K_m init", "align_init"), ("K_m trained", "align_trained")):
            rows.append({"arch": r["arch"], "kernel": kernel, "width": int(r["width"]),
                         "alignment": r[f"{col}_mean"], "sd": r[f"{col}_sd"], "units": int(r["n_seeds"])})
    for arch, g in kinf.groupby("arch", sort=False):
        for w in sorted(summary["width"].unique()):
            rows.append({"arch": arch, "kernel": "K∞", "width": int(w), "alignment": float(g["align"].mean()),
                         "sd": float(g["align"].std(ddof=1)) if len(g) > 1 else float("nan"), "units": len(g)})
    return pd.DataFrame(rows, columns=["arch", "kernel", "width", "alignment", "sd", "units"])


def alignment_width_fig(data: pd.DataFrame) -> go.Figure:
    """Centred alignment A(K, YYᵀ) against width per architecture and kernel, ± sd bars."""
    fig = go.Figure()
    for (arch, kernel), g in data.groupby(["arch", "kernel"], sort=False):
        g = g.sort_values("width")
        fig.add_trace(go.Scatter(x=g["width"], y=g["alignment"], error_y=dict(type="data", array=g["sd"]),
                                 mode="lines+markers", name=f"{arch_label(arch)}, {kernel}",
                                 line=dict(color=ARCH_COLORS.get(arch), dash=KERNEL_DASH.get(kernel, "solid")),
                                 hovertemplate="m = %{x}<br>A = %{y:.3f}<extra></extra>"))
    fig.update_xaxes(type="log", title="hidden width m (units)")
    fig.update_yaxes(title="alignment A(K, YYᵀ)")
    return _layout(fig)


def power_data(power: pd.DataFrame) -> pd.DataFrame:
    """C(k) and the eigenvalue s_k/n per (arch, kernel, k), averaged over seeds and draws."""
    if power.empty:
        return pd.DataFrame(columns=["arch", "kernel", "k", "C", "C_sd", "eigenvalue"])
    g = power.groupby(["arch", "kernel", "k"], sort=False)
    out = g.agg(C=("C", "mean"), C_sd=("C", "std"), eigenvalue=("eigenvalue", "mean")).reset_index()
    return out


def power_fig(data: pd.DataFrame) -> go.Figure:
    """Left: cumulative power C(k) of the one-hot targets against k (log). Right: the spectrum."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Cumulative power C(k) of the labels",
                                                        "Eigenvalues s_k / n"), horizontal_spacing=0.12)
    for (arch, kernel), g in data.groupby(["arch", "kernel"], sort=False):
        style = dict(color=ARCH_COLORS.get(arch), dash=KERNEL_DASH.get(kernel, "solid"))
        name = f"{arch_label(arch)}, {kernel}"
        fig.add_trace(go.Scatter(x=g["k"], y=g["C"], mode="lines", name=name, line=style, legendgroup=name,
                                 hovertemplate="k = %{x}<br>C = %{y:.3f}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["k"], y=for_log_axis(g["eigenvalue"]), mode="lines", name=name, line=style,
                                 legendgroup=name, showlegend=False,
                                 hovertemplate="k = %{x}<br>λ = %{y:.3g}<extra></extra>"), row=1, col=2)
    fig.update_xaxes(type="log", title="eigenvector index k (decreasing eigenvalue)")
    fig.update_yaxes(title="C(k) (share of ‖Y‖²)", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(type="log", title="eigenvalue s_k / n (kernel units)", row=1, col=2)
    return _layout(fig)


def curve_data(curves: pd.DataFrame) -> pd.DataFrame:
    """Learning curves per (arch, kernel, p): measured mean and sd, theory, averaged over seeds and draws;
    ``measured_se`` the standard error of that average (each unit's trials independent of the others')."""
    if curves.empty:
        return pd.DataFrame(columns=["arch", "kernel", "p", "p_over_n", "measured", "measured_sd", "measured_se",
                                     "theory"])
    g = curves.groupby(["arch", "kernel", "p"], sort=False)
    return g.agg(p_over_n=("p_over_n", "mean"), measured=("measured", "mean"), measured_sd=("measured_sd", "mean"),
                 measured_se=("measured_se", lambda v: float(np.sqrt(np.sum(np.square(v)))) / len(v)),
                 theory=("theory", "mean")).reset_index()


def curve_fig(data: pd.DataFrame) -> go.Figure:
    """Kernel-ridge test error against p: measured (markers ± sd) and the spectral theory (lines)."""
    fig = go.Figure()
    for (arch, kernel), g in data.groupby(["arch", "kernel"], sort=False):
        name = f"{arch_label(arch)}, {kernel}"
        color = ARCH_COLORS.get(arch)
        fig.add_trace(go.Scatter(x=g["p"], y=for_log_axis(g["measured"]), mode="markers", name=f"{name}, measured",
                                 error_y=dict(type="data", array=g["measured_sd"]),
                                 marker=dict(color=color, symbol="circle" if kernel == "K∞" else "diamond"),
                                 hovertemplate="p = %{x}<br>E = %{y:.3g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=g["p"], y=for_log_axis(g["theory"]), mode="lines", name=f"{name}, theory",
                                 line=dict(color=color, dash=KERNEL_DASH.get(kernel, "solid")),
                                 hovertemplate="p = %{x}<br>theory %{y:.3g}<extra></extra>"))
    fig.update_xaxes(type="log", title="training-set size p (points)")
    fig.update_yaxes(type="log", title="test error E_g / E_g(0) (unitless)")
    return _layout(fig)


def training_data(training: pd.DataFrame) -> pd.DataFrame:
    """Alignment and distance to K∞ per (arch, width, epoch), mean and sd over seeds and draws."""
    if training.empty:
        return pd.DataFrame(columns=["arch", "width", "epoch", "alignment", "alignment_sd", "kernel_dist"])
    g = training.groupby(["arch", "width", "epoch"], sort=True)
    return g.agg(alignment=("alignment", "mean"), alignment_sd=("alignment", "std"),
                 kernel_dist=("kernel_dist", "mean")).reset_index()


def training_fig(data: pd.DataFrame) -> go.Figure:
    """Per architecture: alignment of K_m(t) (left axis) and ‖K_m(t) − K∞‖/‖K∞‖ (right axis,
    leaving the kernel regime) against epoch, one line per width."""
    archs = list(dict.fromkeys(data["arch"]))
    fig = make_subplots(rows=1, cols=max(1, len(archs)), subplot_titles=[arch_label(a) for a in archs],
                        specs=[[{"secondary_y": True}] * max(1, len(archs))])
    widths = sorted(data["width"].unique())
    for j, arch in enumerate(archs, start=1):
        for i, w in enumerate(widths):
            g = data[(data["arch"] == arch) & (data["width"] == w)]
            shade = 0.35 + 0.65 * i / max(1, len(widths) - 1)
            fig.add_trace(go.Scatter(x=g["epoch"], y=g["alignment"], mode="lines+markers", opacity=shade,
                                     name=f"alignment, m = {w}", legendgroup=f"a{w}", showlegend=j == 1,
                                     error_y=dict(type="data", array=g["alignment_sd"]),
                                     line=dict(color=ARCH_COLORS.get(arch))), row=1, col=j, secondary_y=False)
            fig.add_trace(go.Scatter(x=g["epoch"], y=g["kernel_dist"], mode="lines", opacity=shade,
                                     name=f"‖K_m − K∞‖/‖K∞‖, m = {w}", legendgroup=f"d{w}", showlegend=j == 1,
                                     line=dict(color="gray", dash="dash")), row=1, col=j, secondary_y=True)
    fig.update_xaxes(title="epoch")
    fig.update_yaxes(title="centred alignment A(K_m(t), YYᵀ)", secondary_y=False)
    fig.update_yaxes(title="distance to K∞ (unitless)", secondary_y=True)
    return _layout(fig)


def both_halves_data(summary: pd.DataFrame) -> pd.DataFrame:
    """The ``flips_training_summary`` frame (``engine.experiments.along.frames``) as drawn: per
    (arch, width, epoch) the alignment (mean, sd), the flip rate, both nulls and the excess with its
    interval; empty columns where the run measured no flips."""
    cols = ["arch", "width", "epoch", "alignment_mean", "alignment_sd", "flip_rate_mean", "null_seed_flip_rate_mean",
            "null_random_flip_rate_mean", "flip_excess", "flip_excess_low", "flip_excess_high", "n_nets"]
    if summary is None or summary.empty:
        return pd.DataFrame(columns=cols)
    return summary[cols].sort_values(["arch", "epoch"], kind="stable").reset_index(drop=True)


def both_halves_fig(data: pd.DataFrame) -> go.Figure:
    """Per architecture (a column each) at the largest width, against epoch: the alignment of K_m(t)
    with the labels above (the power half), and below, on the same epochs, the flip excess of the
    ridge reading on K_m(t) in points of the top-τ share with its 95 % interval beside the larger
    null's own flip rate (the vulnerability half)."""
    archs = list(dict.fromkeys(data["arch"]))
    cols = max(1, len(archs))
    titles = [f"{arch_label(a)}, m = {int(data[data['arch'] == a]['width'].iloc[0])}" for a in archs]
    fig = make_subplots(rows=2, cols=cols, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=titles + [""] * cols)
    for j, arch in enumerate(archs, start=1):
        g = data[data["arch"] == arch]
        color = ARCH_COLORS.get(arch)
        fig.add_trace(go.Scatter(x=g["epoch"], y=g["alignment_mean"], mode="lines+markers",
                                 name="alignment A(K_m(t), YYᵀ) ± sd", legendgroup="a", showlegend=j == 1,
                                 line=dict(color=color), error_y=dict(type="data", array=g["alignment_sd"])),
                      row=1, col=j)
        fig.add_trace(go.Scatter(x=g["epoch"], y=100 * g["flip_excess"], mode="lines+markers",
                                 name="flip excess over the larger null (95 % interval)", legendgroup="e",
                                 showlegend=j == 1, line=dict(color=color, dash="dash"), marker=dict(symbol="diamond"),
                                 error_y=dict(type="data", array=100 * (g["flip_excess_high"] - g["flip_excess"]),
                                              arrayminus=100 * (g["flip_excess"] - g["flip_excess_low"]))),
                      row=2, col=j)
        null = 100 * g[["null_seed_flip_rate_mean", "null_random_flip_rate_mean"]].max(axis=1)
        fig.add_trace(go.Scatter(x=g["epoch"], y=null, mode="lines", name="the larger null's own flip rate",
                                 legendgroup="n", showlegend=j == 1, line=dict(color="gray", dash="dot")),
                      row=2, col=j)
        fig.add_hline(y=0, line=dict(color="black", width=1), row=2, col=j)
    fig.update_xaxes(title="epoch", row=2)
    fig.update_yaxes(title="centred alignment", row=1, col=1)
    fig.update_yaxes(title="points of top-τ", row=2, col=1)
    return _layout(fig, height=560)


def alignment_figure(result: Result, metric: str | None = None) -> go.Figure:
    """The main chart of an ``alignment`` result (``figure alignment``): alignment against width, titled."""
    from ..export import settings_line, titled

    data = alignment_width_data(result.frames["summary"], result.frames["kinf"])
    return titled(alignment_width_fig(data), "Centred kernel–target alignment against width",
                  settings_line(result.config))
