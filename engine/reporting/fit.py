"""Fitting a chart to its canvas: wrapped titles, legends and log ticks that stay inside a slide.

Plotly does not wrap text or shrink a legend to fit. ``fit`` estimates each text's width from
the font size (``CHAR_EM`` per glyph, conservative for digits and capitals), wraps titles and
legend entries at the canvas width, and moves the plot area so that nothing is cut off at
16:9 or 4:3; a log axis over many decades keeps at most ``LOG_LABELS`` tick labels.
"""

from __future__ import annotations

import plotly.graph_objects as go

# ---------------------------------------------------------------- fitting a chart to its canvas

TITLE_GAP_PX = 12   # from the canvas's top edge to the title's
LOG_LABELS = 7      # most tick labels on a log axis of many decades
CHAR_EM = 0.62      # average advance of a glyph of the chart font, in em (conservative for digits and capitals)
LINE_EM = 1.3       # plotly's line height for <br> breaks


def _text_px(text: str, size: float) -> float:
    return len(text) * size * CHAR_EM


def _wrap(text: str, size: float, width: float) -> str:
    """``text`` with <br> breaks so that no line is wider than ``width`` pixels at ``size``."""
    lines = []
    for para in str(text).split("<br>"):
        line = ""
        for word in para.split(" "):
            trial = f"{line} {word}".strip()
            if line and _text_px(trial, size) > width:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return "<br>".join(lines)


def _lines(text: str | None) -> int:
    return 0 if not text else str(text).count("<br>") + 1


def _legend_rows(fig: go.Figure, size: float, width: float) -> int:
    """Rows of a horizontal legend across ``width`` pixels (entries of symbol + name)."""
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    if not names:
        return 0
    rows, used = 1, 0.0
    for name in names:
        w = 40 + _text_px(name, size) + 20  # symbol, text and the gap plotly leaves after each entry
        if used and used + w > width:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def fit(fig: go.Figure, width: int, height: int) -> go.Figure:
    """A copy sized for a ``width`` × ``height`` canvas (CSS pixels): the title and its settings
    line wrap to the width, the top margin holds them, a legend above the plot (in as many rows
    as its entries need) and any annotation above the plot (subplot titles); every axis grows
    the margins for its tick labels and title (``automargin``). Charts without a title keep
    their layout apart from the automargins."""
    out = go.Figure(fig)
    base = float(out.layout.font.size or 12)
    out.update_xaxes(automargin=True)
    out.update_yaxes(automargin=True)
    title = out.layout.title
    left = float(out.layout.margin.l if out.layout.margin.l is not None else 80)
    room = width - 0.02 * width - 20
    top = 0.0
    sub = title.subtitle.text if title.subtitle else None
    if title.text or sub:
        size = float(title.font.size or base * 1.4)
        sub_size = float((title.subtitle.font.size if title.subtitle else None) or base)
        text = _wrap(title.text or "", size, room)
        top = TITLE_GAP_PX + _lines(text) * size * LINE_EM + 8
        update = dict(text=text, x=0.01, xanchor="left", xref="container", y=1.0 - TITLE_GAP_PX / height,
                      yanchor="top", yref="container")
        if sub:
            sub = _wrap(sub, sub_size, room)
            update["subtitle"] = dict(text=sub)
            top += _lines(sub) * sub_size * LINE_EM + 6
        out.update_layout(title=update)
    legend = out.layout.legend
    horizontal_above = legend.orientation == "h" and (legend.y is None or legend.y >= 1.0)
    if horizontal_above and out.layout.showlegend is not False:
        size = float(legend.font.size or base)
        right = float(out.layout.margin.r if out.layout.margin.r is not None else 80)
        rows = _legend_rows(out, size, width - left - right - 40)
        top += rows * max(size * LINE_EM, 20) + 10
        out.update_layout(legend=dict(y=1.0, yanchor="bottom", yref="paper"))
    above = 0.0
    for a in out.layout.annotations or ():
        if a.yref == "paper" and a.y is not None and a.y >= 0.99 and (a.yanchor in (None, "bottom", "auto")):
            above = max(above, _lines(a.text) * float(a.font.size or base) * LINE_EM + 8)
    if title.text or sub or horizontal_above:
        top = top + (above if not horizontal_above else max(0.0, above - 10)) + 8
        out.update_layout(margin=dict(t=int(min(top, 0.6 * height))))
    return out


def full_size_log_ticks(fig: go.Figure) -> go.Figure:
    """Log axes without chosen ticks get 1-2-5 labels (within two decades) or powers of ten at
    the axis's own font size, instead of plotly's 9 px minor digits that stack on a slide."""
    import math

    import numpy as np

    axes: dict[str, list[np.ndarray]] = {}
    for trace in fig.data:
        for letter in ("x", "y"):
            ref = getattr(trace, f"{letter}axis", None) or letter
            values = getattr(trace, letter, None)
            if values is None:
                continue
            try:
                v = np.asarray(values, dtype=float).ravel()
            except (TypeError, ValueError):
                continue
            axes.setdefault(ref, []).append(v)
    for ref, chunks in axes.items():
        name = ref[0] + "axis" + ref[1:]
        axis = fig.layout[name] if name in fig.layout else None
        if axis is None or axis.type != "log" or axis.tickvals is not None or axis.dtick is not None:
            continue
        v = np.concatenate(chunks)
        v = v[np.isfinite(v) & (v > 0)]
        if not v.size:
            continue
        lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))
        if hi - lo > 2:  # powers of ten, at most about LOG_LABELS of them (eigenvalues span 17 decades)
            fig.layout[name].update(dtick=max(1, math.ceil((hi - lo) / LOG_LABELS)))
            continue
        ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in (1, 2, 5)]
        ticks = [t for t in ticks if v.min() / 1.5 <= t <= v.max() * 1.5] or [10.0 ** lo]
        fig.layout[name].update(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    return fig
