"""The malleability page's null baselines: each flip rate beside the flips that need no attack.

``nulls_fig`` draws, per architecture and attack at one ε, the attack's flip rate, the seed
null (another network seed, no attack) and the random null (a random perturbation of the
same per-row norm) as grouped bars; ``excess_fig`` draws the flip excess over the larger
null with its 95 % bootstrap interval. Both read a summary of ``run_malleability`` and
average nothing themselves.

Each chart of the page downloads its own table, not the summary's fifty columns: ``nulls_data``
and ``excess_data`` are what the two figures draw, ``bars_data`` what ``flip_bars_fig`` draws at
one ε and ``sweep_data`` what ``eps_sweep_fig`` draws, each with the columns naming its rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import ARCH_COLORS, arch_label, eps_at, styled

__all__ = ["excess_fig", "nulls_fig"]

NULLS = (("flip_rate", "attack", 1.0, ""), ("null_seed_flip_rate", "seed null", 0.55, "/"),
         ("null_random_flip_rate", "random null", 0.3, "."))  # (summary column, legend, opacity, pattern)


KEYS = ("arch", "attack", "reading", "width", "eps")  # what names a row of a chart's table, where the summary has it


def _at(summary: pd.DataFrame, eps: float) -> pd.DataFrame:
    return summary[np.isclose(summary["eps"].astype(float), eps)]


def _keys(d: pd.DataFrame) -> pd.DataFrame:
    return d[[k for k in KEYS if k in d]].reset_index(drop=True)


def nulls_data(summary: pd.DataFrame, eps: float) -> pd.DataFrame:
    """What ``nulls_fig`` draws: per row of the summary at ``eps``, its ``KEYS`` and, in percent of
    the top-τ points (means over seeds), ``flip_rate_pct`` and the nulls' ``null_seed_flip_rate_pct``
    and ``null_random_flip_rate_pct`` (each where the summary has it)."""
    d = _at(summary, eps)
    out = _keys(d)
    for col, *_ in NULLS:
        if f"{col}_mean" in d:
            out[f"{col}_pct"] = 100.0 * d[f"{col}_mean"].astype(float).to_numpy()
    return out


def excess_data(summary: pd.DataFrame, eps: float) -> pd.DataFrame:
    """What ``excess_fig`` draws: ``KEYS`` and the flip excess over the larger null with its 95 %
    bootstrap interval, in percent points (``flip_excess_pct``, ``…_low_pct``, ``…_high_pct``)."""
    d = _at(summary, eps)
    out = _keys(d)
    for col, to in (("flip_excess_mean", "flip_excess_pct"), ("flip_excess_low", "flip_excess_low_pct"),
                    ("flip_excess_high", "flip_excess_high_pct")):
        out[to] = 100.0 * d[col].astype(float).to_numpy()
    return out


def bars_data(summary: pd.DataFrame, eps: float, value: str = "flip_rate_pct") -> pd.DataFrame:
    """What ``flip_bars_fig`` draws at ``eps``: ``KEYS``, ``{value}_mean``, ``{value}_sd`` and ``n_seeds``."""
    d = _at(summary, eps)
    return pd.concat([_keys(d), d[[f"{value}_mean", f"{value}_sd", "n_seeds"]].reset_index(drop=True)], axis=1)


def sweep_data(summary: pd.DataFrame, value: str = "flip_rate_pct") -> pd.DataFrame:
    """What ``eps_sweep_fig`` draws: ``KEYS``, ``{value}_mean`` and ``{value}_sd`` at every ε."""
    return pd.concat([_keys(summary), summary[[f"{value}_mean", f"{value}_sd"]].reset_index(drop=True)], axis=1)


def nulls_fig(summary: pd.DataFrame, eps: float, eps_label: str = "ε", attention: str | None = None) -> go.Figure:
    """Grouped bars at one ε: x = (architecture, attack), one bar each for the attack's flip rate
    and the two nulls, in percent of the top-τ points (means over seeds; ``nulls_data``)."""
    d = nulls_data(summary, eps)
    x = [[arch_label(a, attention) for a in d["arch"]], [k.upper() for k in d["attack"]]]
    colors = [ARCH_COLORS.get(a, "black") for a in d["arch"]]
    fig = go.Figure()
    for col, name, alpha, pattern in NULLS:  # the pattern tells them apart in the legend, whatever the colour
        if f"{col}_pct" not in d:
            continue
        y = d[f"{col}_pct"]
        fig.add_trace(go.Bar(x=x, y=y, name=name, marker_color=colors, marker_opacity=alpha,
                             marker_pattern_shape=pattern,
                             text=[f"{v:.0f}" for v in y], textposition="outside",
                             hovertemplate=f"{name}<br>%{{x}}<br>%{{y:.1f}} %<extra></extra>"))
    fig.update_layout(barmode="group")
    return styled(fig, f"architecture, attack, at {eps_at(eps_label, eps)}", "flip rate (% of top-τ points)")


def excess_fig(summary: pd.DataFrame, eps: float, eps_label: str = "ε", attention: str | None = None) -> go.Figure:
    """Flip excess (flip rate − the larger null) per architecture and attack at one ε, in
    percent, with its 95 % bootstrap interval as asymmetric error bars; zero is marked (``excess_data``)."""
    d = excess_data(summary, eps)
    fig = go.Figure()
    for arch, da in d.groupby("arch", sort=False):
        label = arch_label(arch, attention)
        mid, lo, hi = da["flip_excess_pct"], da["flip_excess_low_pct"], da["flip_excess_high_pct"]
        fig.add_trace(go.Bar(x=[a.upper() for a in da["attack"]], y=mid, name=label,
                             marker_color=ARCH_COLORS.get(arch, "black"),
                             error_y=dict(type="data", array=(hi - mid).clip(lower=0),
                                          arrayminus=(mid - lo).clip(lower=0), visible=True),
                             customdata=np.stack([lo, hi], axis=1),
                             hovertemplate=(f"{label}<br>%{{x}}<br>excess %{{y:.1f}} % "
                                            "[%{customdata[0]:.1f}, %{customdata[1]:.1f}]<extra></extra>")))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="group")
    return styled(fig, f"attack, at {eps_at(eps_label, eps)}", "flip excess over the larger null (% points)")
