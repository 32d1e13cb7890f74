"""Fault injection on figure export: an output path that cannot take the image is refused in
one line before anything is computed (the cache stays as it was, so no result was made), and
``check_output_path`` itself, in process, against each kind of bad place."""

from __future__ import annotations

import os
import stat

import pytest

from engine.reporting import export
from engine.runtime.errors import BadInput
from test_faults_cli import private_cache, refused

ROOT_USER = os.geteuid() == 0
FIGURE = ("figure", "spectrum", "--dataset", "synthetic", "--n", "20", "--n-test", "4")


@pytest.fixture()
def cache(tmp_path):
    return private_cache(tmp_path / "cache")


@pytest.fixture()
def place(tmp_path):
    """A folder with a subfolder and a plain file in it."""
    folder = tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    (folder / "afile").write_text("a file, not a folder")
    return folder


# ---------------------------------------------------------------- in process

@pytest.mark.parametrize("name, words", [
    ("sub", "cannot tell the image format"),
    ("sub.png/", "is a folder"),
    ("afile/x.png", "is a file, not a folder"),
    ("afile/deeper/x.png", "is a file, not a folder"),
    ("x" * 300 + ".png", "at most 255"),
    ("x.jpeg", "cannot tell the image format"),
])
def test_bad_output_paths_are_one_line(place, name, words):
    (place / "sub.png").mkdir()
    with pytest.raises(BadInput, match=words) as info:
        export.check_output_path(place / name)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("path, words", [("/proc/x.png", "not writable"),
                                         ("~nosuchuser-engine-test/x.png", "cannot expand")])
def test_places_that_take_no_file_are_one_line(path, words):
    with pytest.raises(BadInput, match=words):
        export.check_output_path(path)


def test_a_fifo_in_place_of_the_image_is_refused(place):
    os.mkfifo(place / "pipe.png")  # writing the image into it would wait for a reader
    with pytest.raises(BadInput, match="not a regular file"):
        export.check_output_path(place / "pipe.png")


def test_a_read_only_image_or_folder_is_refused(place):
    (place / "old.png").write_bytes(b"old")
    (place / "old.png").chmod(stat.S_IRUSR)
    with pytest.raises(BadInput, match="read-only"):
        export.check_output_path(place / "old.png")
    (place / "sub").chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(BadInput, match="not writable"):
            export.check_output_path(place / "sub" / "x.png")
    finally:
        (place / "sub").chmod(stat.S_IRWXU)


def test_a_good_path_is_checked_without_leaving_anything(place):
    before = sorted(p.name for p in place.rglob("*"))
    assert export.check_output_path(place / "sub" / "fig.svg") == place / "sub" / "fig.svg"
    assert export.check_output_path(place / "new" / "deeper" / "fig.pdf").name == "fig.pdf"
    assert sorted(p.name for p in place.rglob("*")) == before  # no probe file, no folder made


def test_write_image_checks_the_path_before_rendering(place):
    # no figure at all: a render first would fail on it in its own words, not as this BadInput
    with pytest.raises(BadInput, match="is a file, not a folder"):
        export.write_image(None, place / "afile" / "x.png")


@pytest.mark.skipif(export.browser_path() is None, reason="no Chromium or Chrome here (apt-get install chromium)")
def test_write_image_leaves_only_the_image(place):
    import plotly.graph_objects as go

    path = export.write_image(go.Figure(go.Scatter(x=[0, 1], y=[1, 0])), place / "new" / "x.svg", 200, 100)
    assert path.read_bytes().lstrip().startswith((b"<svg", b"<?xml"))
    assert sorted(p.name for p in (place / "new").iterdir()) == ["x.svg"]  # no temporary file left


# ---------------------------------------------------------------- as a user runs it

def test_cli_figure_into_a_folder_is_refused_before_computing(cache, place):
    (place / "fig.png").mkdir()
    line = refused(2, *FIGURE, "--out", place / "fig.png", cache=cache, data=place)
    assert "is a folder" in line


@pytest.mark.slow
@pytest.mark.parametrize("where", ["proc", "parent is a file", "long name", "unknown user", "bad suffix"])
def test_cli_figure_out_that_cannot_be_written_is_refused_before_computing(cache, place, where):
    out = {"proc": "/proc/x.png", "parent is a file": place / "afile" / "x.png",
           "long name": place / ("x" * 300 + ".png"), "unknown user": "~nosuchuser-engine-test/x.png",
           "bad suffix": place / "x.jpeg"}[where]
    refused(2, *FIGURE, "--out", out, cache=cache, data=place)


@pytest.mark.slow
@pytest.mark.parametrize("value", ["nan", "inf", "1e300"])
def test_cli_figure_max_gib_out_of_range_is_one_line(cache, place, value):
    line = refused(2, *FIGURE, "--out", place / "x.png", "--max-gib", value, cache=cache, data=place)
    assert "--max-gib" in line
