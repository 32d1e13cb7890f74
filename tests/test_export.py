"""engine.reporting.export: PNG, SVG and PDF from a headless Chromium, and `python -m engine figure`."""

import json
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from conftest import REL_PDF_ASPECT
from engine import cli
from engine.data import DataSpec
from engine.experiments.configs.alignment import AlignmentConfig
from engine.experiments.configs.dynamics import DynamicsConfig
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.retrain import RetrainConfig
from engine.experiments.configs.scaling import ScalingConfig
from engine.experiments.configs.spectrum import SpectrumConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.dynamics import run_dynamics
from engine.experiments.registry import EXPERIMENTS
from engine.maths.specs import TrainSpec
from engine.reporting import export
from engine.runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
needs_browser = pytest.mark.skipif(export.browser_path() is None,
                                   reason="no Chromium or Chrome here (apt-get install chromium); kaleido "
                                          "cannot download one")
SYN = DataSpec("synthetic", n=40, n_test=20, synthetic_d=8, synthetic_classes=2)
TITLE = "Export check: a title for the slide"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _svg_text(data: bytes) -> str:
    root = ET.fromstring(data)  # parses as XML
    assert root.tag.endswith("svg")
    return " ".join(t for t in root.itertext())


def _pdf_aspect(data: bytes) -> float:
    """Width over height of the PDF's one page, from its MediaBox (in points)."""
    assert data.startswith(b"%PDF-")
    boxes = re.findall(rb"/MediaBox\s*\[\s*([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*\]", data)
    assert len(boxes) == 1, boxes
    x0, y0, x1, y1 = map(float, boxes[0])
    return (x1 - x0) / (y1 - y0)


def _figure() -> go.Figure:
    fig = go.Figure(go.Scatter(x=[16, 64, 256], y=[0.3, 0.15, 0.08], name="2L-ReLU"))
    return export.titled(fig, TITLE)


@pytest.mark.slow
@needs_browser
def test_png_svg_and_pdf_bytes():
    fig = _figure()
    png = export.image_bytes(fig, "png", width=500, height=300, scale=2)
    assert _png_size(png) == (1000, 600) and len(png) > 5000
    svg = export.image_bytes(fig, "svg", width=500, height=300)
    assert TITLE in _svg_text(svg)
    pdf = export.image_bytes(fig, "pdf", width=500, height=300)
    assert pdf.startswith(b"%PDF-") and len(pdf) > 1000


@needs_browser
def test_a_pdf_is_a_16_9_page_from_the_dashboard_button_and_by_default():
    """The dashboard's PDF button renders ``SLIDE_PX``; ``python -m engine figure … --out x.pdf`` gives
    no size, so the default must be 16:9 too, not the chart's 1000 × 400 strip (2.5:1) the PNG keeps."""
    from ui import render

    assert set(render.IMAGE_MIME) == set(export.FORMATS) and render.IMAGE_MIME["pdf"] == "application/pdf"
    fig = _figure().update_layout(height=400)  # a page chart's own height
    assert _pdf_aspect(render._image(export.slide(fig, "settings"), "pdf")()) == pytest.approx(16 / 9, rel=REL_PDF_ASPECT)
    assert _pdf_aspect(export.image_bytes(fig, "pdf")) == pytest.approx(16 / 9, rel=REL_PDF_ASPECT)
    assert _pdf_aspect(export.image_bytes(fig, "pdf", width=1000)) == pytest.approx(16 / 9, rel=REL_PDF_ASPECT)
    assert _pdf_aspect(export.image_bytes(fig, "pdf", width=800, height=600)) == pytest.approx(4 / 3, rel=REL_PDF_ASPECT)


def _small(kind: str):
    """A small config of a figure kind (synthetic data, seconds each); the registry's probe for the others."""
    t = TrainSpec(epochs=2, batch_size=20)
    sgd = TrainSpec(epochs=2, batch_size=20, optimizer="sgd")
    small = {
        "spectrum": lambda: SpectrumConfig(data=DataSpec("synthetic", n=30, n_test=1, synthetic_d=8)),
        "ntk-sweep": lambda: SweepConfig(data=SYN, train=t, widths=(16, 64), seeds=(0,)),
        "malleability": lambda: MalleabilityConfig(data=SYN, train=t, widths=(32,), seeds=(0,), attacks=("fgsm",),
                                                   eps=(0.05, 0.1)),
        "scaling": lambda: ScalingConfig(train=TrainSpec(epochs=2), n=16, d=6, kappas=(2.0, 4.0), min_width=16,
                                         max_width=64, seeds=(0,)),
        "dynamics": lambda: DynamicsConfig(data=SYN, train=sgd, widths=(16, 64), seeds=(0,)),
        "retrain-loo": lambda: RetrainConfig(data=SYN, train=replace(sgd, loss="mse"), widths=(16, 64), seeds=(0,),
                                             k=2),
        "alignment": lambda: AlignmentConfig(data=SYN, train=replace(t, snapshot_epochs=(0, 2)), widths=(16, 64),
                                             seeds=(0,), data_seeds=(0,), curve_ns=(10, 20), curve_trials=2),
    }
    return small[kind]() if kind in small else EXPERIMENTS[kind].probe()


@pytest.mark.slow
@needs_browser
@pytest.mark.parametrize("kind", [n for n, e in EXPERIMENTS.items() if e.figure])
def test_every_kind_renders_its_main_chart_with_its_title(kind):
    res = EXPERIMENTS[kind].runner(_small(kind))
    fig = export.main_figure(kind, res)
    title = fig.layout.title.text
    assert title and fig.data, kind
    svg = _svg_text(export.image_bytes(fig, "svg"))
    # plotly may wrap or escape the title; its first words are text nodes of the SVG
    assert " ".join(title.split()[:3]) in svg, (kind, title)


def test_main_figure_options_and_refusals():
    res = run_dynamics(DynamicsConfig(data=SYN, train=TrainSpec(epochs=2, batch_size=20, optimizer="sgd"),
                                      widths=(16, 64), seeds=(0,)))
    assert "flipped" in export.main_figure("regime", res, "pattern_change").layout.title.text
    assert "K∞" in export.main_figure("regime", res, "k_inf_gap").layout.title.text
    with pytest.raises(BadInput, match="unknown metric"):
        export.main_figure("regime", res, "kernel_dist_init")
    assert export.main_figure("dynamics", res).layout.title.text == export.main_figure("regime", res).layout.title.text
    with pytest.raises(BadInput, match="unknown experiment"):
        export.main_figure("heatmap", res)
    with pytest.raises(BadInput, match=".png"):
        export.format_of("slide.jpeg")
    big = export.talk_style(_figure())
    assert big.layout.font.size == 18 and big.data[0].line.width == 3


def test_the_malleability_figure_sets_every_flip_rate_beside_its_nulls_and_the_verdict():
    """The CLI's only PDF route of the key chart: attack, seed null and random null bars at the
    largest ε (the summary's own means, in percent), and the one rule's verdict in the settings line."""
    from engine.experiments.malleability import run_malleability
    from engine.reporting import protocols

    cfg = MalleabilityConfig(data=SYN, train=TrainSpec(epochs=2, batch_size=20), widths=(32,), seeds=(0, 1),
                             attacks=("fgsm",), eps=(0.05, 0.1))
    res = run_malleability(cfg)
    fig = export.main_figure("malleability", res)
    assert [t.name for t in fig.data] == ["attack", "seed null", "random null"]
    at = res.frames["summary"][res.frames["summary"]["eps"].astype(float) == 0.1]
    for trace, col in zip(fig.data, ("flip_rate_mean", "null_seed_flip_rate_mean", "null_random_flip_rate_mean"),
                          strict=True):
        np.testing.assert_allclose(trace.y, 100.0 * at[col].astype(float).to_numpy())
    verdict = protocols.flip_verdict(at, eps=0.1)["verdict"]
    assert fig.layout.title.subtitle.text.endswith(f"verdict (FGSM): {verdict}")
    assert "beside their nulls" in fig.layout.title.text
    with pytest.raises(BadInput, match="unknown reading 'retrain'.*allowed: ridge"):
        export.main_figure("malleability", res, "retrain")
    bare = run_malleability(replace(cfg, nulls=False, seeds=(0,)))
    no_nulls = export.main_figure("malleability", bare)
    assert "no nulls measured" in no_nulls.layout.title.text
    assert no_nulls.layout.title.subtitle.text.endswith("verdict (FGSM): uninformative")


def test_a_browser_that_is_not_there_is_one_line(monkeypatch):
    monkeypatch.setenv("ENGINE_BROWSER", "/nonexistent/chromium")
    with pytest.raises(export.BrowserMissing, match="/nonexistent/chromium") as info:
        export.image_bytes(_figure(), "png")
    assert info.value.exit_code == 3 and "\n" not in str(info.value)


def test_figure_help_lists_the_kinds(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["figure", "--help"])
    out = capsys.readouterr().out
    for kind in [n for n, e in EXPERIMENTS.items() if e.figure]:
        assert kind in out


@pytest.mark.slow
@needs_browser
def test_cli_figure_renders_from_the_cache(tmp_path):
    args = [sys.executable, "-m", "engine", "figure", "regime", "--dataset", "synthetic", "--n", "40", "--n-test", "20",
            "--synthetic-classes", "2", "--widths", "16,64", "--epochs", "2", "--seeds", "0", "--optimizer", "sgd",
            "--cache-dir", str(tmp_path / "cache"), "--json", "--quiet"]
    outs = []
    for name in ("regime.png", "regime.pdf"):
        p = subprocess.run([*args, "--out", str(tmp_path / name)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        outs.append(json.loads(p.stdout))
    assert not outs[0]["cached"] and outs[1]["cached"]  # the second file is drawn from the cache
    w, h = _png_size((tmp_path / "regime.png").read_bytes())
    assert (w, h) == (2 * export.WIDTH_PX, 2 * 400)
    assert _pdf_aspect((tmp_path / "regime.pdf").read_bytes()) == pytest.approx(16 / 9, rel=REL_PDF_ASPECT)
    p = subprocess.run([*args, "--out", str(tmp_path / "regime.jpeg")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and p.stderr.startswith("error:") and ".png" in p.stderr and not p.stdout


def test_talk_style_enlarges_text_and_swaps_in_colour_blind_safe_colours():
    import plotly.graph_objects as go

    from engine.reporting.export import OKABE_ITO, talk_style
    from engine.reporting.plots import ARCH_COLORS

    fig = go.Figure([go.Scatter(x=[1, 2], y=[1, 2], line=dict(color=ARCH_COLORS["relu"])),
                     go.Bar(x=[1], y=[1], marker_color=ARCH_COLORS["attn"])])
    out = talk_style(fig)
    assert out.data[0].line.color == OKABE_ITO[ARCH_COLORS["relu"]] and out.data[0].line.width == 3
    assert out.data[1].marker.color == OKABE_ITO[ARCH_COLORS["attn"]]
    band = talk_style(go.Figure(go.Scatter(x=[1, 2], y=[1, 2], fill="toself", fillcolor=ARCH_COLORS["attn"],
                                           line=dict(width=0))))
    assert band.data[0].fillcolor == OKABE_ITO[ARCH_COLORS["attn"]]  # a mean ± sd band keeps its line's colour
    assert band.data[0].line.width == 0                               # and no outline
    assert out.layout.font.size == 18
    assert fig.data[0].line.color == ARCH_COLORS["relu"]  # the page's own figure is untouched


def test_talk_style_maps_colour_lists_and_leaves_numbers_alone():
    from engine.reporting.slides import talk_style

    fig = go.Figure([go.Bar(x=[1, 2, 3], y=[1, 2, 3], marker=dict(color=["#d62728", "#1f77b4", "black"],
                                                                    pattern=dict(shape="/", fgcolor="#d62728")),
                            error_y=dict(array=[1, 1, 1], color="#1f77b4")),
                     go.Scatter(x=[1, 2], y=[1, 2], marker=dict(color=[0.1, 0.9], colorscale="Viridis"))])
    fig.add_vrect(x0=1, x1=2, fillcolor="#2ca02c")
    out = talk_style(fig)
    assert list(out.data[0].marker.color) == ["#D55E00", "#0072B2", "black"]
    assert out.data[0].marker.pattern.fgcolor == "#D55E00" and out.data[0].error_y.color == "#0072B2"
    assert list(out.data[1].marker.color) == [0.1, 0.9]
    assert out.layout.shapes[0].fillcolor == "#009E73"
    assert list(fig.data[0].marker.color) == ["#d62728", "#1f77b4", "black"]  # the page's figure is untouched


def test_a_slide_of_nets_near_chance_says_so_and_greys_them():
    """``figure ntk-sweep`` of nets that did not learn (no epochs: fresh nets on two classes) greys their
    points and warns in the settings line; a trained group is not named."""
    from engine.maths import gates

    res = EXPERIMENTS["ntk-sweep"].runner(SweepConfig(data=SYN, train=TrainSpec(epochs=0), widths=(16, 64),
                                                      seeds=(0,)))
    rows = res.frames["rows"]
    bad = gates.untrained(rows, res.meta["n_classes"])
    fig = export.main_figure("ntk-sweep", res, "prediction_gap_trained")
    line = "⚠ near chance, greyed: 2L-ReLU m = 16, 64; MLP-Attn m = 16, 64"
    assert len(bad) == 4  # two classes, every fresh net within 10 points of 50 %
    assert line in (fig.layout.title.subtitle.text or "")
    assert any("near chance" in (t.name or "") for t in fig.data)
    # the CLI's and the page's slide put their own settings line under the title: the warning stays
    again = export.slide(fig, export.settings_line(res.config))
    assert again.layout.title.subtitle.text.count(line) == 1
    # at init every net is untrained by definition: the page's init chart is not greyed, nor is the slide
    init = export.main_figure("ntk-sweep", res, "prediction_gap_init")
    assert "near chance" not in (init.layout.title.subtitle.text or "")
    assert not any("near chance" in (t.name or "") for t in init.data)
    # the rule itself on hand-made rows: one group at chance, one trained
    import pandas as pd

    made = pd.DataFrame({"arch": ["attn", "attn", "relu"], "width": [16, 16, 16], "train_acc": [0.34, 0.9, 0.95]})
    from engine.reporting import plots

    assert plots.near_chance(gates.untrained(made, 3)) == "⚠ near chance, greyed: MLP-Attn m = 16"
    assert plots.near_chance(gates.untrained(made.assign(train_acc=0.9), 3)) == ""
