"""Figures for talks: a page's main chart rendered headless to PNG, SVG or PDF.

kaleido 1.x (pinned in requirements.txt) renders Plotly figures in a Chrome or Chromium it
drives over the DevTools protocol (through ``choreographer``); it ships no browser and cannot
download one here. Its ``kaleido.Kaleido(**kwargs)`` passes unknown keywords on to
``choreographer.Browser(path=...)``, the browser's executable (the environment variable
``BROWSER_PATH`` does the same). ``browser_path`` picks one: ``$ENGINE_BROWSER``,
``$BROWSER_PATH``, Debian's ``/usr/bin/chromium``, then chromium or Chrome on ``PATH``.
MathJax is switched off (kaleido would fetch it from a CDN; the figures use Unicode, not
LaTeX) and plotly.js comes from the installed plotly package, so nothing is downloaded.

``image_bytes(fig, "png" | "svg" | "pdf")`` is the helper for download buttons;
``main_figure(kind, result)`` builds the chart a page leads with from a cached result (each
experiment's registry record names its figure function here), so that ``python -m engine
figure KIND ... --out FILE`` draws exactly what the dashboard shows.
Each call starts a fresh headless browser (about a second).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import plotly.graph_objects as go

from .errors import BadInput, EngineError

FORMATS = ("png", "svg", "pdf")
DEBIAN_CHROMIUM = "/usr/bin/chromium"
WIDTH_PX = 1000       # default image size in CSS pixels (PNG: times ``scale``)
HEIGHT_PX = 560
SCALE = 2.0           # PNG pixel density: sharp on a projector
TIMEOUT_S = 90.0      # kaleido's limit for one image


class BrowserMissing(EngineError):
    """No Chrome or Chromium to render with (exit code 3, like missing data)."""

    exit_code = 3


def browser_path() -> str | None:
    """The browser kaleido will drive, or None when there is none here."""
    for name in ("ENGINE_BROWSER", "BROWSER_PATH"):
        value = os.environ.get(name)
        if value:
            return value
    if os.access(DEBIAN_CHROMIUM, os.X_OK):
        return DEBIAN_CHROMIUM
    for exe in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(exe)
        if found:
            return found
    return None


def format_of(path: str | os.PathLike) -> str:
    """"png", "svg" or "pdf" from a file name's suffix; ``BadInput`` otherwise."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise BadInput(f"cannot tell the image format of {str(path)!r}; end the file name in "
                       f"{', '.join('.' + f for f in FORMATS)}")
    return fmt


def image_bytes(fig: go.Figure, fmt: str = "png", width: int | None = None, height: int | None = None,
                scale: float = SCALE) -> bytes:
    """The figure as PNG, SVG or PDF bytes, rendered by kaleido in a headless Chromium.

    width/height in CSS pixels (default: ``WIDTH_PX`` and the figure's own height, else
    ``HEIGHT_PX``); ``scale`` multiplies the PNG's pixels (vector formats ignore it).
    Raises ``BrowserMissing`` when no browser is found, ``EngineError`` (one line) when the
    render fails. For a page: ``st.download_button("PNG", lambda: image_bytes(fig, "png"), ...)``.
    """
    if fmt not in FORMATS:
        raise BadInput(f"unknown image format {fmt!r}; allowed: {', '.join(FORMATS)}")
    browser = browser_path()
    if browser is None:
        raise BrowserMissing("no Chrome or Chromium found to render images with; install Debian's chromium "
                             "(apt-get install chromium) or set ENGINE_BROWSER to a browser's path")
    if not (os.path.isfile(browser) and os.access(browser, os.X_OK)):
        raise BrowserMissing(f"the browser {browser!r} is not an executable file; fix ENGINE_BROWSER "
                             "or BROWSER_PATH")
    try:
        import kaleido
    except ImportError:
        raise EngineError("kaleido is not installed; pip install -r requirements.txt") from None
    opts = {"format": fmt, "width": int(width or WIDTH_PX),
            "height": int(height or fig.layout.height or HEIGHT_PX),
            "scale": float(scale) if fmt == "png" else 1.0}  # vector formats keep their CSS size
    try:
        data = kaleido.calc_fig_sync(fig, opts=opts, kopts={"path": browser, "mathjax": False, "timeout": TIMEOUT_S})
    except Exception as exc:  # kaleido and choreographer raise many kinds; the user needs one line
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise EngineError(f"rendering the {fmt.upper()} with {browser} failed: {text[:300]}") from exc
    return bytes(data)


def write_image(fig: go.Figure, path: str | os.PathLike, width: int | None = None, height: int | None = None,
                scale: float = SCALE) -> Path:
    """Render to ``path`` (format from its suffix); creates missing parent folders."""
    path = Path(path).expanduser()
    data = image_bytes(fig, format_of(path), width, height, scale)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


OKABE_ITO = {  # plotly's default colours -> Okabe & Ito (2008), distinguishable with every colour vision
    "#1f77b4": "#0072B2", "#d62728": "#D55E00", "#2ca02c": "#009E73", "#9467bd": "#CC79A7",
    "#ff7f0e": "#E69F00", "#8c564b": "#56B4E9", "#7f7f7f": "#000000", "#17becf": "#F0E442",
}


def talk_style(fig: go.Figure) -> go.Figure:
    """A copy with slide-sized text, thicker lines and larger markers (the Presentation mode)."""
    out = go.Figure(fig)
    out.update_layout(font=dict(size=18), title_font=dict(size=22), legend=dict(font=dict(size=16)),
                      colorway=list(OKABE_ITO.values()))
    out.update_traces(line_width=3, marker_size=9, selector=dict(type="scatter"))
    out.update_annotations(font_size=18)
    for trace in out.data:  # the dashboard's own colours, swapped for their colour-blind-safe twins
        for part in ("marker", "line"):
            obj = getattr(trace, part, None)
            color = getattr(obj, "color", None) if obj is not None else None
            if isinstance(color, str) and color.lower() in OKABE_ITO:
                obj.color = OKABE_ITO[color.lower()]
    return out


def titled(fig: go.Figure, title: str) -> go.Figure:
    """Put ``title`` at the top left, above the horizontal legend, with room for both."""
    top = max(int(fig.layout.margin.t or 0), 95)
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", y=0.98, yanchor="top"),
                      margin=dict(t=top))
    return fig


# ---------------------------------------------------------------- a page's main chart

def _where(config: dict) -> str:
    data = config.get("data") or {}
    if not data:
        return ""
    return f" ({data.get('dataset')}, n = {data.get('n')})"


def main_figure(kind: str, result, metric: str | None = None) -> go.Figure:
    """The chart a page leads with, drawn from its result, titled for a slide.

    kind: an experiment with a figure in ``engine.registry.EXPERIMENTS`` (old spellings such as
    ``ntk`` and ``regime`` too); ``metric`` picks the plotted column where the figure has a
    choice (``ntk_figure``, ``dynamics_figure``).
    """
    from .registry import get

    return get(kind).main_figure(result, metric)


def spectrum_figure(result, metric: str | None = None) -> go.Figure:
    """Eigenvalues of G and of the attention features' Gram (a ``spectrum`` result)."""
    from . import plots

    summ = result.meta["summary"]
    data = plots.spectrum_data(result.arrays["eig_G"], result.arrays["eig_attention"])
    fig = plots.spectrum_fig(data, summ["rank_tol"], summ["attention"])
    return titled(fig, "Eigenvalues of G and of the attention features' Gram" + _where(result.config))


def ntk_figure(result, metric: str | None = None) -> go.Figure:
    """One sweep metric against width (an ``ntk-sweep`` result; default kernel_dist_init)."""
    from . import plots

    metric = metric or "kernel_dist_init"
    rows = result.frames["rows"]
    if metric not in rows:
        raise BadInput(f"unknown metric {metric!r} for ntk-sweep; allowed: "
                       f"{', '.join(m for m in plots.METRICS if m in rows)}")
    fig = plots.distance_fig(plots.distance_data(rows, metric), metric)
    return titled(fig, plots.METRICS.get(metric, (metric,))[0] + _where(result.config))


def malleability_figure(result, metric: str | None = None) -> go.Figure:
    """Flip rates per attack and architecture at the largest ε (a ``malleability`` result)."""
    from . import plots, tables

    cfg = result.config
    summary = tables.percent(result.frames["summary"], ["flip_rate", "pair_flip_rate"])
    eps = float(summary["eps"].astype(float).max())
    units = "pixel units" if cfg.get("space") == "raw" else "unit-row units"  # as the page labels it
    label = f"ε ({(cfg.get('attack') or {}).get('norm', '')} radius, {units})"
    fig = plots.flip_bars_fig(summary, eps, eps_label=label)
    return titled(fig, f"Influence sign flips under attack, ε = {eps:g}" + _where(cfg))


def scaling_figure(result, metric: str | None = None) -> go.Figure:
    """Width needed against κ with the fitted power law (a ``scaling`` result)."""
    from . import plots

    frames = result.frames
    fig = plots.scaling_fig(plots.scaling_data(frames["widths"], frames["fit"]), result.config["max_width"])
    return titled(fig, "Width needed to stay near K∞ against the condition number κ" + _where(result.config))


DYNAMICS_METRICS = ("lin_gap", "pattern_change", "k_inf_gap", "weight_movement")


def dynamics_figure(result, metric: str | None = None) -> go.Figure:
    """One of ``DYNAMICS_METRICS`` after training against width (a ``dynamics`` result; default lin_gap)."""
    from . import plots

    metric = metric or "lin_gap"
    if metric not in DYNAMICS_METRICS:
        raise BadInput(f"unknown metric {metric!r} for dynamics; allowed: {', '.join(DYNAMICS_METRICS)}")
    final = result.frames["final"]
    if final[f"{metric}_mean"].isna().all():
        raise BadInput(f"{metric} was not measured in this run (k_inf_gap needs MSE and SGD)")
    fig = plots.regime_width_fig(plots.regime_width_data(final, metric), metric)
    title = f"{plots.REGIME_LABELS[metric][0]} after {result.config['train']['epochs']} epochs"
    return titled(fig, title + _where(result.config))
