"""Charts of kernels and spectra: heatmaps, eigenvalues, the paper's widths, NTK convergence."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..slides import warn
from .style import (
    ARCH_COLORS,
    HEIGHT,
    LARGEST_PARAMS_LOG10,
    MAX_SIDE,
    METRICS,
    PRACTICAL_LOG10,
    arch_label,
    attention_of,
    by_arch,
    for_log_axis,
    log_ticks,
    near_chance,
    pretty_formula,
    styled,
    width_ticks,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "block_average", "class_boundaries", "distance_data", "distance_fig", "kappa_growth_data", "kappa_growth_fig",
    "kernel_diff_data", "kernel_heatmaps_fig", "largest_width_log10", "loss_data", "loss_fig", "matrix_data",
    "paper_trend_data", "paper_trend_fig", "spectrum_data", "spectrum_fig", "trajectory_data", "trajectory_fig",
    "width_needed_data", "width_needed_fig"
]

# ---------------------------------------------------------------- matrices

def block_average(K: np.ndarray, max_side: int = MAX_SIDE) -> tuple[np.ndarray, int]:
    """Average K (n1, n2) over square blocks so that neither side exceeds ``max_side``.

    Block size b = ceil(max(n1, n2) / max_side); the last block of each axis may be smaller
    and is averaged over its true size. Returns (float32 (ceil(n1/b), ceil(n2/b)), b).
    """
    K = np.asarray(K, dtype=np.float64)
    if K.ndim != 2:
        raise ValueError(f"block_average needs a 2-D matrix, got shape {K.shape}")
    b = max(1, math.ceil(max(K.shape) / max_side))
    if b == 1:
        return K.astype(np.float32), 1
    r, c = np.arange(0, K.shape[0], b), np.arange(0, K.shape[1], b)
    sums = np.add.reduceat(np.add.reduceat(K, r, axis=0), c, axis=1)
    counts = np.outer(np.diff(np.append(r, K.shape[0])), np.diff(np.append(c, K.shape[1])))
    return (sums / counts).astype(np.float32), b


def matrix_data(K: np.ndarray, max_side: int = MAX_SIDE) -> pd.DataFrame:
    """The (block-averaged) matrix as a table: rows are row blocks, columns column blocks."""
    small, b = block_average(K, max_side)
    idx = [f"{i * b}" for i in range(small.shape[0])]
    cols = [f"{j * b}" for j in range(small.shape[1])]
    return pd.DataFrame(small, index=pd.Index(idx, name="row_start"), columns=cols)


def kernel_diff_data(K_m: np.ndarray, K_inf: np.ndarray, max_side: int = MAX_SIDE) -> pd.DataFrame:
    """K_m − K∞ as the heatmap shows it (block means when larger than ``max_side``)."""
    return matrix_data(np.asarray(K_m, np.float64) - np.asarray(K_inf, np.float64), max_side)


def class_boundaries(y: ArrayLike) -> list[int]:
    """Indices k where the label changes between points k−1 and k (labels sorted into blocks)."""
    y = np.asarray(y).ravel()
    return [int(k) for k in np.flatnonzero(y[1:] != y[:-1]) + 1]


def kernel_heatmaps_fig(K_m: np.ndarray, K_inf: np.ndarray, width: int, arch: str,
                        y: np.ndarray | None = None, max_side: int = MAX_SIDE,
                        attention: str | None = None) -> go.Figure:
    """K_m, K∞ and K_m − K∞ side by side (shared scale for the two kernels), each axis exactly
    the n training points; with labels ``y`` (sorted into class blocks) thin lines mark where
    one class ends and the next begins."""
    A, b = block_average(K_m, max_side)
    B, _ = block_average(K_inf, max_side)
    D, _ = block_average(np.asarray(K_m, np.float64) - np.asarray(K_inf, np.float64), max_side)
    lo, hi = float(min(A.min(), B.min())), float(max(A.max(), B.max()))
    dmax = float(np.abs(D).max()) or 1.0
    note = "" if b == 1 else f" ({b}x{b} block means)"
    fig = make_subplots(1, 3, horizontal_spacing=0.1,
                        subplot_titles=(f"K_m, m = {width}", "K∞ (infinite width)", "K_m − K∞"))
    ticks = np.arange(A.shape[0]) * b
    hover = "row %{y}, column %{x}<br>value %{z:.4g}<extra></extra>"
    for col, (Z, axis) in enumerate(((A, "coloraxis"), (B, "coloraxis"), (D, "coloraxis2")), start=1):
        fig.add_trace(go.Heatmap(z=Z, x=ticks, y=ticks, coloraxis=axis, hovertemplate=hover), 1, col)
    fig.update_layout(
        coloraxis=dict(colorscale="Viridis", cmin=lo, cmax=hi,
                       colorbar=dict(title="K", x=0.64, xanchor="left", len=0.9, thickness=12)),
        coloraxis2=dict(colorscale="RdBu_r", cmid=0.0, cmin=-dmax, cmax=dmax,
                        colorbar=dict(title="K_m − K∞", x=1.01, xanchor="left", len=0.9, thickness=12)))
    styled(fig, "", "", title=f"{arch_label(arch, attention)} kernels on training points sorted by label{note}",
           height=420)
    n = np.asarray(K_m).shape[0]
    edge = (-b / 2, (A.shape[0] - 0.5) * b)  # the cells' outer edges: no empty band around the matrix
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="training point j (index)", range=list(edge), showgrid=False, zeroline=False,
                         row=1, col=col)
        fig.update_yaxes(range=[edge[1], edge[0]], showgrid=False, zeroline=False, row=1, col=col,  # fills its panel
                         title_text="training point i (index)" if col == 1 else None, showticklabels=col == 1)
    if y is not None and len(y) == n:
        for k in class_boundaries(y):
            at = k - b / 2  # between the block holding point k−1 and the one holding k (block means: approximate)
            for col in (1, 2, 3):
                xref, yref = ("x", "y") if col == 1 else (f"x{col}", f"y{col}")
                for x0, y0, x1, y1 in ((at, edge[0], at, edge[1]), (edge[0], at, edge[1], at)):
                    fig.add_shape(type="line", x0=x0, y0=y0, x1=x1, y1=y1, xref=xref, yref=yref,
                                  line=dict(color="rgba(255,255,255,0.8)" if col < 3 else "rgba(0,0,0,0.45)",
                                            width=1))
    return fig


# ---------------------------------------------------------------- spectrum

def spectrum_data(eig_G: np.ndarray, eig_attention: np.ndarray) -> pd.DataFrame:
    k = max(len(eig_G), len(eig_attention))
    pad = lambda v: np.concatenate([np.asarray(v, float), np.full(k - len(v), np.nan)])  # noqa: E731
    return pd.DataFrame({"k": np.arange(1, k + 1), "eig_G": pad(eig_G), "eig_attention": pad(eig_attention)})


def spectrum_fig(data: pd.DataFrame, rank_tol: float | None = None, attention: str = "linear") -> go.Figure:
    """Eigenvalues of G and of the attention features' Gram against their rank, log y."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=data["k"], y=for_log_axis(data["eig_G"]), name="G = Z Zᵀ (inputs)",
                             mode="lines", line=dict(color=ARCH_COLORS["relu"]),
                             hovertemplate="k = %{x}<br>λ_k(G) = %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=data["k"], y=for_log_axis(data["eig_attention"]),
                             name=f"attention features ({attention})", mode="lines",
                             line=dict(color=ARCH_COLORS["attn"]),
                             hovertemplate="k = %{x}<br>λ_k = %{y:.4g}<extra></extra>"))
    if rank_tol:  # a trace, not add_hline: hline annotations misplace on log axes
        fig.add_trace(go.Scatter(x=[data["k"].min(), data["k"].max()], y=[rank_tol, rank_tol], mode="lines",
                                 name=f"rank tolerance of G ({rank_tol:.2g})",
                                 line=dict(color="grey", dash="dot"),
                                 hovertemplate="numerical-rank tolerance %{y:.3g}<extra></extra>"))
    return styled(fig, "index k (eigenvalues in descending order)", "eigenvalue λ_k (unitless)", logy=True)


def width_needed_data(thresholds: dict[str, float | None], attention: str = "linear") -> pd.DataFrame:
    """log10 width of each of the paper's bounds; ``attention`` is the variant the page measured.

    The MLP-Attn bounds are the paper's for linear attention (power 6) whatever the variant, so
    for any other variant their label says so instead of implying a bound for that variant.
    """
    of = "" if attention in ("linear", None) else " (the paper's linear-attention bound)"
    names = {"attn_v1": f"MLP-Attn v1: κ⁶/ε²{of}", "attn_v2": f"MLP-Attn v2: κ_d⁶·n·ln n{of}",
             "relu_v1": "2L-ReLU v1: κ²/ε²", "relu_v2": "2L-ReLU v2: κ_d²·n·ln n"}
    rows = [{"bound": names.get(k, k), "key": k, "log10_width": v}
            for k, v in thresholds.items() if v is not None and math.isfinite(v)]
    return pd.DataFrame(rows, columns=["bound", "key", "log10_width"])


def largest_width_log10(d: int, n_out: int = 10) -> float:
    """log10 of the hidden width at which this two-layer head, d inputs and n_out outputs, has as
    many parameters as the largest models (``LARGEST_PARAMS_LOG10``): m (d + n_out) = 10^12."""
    return LARGEST_PARAMS_LOG10 - math.log10(max(1, int(d) + int(n_out)))


PRACTICAL_GREEN = "green"  # the practical widths' band, translucent over the bars
NAME_ROW_PX = (60, 80)     # height of a bound's row with a one- or two-line name: room for Presentation's 16 px
CHROME_PX = 200            # title, legend and x axis of a half-column chart in Presentation, roughly


def width_needed_fig(data: pd.DataFrame, d: int = 784, n_out: int = 10) -> go.Figure:
    """log10 of the width each bound asks for, against practical widths and the largest models,
    the latter in hidden units of this net (``largest_width_log10``: d inputs, n_out outputs).

    The practical band and the dashed line are drawn above the bars (translucent, so a bar shows
    through) and named in the legend, where no label can cross a bar, another label or the
    title. Bound names sit above their bars (a variant's note on a line of its own), each row
    tall enough for its name at Presentation's text size; values sit inside the bars' ends."""
    colors = [ARCH_COLORS["attn"] if k.startswith("attn") else ARCH_COLORS["relu"] for k in data["key"]]
    fig = go.Figure(go.Bar(x=data["log10_width"], y=data["bound"], orientation="h", width=0.4,
                           marker_color=colors, text=[f"10^{v:.1f}" for v in data["log10_width"]],
                           textposition="inside", insidetextanchor="end", textfont=dict(color="white"),
                           showlegend=False, hovertemplate="%{y}<br>log10 m = %{x:.2f}<extra></extra>"))
    fig.add_vrect(x0=PRACTICAL_LOG10[0], x1=PRACTICAL_LOG10[1], fillcolor=PRACTICAL_GREEN, opacity=0.2,
                  line_width=0, layer="above")
    largest = largest_width_log10(d, n_out)
    fig.add_vline(x=largest, line_dash="dash", line_color="black", layer="above")
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip",  # legend entries only
                             name=f"practical widths (1e{PRACTICAL_LOG10[0]:.0f}–1e{PRACTICAL_LOG10[1]:.0f})",
                             marker=dict(symbol="square", size=14, color=PRACTICAL_GREEN, opacity=0.35)))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", hoverinfo="skip",
                             name="1e12 parameters (largest models)",
                             line=dict(color="black", dash="dash")))
    two_lines = bool(data["bound"].str.contains(" (", regex=False).any())
    for i, bound in enumerate(data["bound"]):  # the name just above its bar, not on a crowded y axis
        fig.add_annotation(x=0, y=i - 0.22, xref="x", yref="y", text=bound.replace(" (", "<br>("), showarrow=False,
                           xanchor="left", yanchor="bottom", align="left", font=dict(size=11, color="#333"),
                           bgcolor="rgba(255,255,255,0.85)", borderpad=1)
    top = max([largest + 4] + [v + 2 for v in data["log10_width"]])
    fig.update_xaxes(range=[0, top])
    # first bound on top, with its name's room above it (a category axis's range runs bottom to top)
    fig.update_yaxes(range=[len(data) - 0.5, -0.85], showticklabels=False)
    height = max(HEIGHT, int(CHROME_PX + NAME_ROW_PX[two_lines] * (len(data) + 0.35)))
    styled(fig, "log10 of width m (hidden units)", "bound (paper version)", height=height)
    fig.update_layout(legend=dict(itemclick=False, itemdoubleclick=False))
    return fig


def kappa_growth_data(growth: pd.DataFrame) -> pd.DataFrame:
    """κ(G), the theory's κ of the attention Gram for the variant measured, and the measured one.

    ``kappa_attention_theory`` follows the variant (κ³ linear, κ^(2k+1) stacked:k, (λ₁/λ_r)³
    truncated:r; NaN for softmax and qkv, which have no closed form); its formula is carried
    in ``kappa_attention_formula``.
    """
    cols = ["n", "numerical_rank", "kappa", "kappa_attention", "kappa_attention_theory",
            "kappa_attention_formula", "attention"]
    out = growth[[c for c in cols if c in growth]].copy()
    if "kappa_attention_theory" in out:
        out["kappa_attention_theory"] = pd.to_numeric(out["kappa_attention_theory"], errors="coerce")
    return out


def kappa_growth_fig(data: pd.DataFrame) -> go.Figure:
    """κ(G), the variant's theory line and the measured attention κ against n, log y."""
    attention = attention_of(data) or "linear"
    formula = pretty_formula(next((f for f in data.get("kappa_attention_formula", []) if isinstance(f, str)), None))
    has_theory = "kappa_attention_theory" in data and data["kappa_attention_theory"].notna().any()
    theory = (f"{formula or 'theory'} (theory for {attention} attention)" if has_theory
              else f"no closed-form theory for {attention} attention")
    fig = go.Figure()
    series = [("kappa", "κ(G)", ARCH_COLORS["relu"], "lines+markers"),
              ("kappa_attention_theory", theory, "grey", "lines"),
              ("kappa_attention", f"κ of attention features, {attention} (measured)", ARCH_COLORS["attn"], "markers")]
    for col, name, color, mode in series:
        if col in data and (col != "kappa_attention_theory" or has_theory):
            fig.add_trace(go.Scatter(x=data["n"], y=for_log_axis(data[col]), name=name, mode=mode,
                                     line=dict(color=color, dash="dash" if mode == "lines" else "solid"),
                                     marker=dict(size=11 if mode == "markers" else 6,
                                                 symbol="circle-open" if mode == "markers" else "circle",
                                                 line_width=2),
                                     hovertemplate="n = %{x}<br>" + name + " = %{y:.3g}<extra></extra>"))
    if not has_theory:  # say it on the chart, not only in the legend
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=theory, line=dict(color="grey", dash="dash"),
                                 hoverinfo="skip"))
    styled(fig, "training points n", "condition number κ = λ_max / λ_rank (unitless)", logy=True)
    log_ticks(fig, np.concatenate([pd.to_numeric(data[c], errors="coerce").to_numpy(float)
                                    for c in ("kappa", "kappa_attention", "kappa_attention_theory") if c in data]))
    return fig


# ---------------------------------------------------------------- NTK convergence

def distance_data(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean, sd (ddof 1), min and max over seeds of ``metric`` per (arch, width); keeps the
    rows' ``attention`` column (the MLP-Attn variant, None for 2L-ReLU) so labels can name it."""
    g = rows.groupby(["arch", "width"])[metric]
    out = g.agg(["mean", "std", "min", "max", "count"]).reset_index()
    out = out.rename(columns={"count": "seeds", "std": "sd"})
    if "attention" in rows:
        variant = rows.dropna(subset=["attention"]).groupby("arch")["attention"].first()
        out.insert(1, "attention", out["arch"].map(variant))
    return out


UNTRAINED_GREY = "#9e9e9e"


def distance_fig(data: pd.DataFrame, metric: str, attention: str | None = None,
                 untrained: pd.DataFrame | None = None) -> go.Figure:
    """Distance against width, one line per arch, mean ± sd over seeds as a band; log axes.
    Legends name the attention variant (``attention``, else the data's column). ``untrained``: the
    (arch, width) groups whose nets stayed near chance (``engine.maths.gates.untrained``), drawn as
    grey crosses named in the legend: their distances describe nets that did not learn the task;
    the figure carries ``near_chance``'s warning, which every slide of it keeps (``slides.warn``)."""
    fig = go.Figure()
    attention = attention_of(data, attention)
    bad = set() if untrained is None or untrained.empty else set(zip(untrained["arch"], untrained["width"],
                                                                        strict=True))
    for arch, d in by_arch(data):
        d = d.sort_values("width")
        color = ARCH_COLORS.get(arch, "black")
        label = arch_label(arch, attention)
        grey = [(arch, w) in bad for w in d["width"]]
        if any(grey):
            fig.add_trace(go.Scatter(
                x=d["width"][grey], y=for_log_axis(d["mean"][grey]), mode="markers", name=f"{label}: near chance",
                marker=dict(color=UNTRAINED_GREY, symbol="x", size=14), hoverinfo="skip"))
        if (d["seeds"] > 1).any():
            fig.add_trace(go.Scatter(
                x=np.concatenate([d["width"], d["width"][::-1]]),
                y=for_log_axis(np.concatenate([d["mean"] + d["sd"].fillna(0), (d["mean"] - d["sd"].fillna(0))[::-1]])),
                fill="toself", fillcolor=color, opacity=0.18, line=dict(width=0), mode="lines",
                name=f"{label} mean ± sd", hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(
            x=d["width"], y=for_log_axis(d["mean"]), mode="lines+markers", name=label,
            line=dict(color=color), customdata=np.stack([d["sd"].fillna(0), d["min"], d["max"], d["seeds"]], axis=1),
            hovertemplate=(f"{label}<br>m = %{{x}}<br>mean %{{y:.4g}} ± %{{customdata[0]:.2g}} (sd)"
                           "<br>min %{customdata[1]:.4g}, max %{customdata[2]:.4g}"
                           "<br>seeds %{customdata[3]}<extra></extra>")))
    title, axis = METRICS.get(metric, (metric, metric))
    fraction = metric.endswith("_acc") or "_acc_" in metric  # accuracies: a linear 0 … 1 axis, not log
    styled(fig, "width m (hidden units, log scale)", axis, title=title, logx=True, logy=not fraction)
    width_ticks(fig, data["width"])
    if fraction:
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    else:
        log_ticks(fig, np.concatenate([data["min"], data["max"], data["mean"]]))
    return warn(fig, near_chance(untrained))


def loss_data(losses: pd.DataFrame) -> pd.DataFrame:
    return losses.groupby(["arch", "width", "epoch"])["loss"].mean().reset_index()


def _epoch_lines(data: pd.DataFrame, value: str, what: str, mode: str = "lines", logy: bool = False,
                 attention: str | None = None) -> go.Figure:
    """One line per (arch, width) of ``value`` against epoch: arch colour, darker = wider.
    With ``logy`` non-positive values become gaps."""
    fig = go.Figure()
    widths = sorted(data["width"].unique())
    attention = attention_of(data, attention)
    for arch, da in by_arch(data):
        label = arch_label(arch, attention)
        for w, d in da.groupby("width"):
            fig.add_trace(go.Scatter(
                x=d["epoch"], y=for_log_axis(d[value]) if logy else d[value], mode=mode, name=f"{label} m={w}",
                line=dict(color=ARCH_COLORS.get(arch, "black"), dash="solid" if arch == "relu" else "dash"),
                opacity=0.35 + 0.65 * (widths.index(w) + 1) / len(widths),
                hovertemplate=f"{label} m={w}<br>epoch %{{x}}<br>{what} %{{y:.4g}}<extra></extra>"))
    return fig


def loss_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """Training loss per epoch, one line per (arch, width), averaged over seeds."""
    return styled(_epoch_lines(data, "loss", "loss", attention=attention), "epoch (0 = before training)",
                  "mean training loss (nats for CE, squared error for MSE)")


def trajectory_data(trajectory: pd.DataFrame) -> pd.DataFrame:
    """Kernel distance to K∞ at the snapshot epochs, averaged over seeds, per (arch, width)."""
    return trajectory.groupby(["arch", "width", "epoch"])["kernel_dist"].mean().reset_index()


def trajectory_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """‖K_t − K∞‖/‖K∞‖ against epoch, one line per (arch, width), log y."""
    fig = _epoch_lines(data, "kernel_dist", "distance", mode="lines+markers", logy=True, attention=attention)
    styled(fig, "epoch (0 = initialisation)", "relative kernel distance to K∞ (unitless)", logy=True)
    log_ticks(fig, data["kernel_dist"])
    return fig


def paper_trend_data(measured: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Function distance relative to its value at the smallest width, here and in the paper.

    measured: arch, width, mean (from ``distance_data``, optionally attention); paper: arch,
    width, value. ``attention`` is the MLP-Attn variant of each line: the measured one's (when
    known) and linear for the paper's.
    """
    rows = []
    for source, df, col in (("measured here", measured, "mean"), ("paper", paper, "value")):
        for arch, d in by_arch(df):
            d = d.sort_values("width")
            base = float(d[col].iloc[0])
            variant = None if arch != "attn" else ("linear" if source == "paper" else attention_of(d))
            for w, v in zip(d["width"], d[col], strict=True):
                rows.append({"source": source, "arch": arch, "attention": variant, "width": int(w),
                             "value": float(v), "relative": float(v) / base if base else np.nan})
    return pd.DataFrame(rows, columns=["source", "arch", "attention", "width", "value", "relative"])


def paper_trend_fig(data: pd.DataFrame) -> go.Figure:
    """Relative function distance against width, here (solid) and in the paper (dashed), each
    MLP-Attn line named by its attention variant (the paper's is linear)."""
    fig = go.Figure()
    for (source, arch), d in data.groupby(["source", "arch"], sort=False):
        variant = attention_of(d)
        fig.add_trace(go.Scatter(
            x=d["width"], y=d["relative"], mode="lines+markers", name=f"{arch_label(arch, variant)}, {source}",
            line=dict(color=ARCH_COLORS.get(arch, "black"), dash="dash" if source == "paper" else "solid"),
            customdata=d["value"],
            hovertemplate=(f"{arch_label(arch, variant)}, {source}<br>m = %{{x}}<br>relative %{{y:.3f}}"
                           "<br>absolute %{customdata:.4g}<extra></extra>")))
    fig.add_hline(y=1.0, line_color="grey", line_dash="dot")
    styled(fig, "width m (hidden units, log scale)", "‖f_m − f_NTK‖ / value at smallest width (ratio)",
           logx=True)
    width_ticks(fig, data["width"])
    return fig
