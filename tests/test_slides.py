"""Exports that go on a slide as they are: every figure kind rendered by Chromium at 16:9 and
4:3, plain and in Presentation mode, with every text box inside the canvas and the title and
its settings line clear of the other text.

Text boxes come from the SVG itself: each ``<text>`` element's x/y with every enclosing
``translate`` and its own ``rotate`` (the y-axis titles), and a conservative size of font size
× characters × ``CHAR_EM`` (wider than the chart font's average glyph) by the number of lines.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from engine.experiments.registry import EXPERIMENTS
from engine.reporting import export, fit, plots, tables
from engine.reporting.plots import alignment as AP
from engine.reporting.plots.nulls import excess_fig, nulls_fig

needs_browser = pytest.mark.skipif(export.browser_path() is None,
                                   reason="no Chromium or Chrome here (apt-get install chromium)")
SIZES = {"16:9": (1280, 720), "4:3": (1024, 768)}
CHAR_EM = 0.62  # px per character per px of font size: Open Sans' widest average (capitals, digits ~0.57)
NUM = r"-?[\d.]+(?:e-?\d+)?"
SETTINGS = "mnist, n = 1000 (500 test) · m = 16, 64, 256, 1024 · 3 seeds (0–2) · Adam lr 0.001, wd 0.001, 500 epochs"


# ---------------------------------------------------------------- text boxes of an SVG

def _translate(transform: str | None) -> tuple[float, float]:
    x = y = 0.0
    for m in re.finditer(rf"translate\(\s*({NUM})(?:[ ,]+({NUM}))?\s*\)", transform or ""):
        x, y = x + float(m.group(1)), y + float(m.group(2) or 0)
    return x, y


def text_boxes(svg: bytes) -> tuple[float, float, list[dict]]:
    """(width, height, boxes): one box [x0, y0, x1, y1] per visible text element, in canvas pixels."""
    root = ET.fromstring(svg)
    out: list[dict] = []

    def walk(el, dx: float, dy: float) -> None:
        tag = el.tag.split("}")[-1]
        style = el.get("style") or ""
        if "display: none" in style or re.search(r"(^|;)\s*opacity:\s*0(;|$)", style):
            return
        tx, ty = _translate(el.get("transform"))
        if tag != "text":
            for child in el:
                walk(child, dx + tx, dy + ty)
            return
        lines = [t for t in el.iter() if t.tag.split("}")[-1] == "tspan" and "line" in (t.get("class") or "")]
        texts = [t for t in (["".join(t.itertext()) for t in lines] or ["".join(el.itertext())]) if t.strip()]
        if not texts:
            return
        m = re.search(rf"font-size:\s*({NUM})px", style)
        size = float(m.group(1)) if m else 12.0
        x, y = float(el.get("x") or 0) + dx + tx, float(el.get("y") or 0) + dy + ty
        w, h = max(len(t) for t in texts) * size * CHAR_EM, size * (1 + 1.3 * (len(texts) - 1))
        x0 = x - {"start": 0.0, "middle": w / 2, "end": w}[el.get("text-anchor") or "start"]
        box = [x0, y - 0.8 * size, x0 + w, y - 0.8 * size + h]  # ascent ~0.8 em above the baseline
        rot = re.search(rf"rotate\(\s*({NUM})[ ,]+({NUM})[ ,]+({NUM})\s*\)", el.get("transform") or "")
        if rot and abs(abs(float(rot.group(1))) - 90) < 1:  # a y-axis title, turned about its anchor
            cx, cy = float(rot.group(2)) + dx, float(rot.group(3)) + dy
            bw, bh = box[2] - box[0], box[3] - box[1]
            box = [cx - bh / 2, cy - bw / 2, cx + bh / 2, cy + bw / 2]
        out.append({"text": " / ".join(texts), "box": box, "class": el.get("class") or ""})

    walk(root, 0.0, 0.0)
    return float(root.get("width")), float(root.get("height")), out


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def problems(svg: bytes, slack: float = 1.0) -> list[str]:
    """Text outside the canvas, and text that overlaps the title or its settings line."""
    W, H, boxes = text_boxes(svg)
    out = [f"outside {W:g}x{H:g}: {b['text'][:60]!r} at {[round(v) for v in b['box']]}" for b in boxes
           if b["box"][0] < -slack or b["box"][1] < -slack or b["box"][2] > W + slack or b["box"][3] > H + slack]
    heads = [b for b in boxes if b["class"] in ("gtitle", "gtitle-subtitle")]
    for h in heads:
        for b in boxes:
            if b is not h and b not in heads and _overlap(h["box"], b["box"]):
                out.append(f"{b['text'][:40]!r} overlaps the title block {h['text'][:40]!r}")
    return out


def _svg(title_at: str) -> bytes:
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100">'
            f'<g transform="translate({title_at})"><text class="gtitle" x="0" y="20" style="font-size: 20px">'
            'Too long</text></g><text x="0" y="30" class="legendtext" style="font-size: 12px">legend</text>'
            '<text class="ytitle" transform="rotate(-90,110,50)" x="110" y="50" text-anchor="middle" '
            'style="font-size: 12px">a y title that is far too long</text></svg>').encode()


def test_the_box_estimate_finds_clipped_and_overlapping_text():
    """The checker itself: a title past the right edge, a rotated y title taller than the canvas
    and a legend under the title are found; text well inside is not."""
    found = problems(_svg("150,0"))   # "Too long" at 20 px: about 99 px wide from x = 150
    assert len(found) == 2 and "Too long" in found[0] and "a y title" in found[1], found
    found = problems(_svg("0,0"))     # inside, but over the legend's line
    assert len(found) == 2 and "a y title" in found[0] and "'legend' overlaps the title" in found[1], found
    found = problems(_svg("0,60"))    # inside and clear of the legend: only the y title is left
    assert len(found) == 1 and "a y title" in found[0], found


# ---------------------------------------------------------------- every figure kind

def _page_figures() -> dict:
    """Page charts with what the main figures lack: subplots, colour bars, annotations above the plot."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((60, 8))
    K = A @ A.T / 8
    y = np.repeat(np.arange(3), 20)
    summary = pd.DataFrame([{"arch": a, "width": w, "epoch": e, "lin_gap_mean": 0.5 / (1 + e) * w ** -0.5 * (3 if a == "attn" else 1),
                             "lin_gap_sd": 0.01} for a in ("relu", "attn") for w in (16, 64, 256, 1024) for e in range(0, 50, 5)])
    thresholds = {"attn_v1": 31.2, "attn_v2": 24.5, "relu_v1": 9.1, "relu_v2": 8.0}
    return {
        "kernel heatmaps": (plots.kernel_heatmaps_fig(K, K + 0.01 * rng.standard_normal(K.shape), 1024, "attn", y=y),
                            None),
        "regime against epochs": (plots.regime_epoch_fig(plots.regime_epoch_data(summary, "lin_gap"), "lin_gap"),
                                  "Gap to the linearised net during training"),
        "width needed": (plots.width_needed_fig(plots.width_needed_data(thresholds)),
                         "Width needed for the kernel regime, by bound"),
        "influence digits": (plots.influence_grid_fig(rng.random((60, 784)), (1, 28, 28), plots.influence_grid_data(
            rng.standard_normal(60), [str(c) for c in y], 8, "attn")), "MLP-Attn: most positive and negative influence"),
        "influence histogram": (plots.influence_hist_fig(pd.DataFrame(
            {"arch": ["relu"] * 60 + ["attn"] * 60, "influence": np.r_[1e-3 * rng.standard_normal(60),
                                                                       rng.standard_normal(60)]})), None),
    }


def _kinds(tmp_path) -> dict:
    from tests.test_export import _small

    results = {kind: EXPERIMENTS[kind].runner(_small(kind)) for kind, e in EXPERIMENTS.items() if e.figure}
    figs = {kind: export.main_figure(kind, res) for kind, res in results.items()}
    figs.update({name: export.slide(fig, SETTINGS, title) for name, (fig, title) in _page_figures().items()})
    return figs


async def _render(jobs: list[tuple[str, object, dict]]) -> dict:
    """SVG bytes of every (name, figure, opts), in one browser (one per figure would take minutes)."""
    import kaleido

    out = {}
    async with kaleido.Kaleido(path=export.browser_path(), mathjax=False, timeout=export.TIMEOUT_S) as k:
        for name, fig, opts in jobs:
            out[name] = await k.calc_fig(fig, opts=opts)
    return out


@pytest.mark.slow
@pytest.mark.browser
@needs_browser
def test_every_figure_kind_fits_a_slide_at_16_9_and_4_3(tmp_path):
    jobs = []
    for kind, fig in _kinds(tmp_path).items():
        assert fig.layout.title.text and fig.layout.title.subtitle.text, kind  # a title and a settings line
        for talk in (False, True):
            shown = export.talk_style(fig) if talk else fig
            for ratio, (w, h) in SIZES.items():
                name = f"{kind} at {ratio}{' (Presentation)' if talk else ''}"
                jobs.append((name, fit.fit(shown, w, h), {"format": "svg", "width": w, "height": h}))
    svgs = asyncio.run(_render(jobs))
    found = {name: problems(svg) for name, svg in svgs.items()}
    assert not {k: v for k, v in found.items() if v}, found


@pytest.mark.browser
@needs_browser
def test_image_bytes_fits_a_long_title_and_settings_line_to_the_canvas():
    """image_bytes itself wraps what would run off a 4:3 canvas and makes room above the plot."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[16, 64, 256], y=[0.3, 0.15, 0.08], name="2L-ReLU"))
    fig = plots.style.styled(fig, "width m (hidden units, log scale)", "a long y-axis title (unitless)", logx=True)
    long = "Kernel-regression prediction gap at init: ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖, MLP-Attn and 2L-ReLU"
    svg = export.image_bytes(export.talk_style(export.slide(fig, SETTINGS, long)), "svg", 1024, 768)
    assert problems(svg) == []
    _, _, boxes = text_boxes(svg)
    assert any("mnist, n = 1000" in b["text"] for b in boxes)  # the settings line is drawn


def test_presentation_mode_scales_ticks_axis_titles_legends_and_subplot_titles():
    fig = _page_figures()["regime against epochs"][0]
    out = export.talk_style(fig)
    axes = [k for k in out.layout if k.startswith(("xaxis", "yaxis")) and out.layout[k] is not None]
    assert len(axes) == 4
    for k in axes:  # set on every axis: Streamlit's theme would otherwise keep its 12 px ticks
        assert out.layout[k].tickfont.size == export.TALK["ticks"], k
        assert out.layout[k].title.font.size == export.TALK["axis_titles"], k
    assert out.layout.legend.font.size == export.TALK["legend"]
    assert {a.font.size for a in out.layout.annotations} == {export.TALK["annotations"]}
    assert fig.layout.xaxis.tickfont.size is None  # the page's own figure is untouched


def test_log_axes_get_full_size_labels_not_minor_digits():
    import plotly.graph_objects as go

    fig = export.titled(go.Figure(go.Scatter(x=[1, 2, 3], y=[0.12, 0.3, 0.45])).update_yaxes(type="log"), "t")
    assert list(fig.layout.yaxis.ticktext) == ["0.1", "0.2", "0.5"]  # 1-2-5 within two decades
    wide = export.titled(go.Figure(go.Scatter(x=[1, 2], y=[1e-4, 10])).update_yaxes(type="log"), "t")
    assert wide.layout.yaxis.dtick == 1  # powers of ten beyond


@pytest.mark.parametrize("name", [n for n, e in EXPERIMENTS.items() if e.figure])
def test_the_settings_line_names_data_sizes_seeds_and_protocol(name):
    from engine.runtime.cache import canonical

    cfg = EXPERIMENTS[name].presets["quick"]
    line = export.settings_line(canonical(cfg))
    data = getattr(cfg, "data", None)
    if data is not None:
        assert line.startswith(f"{data.dataset}, n = {data.n}"), line
    else:  # the scaling law draws its own synthetic data
        assert line.startswith(f"synthetic, n = {cfg.n}, d = {cfg.d}"), line
    if getattr(cfg, "seeds", None):
        assert f"{len(cfg.seeds)} seed" in line
    if getattr(cfg, "train", None):
        assert f"{cfg.train.epochs} epochs" in line and export.OPTIMIZER_NAMES[cfg.train.optimizer] in line
    if name == "malleability":
        assert f"{cfg.attack.steps} steps" in line
    if data is not None:  # the draw: a reader can reproduce the exact sample
        draws = cfg.data_seeds if getattr(cfg, "data_seeds", ()) else (cfg.data.seed,)
        assert f"data draw{'s' if len(draws) > 1 else ''} {', '.join(map(str, draws))}" in line, line
    assert export.settings_line(canonical(cfg), "verdict (PGD): holds").endswith(" · verdict (PGD): holds")


# ---------------------------------------------------------------- one colour per architecture (issue 35 item 5)

ARCH_NAMES = {"2L-ReLU": "relu", "MLP-Attn": "attn"}
NEUTRAL = {"grey", "gray", "black", "white"}


def _arch_figures() -> dict:
    """Every chart that colours by architecture, built from small frames as the pages build them."""
    archs = ("relu", "attn")
    rows = pd.DataFrame([{"arch": a, "width": w, "seed": s, "kernel_dist_init": w ** -0.5 + 0.01 * s,
                          "function_dist": 1.0 + s + w / 1e3} for a in archs for w in (16, 64) for s in (0, 1)])
    measured = plots.distance_data(rows, "function_dist")
    paper = pd.DataFrame({"arch": ["relu", "relu", "attn", "attn"], "width": [16, 64, 16, 64], "value": [4., 3., 1., 2.]})
    mall = pd.DataFrame([{"arch": a, "attack": k, "eps": e, "reading": "ridge", "width": 64, "n_seeds": 2,
                          "flip_rate_mean": f, "flip_rate_sd": 0.01, "spearman_mean": 0.9, "spearman_sd": 0.01,
                          "null_seed_flip_rate_mean": 0.02, "null_random_flip_rate_mean": 0.01,
                          "flip_excess_mean": f - 0.02, "flip_excess_low": f - 0.05, "flip_excess_high": f}
                         for a, f in (("relu", 0.05), ("attn", 0.4)) for k in ("fgsm", "pgd") for e in (0.1, 0.3)])
    pct = tables.percent(mall, ["flip_rate"])
    agg = pd.DataFrame({"arch": ["relu"] * 6 + ["attn"] * 6, "train_index": list(range(6)) * 2, "label": [0, 1] * 6,
                        "influence": np.linspace(-1, 1, 12)})
    against = pd.DataFrame([{"arch": a, "reading": "retrain", "train_index": i, "label": 0, "ridge": 0.1 * i,
                             "read": 0.2 * i} for a in archs for i in range(3)])
    final = pd.DataFrame([{"arch": a, "width": w, "lin_gap_mean": 1 / w, "lin_gap_sd": 0} for a in archs for w in (16, 64)])
    retrain = pd.DataFrame([{"pick": "top", "arch": a, "attention": None, "kernel": k, "loo": lo, "width": w,
                             "retrain_spearman_mean": 0.9, "retrain_spearman_sd": 0.01}
                            for a in archs for k in ("entk", "kinf") for lo in ("ridge", "flow") for w in (16, 64)])
    widths = pd.DataFrame({"arch": ["relu", "relu", "attn", "attn"], "attention": [None, None, "linear", "linear"],
                           "kappa": [2.0, 8.0, 2.0, 8.0], "width_needed": [100.0, 400.0, 300.0, None],
                           "censored": [False, False, False, True]})
    fit_ = pd.DataFrame({"arch": ["relu", "attn"], "attention": [None, "linear"], "points": [2, 1],
                         "exponent": [1.0, None], "intercept": [np.log(50.0), None], "theory_exponent": [2.0, 6.0]})
    kernels = ("K_m init", "K∞")
    return {
        "distance": plots.distance_fig(plots.distance_data(rows, "kernel_dist_init"), "kernel_dist_init"),
        "paper trend": plots.paper_trend_fig(plots.paper_trend_data(measured, paper)),
        "width needed": plots.width_needed_fig(plots.width_needed_data({"attn_v1": 27.0, "relu_v1": 10.0})),
        "nulls": nulls_fig(mall, 0.3), "excess": excess_fig(mall, 0.3),
        "flip bars": plots.flip_bars_fig(pct, 0.3), "eps sweep": plots.eps_sweep_fig(pct),
        "interventions": plots.interventions_fig(pd.DataFrame({"arch": archs, "intervention": "none", "test_acc": 1})),
        "compare": plots.compare_bars_fig(pd.DataFrame({"attack": ["PGD", "PGD"], "arch": list(archs), "paper": [4, 30],
                                                        "measured": [5, 20], "null": [1, 2]}), "attack", "flip rate"),
        "histogram": plots.influence_hist_fig(plots.influence_hist_data(agg)),
        "excess width": plots.excess_width_fig(plots.excess_width_data(mall.assign(width=16), "pgd", 0.3)),
        "against ridge": plots.against_ridge_fig(against),
        "regime width": plots.regime_width_fig(plots.regime_width_data(final, "lin_gap"), "lin_gap"),
        "retrain": plots.retrain_width_fig(plots.retrain_width_data(retrain)),
        "scaling": plots.scaling_fig(plots.scaling_data(widths, fit_), max_width=1024),
        "alignment": AP.alignment_width_fig(pd.DataFrame([{"arch": a, "kernel": k, "width": w, "alignment": 0.5,
                                                           "sd": 0.01, "units": 2} for a in archs for k in kernels
                                                          for w in (16, 64)])),
        "curves": AP.curve_fig(pd.DataFrame([{"arch": a, "kernel": k, "p": p, "p_over_n": p / 40, "measured": 0.5,
                                              "measured_sd": 0.01, "theory": 0.4} for a in archs for k in kernels
                                             for p in (10, 20)])),
    }


def _colours(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]


def arch_colours(fig) -> dict[str, set]:
    """arch -> the colours its marks are drawn in: a trace named for an architecture gives all its
    colours to it, a trace of several (bars per (architecture, attack)) one colour per bar."""
    out: dict[str, set] = {}
    for t in fig.data:
        marker, line, error = (getattr(t, k, None) for k in ("marker", "line", "error_y"))
        values = [getattr(marker, "color", None), getattr(line, "color", None), getattr(t, "fillcolor", None),
                  getattr(error, "color", None), getattr(getattr(marker, "pattern", None), "fgcolor", None)]
        named = [a for label, a in ARCH_NAMES.items() if label in str(t.name or "")]
        if named:
            out.setdefault(named[0], set()).update(c for v in values for c in _colours(v))
            continue
        x, y = (list(v) if v is not None else [] for v in (getattr(t, "x", None), getattr(t, "y", None)))
        # labels per bar: a multi-category x's first level, or the bound names on y
        labels = list(x[0]) if x and not isinstance(x[0], str) and hasattr(x[0], "__len__") else (
            [str(v) for v in y] if y and isinstance(y[0], str) else [])
        for i, label in enumerate(labels):
            arch = next((a for name, a in ARCH_NAMES.items() if name in label), None)
            for v in values:
                if arch is not None and v is not None and not isinstance(v, str):
                    out.setdefault(arch, set()).add(v[i])
    return {a: {c for c in cs if c.lower() not in NEUTRAL} for a, cs in out.items()}


@pytest.mark.parametrize("talk", [False, True], ids=["dashboard", "Presentation"])
def test_every_figure_draws_each_architecture_in_one_colour(talk):
    """Per trace and per bar (nulls_fig and width_needed_fig colour each bar), in markers, lines,
    fills, error bars and patterns: one colour per architecture across all figures, the dashboard's
    or, in Presentation, its Okabe–Ito twin, and in Presentation none of the dashboard's left anywhere."""
    figs = _arch_figures()
    want = {a: export.OKABE_ITO[c] if talk else c for a, c in plots.ARCH_COLORS.items()}
    assert plots.ARCH_COLORS["attn"] in figs["nulls"].data[0].marker.color  # one colour per bar: a list
    for name, fig in figs.items():
        shown = export.talk_style(fig) if talk else fig
        found = arch_colours(shown)
        assert set(found) == set(want), name  # the checker sees both architectures in every figure
        assert found == {a: {want[a]} for a in found}, (name, found)
        if talk:  # nowhere else either: shapes, layout, any colour property
            assert not [c for c in plots.ARCH_COLORS.values() if c in shown.to_json().lower()], name


@pytest.mark.browser
@needs_browser
def test_the_width_needed_chart_labels_overlap_nothing_on_the_page_or_a_slide():
    """Presentation on, in a half column of the page and on 16:9 and 4:3 slides: no two texts of the
    chart overlap (title, settings line, legend, bound names, bar values, axis titles and ticks) and
    every one is inside the canvas. Legend entries are not compared with each other: plotly places
    them by their measured widths, which ``CHAR_EM``'s conservative estimate exceeds."""
    from ui.render import PAGE_WIDTH_PX

    jobs = []
    for attention in ("linear", "softmax:0.1"):
        data = plots.width_needed_data({"attn_v1": 31.2, "attn_v2": 24.5, "relu_v1": 9.1, "relu_v2": 8.0}, attention)
        fig = export.talk_style(export.slide(plots.width_needed_fig(data), SETTINGS,
                                             "Width the paper's bounds ask for (log10 hidden units)"))
        sizes = {"page": (PAGE_WIDTH_PX, int(fig.layout.height)), **SIZES}
        for where, (w, h) in sizes.items():
            jobs.append((f"{attention} on the {where}", fit.fit(fig, w, h), {"format": "svg", "width": w, "height": h}))
    found = {}
    for name, svg in asyncio.run(_render(jobs)).items():
        W, H, boxes = text_boxes(svg)
        bad = [f"outside: {b['text'][:40]!r}" for b in boxes
               if b["box"][0] < -1 or b["box"][1] < -1 or b["box"][2] > W + 1 or b["box"][3] > H + 1]
        bad += [f"{a['text'][:30]!r} overlaps {b['text'][:30]!r}" for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if _overlap(a["box"], b["box"]) and not a["class"] == b["class"] == "legendtext"]
        found[name] = bad
    assert not {k: v for k, v in found.items() if v}, found


# ---------------------------------------------------------------- larger text on every page

def test_presentation_enlarges_the_text_of_every_page_only_while_it_is_on(tmp_path, monkeypatch):
    """The sidebar's Presentation toggle emits one style block before the page (so text-only pages
    get it too), enlarging body text, captions, tables and metrics; off, there is none."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from tests.conftest import steady_app_state

    steady_app_state(monkeypatch, tmp_path / "cache", tmp_path / "no-data")
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=600)
    at.query_params.update({"data": "synthetic", "n": "30", "n_test": "10", "widths": ["16"]})
    styles = lambda: [h.proto.body for h in at.get("html") if "<style>" in h.proto.body]  # noqa: E731
    at.run()
    assert not at.exception and styles() == []
    at.toggle(key="presentation").set_value(True).run()
    assert not at.exception
    (css,) = styles()
    for part in ("stMarkdownContainer", "stCaptionContainer", "stTable", "stDataFrame", "stMetricValue",
                 "stMetricLabel"):
        assert re.search(rf'\[data-testid="{part}"\][^{{]*\{{[^}}]*(font-size: [\d.]+rem|zoom: 1\.\d+)', css), part
    sizes = [float(v) for v in re.findall(r"font-size: ([\d.]+)rem", css)]
    assert sizes and min(sizes) > 1.0  # larger than Streamlit's 1 rem body and 0.875 rem captions
    at.switch_page("pages/grid.py").run()  # a page whose content is its table: the style comes with it
    assert len(styles()) == 1 and not at.exception
    at.toggle(key="presentation").set_value(False).run()
    assert styles() == []
