"""The malleability page's null baselines: each flip rate beside the flips that need no attack.

``nulls_fig`` draws, per architecture and attack at one ε, the attack's flip rate, the seed
null (another network seed, no attack) and the random null (a random perturbation of the
same per-row norm) as grouped bars; ``excess_fig`` draws the flip excess over the larger
null with its 95 % bootstrap interval. Both read a summary of ``run_malleability`` and
average nothing themselves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import ARCH_COLORS, arch_label, eps_at, styled

NULLS = (("flip_rate", "attack", 1.0, ""), ("null_seed_flip_rate", "seed null", 0.55, "/"),
         ("null_random_flip_rate", "random null", 0.3, "."))  # (summary column, legend, opacity, pattern)


def _at(summary: pd.DataFrame, eps: float) -> pd.DataFrame:
    return summary[np.isclose(summary["eps"].astype(float), eps)]


def nulls_fig(summary: pd.DataFrame, eps: float, eps_label: str = "ε", attention: str | None = None) -> go.Figure:
    """Grouped bars at one ε: x = (architecture, attack), one bar each for the attack's flip rate
    and the two nulls, in percent of the top-τ points (means over seeds)."""
    d = _at(summary, eps)
    x = [[arch_label(a, attention) for a in d["arch"]], [k.upper() for k in d["attack"]]]
    colors = [ARCH_COLORS.get(a, "black") for a in d["arch"]]
    fig = go.Figure()
    for col, name, alpha, pattern in NULLS:  # the pattern tells them apart in the legend, whatever the colour
        if f"{col}_mean" not in d:
            continue
        y = 100.0 * d[f"{col}_mean"].astype(float)
        fig.add_trace(go.Bar(x=x, y=y, name=name, marker_color=colors, marker_opacity=alpha,
                             marker_pattern_shape=pattern,
                             text=[f"{v:.0f}" for v in y], textposition="outside",
                             hovertemplate=f"{name}<br>%{{x}}<br>%{{y:.1f}} %<extra></extra>"))
    fig.update_layout(barmode="group")
    return styled(fig, f"architecture, attack, at {eps_at(eps_label, eps)}", "flip rate (% of top-τ points)")


def excess_fig(summary: pd.DataFrame, eps: float, eps_label: str = "ε", attention: str | None = None) -> go.Figure:
    """Flip excess (flip rate − the larger null) per architecture and attack at one ε, in
    percent, with its 95 % bootstrap interval as asymmetric error bars; zero is marked."""
    d = _at(summary, eps)
    fig = go.Figure()
    for arch, da in d.groupby("arch", sort=False):
        label = arch_label(arch, attention)
        mid = 100.0 * da["flip_excess_mean"].astype(float)
        lo, hi = 100.0 * da["flip_excess_low"].astype(float), 100.0 * da["flip_excess_high"].astype(float)
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
