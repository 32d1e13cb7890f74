"""Chart of the retraining check (``engine.experiments.retrain``): how far each kernel's leave-one-out is from the
network's, against width, beside the lazy regime's m^-1/2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import ARCH_COLORS, arch_label, by_arch, for_log_axis

__all__ = ["KERNEL_LABELS", "LOO_LABELS", "RETRAIN_LABELS", "retrain_width_data", "retrain_width_fig"]

RETRAIN_LABELS = {  # agreement metric -> (its name, the axis title of 1 − it)
    "retrain_spearman": ("Spearman ρ", "1 − Spearman ρ (unitless)"),
    "retrain_pearson": ("Pearson r", "1 − Pearson r (unitless)"),
    "retrain_sign_agreement": ("sign agreement", "share of signs that disagree (fraction)"),
}
KERNEL_LABELS = {"entk": "eNTK of the trained net", "kinf": "K∞"}
KERNEL_DASH = {"entk": "solid", "kinf": "dash"}
LOO_LABELS = {"ridge": "Kernel ridge leave-one-out (the engine's influence)",
              "flow": "Kernel gradient descent for the same SGD steps"}


def retrain_width_data(summary: pd.DataFrame, metric: str = "retrain_spearman", pick: str = "top") -> pd.DataFrame:
    """arch, attention, kernel, loo, width, mean and sd of ``metric`` for one ``pick``, with
    ``disagreement`` = 1 − mean and its m^-1/2 reference through the smallest width, per
    (arch, kernel, loo): the table ``retrain_width_fig`` draws."""
    rows = summary[summary["pick"] == pick]
    out = rows[["arch", "attention", "kernel", "loo", "width", f"{metric}_mean", f"{metric}_sd"]].copy()
    out = out.rename(columns={f"{metric}_mean": "mean", f"{metric}_sd": "sd"})
    out = out.sort_values(["loo", "arch", "kernel", "width"]).reset_index(drop=True)
    out["disagreement"] = 1.0 - out["mean"]
    ref = np.full(len(out), np.nan)
    for _, g in out.groupby(["loo", "arch", "kernel"], sort=False):
        w0, v0 = float(g["width"].iloc[0]), float(g["disagreement"].iloc[0])
        ref[g.index] = v0 * np.sqrt(w0 / g["width"].to_numpy(float))
    out["reference_inv_sqrt_m"] = ref
    return out


def retrain_width_fig(data: pd.DataFrame, metric: str = "retrain_spearman") -> go.Figure:
    """1 − agreement against width (log-log), mean ± sd over seeds: one panel per leave-one-out
    (ridge, flow), one line per (arch, kernel: solid eNTK, dashed K∞), and a dotted m^-1/2 line
    through each one's smallest width. The panels share their y-axis."""
    name, axis = RETRAIN_LABELS[metric]
    loos = [lo for lo in LOO_LABELS if lo in set(data["loo"])]
    fig = make_subplots(1, len(loos), subplot_titles=[LOO_LABELS[lo] for lo in loos], shared_yaxes=True,
                        horizontal_spacing=0.06)
    shown = set()
    for col, loo in enumerate(loos, start=1):
        for arch, d_arch in by_arch(data[data["loo"] == loo]):
            color = ARCH_COLORS.get(arch, "#7f7f7f")
            label = arch_label(arch, next((a for a in d_arch["attention"] if isinstance(a, str) and a), None))
            for kernel in [k for k in KERNEL_LABELS if k in set(d_arch["kernel"])]:
                d = d_arch[d_arch["kernel"] == kernel]
                line = f"{label}, {KERNEL_LABELS[kernel]}"
                fig.add_trace(go.Scatter(
                    x=d["width"], y=for_log_axis(d["disagreement"]), mode="lines+markers", name=line,
                    legendgroup=line, showlegend=line not in shown, line=dict(color=color, dash=KERNEL_DASH[kernel]),
                    error_y=dict(type="data", array=d["sd"].fillna(0)), customdata=d["mean"],
                    hovertemplate=f"{line}<br>m = %{{x}}<br>{name} = %{{customdata:.3f}}<extra></extra>"), 1, col)
                fig.add_trace(go.Scatter(
                    x=d["width"], y=for_log_axis(d["reference_inv_sqrt_m"]), mode="lines", name="m^-1/2 reference",
                    legendgroup="reference", showlegend="reference" not in shown,
                    line=dict(color=color, dash="dot", width=1),
                    hovertemplate="m^-1/2 reference<br>%{y:.3g}<extra></extra>"), 1, col)
                shown |= {line, "reference"}
        widths = sorted({int(w) for w in data["width"]})
        fig.update_xaxes(title_text="width m (hidden units)", type="log", tickvals=widths,
                         ticktext=[str(w) for w in widths], row=1, col=col)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title_text=axis, row=1, col=1)
    fig.update_layout(template="plotly_white", height=460, margin=dict(l=60, r=20, t=60, b=130),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), hovermode="closest")
    return fig
