"""The dashboard through Streamlit's AppTest: every page at its defaults, controls, shareable URLs.

Each test gets its own cache folder (ENGINE_CACHE_DIR). Runs happen in the job manager's
background threads, so ``settle`` reruns the script until no progress bar is left.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import MNIST_DIR, steady_app_state

APP = str(Path(__file__).resolve().parents[1] / "app.py")
NO_CHART = {"pages/grid.py"}  # a status table of a grid's cells: its charts come after a grid run


def chart_pages() -> tuple[str, ...]:
    """Every page app.py routes (``ui.nav.pages``, from the registry) that opens on a chart: a new
    experiment's page is checked here without an edit."""
    from ui import nav

    return tuple(p.path for p in nav.pages() if p.path not in NO_CHART)


PAGES = chart_pages()
SMALL = {"data": "synthetic", "n": "60", "n_test": "20", "widths": ["16", "64"],
         "scaling.kappas": ["2.0", "8.0"], "scaling.epochs": "10", "scaling.max_width": "1024",
         "scaling.seeds": "2", "regime.epochs": "5", "regime.seeds": "1", "regime.every": "1"}


@pytest.fixture()
def env(tmp_path, monkeypatch):
    steady_app_state(monkeypatch, tmp_path / "cache", MNIST_DIR or tmp_path / "no-data")
    return tmp_path


def settle(at: AppTest, timeout: float | None = None) -> AppTest:
    """Rerun until every background job has finished (no progress bar on the page).

    Waits on the jobs themselves, never on a wall-clock deadline: a slow machine is slow, not
    wrong (pytest-timeout bounds a test that truly hangs). ``timeout`` is accepted and ignored."""
    from ui.common import get_manager

    at.run()
    idle_reruns = 0
    while at.get("progress"):
        running = [job for job in get_manager().jobs() if not job.done]
        for job in running:
            job.wait()
        idle_reruns = 0 if running else idle_reruns + 1
        assert idle_reruns < 5, "a progress bar stays on the page with no job running"
        at.run()
    return at


def app(query: dict | None = None) -> AppTest:
    """The app after its first run (AppTest resolves st.navigation's pages only after one)."""
    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params.update(query or {})
    return at.run()


def open_page(at: AppTest, page: str) -> AppTest:
    if page != PAGES[0]:
        at.switch_page(page)
    return settle(at)


def run_if_waiting(at: AppTest) -> AppTest:
    """Click the first run button of a page whose defaults are too heavy to start by themselves."""
    waiting = [b for b in at.button if str(b.key or "").startswith("run.")]
    if waiting and not at.get("plotly_chart"):
        waiting[0].click()
        settle(at, timeout=400.0)
    return at


def check_page(at: AppTest, page: str) -> None:
    run_if_waiting(at)
    assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
    assert not at.error, f"{page}: {[e.value for e in at.error]}"
    charts = at.get("plotly_chart")
    assert charts, f"{page} shows no chart"
    assert len(at.get("download_button")) >= len(charts) - 1, f"{page}: a chart lacks its CSV"


@pytest.mark.slow
def test_every_page_runs_at_defaults_on_synthetic_data(env):
    at = app(SMALL)
    for page in PAGES:
        check_page(open_page(at, page), page)


def test_default_dataset_falls_back_when_mnist_is_absent(env, monkeypatch):
    monkeypatch.setenv("ENGINE_DATA_DIR", str(env / "empty"))
    at = settle(app({"n": "30", "n_test": "10", "widths": ["16"]}))
    names = at.selectbox(key="data").options
    assert "mnist" not in names and names[-1] == "synthetic"
    assert at.selectbox(key="data").value == names[0]
    assert not at.exception


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_sidebar_controls_change_results(env):
    at = open_page(app(SMALL), "pages/spectrum.py")
    assert _metric(at, "numerical rank of G").endswith("/ 60")
    at.number_input(key="n").set_value(40)
    settle(at)
    assert _metric(at, "numerical rank of G").endswith("/ 40")
    at.selectbox(key="attention").set_value("stacked:2")
    settle(at)
    assert "stacked:2" in " ".join(m.value for m in at.markdown)
    assert not at.exception


def test_picking_an_optimiser_sets_a_learning_rate_it_trains_with(env):
    """Plain SGD with Adam's lr 1e-3 would barely move the net: the NTK page's lr follows the
    optimiser picked (still editable), and the run's command line carries both."""
    from engine.maths.specs import SUGGESTED_LR

    at = open_page(app({**SMALL, "ntk.seeds": "1"}), "pages/ntk-sweep.py")
    assert at.number_input(key="ntk.lr").value == SUGGESTED_LR["adam"]
    at.selectbox(key="ntk.optimizer").set_value("sgd")
    settle(at)
    assert at.number_input(key="ntk.lr").value == SUGGESTED_LR["sgd"]
    line = " ".join(c.value for c in at.code)
    assert "--optimizer sgd" in line and f"--lr {SUGGESTED_LR['sgd']:g}" in line
    at.number_input(key="ntk.lr").set_value(0.5)
    settle(at)
    assert "--lr 0.5" in " ".join(c.value for c in at.code) and not at.exception


def test_page_controls_change_results(env):
    at = open_page(app({**SMALL, "ntk.seeds": "1"}), "pages/ntk-sweep.py")
    rows = next(d.value for d in at.dataframe if "seed" in d.value.columns)  # one row per seed
    assert set(rows["width"]) == {16, 64} and set(rows["seed"]) == {0}
    at.number_input(key="ntk.seeds").set_value(2)
    settle(at)
    assert set(next(d.value for d in at.dataframe if "seed" in d.value.columns)["seed"]) == {0, 1}
    assert not at.exception


def test_query_parameters_restore_a_view(env):
    view = {**SMALL, "n": "50", "seed": "3", "archs": ["2L-ReLU"], "ntk.epochs": "0", "ntk.seeds": "1"}
    at = open_page(app(view), "pages/ntk-sweep.py")
    assert at.number_input(key="n").value == 50
    assert at.number_input(key="seed").value == 3
    assert at.multiselect(key="widths").value == [16, 64]
    assert at.multiselect(key="archs").value == ["relu"]
    assert at.number_input(key="ntk.epochs").value == 0
    rows = next(d.value for d in at.dataframe if "seed" in d.value.columns)
    assert set(rows["arch"]) == {"relu"} and set(rows["seed"]) == {3}
    assert "no loss curves" in " ".join(c.value for c in at.caption)


def test_settings_persist_across_page_switches(env):
    at = open_page(app(SMALL), "pages/spectrum.py")
    at.number_input(key="n").set_value(30)
    settle(at)
    open_page(at, "pages/influence.py")
    assert at.number_input(key="n").value == 30
    assert not at.exception


def test_engine_errors_show_as_one_line(env):
    at = open_page(app({**SMALL, "classes": "1-1"}), "pages/spectrum.py")
    assert not at.exception
    assert at.error, "the bad class pair should show an error box"
    message = at.error[0].value
    assert "synthetic classes" in message and "\n" not in message


@pytest.mark.slow
def test_heavy_runs_wait_for_a_click_and_can_be_cancelled(env):
    at = open_page(app({**SMALL, "ntk.seeds": "1"}), "pages/ntk-sweep.py")
    at.number_input(key="n").set_value(1000)
    at.multiselect(key="widths").set_value([16, 16384])
    at.number_input(key="ntk.epochs").set_value(1000)
    at.run()
    run = [b for b in at.button if b.label == "Run the sweep"]
    assert run, "heavy settings should wait for a click"
    assert not at.get("progress")
    run[0].click().run()
    cancel = [b for b in at.button if b.label == "Cancel"]
    assert cancel and at.get("progress"), "a started run shows a progress bar and a Cancel button"
    assert "left" in at.get("progress")[0].proto.text
    cancel[0].click().run()
    from ui.common import get_manager

    for job in get_manager().jobs():  # the cancelled job itself says when it has stopped
        job.wait()
    at.run()
    assert any("cancelled" in i.value for i in at.info)
    assert not at.exception


@pytest.mark.slow
def test_every_page_runs_on_a_binary_task(env):
    at = app({**SMALL, "classes": "0-1"})
    for page in PAGES:
        check_page(open_page(at, page), page)


def test_malleability_options_render(env):
    view = {**SMALL, "mall.interventions": "true", "mall.retrain": "true", "mall.perturb": "all",
            "mall.eps": ["0.05"], "mall.attacks": ["PGD"], "mall.steps": "3", "mall.epochs": "5"}
    at = open_page(app(view), "pages/malleability.py")
    if any(b.label == "Run the attacks" for b in at.button):
        next(b for b in at.button if b.label == "Run the attacks").click()
        settle(at)
    check_page(at, "malleability with options")
    assert any(h.value == "Interventions" for h in at.header)


def test_an_uploaded_npz_is_a_data_set(env):
    import io

    import numpy as np

    from engine.data import store_npz

    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    np.savez(buf, X=rng.random((80, 6, 6)), y=np.arange(80) % 3)
    path = str(store_npz(buf.getvalue(), "mine.npz", env / "uploads"))
    at = AppTest.from_file(APP, default_timeout=600)
    at.session_state["uploads"] = [path]
    at.query_params.update({"n": "40", "n_test": "10", "widths": ["16"]})
    at.run()
    at.selectbox(key="data").set_value(path).run()
    at = open_page(at, "pages/spectrum.py")
    check_page(at, "pages/spectrum.py")
    assert "Task: **mine.npz**" in [c.value for c in at.sidebar.caption]  # by its file name, not the stored one


def test_a_missing_data_set_offers_a_download_that_reports_its_outcome(env):
    at = settle(app(SMALL))
    at.button(key="fetch.cifar10").click().run()
    assert any("cifar10 not found" in e.value and "cifar-10-batches-py" in e.value for e in at.error)
    assert not at.exception


def _headline(at: AppTest):
    return next(t.value for t in at.table if "quantity" in t.value.columns)


def _fresh_overview() -> tuple[AppTest, object]:
    """The Overview on an empty cache, run twice: any job it started would show by then."""
    at = app(SMALL)
    at.run()
    assert not at.get("progress") and not at.exception
    (button,) = [b for b in at.button if b.label == "Measure them here"]
    return at, button


def test_the_overview_starts_nothing_until_asked(env):
    """A fresh server shows the paper's numbers and one button with the engine's estimate."""
    at, _ = _fresh_overview()
    table = _headline(at)
    assert set(table["here"]) == {"—"}
    assert "45.1 / 39.9 / 39.2 (mnist)" in set(table["paper"])  # paper.NTK_DISTANCE, ReLU
    note = " ".join(c.value for c in at.caption)
    assert "Not measured here yet" in note and "of work here in all" in note and "flip rates" in note
    assert not at.get("plotly_chart")
    protocols = next(m.value for m in at.markdown if m.value.startswith("- paper protocol ("))
    assert "- trained, centred MLP-Attn (" in protocols and protocols.count(": not in this cache") >= 4


@pytest.mark.slow
def test_the_overview_measures_on_a_click_then_reads_the_cache(env):
    from ui.common import get_manager

    at, button = _fresh_overview()
    button.click()
    settle(at, timeout=400.0)
    assert "—" not in set(_headline(at)["here"]) and at.get("plotly_chart") and not at.error

    get_manager.clear()  # a restarted server: no finished job in memory, only the disk cache
    again = app(SMALL)
    again.run()
    assert not again.get("progress") and "—" not in set(_headline(again)["here"])
    assert not [b for b in again.button if b.label == "Measure them here"] and not again.exception


def test_the_kernel_regime_preset_sets_the_binary_mse_set_up_in_one_click(env):
    """The button sets the page's data, n, widths and controls to engine.experiments.dynamics' ``binary-mse``
    preset on this page only: the shared sidebar keeps its own, and one button goes back to it."""
    from engine.experiments.configs.dynamics import PRESETS

    preset = PRESETS["dynamics"]["binary-mse"]
    at = app(SMALL)
    at.switch_page("pages/dynamics.py")
    at.run()
    at.button(key="regime.binary").click()
    at.run()
    assert not at.exception
    shown = " ".join(i.value for i in at.info)
    assert f":{preset.data.dataset.split(':')[1]}, n = {preset.data.n}" in shown and "this page only" in shown
    assert at.number_input(key="n").value == int(SMALL["n"]) and at.text_input(key="classes").value in ("", "all")
    assert at.number_input(key="regime.epochs").value == preset.train.epochs
    assert at.number_input(key="regime.seeds").value == len(preset.seeds)
    assert at.selectbox(key="regime.optimizer").value == preset.train.optimizer
    assert at.select_slider(key="regime.lr").value == preset.train.lr
    assert at.selectbox(key="regime.param").value == preset.train.param
    at.button(key="regime.binary.off").click()
    at.run()
    assert not any("this page only" in i.value for i in at.info) and not at.exception


def test_malleability_reads_one_attack_three_ways_across_widths(env):
    """Every reading and two widths from a link: the gap table and the excess-against-width chart render,
    and the table and the bars show the reading and width picked."""
    view = {**SMALL, "classes": "0-1", "mall.readings": ["ridge", "flow", "retrain"], "mall.widths": ["64", "256"],
            "mall.optimizer": "sgd", "mall.lr": "1.0", "mall.decay": "0.0", "mall.loss": "mse",
            "mall.init": "antisymmetric", "mall.eps": ["0.3"], "mall.attacks": ["PGD"], "mall.steps": "3",
            "mall.epochs": "5", "mall.norm": "l2", "mall.space": "normalized"}
    at = open_page(app(view), "pages/malleability.py")
    if any(b.label == "Run the attacks" for b in at.button):
        next(b for b in at.button if b.label == "Run the attacks").click()
        settle(at, timeout=400.0)
    check_page(at, "malleability read three ways")
    assert any(h.value == "Every reading, every width" for h in at.subheader)
    assert at.selectbox(key="mall.shown_reading").options == ["ridge LOO (kernel)", "gradient flow (kernel)",
                                                              "retraining (network)"]
    assert len(at.dataframe) >= 2


def test_each_readme_protocol_is_one_click_on_the_malleability_page(env):
    """The three protocol buttons set this page's size and attention and every control to the registry's
    presets, so the page then measures what the README's rows report; the shared sidebar (and so every
    other page) keeps its own, and one button goes back to it."""
    from engine.experiments.registry import preset

    at = open_page(app(SMALL), "pages/malleability.py")
    next(b for b in at.button if b.key == "mall.protocol.three readings").click()
    settle(at)
    net = preset("malleability", "network")
    assert at.multiselect(key="mall.readings").value == list(net.readings)
    assert at.multiselect(key="mall.widths").value == list(net.widths)
    n_before = at.number_input(key="n").value
    assert at.selectbox(key="attention").value != "centered" or n_before != net.data.n  # the sidebar kept its own
    shown = " ".join(i.value for i in at.info)
    assert f"n = {net.data.n}" in shown and "centered attention" in shown and "this page only" in shown
    assert at.number_input(key="mall.lr").value == net.train.lr and at.radio(key="mall.loss").value == "mse"
    next(b for b in at.button if b.key == "mall.protocol.trained, centred").click()
    settle(at)
    trained = preset("malleability", "trained")
    assert at.number_input(key="mall.epochs").value == trained.train.epochs
    assert at.multiselect(key="mall.readings").value == ["ridge"] and not at.exception
    next(b for b in at.button if b.key == "mall.protocol.off").click()
    settle(at)
    assert not any("this page only" in i.value for i in at.info) and at.number_input(key="n").value == n_before


def test_influence_reads_its_top_points_by_retraining_too(env):
    view = {**SMALL, "influence.readings": ["retraining (network)"], "influence.read_points": "5", "influence.epochs": "10"}
    at = run_if_waiting(open_page(app(view), "pages/influence.py"))
    check_page(at, "influence with the retrain reading")
    assert any(h.value == "The same points read by the network" for h in at.header)
    rows = at.dataframe[-1].value
    assert list(rows.reading) == ["retrain"] * len(rows) and set(rows.points) == {5}
    assert "flow" not in at.multiselect(key="influence.readings").options  # Adam: flow is not offered
