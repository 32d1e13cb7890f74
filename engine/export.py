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
import stat
import tempfile
from pathlib import Path

import plotly.graph_objects as go

from .data.folders import expand_path, writable
from .errors import BadInput, EngineError
from .plots.style import NORM_SYMBOLS

FORMATS = ("png", "svg", "pdf")
DEBIAN_CHROMIUM = "/usr/bin/chromium"
WIDTH_PX = 1000       # default image size in CSS pixels (PNG: times ``scale``)
HEIGHT_PX = 560
SCALE = 2.0           # PNG pixel density: sharp on a projector
SLIDE_PX = (1280, 720)  # the dashboard's PNG and SVG buttons: a 16:9 slide in CSS pixels
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
    ``HEIGHT_PX``); ``scale`` multiplies the PNG's pixels (vector formats ignore it). The
    figure is ``fit`` to that size first: its title and settings line wrap to the width and
    the margins hold them, the legend and every axis title, so no text is clipped.
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
    fig = fit(fig, opts["width"], opts["height"])  # title, legend and axis titles inside this canvas
    try:
        data = kaleido.calc_fig_sync(fig, opts=opts, kopts={"path": browser, "mathjax": False, "timeout": TIMEOUT_S})
    except Exception as exc:  # kaleido and choreographer raise many kinds; the user needs one line
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise EngineError(f"rendering the {fmt.upper()} with {browser} failed: {text[:300]}") from exc
    return bytes(data)


def check_output_path(path: str | os.PathLike) -> Path:
    """The image file ``path`` names (``~`` expanded), checked before any work is done: a
    known suffix (``format_of``), names within the file system's limits, not an existing
    folder, FIFO or device, and a parent that is (or can be created as) a writable folder.
    One-line ``BadInput`` naming the path otherwise. Where the parent exists, a probe file is
    created and removed there, so places that refuse files whatever their mode says (``/proc``,
    a read-only mount) are found now, not after the computation. Creates no folder."""
    p = expand_path(path, "output file")
    format_of(p)
    if p.name in ("", ".", ".."):
        raise BadInput(f"output file {str(path)!r} names no file; give a file name ending in .png, .svg or .pdf")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        above = next((q for q in p.parents if q.exists()), p.parent)
        raise BadInput(f"output file {p}: {above} is a file, not a folder; choose another place") from None
    except OSError as exc:  # a loop of links, no permission
        raise BadInput(f"output file {p}: cannot be written there ({exc.strerror or exc})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise BadInput(f"output file {p} is {kind}; give a file name ending in .png, .svg or .pdf")
    if st is not None and not (os.access(p, os.W_OK) and st.st_mode & 0o222):
        raise BadInput(f"output file {p} exists and is read-only; choose another name or make it writable")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"output file {p}: {parent} is a file, not a folder; choose another place")
    if not writable(parent):
        raise BadInput(f"output file {p}: the folder {parent} is not writable; choose another place")
    if parent == p.parent:
        try:
            fd, probe = tempfile.mkstemp(dir=parent, prefix=".engine-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise BadInput(f"output file {p}: no file can be created in {parent} ({exc.strerror or exc}); "
                           "choose another place") from None
    return p


def write_image(fig: go.Figure, path: str | os.PathLike, width: int | None = None, height: int | None = None,
                scale: float = SCALE) -> Path:
    """Render to ``path`` (format from its suffix; checked by ``check_output_path`` first);
    creates missing parent folders. The file is written beside its name and renamed into
    place, so a failed write leaves no partial image. Raises ``BadInput`` for a bad path."""
    path = check_output_path(path)
    data = image_bytes(fig, format_of(path), width, height, scale)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:  # the place changed since the check, or the disk is full
        raise BadInput(f"output file {path}: cannot be written ({exc.strerror or exc})") from None
    return path


OKABE_ITO = {  # plotly's default colours -> Okabe & Ito (2008), distinguishable with every colour vision
    "#1f77b4": "#0072B2", "#d62728": "#D55E00", "#2ca02c": "#009E73", "#9467bd": "#CC79A7",
    "#ff7f0e": "#E69F00", "#8c564b": "#56B4E9", "#7f7f7f": "#000000", "#17becf": "#F0E442",
}


TALK = dict(font=18, title=22, subtitle=16, ticks=16, axis_titles=18, legend=16, annotations=16)  # px


def talk_style(fig: go.Figure) -> go.Figure:
    """A copy with slide-sized text (``TALK``: ticks, axis titles, legend, subplot titles and
    colour bars too, set on every axis so that no theme's 12 px survives), thicker lines,
    larger markers and colour-blind-safe colours (the Presentation mode)."""
    out = go.Figure(fig)
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
    for trace in out.data:  # the dashboard's own colours, swapped for their colour-blind-safe twins
        for part in ("marker", "line"):
            obj = getattr(trace, part, None)
            color = getattr(obj, "color", None) if obj is not None else None
            if isinstance(color, str) and color.lower() in OKABE_ITO:
                obj.color = OKABE_ITO[color.lower()]
        fill = getattr(trace, "fillcolor", None)  # a mean ± sd band: the same colour as its line
        if isinstance(fill, str) and fill.lower() in OKABE_ITO:
            trace.fillcolor = OKABE_ITO[fill.lower()]
    return _full_size_log_ticks(out)


def titled(fig: go.Figure, title: str, settings: str = "") -> go.Figure:
    """Put ``title`` at the top left and ``settings`` (one line: data, n, seeds, protocol) under
    it; ``fit`` gives them, and the legend below them, room at any export size."""
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", xref="container", y=1.0, yanchor="top",
                                 yref="container", pad=dict(t=10), subtitle=dict(text=settings or None)))
    return _full_size_log_ticks(fig)


def slide(fig: go.Figure, settings: str = "", title: str | None = None) -> go.Figure:
    """A copy of a page's chart ready for a slide: ``title`` (default: the chart's own), the
    settings line under it, and full-size tick labels on log axes. ``image_bytes`` then fits it
    to the export's size."""
    out = go.Figure(fig)
    text = title or out.layout.title.text or ""
    return titled(out, text, settings)


# ---------------------------------------------------------------- the settings line

def _seeds(seeds) -> str:
    seeds = [int(s) for s in seeds or ()]
    if not seeds:
        return ""
    run = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    text = f"{seeds[0]}–{seeds[-1]}" if run and len(seeds) > 2 else ", ".join(str(s) for s in seeds)
    return f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({text})"


OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def settings_line(config: dict) -> str:
    """One line for a slide from a result's canonical config (``Result.config``): data set and
    sizes, seeds, training protocol and, where there is one, the attack. Missing parts are left
    out, so any experiment's config (or ``{}``) gives a line."""
    config = config or {}
    parts = []
    data = config.get("data") or {}
    if data:
        name = str(data.get("dataset", ""))
        if name.lower().endswith(".npz"):
            name = Path(name).name
        size = f"n = {data.get('n')}"
        if data.get("n_test", 1) > 1:
            size += f" ({data.get('n_test')} test)"
        parts.append(f"{name}, {size}")
    elif "kappas" in config:  # the scaling law's own synthetic draws
        parts.append(f"synthetic, n = {config.get('n')}, d = {config.get('d')}, κ dialled")
    if config.get("widths") and len(config["widths"]) <= 6:
        parts.append("m = " + ", ".join(str(w) for w in config["widths"]))
    elif config.get("width"):
        parts.append(f"m = {config['width']}")
    if _seeds(config.get("seeds")):
        parts.append(_seeds(config.get("seeds")))
    train = config.get("train") or {}
    if train:
        opt = OPTIMIZER_NAMES.get(train.get("optimizer"), train.get("optimizer"))
        bits = [f"{opt} lr {train.get('lr'):g}" if train.get("lr") is not None else str(opt)]
        if train.get("weight_decay"):
            bits.append(f"wd {train['weight_decay']:g}")
        bits.append(f"{train.get('epochs')} epochs")
        if train.get("param") and train["param"] != "ntk":
            bits.append(train["param"])
        parts.append(", ".join(bits))
    attack = config.get("attack") or {}
    if attack and config.get("attacks"):
        space = {"raw": "pixels", "normalized": "unit rows"}.get(config.get("space"), config.get("space"))
        parts.append(f"{NORM_SYMBOLS.get(attack.get('norm'), attack.get('norm'))} attacks on {space}, "
                     f"{attack.get('steps')} steps")
    if config.get("attention") and config.get("attention") != "linear":
        parts.append(f"attention {config['attention']}")
    return " · ".join(p for p in parts if p)


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


def _lines(text) -> int:
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


def _full_size_log_ticks(fig: go.Figure) -> go.Figure:
    """Log axes without chosen ticks get 1-2-5 labels (within two decades) or powers of ten at
    the axis's own font size, instead of plotly's 9 px minor digits that stack on a slide."""
    import math

    import numpy as np

    axes = {}
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


# ---------------------------------------------------------------- a page's main chart

NTK_DEFAULT = "prediction_gap_init"  # the NTK page opens on it too


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
    return titled(fig, "Eigenvalues of G and of the attention features' Gram", settings_line(result.config))


def ntk_figure(result, metric: str | None = None) -> go.Figure:
    """One sweep metric against width (an ``ntk-sweep`` result; default ``NTK_DEFAULT``, the
    prediction gap: the Frobenius distance is blind to the conditioning the paper is about)."""
    from . import plots

    metric = metric or NTK_DEFAULT
    rows = result.frames["rows"]
    if metric not in rows:
        raise BadInput(f"unknown metric {metric!r} for ntk-sweep; allowed: "
                       f"{', '.join(m for m in plots.METRICS if m in rows)}")
    fig = plots.distance_fig(plots.distance_data(rows, metric), metric)
    return titled(fig, plots.METRICS.get(metric, (metric,))[0], settings_line(result.config))


def malleability_figure(result, metric: str | None = None) -> go.Figure:
    """Flip rates per attack and architecture at the largest ε (a ``malleability`` result)."""
    from . import plots, tables

    cfg = result.config
    summary = tables.percent(result.frames["summary"], ["flip_rate", "pair_flip_rate"])
    eps = float(summary["eps"].astype(float).max())
    label = plots.eps_label((cfg.get("attack") or {}).get("norm", "linf"), cfg.get("space", "raw"))
    fig = plots.flip_bars_fig(summary, eps, eps_label=label)
    return titled(fig, f"Influence sign flips under attack, ε = {eps:g}", settings_line(cfg))


def scaling_figure(result, metric: str | None = None) -> go.Figure:
    """Width needed against κ with the fitted power law (a ``scaling`` result)."""
    from . import plots

    frames = result.frames
    fig = plots.scaling_fig(plots.scaling_data(frames["widths"], frames["fit"]), result.config["max_width"])
    return titled(fig, "Width needed to stay near K∞ against the condition number κ", settings_line(result.config))


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
    return titled(fig, title, settings_line(result.config))


RETRAIN_METRICS = ("retrain_spearman", "retrain_pearson", "retrain_sign_agreement")


def retrain_figure(result, metric: str | None = None) -> go.Figure:
    """1 − one of ``RETRAIN_METRICS`` against width for the top-|influence| points (a ``retrain-loo``
    result; default retrain_spearman), one panel per leave-one-out, with the m^-1/2 reference."""
    from . import plots

    metric = metric or "retrain_spearman"
    if metric not in RETRAIN_METRICS:
        raise BadInput(f"unknown metric {metric!r} for retrain-loo; allowed: {', '.join(RETRAIN_METRICS)}")
    fig = plots.retrain_width_fig(plots.retrain_width_data(result.frames["summary"], metric, "top"), metric)
    title = f"Kernel against retrained influence: 1 − {plots.RETRAIN_LABELS[metric][0]} against width"
    return titled(fig, title, settings_line(result.config))
