"""Charts of influence and malleability: image grids, histograms, flip rates, before and after."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence, cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import ARCH_COLORS, ATTACK_DASH, arch_label, attention_of, by_arch, eps_at, styled

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "before_after_fig", "compare_bars_fig", "eps_sweep_fig", "flip_bars_fig", "image_grid_fig",
    "influence_bar_fig", "influence_extremes", "influence_grid_data", "influence_grid_fig", "influence_hist_data",
    "influence_hist_fig", "influence_shift_fig", "interventions_fig", "spread"
]

# ---------------------------------------------------------------- images and influence

def _grid_shape(image_shape: Sequence[int] | None, d: int) -> tuple[int, int, int]:
    if image_shape:
        return cast("tuple[int, int, int]", tuple(int(s) for s in image_shape))  # (C, H, W)
    side = int(math.isqrt(d))
    return (1, side, d // side) if side * (d // side) == d else (1, 1, d)


def image_grid_fig(images: Sequence[ArrayLike | None], image_shape: Sequence[int] | None, titles: list[str],
                   cols: int = 8, hover: list[str] | None = None) -> go.Figure:
    """Images (k, d) in a grid, row-major; a None entry leaves its cell empty.

    Grey images are heatmaps (pixel values on hover), RGB ones images.
    """
    k = len(images)
    d = next(np.asarray(im).size for im in images if im is not None) if k else 1
    C, H, W = _grid_shape(image_shape, d)
    cols = max(1, min(cols, k))
    rows = max(1, math.ceil(k / cols))
    fig = make_subplots(rows, cols, subplot_titles=titles + [""] * (rows * cols - k),
                        horizontal_spacing=0.01, vertical_spacing=0.12 if rows > 1 else 0.02)
    for i in range(k):
        if images[i] is None:
            continue
        r, c = divmod(i, cols)
        img = np.asarray(images[i], dtype=np.float32).reshape(C, H, W)
        extra = "" if hover is None else hover[i]
        if C == 3:
            rgb = np.clip(img.transpose(1, 2, 0), 0, 1) * 255
            fig.add_trace(go.Image(z=rgb.astype(np.uint8),
                                   hovertemplate=f"{extra}<br>x %{{x}}, y %{{y}}<br>RGB %{{z}}<extra></extra>"),
                          r + 1, c + 1)
        else:
            fig.add_trace(go.Heatmap(z=img[0], colorscale="gray", showscale=False, zmin=float(min(0, img.min())),
                                     zmax=float(max(1, img.max())),
                                     hovertemplate=f"{extra}<br>x %{{x}}, y %{{y}}<br>pixel %{{z:.3f}}<extra></extra>"),
                          r + 1, c + 1)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed")
    for i in range(k):
        axis = "" if i == 0 else str(i + 1)
        fig.update_layout(**{f"yaxis{axis}": dict(scaleanchor=f"x{axis}", autorange="reversed")})
    fig.update_annotations(font_size=11)
    fig.update_layout(template="plotly_white", height=150 * rows + 60,
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def influence_extremes(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the k largest (most positive) and k smallest (most negative) values, each
    ordered from the extreme inwards; only strictly positive / negative values qualify."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    top = [i for i in order[::-1][:k] if v[i] > 0]
    bottom = [i for i in order[:k] if v[i] < 0]
    return np.asarray(top, dtype=np.int64), np.asarray(bottom, dtype=np.int64)


def influence_grid_data(values: np.ndarray, labels: list[str], k: int, arch: str) -> pd.DataFrame:
    """The k most positive and k most negative entries of one influence row (n,)."""
    top, bottom = influence_extremes(values, k)
    idx = np.concatenate([top, bottom]).astype(np.int64)
    return pd.DataFrame({"arch": arch, "role": ["positive"] * len(top) + ["negative"] * len(bottom),
                         "train_index": idx, "label": [labels[j] for j in idx],
                         "influence": np.asarray(values, dtype=np.float64)[idx]})


def influence_grid_fig(X: np.ndarray, image_shape: Sequence[int] | None, data: pd.DataFrame) -> go.Figure:
    """Training images of ``influence_grid_data``: positive ones on the top row, negative below."""
    pos, neg = data[data["role"] == "positive"], data[data["role"] == "negative"]
    cols = max(len(pos), len(neg), 1)
    cells, titles, hover = [], [], []
    for part in (pos, neg):
        for r in part.itertuples():
            cells.append(X[r.train_index])
            titles.append(f"#{r.train_index} · {r.label}<br>{r.influence:+.3g}")
            hover.append(f"{r.role}: training #{r.train_index}, influence {r.influence:+.4g}")
        pad = cols - len(part)
        cells += [None] * pad
        titles += [""] * pad
        hover += [""] * pad
    return image_grid_fig(cells, image_shape, titles, cols=cols, hover=hover)


def influence_hist_data(aggregate: pd.DataFrame) -> pd.DataFrame:
    return aggregate[["arch", "train_index", "label", "influence"]].copy()


def spread(values: ArrayLike) -> float:
    """Robust spread of influence values: the median absolute value (0 for none)."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else 0.0


def influence_hist_fig(data: pd.DataFrame, value: str = "influence",
                       title: str = "Influence on test predictions", attention: str | None = None,
                       bins: int = 40) -> go.Figure:
    """Histograms of influence values, all architectures overlaid on one x-axis with the same bins.

    The nets' influences can differ by orders of magnitude; separate axes would make them look
    alike, so they share one, each legend entry gives the median |influence|, and when those
    differ more than 10x the ratio is written on the chart.
    """
    groups = list(by_arch(data))
    attention = attention_of(data, attention)
    spreads = {a: spread(d[value]) for a, d in groups}
    v = np.asarray(data[value], dtype=np.float64)
    v = v[np.isfinite(v)]
    lo, hi = (float(v.min()), float(v.max())) if v.size else (-1.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    size = (hi - lo) / bins
    fig = go.Figure()
    for arch, d in groups:
        label = arch_label(arch, attention)
        fig.add_trace(go.Histogram(x=d[value], name=f"{label}: median |I| {spreads[arch]:.2g}",
                                   xbins=dict(start=lo, end=hi + size / 2, size=size), autobinx=False,
                                   marker_color=ARCH_COLORS.get(arch, "black"), opacity=0.6,
                                   hovertemplate=f"{label}<br>%{{x}}<br>%{{y}} points<extra></extra>"))
    fig.update_layout(barmode="overlay")
    styled(fig, "influence (output units; one scale for all)", "training points (count)", title=title)
    positive = {a: s for a, s in spreads.items() if s > 0}
    if len(positive) >= 2 and max(positive.values()) > 10 * min(positive.values()):
        big, small = max(positive, key=positive.__getitem__), min(positive, key=positive.__getitem__)
        fig.add_annotation(x=0.99, y=0.97, xref="paper", yref="paper", xanchor="right", yanchor="top",
                           showarrow=False, align="right", bgcolor="rgba(255,255,255,0.85)",
                           text=f"{arch_label(small, attention)}: influences about "
                                f"{positive[big] / positive[small]:,.0f}× smaller<br>than "
                                f"{arch_label(big, attention)}'s (same axis)",
                           font=dict(size=12, color="#333"))
    return fig


def influence_bar_fig(values: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """Influence of each shown training image (same order as the grid)."""
    v = np.asarray(values, dtype=np.float64)
    fig = go.Figure(go.Bar(x=labels, y=v, marker_color=np.where(v >= 0, "#2ca02c", "#d62728"),
                           hovertemplate="%{x}<br>influence %{y:.4g}<extra></extra>"))
    return styled(fig, "training image (index, label)", "influence (output units)", title=title, height=300)


# ---------------------------------------------------------------- malleability

def flip_bars_fig(summary: pd.DataFrame, eps: float, value: str = "flip_rate_pct",
                  y_title: str = "flip rate (% of top-τ points)", fmt: str = ".1f",
                  eps_label: str = "ε", attention: str | None = None) -> go.Figure:
    """Grouped bars at one ε: attack on x, one bar per arch, height ``{value}_mean`` with
    ``{value}_sd`` error bars (a summary from ``engine.reporting.tables``; nothing is averaged here)."""
    d = summary[np.isclose(summary["eps"].astype(float), eps)]
    fig = go.Figure()
    top = 0.0
    for arch, da in by_arch(d):
        label = arch_label(arch, attention)
        mean, sd = da[f"{value}_mean"], da[f"{value}_sd"].fillna(0)
        x = [a.upper() for a in da["attack"]]
        fig.add_trace(go.Bar(x=x, y=mean, name=label, offsetgroup=arch,
                             marker_color=ARCH_COLORS.get(arch, "black"),
                             error_y=dict(type="data", array=sd, visible=True),
                             customdata=np.stack([sd, da["n_seeds"]], axis=1),
                             hovertemplate=(f"{label}<br>%{{x}}<br>%{{y:.2f}} ± %{{customdata[0]:.2f}}"
                                            " (sd over %{customdata[1]} seeds)<extra></extra>")))
        # the value above the error bar's cap, in the bar's own slot: no error bar strikes through it
        fig.add_trace(go.Scatter(x=x, y=mean + sd, mode="text", text=[format(v, fmt) for v in mean],
                                 textposition="top center", offsetgroup=arch, showlegend=False,
                                 hoverinfo="skip", cliponaxis=False, textfont=dict(color="#333")))
        top = max(top, float(np.nanmax((mean + sd).to_numpy(float))) if len(mean) else 0.0)
    fig.update_layout(barmode="group", scattermode="group")
    if top > 0:
        fig.update_yaxes(range=[0, top * 1.18])  # room for the labels above the tallest cap
    x_title = f"attack, at {eps_at(eps_label, eps)}"
    return styled(fig, x_title, y_title)


def eps_sweep_fig(summary: pd.DataFrame, value: str = "flip_rate_pct",
                  y_title: str = "flip rate (% of top-τ points)", eps_label: str = "ε",
                  attention: str | None = None) -> go.Figure:
    """Mean ± sd over seeds against ε: colour by arch, dash by attack."""
    fig = go.Figure()
    for (arch, attack), d in summary.groupby(["arch", "attack"], sort=False):
        d = d.sort_values("eps")
        label = arch_label(arch, attention)
        fig.add_trace(go.Scatter(
            x=d["eps"], y=d[f"{value}_mean"], mode="lines+markers", name=f"{label} {attack.upper()}",
            error_y=dict(type="data", array=d[f"{value}_sd"].fillna(0), visible=True),
            line=dict(color=ARCH_COLORS.get(arch, "black"), dash=ATTACK_DASH.get(attack, "solid")),
            hovertemplate=f"{label} {attack.upper()}<br>ε = %{{x:g}}<br>%{{y:.3g}}<extra></extra>"))
    return styled(fig, eps_label, y_title)


def interventions_fig(data: pd.DataFrame, value: str = "test_acc",
                      y_title: str = "test accuracy (fraction)", attention: str | None = None) -> go.Figure:
    fig = go.Figure()
    for arch, d in by_arch(data):
        label = arch_label(arch, attention)
        fig.add_trace(go.Bar(x=d["intervention"], y=d[value], name=label,
                             marker_color=ARCH_COLORS.get(arch, "black"),
                             hovertemplate=f"{label}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>"))
    fig.update_layout(barmode="group")
    return styled(fig, "intervention on the training set", y_title)


def before_after_fig(clean: np.ndarray, perturbed: np.ndarray, image_shape: Sequence[int] | None,
                     title: str = "") -> go.Figure:
    """Clean image, perturbed image and their difference (pixel units)."""
    clean = np.asarray(clean, dtype=np.float32)
    perturbed = np.asarray(perturbed, dtype=np.float32)
    C, H, W = _grid_shape(image_shape, clean.size)
    a, b = clean.reshape(C, H, W), perturbed.reshape(C, H, W)
    diff = (b - a).mean(axis=0)
    dmax = float(np.abs(diff).max()) or 1.0
    fig = make_subplots(1, 3, subplot_titles=("clean", "perturbed", "perturbed − clean"),
                        horizontal_spacing=0.04)
    for col, img in ((1, a), (2, b)):
        if C == 3:
            fig.add_trace(go.Image(z=(np.clip(img.transpose(1, 2, 0), 0, 1) * 255).astype(np.uint8)), 1, col)
        else:
            fig.add_trace(go.Heatmap(z=img[0], colorscale="gray", zmin=0, zmax=1, showscale=False,
                                     hovertemplate="x %{x}, y %{y}<br>pixel %{z:.3f}<extra></extra>"), 1, col)
    fig.add_trace(go.Heatmap(z=diff, colorscale="RdBu_r", zmid=0, zmin=-dmax, zmax=dmax,
                             colorbar=dict(title="Δ pixel"),
                             hovertemplate="x %{x}, y %{y}<br>Δ %{z:.3f}<extra></extra>"), 1, 3)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, title_text="pixel column")
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed")
    fig.update_yaxes(title_text="pixel row", row=1, col=1)  # the others would run into the image to their left
    for axis in ("", "2", "3"):
        fig.update_layout(**{f"yaxis{axis}": dict(scaleanchor=f"x{axis}", autorange="reversed")})
    fig.update_layout(template="plotly_white", height=320, title=title or None,
                      margin=dict(l=40, r=20, t=60, b=30))
    return fig


def influence_shift_fig(before: np.ndarray, after: np.ndarray, highlight: int | None = None,
                        arch: str = "attn", attention: str | None = None) -> go.Figure:
    """Aggregate influence of every training point before vs after the perturbation."""
    before, after = np.asarray(before, float), np.asarray(after, float)
    idx = np.arange(before.size)
    fig = go.Figure(go.Scattergl(x=before, y=after, mode="markers", name=arch_label(arch, attention),
                                 marker=dict(size=5, color=ARCH_COLORS.get(arch, "black"), opacity=0.6),
                                 customdata=idx,
                                 hovertemplate="training point %{customdata}<br>before %{x:.4g}"
                                               "<br>after %{y:.4g}<extra></extra>"))
    if highlight is not None and 0 <= highlight < before.size:
        fig.add_trace(go.Scatter(x=[before[highlight]], y=[after[highlight]], mode="markers",
                                 name=f"point {highlight}", marker=dict(size=14, symbol="circle-open",
                                                                         color="black", line_width=2),
                                 hovertemplate=f"training point {highlight}<br>before %{{x:.4g}}"
                                               "<br>after %{y:.4g}<extra></extra>"))
    lim = float(np.nanmax(np.abs(np.concatenate([before, after])))) if before.size else 1.0
    fig.add_trace(go.Scatter(x=[-lim, lim], y=[-lim, lim], mode="lines", name="no change",
                             line=dict(color="grey", dash="dot"), hoverinfo="skip"))
    return styled(fig, "aggregate influence before the attack (output units)",
                  "aggregate influence after the attack (output units)")


def compare_bars_fig(data: pd.DataFrame, x: str, y_title: str) -> go.Figure:
    """Paper against measured: columns ``x``, ``arch``, ``paper``, ``measured`` (same units) and,
    where present, ``null`` (the measured value's null, drawn hatched beside it: a measured bar
    says something only above it)."""
    fig = go.Figure()
    for arch, d in by_arch(data):
        color = ARCH_COLORS.get(arch, "black")
        fig.add_trace(go.Bar(x=d[x], y=d["paper"], name=f"{arch_label(arch)}, paper", marker_color=color,
                             opacity=0.45,
                             hovertemplate=f"{arch_label(arch)}, paper<br>%{{x}}: %{{y:.3g}}<extra></extra>"))
        fig.add_trace(go.Bar(x=d[x], y=d["measured"], name=f"{arch_label(arch)}, here", marker_color=color,
                             hovertemplate=f"{arch_label(arch)}, here<br>%{{x}}: %{{y:.3g}}<extra></extra>"))
        if "null" in d:
            fig.add_trace(go.Bar(x=d[x], y=d["null"], name=f"{arch_label(arch)}, its null here", marker_color=color,
                                 marker_opacity=0.3, marker_pattern_shape="/",
                                 hovertemplate=f"{arch_label(arch)}, null here<br>%{{x}}: %{{y:.3g}}<extra></extra>"))
    fig.update_layout(barmode="group")
    return styled(fig, x, y_title)
