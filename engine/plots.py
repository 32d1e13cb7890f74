"""Plotly figures of experiment results; no streamlit here, so scripts can use them too.

Each chart comes as a pair: ``*_data(...)`` returns the exact table the chart shows (the
dashboard offers it as CSV) and ``*_fig(data)`` draws it. Figures carry axis titles with
units and hover values. Heatmaps never ship more than ``MAX_SIDE`` x ``MAX_SIDE`` cells:
larger matrices are block-averaged (``block_average``) and sent as float32 arrays, which
plotly encodes as binary, not as lists.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MAX_SIDE = 500
ARCH_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}
ARCH_COLORS = {"relu": "#1f77b4", "attn": "#d62728"}
ATTACK_DASH = {"fgsm": "solid", "pgd": "dash", "mim": "dot"}
PRACTICAL_LOG10 = (3.0, 5.0)   # widths people train: 1e3 .. 1e5 hidden units
LARGEST_LOG10 = 12.0           # the largest models: about 1e12 parameters
HEIGHT = 400

METRICS = {  # column -> (chart title, axis title with units)
    "kernel_dist_init": ("Kernel distance at initialisation: ‖K_m − K∞‖_F / ‖K∞‖_F",
                         "relative kernel distance (unitless)"),
    "kernel_dist_trained": ("Kernel distance after training: ‖K_m − K∞‖_F / ‖K∞‖_F",
                            "relative kernel distance (unitless)"),
    "function_dist": ("Function distance: ‖f_m − f_NTK‖_F on the test points",
                      "function distance (output units)"),
    "function_dist_rms": ("Function distance per test point (RMS)", "RMS distance (output units)"),
    "kernel_dist_whitened_init": ("Whitened kernel distance at init: ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂",
                                  "whitened distance (unitless, κ-sensitive)"),
    "kernel_dist_whitened_trained": ("Whitened kernel distance after training", "whitened distance (unitless, κ-sensitive)"),
    "prediction_gap_init": ("Kernel-regression prediction gap at init: ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖",
                            "relative prediction gap (unitless)"),
    "prediction_gap_trained": ("Kernel-regression prediction gap after training", "relative prediction gap (unitless)"),
    "function_dist_rel": ("Relative function distance ‖f_m − f_NTK‖_F / ‖f_NTK‖_F", "relative distance (unitless)"),
    "train_acc": ("Train accuracy", "train accuracy (fraction)"),
    "test_acc_ntk": ("Test accuracy of K∞ ridge regression", "test accuracy (fraction)"),
    "test_acc": ("Test accuracy", "test accuracy (fraction)"),
    "weight_movement": ("Weight movement ‖W_t − W_0‖_F / ‖W_0‖_F", "relative movement (unitless)"),
}


SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def arch_label(arch: str, attention: str | None = None) -> str:
    """"2L-ReLU", "MLP-Attn", or "MLP-Attn (softmax:0.1)" when the attention variant is given."""
    label = ARCH_LABELS.get(arch, arch)
    return f"{label} ({attention})" if arch == "attn" and isinstance(attention, str) and attention else label


def pretty_formula(formula: str | None) -> str | None:
    """The engine's plain formula (``κ(G)^3``, ``(λ_1/λ_10)^3``) with superscript powers: κ(G)³."""
    if not formula:
        return None
    return re.sub(r"\^(-?\d+)", lambda m: m.group(1).translate(SUPERSCRIPTS), formula)


def _attention_of(data: pd.DataFrame, attention: str | None = None) -> str | None:
    """The attention variant a result was made with: the argument, else the data's own column."""
    if attention:
        return attention
    if "attention" in data:
        found = [a for a in data["attention"] if isinstance(a, str) and a]
        return found[0] if found else None
    return None


def _by_arch(data: pd.DataFrame):
    """(arch, rows) pairs in the fixed order relu, attn, then any others."""
    present = list(dict.fromkeys(data["arch"]))
    order = [a for a in ARCH_LABELS if a in present] + [a for a in present if a not in ARCH_LABELS]
    for arch in order:
        yield arch, data[data["arch"] == arch]


def _style(fig: go.Figure, x: str, y: str, title: str | None = None, logx: bool = False,
           logy: bool = False, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height,
                      title=dict(text=title, y=0.98, yanchor="top", x=0.01) if title else None,
                      margin=dict(l=60, r=20, t=85 if title else 40, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
                      hovermode="closest")
    fig.update_xaxes(title_text=x, type="log" if logx else None)
    fig.update_yaxes(title_text=y, type="log" if logy else None, exponentformat="power")
    return fig


def _log_ticks(fig: go.Figure, values, axis: str = "y") -> None:
    """Readable log-axis ticks: 1-2-5 labels within two decades, powers of ten beyond."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))
    if hi - lo > 2:
        update(dtick=1)  # powers of ten only
        return
    ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if v.min() / 1.5 <= t <= v.max() * 1.5]
    update(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])


def _width_ticks(fig: go.Figure, widths) -> None:
    """Ticks at the measured widths only (log x)."""
    w = sorted({int(x) for x in widths})
    fig.update_xaxes(tickvals=w, ticktext=[str(x) for x in w])


def _positive(v) -> np.ndarray:
    """Values for a log axis: non-positive entries become NaN (gaps) instead of errors."""
    v = np.asarray(v, dtype=np.float64)
    return np.where(v > 0, v, np.nan)


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


def kernel_heatmaps_fig(K_m: np.ndarray, K_inf: np.ndarray, width: int, arch: str,
                        y: np.ndarray | None = None, max_side: int = MAX_SIDE,
                        attention: str | None = None) -> go.Figure:
    """K_m, K∞ and K_m − K∞ side by side (shared scale for the two kernels)."""
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
    _style(fig, "", "", title=f"{arch_label(arch, attention)} kernels on training points sorted by label{note}",
           height=420)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="training point j (index)", row=1, col=col)
        fig.update_yaxes(autorange="reversed", scaleanchor=f"x{'' if col == 1 else col}", row=1, col=col,
                         title_text="training point i (index)" if col == 1 else None, showticklabels=col == 1)
    return fig


# ---------------------------------------------------------------- spectrum

def spectrum_data(eig_G: np.ndarray, eig_attention: np.ndarray) -> pd.DataFrame:
    k = max(len(eig_G), len(eig_attention))
    pad = lambda v: np.concatenate([np.asarray(v, float), np.full(k - len(v), np.nan)])  # noqa: E731
    return pd.DataFrame({"k": np.arange(1, k + 1), "eig_G": pad(eig_G), "eig_attention": pad(eig_attention)})


def spectrum_fig(data: pd.DataFrame, rank_tol: float | None = None, attention: str = "linear") -> go.Figure:
    """Eigenvalues of G and of the attention features' Gram against their rank, log y."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=data["k"], y=_positive(data["eig_G"]), name="G = Z Zᵀ (inputs)",
                             mode="lines", line=dict(color=ARCH_COLORS["relu"]),
                             hovertemplate="k = %{x}<br>λ_k(G) = %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=data["k"], y=_positive(data["eig_attention"]),
                             name=f"attention features ({attention})", mode="lines",
                             line=dict(color=ARCH_COLORS["attn"]),
                             hovertemplate="k = %{x}<br>λ_k = %{y:.4g}<extra></extra>"))
    if rank_tol:  # a trace, not add_hline: hline annotations misplace on log axes
        fig.add_trace(go.Scatter(x=[data["k"].min(), data["k"].max()], y=[rank_tol, rank_tol], mode="lines",
                                 name=f"rank tolerance of G ({rank_tol:.2g})",
                                 line=dict(color="grey", dash="dot"),
                                 hovertemplate="numerical-rank tolerance %{y:.3g}<extra></extra>"))
    return _style(fig, "index k (eigenvalues in descending order)", "eigenvalue λ_k (unitless)", logy=True)


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


def width_needed_fig(data: pd.DataFrame) -> go.Figure:
    """log10 of the width each bound asks for, against practical widths and the largest models.

    Bound names sit above their bars and values inside the bars' ends, so no label crosses a
    bar, the shaded band or the dashed line, at any chart width."""
    colors = [ARCH_COLORS["attn"] if k.startswith("attn") else ARCH_COLORS["relu"] for k in data["key"]]
    fig = go.Figure(go.Bar(x=data["log10_width"], y=data["bound"], orientation="h", width=0.55,
                           marker_color=colors, text=[f"10^{v:.1f}" for v in data["log10_width"]],
                           textposition="inside", insidetextanchor="end", textfont=dict(color="white"),
                           hovertemplate="%{y}<br>log10 m = %{x:.2f}<extra></extra>"))
    fig.add_vrect(x0=PRACTICAL_LOG10[0], x1=PRACTICAL_LOG10[1], fillcolor="green", opacity=0.15,
                  line_width=0, layer="below")
    fig.add_vline(x=LARGEST_LOG10, line_dash="dash", line_color="black", layer="below")
    for x, text, anchor in ((PRACTICAL_LOG10[1], "practical<br>1e3–1e5 ", "right"),
                            (LARGEST_LOG10, " largest models<br> ~1e12 params", "left")):
        fig.add_annotation(x=x, y=1.0, xref="x", yref="paper", text=text, showarrow=False, xanchor=anchor,
                           yanchor="bottom", align=anchor, font=dict(size=11, color="#444"))
    for i, bound in enumerate(data["bound"]):  # the name just above its bar, not on a crowded y axis
        fig.add_annotation(x=0, y=i - 0.3, xref="x", yref="y", text=bound, showarrow=False, xanchor="left",
                           yanchor="bottom", font=dict(size=11, color="#333"), bgcolor="rgba(255,255,255,0.85)",
                           borderpad=1)
    top = max([LARGEST_LOG10 + 4] + [v + 2 for v in data["log10_width"]])
    fig.update_xaxes(range=[0, top])
    fig.update_yaxes(autorange="reversed", showticklabels=False)  # first bound on top
    _style(fig, "log10 of width m needed (hidden units)", "bound (architecture, paper version)")
    fig.update_layout(margin=dict(t=70), showlegend=False)
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
    attention = _attention_of(data) or "linear"
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
            fig.add_trace(go.Scatter(x=data["n"], y=_positive(data[col]), name=name, mode=mode,
                                     line=dict(color=color, dash="dash" if mode == "lines" else "solid"),
                                     marker=dict(size=11 if mode == "markers" else 6,
                                                 symbol="circle-open" if mode == "markers" else "circle",
                                                 line_width=2),
                                     hovertemplate="n = %{x}<br>" + name + " = %{y:.3g}<extra></extra>"))
    if not has_theory:  # say it on the chart, not only in the legend
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=theory, line=dict(color="grey", dash="dash"),
                                 hoverinfo="skip"))
    _style(fig, "training points n", "condition number κ = λ_max / λ_rank (unitless)", logy=True)
    _log_ticks(fig, np.concatenate([pd.to_numeric(data[c], errors="coerce").to_numpy(float)
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


def distance_fig(data: pd.DataFrame, metric: str, attention: str | None = None) -> go.Figure:
    """Distance against width, one line per arch, mean ± sd over seeds as a band; log axes.
    Legends name the attention variant (``attention``, else the data's column)."""
    fig = go.Figure()
    attention = _attention_of(data, attention)
    for arch, d in _by_arch(data):
        d = d.sort_values("width")
        color = ARCH_COLORS.get(arch, "black")
        label = arch_label(arch, attention)
        if (d["seeds"] > 1).any():
            fig.add_trace(go.Scatter(
                x=np.concatenate([d["width"], d["width"][::-1]]),
                y=_positive(np.concatenate([d["mean"] + d["sd"].fillna(0), (d["mean"] - d["sd"].fillna(0))[::-1]])),
                fill="toself", fillcolor=color, opacity=0.18, line=dict(width=0), mode="lines",
                name=f"{label} mean ± sd", hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(
            x=d["width"], y=_positive(d["mean"]), mode="lines+markers", name=label,
            line=dict(color=color), customdata=np.stack([d["sd"].fillna(0), d["min"], d["max"], d["seeds"]], axis=1),
            hovertemplate=(f"{label}<br>m = %{{x}}<br>mean %{{y:.4g}} ± %{{customdata[0]:.2g}} (sd)"
                           "<br>min %{customdata[1]:.4g}, max %{customdata[2]:.4g}"
                           "<br>seeds %{customdata[3]}<extra></extra>")))
    title, axis = METRICS.get(metric, (metric, metric))
    _style(fig, "width m (hidden units, log scale)", axis, title=title, logx=True, logy=True)
    _width_ticks(fig, data["width"])
    _log_ticks(fig, np.concatenate([data["min"], data["max"], data["mean"]]))
    return fig


def loss_data(losses: pd.DataFrame) -> pd.DataFrame:
    return losses.groupby(["arch", "width", "epoch"])["loss"].mean().reset_index()


def _epoch_lines(data: pd.DataFrame, value: str, what: str, mode: str = "lines", logy: bool = False,
                 attention: str | None = None) -> go.Figure:
    """One line per (arch, width) of ``value`` against epoch: arch colour, darker = wider.
    With ``logy`` non-positive values become gaps."""
    fig = go.Figure()
    widths = sorted(data["width"].unique())
    attention = _attention_of(data, attention)
    for arch, da in _by_arch(data):
        label = arch_label(arch, attention)
        for w, d in da.groupby("width"):
            fig.add_trace(go.Scatter(
                x=d["epoch"], y=_positive(d[value]) if logy else d[value], mode=mode, name=f"{label} m={w}",
                line=dict(color=ARCH_COLORS.get(arch, "black"), dash="solid" if arch == "relu" else "dash"),
                opacity=0.35 + 0.65 * (widths.index(w) + 1) / len(widths),
                hovertemplate=f"{label} m={w}<br>epoch %{{x}}<br>{what} %{{y:.4g}}<extra></extra>"))
    return fig


def loss_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """Training loss per epoch, one line per (arch, width), averaged over seeds."""
    return _style(_epoch_lines(data, "loss", "loss", attention=attention), "epoch (0 = before training)",
                  "mean training loss (nats for CE, squared error for MSE)")


def trajectory_data(trajectory: pd.DataFrame) -> pd.DataFrame:
    """Kernel distance to K∞ at the snapshot epochs, averaged over seeds, per (arch, width)."""
    return trajectory.groupby(["arch", "width", "epoch"])["kernel_dist"].mean().reset_index()


def trajectory_fig(data: pd.DataFrame, attention: str | None = None) -> go.Figure:
    """‖K_t − K∞‖/‖K∞‖ against epoch, one line per (arch, width), log y."""
    fig = _epoch_lines(data, "kernel_dist", "distance", mode="lines+markers", logy=True, attention=attention)
    _style(fig, "epoch (0 = initialisation)", "relative kernel distance to K∞ (unitless)", logy=True)
    _log_ticks(fig, data["kernel_dist"])
    return fig


def paper_trend_data(measured: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Function distance relative to its value at the smallest width, here and in the paper.

    measured: arch, width, mean (from ``distance_data``, optionally attention); paper: arch,
    width, value. ``attention`` is the MLP-Attn variant of each line: the measured one's (when
    known) and linear for the paper's.
    """
    rows = []
    for source, df, col in (("measured here", measured, "mean"), ("paper", paper, "value")):
        for arch, d in _by_arch(df):
            d = d.sort_values("width")
            base = float(d[col].iloc[0])
            variant = None if arch != "attn" else ("linear" if source == "paper" else _attention_of(d))
            for w, v in zip(d["width"], d[col]):
                rows.append({"source": source, "arch": arch, "attention": variant, "width": int(w),
                             "value": float(v), "relative": float(v) / base if base else np.nan})
    return pd.DataFrame(rows, columns=["source", "arch", "attention", "width", "value", "relative"])


def paper_trend_fig(data: pd.DataFrame) -> go.Figure:
    """Relative function distance against width, here (solid) and in the paper (dashed), each
    MLP-Attn line named by its attention variant (the paper's is linear)."""
    fig = go.Figure()
    for (source, arch), d in data.groupby(["source", "arch"], sort=False):
        variant = _attention_of(d)
        fig.add_trace(go.Scatter(
            x=d["width"], y=d["relative"], mode="lines+markers", name=f"{arch_label(arch, variant)}, {source}",
            line=dict(color=ARCH_COLORS.get(arch, "black"), dash="dash" if source == "paper" else "solid"),
            customdata=d["value"],
            hovertemplate=(f"{arch_label(arch, variant)}, {source}<br>m = %{{x}}<br>relative %{{y:.3f}}"
                           "<br>absolute %{customdata:.4g}<extra></extra>")))
    fig.add_hline(y=1.0, line_color="grey", line_dash="dot")
    _style(fig, "width m (hidden units, log scale)", "‖f_m − f_NTK‖ / value at smallest width (ratio)",
           logx=True)
    _width_ticks(fig, data["width"])
    return fig


# ---------------------------------------------------------------- images and influence

def _grid_shape(image_shape, d: int) -> tuple[int, int, int]:
    if image_shape:
        return tuple(int(s) for s in image_shape)
    side = int(math.isqrt(d))
    return (1, side, d // side) if side * (d // side) == d else (1, 1, d)


def image_grid_fig(images, image_shape, titles: list[str], cols: int = 8,
                   hover: list[str] | None = None) -> go.Figure:
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


def influence_grid_fig(X: np.ndarray, image_shape, data: pd.DataFrame) -> go.Figure:
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


def spread(values) -> float:
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
    groups = list(_by_arch(data))
    attention = _attention_of(data, attention)
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
    _style(fig, "influence (output units; one scale for all)", "training points (count)", title=title)
    positive = {a: s for a, s in spreads.items() if s > 0}
    if len(positive) >= 2 and max(positive.values()) > 10 * min(positive.values()):
        big, small = max(positive, key=positive.get), min(positive, key=positive.get)
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
    return _style(fig, "training image (index, label)", "influence (output units)", title=title, height=300)


# ---------------------------------------------------------------- malleability

def flip_bars_fig(summary: pd.DataFrame, eps: float, value: str = "flip_rate_pct",
                  y_title: str = "flip rate (% of top-τ points)", fmt: str = ".1f",
                  eps_label: str = "ε", attention: str | None = None) -> go.Figure:
    """Grouped bars at one ε: attack on x, one bar per arch, height ``{value}_mean`` with
    ``{value}_sd`` error bars (a summary from ``engine.tables``; nothing is averaged here)."""
    d = summary[np.isclose(summary["eps"].astype(float), eps)]
    fig = go.Figure()
    for arch, da in _by_arch(d):
        label = arch_label(arch, attention)
        mean, sd = da[f"{value}_mean"], da[f"{value}_sd"].fillna(0)
        fig.add_trace(go.Bar(x=[a.upper() for a in da["attack"]], y=mean, name=label,
                             marker_color=ARCH_COLORS.get(arch, "black"),
                             error_y=dict(type="data", array=sd, visible=True),
                             text=[format(v, fmt) for v in mean], textposition="outside",
                             customdata=np.stack([sd, da["n_seeds"]], axis=1),
                             hovertemplate=(f"{label}<br>%{{x}}<br>%{{y:.2f}} ± %{{customdata[0]:.2f}}"
                                            " (sd over %{customdata[1]} seeds)<extra></extra>")))
    fig.update_layout(barmode="group")
    return _style(fig, f"attack ({eps_label} = {eps:g})", y_title)


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
    return _style(fig, eps_label, y_title)


def interventions_fig(data: pd.DataFrame, value: str = "test_acc",
                      y_title: str = "test accuracy (fraction)", attention: str | None = None) -> go.Figure:
    fig = go.Figure()
    for arch, d in _by_arch(data):
        label = arch_label(arch, attention)
        fig.add_trace(go.Bar(x=d["intervention"], y=d[value], name=label,
                             marker_color=ARCH_COLORS.get(arch, "black"),
                             hovertemplate=f"{label}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>"))
    fig.update_layout(barmode="group")
    return _style(fig, "intervention on the training set", y_title)


def before_after_fig(clean: np.ndarray, perturbed: np.ndarray, image_shape,
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
    for i, axis in enumerate(("", "2", "3")):
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
    return _style(fig, "aggregate influence before the attack (output units)",
                  "aggregate influence after the attack (output units)")


def compare_bars_fig(data: pd.DataFrame, x: str, y_title: str) -> go.Figure:
    """Paper against measured: columns ``x``, ``arch``, ``paper``, ``measured`` (same units)."""
    fig = go.Figure()
    for arch, d in _by_arch(data):
        color = ARCH_COLORS.get(arch, "black")
        fig.add_trace(go.Bar(x=d[x], y=d["paper"], name=f"{arch_label(arch)}, paper", marker_color=color,
                             opacity=0.45,
                             hovertemplate=f"{arch_label(arch)}, paper<br>%{{x}}: %{{y:.3g}}<extra></extra>"))
        fig.add_trace(go.Bar(x=d[x], y=d["measured"], name=f"{arch_label(arch)}, here", marker_color=color,
                             hovertemplate=f"{arch_label(arch)}, here<br>%{{x}}: %{{y:.3g}}<extra></extra>"))
    fig.update_layout(barmode="group")
    return _style(fig, x, y_title)


# ---------------------------------------------------------------- scaling law

def model_label(arch: str, attention) -> str:
    if arch == "attn" and isinstance(attention, str):
        return f"{arch_label(arch)} ({attention})"
    return arch_label(arch)


def scaling_data(widths: pd.DataFrame, fit: pd.DataFrame) -> pd.DataFrame:
    """Width needed per (model, κ), with the fitted and the theory line's value at each κ.

    Censored points (no width up to the maximum met the target) keep ``width_needed`` NaN.
    """
    rows = []
    for _, w in widths.iterrows():
        att = w["attention"] if isinstance(w["attention"], str) else None
        f = fit[(fit["arch"] == w["arch"]) & (fit["attention"].fillna("") == (att or ""))].iloc[0]
        fitted = (math.exp(f["intercept"]) * w["kappa"] ** f["exponent"]
                  if pd.notna(f["exponent"]) else np.nan)
        rows.append({"model": model_label(w["arch"], att), "arch": w["arch"], "attention": att,
                     "kappa": w["kappa"], "width_needed": w["width_needed"], "censored": bool(w["censored"]),
                     "fitted_width": fitted, "exponent": f["exponent"],
                     "exponent_low": f.get("exponent_low"), "exponent_high": f.get("exponent_high"),
                     "monotone": bool(w.get("monotone", True)), "theory_exponent": f["theory_exponent"]})
    return pd.DataFrame(rows)


def scaling_fig(data: pd.DataFrame, max_width: int) -> go.Figure:
    """Width needed against κ on log-log axes: measured points, the fitted power law, and
    censored κ values drawn as open triangles at the maximum width tried."""
    fig = go.Figure()
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for i, (model, d) in enumerate(data.groupby("model", sort=False)):
        color = palette[i % len(palette)]
        ok, cens = d[~d["censored"]], d[d["censored"]]
        p, theory = d["exponent"].iloc[0], d["theory_exponent"].iloc[0]
        lo, hi = d["exponent_low"].iloc[0], d["exponent_high"].iloc[0]
        interval = f" [{lo:.2f}, {hi:.2f}] 95 %" if pd.notna(lo) and pd.notna(hi) else ""
        label = f"{model}: fitted p = {p:.2f}{interval}" if pd.notna(p) else f"{model}: too few points to fit"
        fig.add_trace(go.Scatter(x=ok["kappa"], y=ok["width_needed"], mode="markers", name=label,
                                 marker=dict(color=color, size=9,
                                             symbol=["circle" if m else "x" for m in ok["monotone"]]),
                                 hovertemplate=f"{model}<br>κ = %{{x:g}}<br>width %{{y:.0f}}<extra></extra>"))
        if pd.notna(p):
            fig.add_trace(go.Scatter(x=d["kappa"], y=d["fitted_width"], mode="lines", showlegend=False,
                                     line=dict(color=color), hoverinfo="skip"))
        if pd.notna(theory) and len(ok):
            anchor = ok.iloc[0]
            fig.add_trace(go.Scatter(
                x=d["kappa"], y=anchor["width_needed"] * (d["kappa"] / anchor["kappa"]) ** theory,
                mode="lines", line=dict(color=color, dash="dot"), name=f"{model}: theory p = {theory:g}",
                hoverinfo="skip"))
        if len(cens):
            fig.add_trace(go.Scatter(x=cens["kappa"], y=[max_width] * len(cens), mode="markers",
                                     marker=dict(color=color, symbol="triangle-up-open", size=11),
                                     name=f"{model}: above {max_width}",
                                     hovertemplate=f"{model}<br>κ = %{{x:g}}<br>needs more than {max_width}"
                                                   "<extra></extra>"))
    _style(fig, "κ(G), condition number of the data's Gram (log scale; a tick at every κ tried)",
           "smallest width within the target (hidden units, log scale)", logx=True, logy=True)
    kappas = sorted({float(k) for k in data["kappa"]})
    fig.update_xaxes(tickvals=kappas, ticktext=[f"{k:g}" for k in kappas],
                     range=[math.log10(kappas[0]) - 0.08, math.log10(kappas[-1]) + 0.08] if kappas else None)
    top = np.nanmax(np.r_[data["width_needed"].astype(float), max_width])
    bottom = max(1.0, np.nanmin(data["width_needed"].astype(float).fillna(top)) / 2)
    fig.update_yaxes(range=[math.log10(bottom), math.log10(top * 4)])
    powers = [2.0 ** e for e in range(math.floor(math.log2(bottom)), math.ceil(math.log2(top * 4)) + 1)]
    step = max(1, math.ceil(len(powers) / 8))  # at most about 8 labels: widths are powers of two
    ticks = powers[::step]
    fig.update_yaxes(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    return fig
