"""The causal design along training (``engine.experiments.along``): the flip excess at every snapshot,
one line per (influence kernel, attacker), a panel per architecture."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import arch_label

__all__ = ["ATTACKER_DASH", "KERNEL_COLOURS", "design_data", "design_fig"]

KERNEL_COLOURS = {"K_m(0)": "#0072B2", "K_m(t)": "#D55E00", "K∞": "#009E73"}  # Okabe–Ito: kernel by colour
ATTACKER_DASH = {"epoch 0": "dot", "epoch t": "solid"}                       # attacker by line style


def design_data(summary: pd.DataFrame | None) -> pd.DataFrame:
    """The ``flips_design_summary`` rows in points: arch, epoch, kernel, attacker, excess and its interval."""
    cols = ["arch", "epoch", "kernel", "attacker", "excess", "low", "high", "nets", "draws"]
    if summary is None or summary.empty:
        return pd.DataFrame(columns=cols)
    d = summary.sort_values(["arch", "kernel", "attacker", "epoch"])
    return pd.DataFrame({"arch": d["arch"], "epoch": d["epoch"], "kernel": d["kernel"], "attacker": d["attacker"],
                         "excess": 100 * d["flip_excess"], "low": 100 * d["flip_excess_low"],
                         "high": 100 * d["flip_excess_high"], "nets": d["n_nets"], "draws": d["n_draws"]},
                        columns=cols).reset_index(drop=True)


def design_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """Flip excess (points) against the snapshot epoch: colour the kernel that reads the influence,
    dotted where the attack climbs the epoch-0 net's loss and solid where it climbs the epoch-t net's;
    bars the 95 % interval (data draws the unit). A line that follows its colour's neighbours moves with
    the kernel; one that follows its dash moves with the attacker."""
    archs = list(dict.fromkeys(data["arch"]))
    fig = make_subplots(rows=1, cols=max(1, len(archs)), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[arch_label(a, attention if a == "attn" else None) for a in archs])
    for i, arch in enumerate(archs, start=1):
        for (kernel, attacker), d in data[data["arch"] == arch].groupby(["kernel", "attacker"], sort=False):
            fig.add_trace(go.Scatter(
                x=d["epoch"], y=d["excess"], mode="lines+markers", name=f"{kernel} read, {attacker} net attacked",
                legendgroup=f"{kernel}|{attacker}", showlegend=i == 1,
                line=dict(color=KERNEL_COLOURS.get(kernel, "black"), dash=ATTACKER_DASH.get(attacker, "solid")),
                error_y=dict(type="data", symmetric=False, array=d["high"] - d["excess"],
                             arrayminus=d["excess"] - d["low"], thickness=1),
                hovertemplate=f"{kernel}, {attacker}<br>epoch %{{x}}: %{{y:+.0f}} points<extra></extra>"),
                row=1, col=i)
        fig.update_xaxes(title_text="epoch t", row=1, col=i)
    fig.add_hline(y=0, line=dict(color="grey", width=1))
    fig.update_yaxes(title_text="flip excess over the larger null (points)", row=1, col=1)
    fig.update_layout(template="plotly_white", height=460, margin=dict(l=60, r=20, t=60, b=130),
                      title=dict(text="What the flip excess follows along training: the kernel or the attacker",
                                 x=0.01),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), hovermode="closest")
    return fig
