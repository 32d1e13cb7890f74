"""The malleability run read three ways, against width: does malleability fall as a net enters its
kernel regime, and does each reading say so?

``excess_width_data`` returns the table the chart shows (one row per architecture, reading and
width at one attack and ε: the flip excess over the larger null with its 95 % interval, the flip
rate and both nulls, in percent); ``excess_width_fig`` draws it: one colour per architecture, one
dash per reading, the interval as error bars and the larger null's level as a band per
architecture (flips below it need no attack). Nothing is averaged here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import ARCH_COLORS, arch_label, styled, width_ticks

__all__ = ["READING_LABELS", "against_ridge_data", "against_ridge_fig", "draw_gaps_data", "draw_gaps_fig",
           "excess_width_data", "excess_width_fig"]

READING_LABELS = {"ridge": "ridge LOO (kernel)", "flow": "gradient flow (kernel)", "retrain": "retraining (network)"}
READING_DASH = {"ridge": "dot", "flow": "dash", "retrain": "solid"}
COLUMNS = ("flip_rate", "null_seed_flip_rate", "null_random_flip_rate", "flip_excess")


def excess_width_data(summary: pd.DataFrame, attack: str, eps: float) -> pd.DataFrame:
    """Rows of ``summary`` (a malleability summary) at one attack and ε, in percent, sorted by width."""
    d = summary[(summary["attack"] == attack) & np.isclose(summary["eps"].astype(float), eps)]
    out = d[["arch", "reading", "width"]].copy()
    for c in COLUMNS:
        out[c] = 100.0 * pd.to_numeric(d[f"{c}_mean"], errors="coerce")
    out["flip_excess_low"] = 100.0 * pd.to_numeric(d["flip_excess_low"], errors="coerce")
    out["flip_excess_high"] = 100.0 * pd.to_numeric(d["flip_excess_high"], errors="coerce")
    out["larger_null"] = out[["null_seed_flip_rate", "null_random_flip_rate"]].max(axis=1)
    return out.sort_values(["arch", "reading", "width"]).reset_index(drop=True)


def excess_width_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """Flip excess (% points) against width (log), a line per (architecture, reading)."""
    fig = go.Figure()
    for (arch, reading), g in data.groupby(["arch", "reading"], sort=False):
        label = f"{arch_label(arch, attention)}, {READING_LABELS.get(reading, reading)}"
        mid, lo, hi = g["flip_excess"], g["flip_excess_low"], g["flip_excess_high"]
        fig.add_trace(go.Scatter(
            x=g["width"], y=mid, name=label, mode="lines+markers",
            line=dict(color=ARCH_COLORS.get(arch, "black"), dash=READING_DASH.get(reading, "solid")),
            error_y=dict(type="data", array=(hi - mid).clip(lower=0), arrayminus=(mid - lo).clip(lower=0),
                         visible=True),
            customdata=np.stack([lo, hi, g["flip_rate"], g["null_seed_flip_rate"], g["null_random_flip_rate"]],
                                axis=1),
            hovertemplate=(f"{label}<br>m = %{{x}}<br>excess %{{y:.1f}} [%{{customdata[0]:.1f}}, "
                           "%{customdata[1]:.1f}]<br>flip rate %{customdata[2]:.1f} %, seed null "
                           "%{customdata[3]:.1f} %, random null %{customdata[4]:.1f} %<extra></extra>")))
    for arch, g in data.groupby("arch", sort=False):  # the nulls' level: what no attack already flips
        level = g.groupby("width")["larger_null"].max()
        fig.add_trace(go.Scatter(x=list(level.index) + list(level.index[::-1]),
                                 y=list(level.values) + [0.0] * len(level), fill="toself", mode="none",
                                 fillcolor=ARCH_COLORS.get(arch, "grey"), opacity=0.12, hoverinfo="skip",
                                 name=f"{arch_label(arch, attention)}: larger null (flip rate)"))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    widths = sorted(data["width"].unique())
    out = styled(fig, "width m", "flip excess over the larger null (% points)", logx=True)
    width_ticks(out, widths)
    return out


def against_ridge_data(aggregate: pd.DataFrame, seed: int) -> pd.DataFrame:
    """One row per (architecture, reading other than ridge, point read) of an influence run's
    ``aggregate`` frame at ``seed``: the point's ridge aggregate beside the reading's."""
    d = aggregate[aggregate["seed"] == seed]
    ridge = d[d["reading"] == "ridge"][["arch", "train_index", "influence"]].rename(columns={"influence": "ridge"})
    other = d[d["reading"] != "ridge"].rename(columns={"influence": "read"})
    return other.merge(ridge, on=["arch", "train_index"], how="left")[
        ["arch", "reading", "train_index", "label", "ridge", "read"]].reset_index(drop=True)


def against_ridge_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """Each point read: its ridge influence (x) against the other reading's (y), a colour per
    architecture and a marker per reading, with the y = x line (the readings agree on it)."""
    fig = go.Figure()
    symbols = {"flow": "circle-open", "retrain": "diamond"}
    for (arch, reading), g in data.groupby(["arch", "reading"], sort=False):
        fig.add_trace(go.Scatter(x=g["ridge"], y=g["read"], mode="markers", text=g["train_index"],
                                 name=f"{arch_label(arch, attention)}, {READING_LABELS.get(reading, reading)}",
                                 marker={"color": ARCH_COLORS.get(arch), "symbol": symbols.get(reading, "circle"),
                                         "size": 9},
                                 hovertemplate="training point %{text}<br>ridge %{x:.3g}<br>read %{y:.3g}"))
    if len(data):
        lo = float(np.nanmin(data[["ridge", "read"]].to_numpy()))
        hi = float(np.nanmax(data[["ridge", "read"]].to_numpy()))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x (readings agree)",
                                 line={"color": "grey", "dash": "dot"}))
    return styled(fig, "ridge leave-one-out influence (kernel)", "the same point's influence, other reading",
                  "Each point's influence read two ways")


def draw_gaps_data(verdict: pd.DataFrame, draws: pd.DataFrame, attack: str, eps: float) -> pd.DataFrame:
    """The gap (MLP-Attn's excess minus 2L-ReLU's, % points) per data draw beside its pooled value and
    interval, one row per (reading, width, draw) at one attack and ε: the malleability result's ``draws``
    frame and its ``verdict`` frame (``engine.experiments.flips.verdict``), in percent."""
    keys = ["width", "reading"]
    v = verdict[(verdict["attack"] == attack) & np.isclose(verdict["eps"].astype(float), eps)]
    d = draws[(draws["attack"] == attack) & np.isclose(draws["eps"].astype(float), eps)]
    out = d[[*keys, "data_seed", "gap"]].merge(v[[*keys, "gap", "gap_low", "gap_high", "role", "outcome"]],
                                               on=keys, suffixes=("_draw", ""))
    for c in ("gap_draw", "gap", "gap_low", "gap_high"):
        out[c] = 100.0 * pd.to_numeric(out[c], errors="coerce")
    return out.sort_values([*keys, "data_seed"]).reset_index(drop=True)


def draw_gaps_fig(data: pd.DataFrame) -> go.Figure:
    """Per-draw gaps as points (one strip per reading and width) beside their pooled gap and interval."""
    fig = go.Figure()
    readings = list(dict.fromkeys(data["reading"]))
    for reading in readings:
        g = data[data["reading"] == reading]
        x = [f"m = {w}, {READING_LABELS.get(reading, reading)}" for w in g["width"]]
        fig.add_trace(go.Scatter(x=x, y=g["gap_draw"], mode="markers", name=f"{READING_LABELS.get(reading, reading)}: "
                                 "one data draw", marker=dict(size=8, opacity=0.6, symbol="circle-open",
                                                              color=ARCH_COLORS.get("attn", "black")),
                                 customdata=g["data_seed"],
                                 hovertemplate="draw %{customdata}: gap %{y:.0f} points<extra></extra>"))
        pooled = g.drop_duplicates("width")
        xs = [f"m = {w}, {READING_LABELS.get(reading, reading)}" for w in pooled["width"]]
        mid, lo, hi = pooled["gap"], pooled["gap_low"], pooled["gap_high"]
        fig.add_trace(go.Scatter(x=xs, y=mid, mode="markers", name=f"{READING_LABELS.get(reading, reading)}: "
                                 "mean and 95 % interval over draws", marker=dict(size=12, symbol="diamond",
                                                                                    color="black"),
                                 error_y=dict(type="data", array=(hi - mid).clip(lower=0),
                                              arrayminus=(mid - lo).clip(lower=0), visible=True),
                                 customdata=np.stack([lo, hi, pooled["role"], pooled["outcome"]], axis=1),
                                 hovertemplate=("gap %{y:.0f} [%{customdata[0]:.0f}, %{customdata[1]:.0f}] points"
                                                "<br>%{customdata[2]}: %{customdata[3]}<extra></extra>")))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    return styled(fig, "width and reading", "gap: MLP-Attn's excess − 2L-ReLU's (% points)")
