"""The data set the pages run on says what it is: a missing default or linked data set is named
with its files and folder, an upload is selected at once under its own name with the n its runs
use, and a Run click does not land on Cancel (issue 35 item 6).

AppTest on the real app and engine, synthetic data or an uploaded .npz; ``env`` (tests/test_app.py)
gives each test its own cache folder and job manager.
"""

from __future__ import annotations

import io
import uuid

import numpy as np
import pytest

from tests import test_app
from tests.test_app import app, open_page, settle
from tests.test_url_safety import _live, _unescaped

env = test_app.env  # the fixture: each test's own cache folder and job manager, MNIST where it is shared

IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
TINY = {"n": "30", "n_test": "10", "widths": ["16"]}


def _npz(rows: int, test_rows: int | None = None, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    arrays = dict(X=rng.random((rows, 6)), y=np.arange(rows) % 3)
    if test_rows is not None:
        arrays.update(X_test=rng.random((test_rows, 6)), y_test=np.arange(test_rows) % 3)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _banners(at, start: str) -> list[str]:
    return [w.value for w in at.warning if w.value.startswith(start)]


# ---------------------------------------------------------------- a data set that is not here

def test_a_missing_default_is_named_with_its_files_folder_and_what_is_shown(env, monkeypatch):
    from ui.common import plain

    empty = env / "empty"
    monkeypatch.setenv("ENGINE_DATA_DIR", str(empty))
    at = settle(app(TINY))
    shown = at.selectbox(key="data").value
    assert shown != "mnist" and not at.exception
    (banner,) = _banners(at, "The default data set, mnist, is not here")
    assert all(f in banner for f in IDX), banner
    assert plain(empty / "MNIST" / "raw") in banner and f"show {shown} instead" in banner
    assert "\n" not in banner and _live(banner) == []
    at.switch_page("pages/grid.py")  # every page: the sidebar's code runs on each
    at.run()
    assert len(_banners(at, "The default data set, mnist")) == 1
    others = [o for o in at.selectbox(key="data").options if o != shown]
    if not others:  # e.g. a fresh machine without Debian's dataset-fashion-mnist: only synthetic is offered
        pytest.skip(f"only {shown} is offered here besides the missing default, so picking another data set "
                    "cannot be checked (fashion-mnist or cifar10 in the data folder, or Debian's "
                    "dataset-fashion-mnist, would offer one)")
    at.selectbox(key="data").set_value(others[0]).run()  # picked: no longer a silent switch
    assert not _banners(at, "The default data set") and not at.exception


def test_a_link_to_a_missing_data_set_names_its_files_and_folder(env, monkeypatch):
    from ui.common import plain

    empty = env / "empty"
    monkeypatch.setenv("ENGINE_DATA_DIR", str(empty))
    at = settle(app({**TINY, "data": "mnist"}))
    (line,) = _banners(at, "This link")
    shown = at.selectbox(key="data").value
    assert line.startswith("This link's data set, mnist, is not here") and all(f in line for f in IDX)
    assert plain(empty / "MNIST" / "raw") in line and f"show {shown} instead" in line
    assert not _banners(at, "The default data set")  # one line: the link's, not the default's too


@pytest.mark.parametrize("asked", ["<img src=x onerror=alert(1)>*bold* [a](http://evil.example)", "no_such-set"])
def test_a_link_to_a_data_set_that_does_not_exist_is_one_escaped_line(env, asked):
    at = settle(app({**TINY, "data": asked}))
    assert not at.exception
    naming = [w.value for w in at.warning if "data set" in w.value]
    assert len(naming) == 1, naming
    (line,) = naming
    assert line.startswith("This link asks for the data set") and "\n" not in line
    assert _live(line) == [] and asked in _unescaped(line)
    assert f"shows {at.selectbox(key='data').value} instead" in line


@pytest.mark.parametrize("asked, classes", [("synthetic:0-1", "0-1"), ("Synthetic:2-5", "2-5")])
def test_a_link_opens_a_two_class_task_written_as_the_cli_writes_it(env, asked, classes):
    """``?data=synthetic:0-1`` (the CLI's ``--dataset synthetic:0-1``) opens that data set with that
    pair in Classes: no line says the link's data set is not available."""
    at = settle(app({**TINY, "data": asked}))
    assert not at.exception and not _banners(at, "This link"), [w.value for w in at.warning]
    assert at.selectbox(key="data").value == "synthetic" and at.text_input(key="classes").value == classes
    assert f"Task: **synthetic:{classes}**" in [c.value for c in at.sidebar.caption]


def test_a_link_to_a_missing_two_class_task_names_the_data_sets_files(env, monkeypatch):
    """``?data=mnist:3-8`` where MNIST is missing: the line is about MNIST's files, as for ``data=mnist``."""
    monkeypatch.setenv("ENGINE_DATA_DIR", str(env / "empty"))
    at = settle(app({**TINY, "data": "mnist:3-8"}))
    (line,) = _banners(at, "This link")
    assert line.startswith("This link's data set, mnist, is not here") and all(f in line for f in IDX)
    assert at.query_params["classes"] == "3-8"


# ---------------------------------------------------------------- uploads

def test_an_upload_is_selected_named_by_its_file_and_the_sidebar_shows_its_n(env):
    at = app({"widths": ["16"]})  # n = 200, 100 test points: more than the file holds
    at.file_uploader(key="upload").set_value(("mine.npz", _npz(80, 30), "application/octet-stream")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    box = at.selectbox(key="data")
    assert box.value.endswith(".npz") and box.options[box.index] == "mine.npz"  # selected, by its name
    assert at.query_params["data"] == box.value.rsplit("/", 1)[-1]  # a link still names the stored file
    assert (at.number_input(key="n").value, at.number_input(key="n_test").value) == (80, 30)
    assert any("runs use n = 80 and 30 test points instead of 200 and 100" in i.value for i in at.sidebar.info)
    assert "Task: **mine.npz**" in [c.value for c in at.sidebar.caption]
    at = open_page(at, "pages/spectrum.py")  # the runs use the n the sidebar shows
    assert next(m.value for m in at.metric if m.label == "numerical rank of G").endswith("/ 80")
    assert not at.exception

    at.number_input(key="n").set_value(50).run()  # below what the file holds: kept, the note goes
    assert at.number_input(key="n").value == 50 and not at.sidebar.info

    first = box.value
    at.file_uploader(key="upload").set_value(("mine.npz", _npz(60, seed=1), "application/octet-stream")).run()
    box = at.selectbox(key="data")
    assert box.value != first and box.options[box.index] == "mine.npz (2)"  # the same name, told apart
    assert "mine.npz" in box.options and not at.exception


def test_picking_another_data_set_after_an_upload_gives_back_the_sizes_asked(env):
    at = app({"widths": ["16"]})
    at.file_uploader(key="upload").set_value(("small.npz", _npz(40), "application/octet-stream")).run()
    assert at.number_input(key="n").value + at.number_input(key="n_test").value <= 40
    at.selectbox(key="data").set_value("synthetic").run()
    assert (at.number_input(key="n").value, at.number_input(key="n_test").value) == (200, 100)
    assert not at.sidebar.info and not at.exception


# ---------------------------------------------------------------- Cancel is not where Run was

def test_cancel_is_beside_the_progress_bar_not_where_the_run_button_was(env, monkeypatch):
    """The run button is drawn alone, full width; the progress bar takes its place and Cancel sits
    in the narrow column to its right, without a tooltip that would cover the bar's ETA."""
    import ui.runner
    from tests.test_runner import Slow, SlowRun, button, tab

    monkeypatch.setattr(ui.runner, "INLINE_WAIT_S", 0.3)
    fn = SlowRun()
    at = tab(fn, Slow(uuid.uuid4().hex))
    assert not at.columns  # the Start button: the slot's first thing, at its left edge
    button(at, "Start").click().run()
    try:
        (bar,) = [c for c in at.columns if c.get("progress")]
        (stop,) = [c for c in at.columns if c.button]
        assert not bar.button and "left" in bar.get("progress")[0].proto.text  # the ETA
        (cancel,) = stop.button
        assert cancel.label == "Cancel" and not cancel.help
        assert bar.weight > 4 * stop.weight
    finally:
        fn.gate.set()
