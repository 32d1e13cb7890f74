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
Each call starts a fresh headless browser (about a second). A slide's title, settings line and the
Presentation style (``titled``, ``slide``, ``talk_style``, ``OKABE_ITO``, ``TALK``) live in
``engine.reporting.slides`` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, cast

from ..data.folders import expand_path, writable
from ..runtime.errors import BadInput, EngineError
from .slides import OKABE_ITO as OKABE_ITO, TALK as TALK, slide as slide, talk_style as talk_style, titled

if TYPE_CHECKING:  # plotly is imported where a figure is made: the CLI's parser reads the sizes below
    import plotly.graph_objects as go

    from ..runtime.cache import Result

FORMATS = ("png", "svg", "pdf")
DEBIAN_CHROMIUM = "/usr/bin/chromium"
WIDTH_PX = 1000       # default image size in CSS pixels (PNG: times ``scale``)
HEIGHT_PX = 560
SCALE = 2.0           # PNG pixel density: sharp on a projector
SLIDE_PX = (1280, 720)  # the dashboard's PNG, SVG and PDF buttons, and a PDF's default: a 16:9 slide in CSS pixels
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
    ``HEIGHT_PX``; a PDF is a slide's page, so its default is 16:9: ``SLIDE_PX``, or 9/16 of a
    given width); ``scale`` multiplies the PNG's pixels (vector formats ignore it). The
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
    from .fit import fit

    if fmt == "pdf" and not height:  # a page, not a strip: 16:9 unless a height is asked for
        width = width or SLIDE_PX[0]
        height = round(width * SLIDE_PX[1] / SLIDE_PX[0])
    opts: dict[str, Any] = {"format": fmt, "width": int(width or WIDTH_PX),
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


# ---------------------------------------------------------------- the settings line

def _seeds(seeds: Iterable[int] | None) -> str:
    seeds = [int(s) for s in seeds or ()]
    if not seeds:
        return ""
    run = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    text = f"{seeds[0]}–{seeds[-1]}" if run and len(seeds) > 2 else ", ".join(str(s) for s in seeds)
    return f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({text})"


OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def settings_line(config: dict[str, Any], verdict: str = "") -> str:
    """One line for a slide from a result's canonical config (``Result.config``): data set, sizes
    and draw, seeds, training protocol and, where there is one, the attack; then ``verdict`` (the
    chart's claim as the rule reads it), where given. Missing parts are left out, so any
    experiment's config (or ``{}``) gives a line."""
    from .plots.style import NORM_SYMBOLS

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
        draws = config.get("data_seeds") or ([data["seed"]] if data.get("seed") is not None else [])
        draw = f", data draw{'s' if len(draws) > 1 else ''} {', '.join(str(int(d)) for d in draws)}" if draws else ""
        parts.append(f"{name}, {size}{draw}")
    elif "kappas" in config:  # the scaling law's own synthetic draws
        parts.append(f"synthetic, n = {config.get('n')}, d = {config.get('d')}, κ dialled")
    if config.get("widths") and len(config["widths"]) <= 6:
        parts.append("m = " + ", ".join(str(w) for w in config["widths"]))
    elif config.get("width"):
        parts.append(f"m = {config['width']}")
    if _seeds(config.get("seeds")):
        parts.append(_seeds(config.get("seeds")))
    train: Any = config.get("train") or {}  # JSON of a TrainSpec
    if train:
        opt = OPTIMIZER_NAMES.get(train.get("optimizer"), train.get("optimizer"))
        bits = [f"{opt} lr {train.get('lr'):g}" if train.get("lr") is not None else str(opt)]
        if train.get("weight_decay"):
            bits.append(f"wd {train['weight_decay']:g}")
        bits.append(f"{train.get('epochs')} epochs")
        if train.get("param") and train["param"] != "ntk":
            bits.append(train["param"])
        parts.append(", ".join(bits))
    attack: Any = config.get("attack") or {}  # JSON of an AttackSpec
    if attack and config.get("attacks"):  # a malleability config: its space is set
        space = {"raw": "pixels", "normalized": "unit rows"}.get(cast(str, config.get("space")), config.get("space"))
        parts.append(f"{NORM_SYMBOLS.get(attack.get('norm'), attack.get('norm'))} attacks on {space}, "
                     f"{attack.get('steps')} steps")
    if config.get("attention") and config.get("attention") != "linear":
        parts.append(f"attention {config['attention']}")
    return " · ".join(p for p in [*parts, verdict] if p)


# ---------------------------------------------------------------- a page's main chart

NTK_DEFAULT = "prediction_gap_init"  # the NTK page opens on it too


def main_figure(kind: str, result: Result, metric: str | None = None) -> go.Figure:
    """The chart a page leads with, drawn from its result, titled for a slide.

    kind: an experiment with a figure in ``engine.experiments.registry.EXPERIMENTS`` (old spellings such as
    ``ntk`` and ``regime`` too); ``metric`` picks the plotted column where the figure has a
    choice (``ntk_figure``, ``dynamics_figure``).
    """
    from ..experiments.registry import get

    return get(kind).main_figure(result, metric)


def spectrum_figure(result: Result, metric: str | None = None) -> go.Figure:
    """Eigenvalues of G and of the attention features' Gram (a ``spectrum`` result)."""
    from . import plots

    summ = result.meta["summary"]
    data = plots.spectrum_data(result.arrays["eig_G"], result.arrays["eig_attention"])
    fig = plots.spectrum_fig(data, summ["rank_tol"], summ["attention"])
    return titled(fig, "Eigenvalues of G and of the attention features' Gram", settings_line(result.config))


def ntk_figure(result: Result, metric: str | None = None) -> go.Figure:
    """One sweep metric against width (an ``ntk-sweep`` result; default ``NTK_DEFAULT``, the
    prediction gap: the Frobenius distance is blind to the conditioning the paper is about)."""
    from . import plots

    metric = metric or NTK_DEFAULT
    rows = result.frames["rows"]
    if metric not in rows:
        raise BadInput(f"unknown metric {metric!r} for ntk-sweep; allowed: "
                       f"{', '.join(m for m in plots.METRICS if m in rows)}")
    from ..experiments.columns import SweepRow
    from ..maths import gates

    # every net is untrained at init: as on the page, only the columns of trained nets are greyed
    at_init = {f.name for f in dataclasses.fields(SweepRow) if f.name.endswith("_init")}
    bad = None if metric in at_init else gates.untrained(rows, int(result.meta.get("n_classes") or 2))
    fig = plots.distance_fig(plots.distance_data(rows, metric), metric, untrained=bad)
    return titled(fig, plots.METRICS.get(metric, (metric,))[0], settings_line(result.config, plots.near_chance(bad)))


def malleability_figure(result: Result, metric: str | None = None) -> go.Figure:
    """Flip rates per attack and architecture at the largest ε beside their nulls, at the largest
    width, read by ``metric`` (a reading; default ridge), with the claim's verdict in the settings
    line (a ``malleability`` result; without the nulls, the flip rates alone, and the verdict says
    so)."""
    from . import plots, protocols, tables

    cfg = result.config
    summary = result.frames["summary"]
    readings = list(dict.fromkeys(summary["reading"])) if "reading" in summary else [None]
    reading = metric or ("ridge" if "ridge" in readings else readings[0])
    if reading not in readings:
        raise BadInput(f"unknown reading {reading!r} for this malleability result; allowed: "
                       f"{', '.join(str(r) for r in readings)}")
    if "width" in summary:
        summary = summary[summary["width"] == summary["width"].max()]
    if reading is not None:
        summary = summary[summary["reading"] == reading]
    eps = float(summary["eps"].astype(float).max())
    label = plots.eps_label((cfg.get("attack") or {}).get("norm", "linf"), cfg.get("space", "raw"))
    verdict = protocols.flip_verdict(summary, eps=eps)
    words = f"verdict ({verdict['attack'].upper()}): {verdict['verdict']}"
    if "null_seed_flip_rate_mean" in summary and summary["null_seed_flip_rate_mean"].notna().any():
        fig = plots.nulls_fig(summary, eps, label, cfg.get("attention"))
        title = f"Influence sign flips under attack beside their nulls, ε = {eps:g}"
    else:
        fig = plots.flip_bars_fig(tables.percent(summary, ["flip_rate", "pair_flip_rate"]), eps, eps_label=label)
        title = f"Influence sign flips under attack (no nulls measured), ε = {eps:g}"
    if reading is not None and len(readings) > 1:
        title += f", read by {plots.READING_LABELS.get(reading, reading)}"
    return titled(fig, title, settings_line(cfg, words))


def scaling_figure(result: Result, metric: str | None = None) -> go.Figure:
    """Width needed against κ with the fitted power law (a ``scaling`` result)."""
    from . import plots

    frames = result.frames
    fig = plots.scaling_fig(plots.scaling_data(frames["widths"], frames["fit"]), result.config["max_width"])
    return titled(fig, "Width needed to stay near K∞ against the condition number κ", settings_line(result.config))


DYNAMICS_METRICS = ("lin_gap", "pattern_change", "k_inf_gap", "weight_movement")


def dynamics_figure(result: Result, metric: str | None = None) -> go.Figure:
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


def retrain_figure(result: Result, metric: str | None = None) -> go.Figure:
    """1 − one of ``RETRAIN_METRICS`` against width for the top-|influence| points (a ``retrain-loo``
    result; default retrain_spearman), one panel per leave-one-out, with the m^-1/2 reference."""
    from . import plots

    metric = metric or "retrain_spearman"
    if metric not in RETRAIN_METRICS:
        raise BadInput(f"unknown metric {metric!r} for retrain-loo; allowed: {', '.join(RETRAIN_METRICS)}")
    fig = plots.retrain_width_fig(plots.retrain_width_data(result.frames["summary"], metric, "top"), metric)
    title = f"Kernel against retrained influence: 1 − {plots.RETRAIN_LABELS[metric][0]} against width"
    return titled(fig, title, settings_line(result.config))
