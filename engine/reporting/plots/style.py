"""What every chart shares: labels, colours, metric titles, axis and layout helpers."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ...experiments.columns import titles

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "ARCH_COLORS", "ARCH_LABELS", "ATTACK_DASH", "HEIGHT", "LARGEST_LOG10", "LARGEST_PARAMS_LOG10", "MAX_SIDE",
    "METRICS", "PRACTICAL_LOG10", "SUPERSCRIPTS", "arch_label", "eps_label", "near_chance", "pretty_formula"
]

MAX_SIDE = 500
ARCH_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}
ARCH_COLORS = {"relu": "#1f77b4", "attn": "#d62728"}
ATTACK_DASH = {"fgsm": "solid", "pgd": "dash", "mim": "dot"}
PRACTICAL_LOG10 = (3.0, 5.0)   # widths people train: 1e3 .. 1e5 hidden units
LARGEST_PARAMS_LOG10 = 12.0    # the largest models: about 1e12 parameters (not hidden units)
LARGEST_LOG10 = LARGEST_PARAMS_LOG10  # old name, kept for one release
HEIGHT = 400

METRICS = titles()  # column -> (chart title, axis title with units), declared with the column


SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
NORM_SYMBOLS = {"linf": "ℓ∞", "l2": "ℓ2"}
SPACE_UNITS = {"raw": "pixel units", "normalized": "units of the unit-norm rows"}


def eps_label(norm: str, space: str) -> str:
    """A human axis title for the attack radius: "ℓ∞ radius ε, pixel units"."""
    return f"{NORM_SYMBOLS.get(norm, norm)} radius ε, {SPACE_UNITS.get(space, space)}"


def eps_at(label: str, eps: float) -> str:
    """An ``eps_label`` at one radius: "ℓ∞ radius ε = 0.3, pixel units" (a label without ε gets
    " = 0.3" at its end)."""
    return label.replace("ε", f"ε = {eps:g}", 1) if "ε" in label else f"{label} = {eps:g}"


def arch_label(arch: str, attention: str | None = None) -> str:
    """"2L-ReLU", "MLP-Attn", or "MLP-Attn (softmax:0.1)" when the attention variant is given."""
    label = ARCH_LABELS.get(arch, arch)
    return f"{label} ({attention})" if arch == "attn" and isinstance(attention, str) and attention else label


def near_chance(untrained: pd.DataFrame | None) -> str:
    """The settings line's warning for the (arch, width) groups whose worst net stayed near chance
    (``engine.maths.gates.untrained``; greyed by ``distance_fig``), or "" when every net trained."""
    if untrained is None or untrained.empty:
        return ""
    widths: dict[str, list[str]] = {}
    for r in untrained.itertuples():
        widths.setdefault(arch_label(str(r.arch)), []).append(f"{int(getattr(r, 'width', 0))}")
    return "⚠ near chance, greyed: " + "; ".join(f"{a} m = {', '.join(w)}" for a, w in widths.items())


def pretty_formula(formula: str | None) -> str | None:
    """The engine's plain formula (``κ(G)^3``, ``(λ_1/λ_10)^3``) with superscript powers: κ(G)³."""
    if not formula:
        return None
    return re.sub(r"\^(-?\d+)", lambda m: m.group(1).translate(SUPERSCRIPTS), formula)


def attention_of(data: pd.DataFrame, attention: str | None = None) -> str | None:
    """The attention variant a result was made with: the argument, else the data's own column."""
    if attention:
        return attention
    if "attention" in data:
        found = [a for a in data["attention"] if isinstance(a, str) and a]
        return found[0] if found else None
    return None


def by_arch(data: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(arch, rows) pairs in the fixed order relu, attn, then any others."""
    present = list(dict.fromkeys(data["arch"]))
    order = [a for a in ARCH_LABELS if a in present] + [a for a in present if a not in ARCH_LABELS]
    for arch in order:
        yield arch, data[data["arch"] == arch]


def styled(fig: go.Figure, x: str, y: str, title: str | None = None, logx: bool = False,
           logy: bool = False, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height,
                      title=dict(text=title, y=0.98, yanchor="top", x=0.01) if title else None,
                      margin=dict(l=60, r=20, t=85 if title else 40, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
                      hovermode="closest")
    fig.update_xaxes(title_text=x, type="log" if logx else None)
    fig.update_yaxes(title_text=y, type="log" if logy else None, exponentformat="power")
    return fig


def log_ticks(fig: go.Figure, values: ArrayLike, axis: str = "y") -> None:
    """Readable log-axis ticks: 1-2-5 labels within two decades, powers of ten beyond."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))
    if hi - lo > 2:
        update(dtick=max(1, math.ceil((hi - lo) / 7)))  # powers of ten only, at most about 7 labels
        return
    ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if v.min() / 1.5 <= t <= v.max() * 1.5]
    update(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])


def width_ticks(fig: go.Figure, widths: Iterable[float]) -> None:
    """Ticks at the measured widths only (log x)."""
    w = sorted({int(x) for x in widths})
    fig.update_xaxes(tickvals=w, ticktext=[str(x) for x in w])


def for_log_axis(v: ArrayLike) -> np.ndarray:
    """Values for a log axis: non-positive entries become NaN (gaps) instead of errors."""
    v = np.asarray(v, dtype=np.float64)
    return np.where(v > 0, v, np.nan)
