"""A page's chart made ready for a slide: its title and settings line, and the Presentation style.

``titled`` and ``slide`` put a title and a one-line settings line at the top left (``fit`` then
gives them room at any export size); ``talk_style`` is the dashboard's Presentation mode: slide-sized
text (``TALK``), thicker lines, larger markers, and every colour the dashboard draws with swapped for
its Okabe–Ito twin (``OKABE_ITO``), wherever it is set, so that an architecture keeps one colour on
every slide. ``engine.reporting.export`` re-exports these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # plotly is imported where a figure is made
    import plotly.graph_objects as go

OKABE_ITO = {  # plotly's default colours -> Okabe & Ito (2008), distinguishable with every colour vision
    "#1f77b4": "#0072B2", "#d62728": "#D55E00", "#2ca02c": "#009E73", "#9467bd": "#CC79A7",
    "#ff7f0e": "#E69F00", "#8c564b": "#56B4E9", "#7f7f7f": "#000000", "#17becf": "#F0E442",
}


TALK = dict(font=18, title=22, subtitle=16, ticks=16, axis_titles=18, legend=16, annotations=16)  # px


def _twin(value: Any) -> Any:
    """A colour, or a list of them (one per bar or point), with the dashboard's swapped for their
    Okabe–Ito twins; None where nothing changes (numbers, colour by value, are left alone)."""
    if isinstance(value, str):
        return OKABE_ITO.get(value.lower())
    if isinstance(value, (list, tuple)) or getattr(value, "dtype", None) is not None and value.dtype.kind in "OUS":
        twins = [OKABE_ITO.get(v.lower(), v) if isinstance(v, str) else v for v in value]
        return twins if twins != list(value) else None
    return None


def _recolouring(node: dict) -> dict:
    """The ``*color`` entries of a trace's or shape's dict that ``_twin`` changes, nested as in ``node``,
    for ``update``."""
    out: dict = {}
    for k, v in node.items():
        new = _recolouring(v) if isinstance(v, dict) else _twin(v) if k.endswith("color") else None
        if new:
            out[k] = new
    return out


def talk_style(fig: go.Figure) -> go.Figure:
    """A copy with slide-sized text (``TALK``: ticks, axis titles, legend, subplot titles and
    colour bars too, set on every axis so that no theme's 12 px survives), thicker lines,
    larger markers and colour-blind-safe colours (the Presentation mode): every colour of
    ``OKABE_ITO``'s keys, whether one per trace or one per bar, in markers, lines, fills, error
    bars, patterns and shapes, becomes its twin. The figure passed in is left as it is."""
    import plotly.graph_objects as go

    from .fit import full_size_log_ticks

    out = go.Figure(fig)
    plain = out.to_plotly_json()  # read only for its colours: markers, lines, fills, error bars, patterns, shapes
    for trace, d in zip(out.data, plain["data"], strict=True):
        trace.update(_recolouring(d))
    for kind in ("shapes", "annotations"):
        for obj, d in zip(out.layout[kind], plain["layout"].get(kind, ()), strict=True):
            obj.update(_recolouring(d))
    out.update_layout(font=dict(size=TALK["font"]), title_font=dict(size=TALK["title"]),
                      title_subtitle_font=dict(size=TALK["subtitle"]), legend=dict(font=dict(size=TALK["legend"])),
                      colorway=list(OKABE_ITO.values()))
    out.update_xaxes(tickfont_size=TALK["ticks"], title_font_size=TALK["axis_titles"])
    out.update_yaxes(tickfont_size=TALK["ticks"], title_font_size=TALK["axis_titles"])
    out.update_coloraxes(colorbar_tickfont_size=TALK["ticks"], colorbar_title_font_size=TALK["ticks"])
    for trace in out.data:
        if "colorbar" in trace and trace.showscale is not False:
            trace.update(colorbar_tickfont_size=TALK["ticks"], colorbar_title_font_size=TALK["ticks"])
    for trace in out.data:  # thicker lines and larger markers, but a band's invisible edge stays invisible
        if trace.type == "scatter" and trace.line.width != 0:
            trace.update(line_width=3, marker_size=9)
    out.update_traces(textfont_size=TALK["ticks"], selector=dict(type="bar"))
    out.update_annotations(font_size=TALK["annotations"])
    return full_size_log_ticks(out)


def titled(fig: go.Figure, title: str, settings: str = "") -> go.Figure:
    """Put ``title`` at the top left and ``settings`` (one line: data, n, seeds, protocol) under
    it; ``fit`` gives them, and the legend below them, room at any export size."""
    from .fit import full_size_log_ticks

    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", xref="container", y=1.0, yanchor="top",
                                 yref="container", pad=dict(t=10), subtitle=dict(text=settings or None)))
    return full_size_log_ticks(fig)


WARNING = "warning"  # the key of a chart's warning in its layout.meta


def slide(fig: go.Figure, settings: str = "", title: str | None = None) -> go.Figure:
    """A copy of a page's chart ready for a slide: ``title`` (default: the chart's own), the
    settings line under it, and full-size tick labels on log axes. ``image_bytes`` then fits it
    to the export's size. A warning the chart carries (``warn``) stays on the settings line."""
    import plotly.graph_objects as go

    out = go.Figure(fig)
    text = title or out.layout.title.text or ""
    warning = (out.layout.meta or {}).get(WARNING) if isinstance(out.layout.meta, dict) else None
    if warning and warning not in settings:
        settings = " · ".join(p for p in (settings, warning) if p)
    return titled(out, text, settings)


def warn(fig: go.Figure, text: str) -> go.Figure:
    """Mark ``fig`` with a warning (nets near chance, say) that every slide of it keeps; "" marks nothing."""
    if text:
        meta = dict(fig.layout.meta) if isinstance(fig.layout.meta, dict) else {}
        fig.update_layout(meta={**meta, WARNING: text})
    return fig
