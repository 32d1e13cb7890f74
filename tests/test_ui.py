"""ui.common, ui.sidebar and ui.render through Streamlit's AppTest: settings to specs, the n clamp, one error
per page, charts with their CSV, upload messages and links to uploads.

Small scripts run with ``AppTest.from_function`` (each function is its own script, so it
imports what it uses); the app-level checks run app.py on synthetic data with a fresh cache.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.data import DataSpec, store_npz
from engine.reporting import export
from engine.runtime.errors import EngineError
from tests.conftest import steady_app_state
from ui.common import Shared, display_name
from ui.sidebar import fit_sizes, upload_problem

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = {"data": "synthetic", "n": "40", "n_test": "10", "widths": ["16"]}


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """A fresh cache, no image data (synthetic is the default), and app runs in the server's
    steady state (see tests/test_app.py: AppTest re-decides the v1 `pages/` mode every run)."""
    steady_app_state(monkeypatch, tmp_path / "cache", tmp_path / "no-data")
    return tmp_path


def _npz(rows: int, test_rows: int | None = None) -> bytes:
    rng = np.random.default_rng(0)
    arrays = {"X": rng.random((rows, 5, 5)), "y": np.arange(rows) % 3}
    if test_rows is not None:
        arrays.update(X_test=rng.random((test_rows, 5, 5)), y_test=np.arange(test_rows) % 3)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def settle(at: AppTest, timeout: float = 120.0) -> AppTest:
    deadline = time.monotonic() + timeout
    at.run()
    while at.get("progress") and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()
    return at


# ---------------------------------------------------------------- Shared → DataSpec

def test_shared_settings_become_the_engines_data_spec():
    s = Shared(base="mnist", classes=" 3-8 ", n=50, n_test=20, seed=4)
    assert s.data() == DataSpec(dataset="mnist:3-8", n=50, n_test=20, seed=4)
    assert s.data(n_test=1).n_test == 1 and s.data(n_test=1).dataset == "mnist:3-8"
    assert Shared(base="synthetic", classes="ALL").data().dataset == "synthetic"
    up = Shared(base="/srv/cache/uploads/mine-0123456789abcdef.npz", n=30)
    assert up.uploaded and up.label == "mine-0123456789abcdef.npz" and up.data().dataset == up.base
    assert "mine-0123456789abcdef.npz, n = 30" in up.describe() and "/srv" not in up.describe()


def test_shared_values_reach_a_script_as_a_data_spec():
    def script():
        import streamlit as st

        from ui.common import Shared

        st.session_state["shared"] = Shared(base="synthetic", classes="0-1", n=30, n_test=5, seed=2)
        from ui.common import shared

        spec = shared().data()
        st.markdown(f"{spec.dataset}|{spec.n}|{spec.n_test}|{spec.seed}")

    at = AppTest.from_function(script).run()
    assert not at.exception
    assert at.markdown[0].value == "synthetic:0-1|30|5|2"


# ---------------------------------------------------------------- the n clamp

@pytest.mark.parametrize("n,n_test,rows,test_rows,expected", [
    (40, 10, 80, None, (40, 10)),      # fits: unchanged
    (200, 100, 80, None, (53, 27)),    # shared in proportion to the request
    (200, 1, 80, None, (79, 1)),
    (200, 100, 3, None, (2, 1)),       # the smallest file store_npz accepts
    (200, 100, 80, 30, (80, 30)),      # with X_test each split is its own limit
    (50, 10, 80, 30, (50, 10)),
])
def test_fit_sizes_follows_the_npz_loaders_limits(n, n_test, rows, test_rows, expected, tmp_path):
    assert fit_sizes(n, n_test, rows, test_rows) == expected
    from engine.data import load_sample

    path = store_npz(_npz(rows, test_rows), "mine.npz", tmp_path)
    got_n, got_t = expected
    sample = load_sample(DataSpec(dataset=str(path), n=got_n, n_test=got_t))  # the engine accepts them
    assert sample.X.shape[0] == got_n and sample.X_test.shape[0] == got_t


def test_too_large_n_on_an_upload_is_lowered_and_said_once(env):
    path = str(store_npz(_npz(80), "mine.npz", env / "cache" / "uploads"))

    def script(path):
        import streamlit as st

        from ui.common import Shared
        from ui.sidebar import usable

        s, error, note = usable(Shared(base=path, n=200, n_test=100))
        st.markdown(f"{s.n}|{s.n_test}|{error}")
        st.info(note)

    at = AppTest.from_function(script, args=(path,)).run()
    assert not at.exception
    assert at.markdown[0].value == "53|27|None"
    (note,) = at.info
    assert "mine.npz has 80 rows" in note.value and "n = 53 and 27 test points" in note.value
    assert "instead of 200 and 100" in note.value and "/" not in note.value


def test_the_app_runs_an_upload_with_the_default_n(env):
    path = str(store_npz(_npz(80), "mine.npz", env / "cache" / "uploads"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["uploads"] = [path]
    at.query_params.update({"data": Path(path).name, "widths": ["16"]})  # n = 200, test points 100
    at = settle(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="data").value == path
    assert any("runs use n = 53 and 27 test points" in i.value for i in at.sidebar.info)
    assert any("n = 53, 27 test points" in c.value for c in at.caption)  # the page's own description


# ---------------------------------------------------------------- one error per page

def test_a_bad_class_pair_falls_back_to_all_with_one_error():
    def script():
        import streamlit as st

        from ui.common import Shared
        from ui.sidebar import usable

        for classes in ("1-1", "0-1", "3-x"):
            s, error, note = usable(Shared(base="synthetic", classes=classes))
            st.markdown(f"{classes}|{s.classes}|{s.dataset}")
            if error:
                st.error(error)

    at = AppTest.from_function(script).run()
    assert [m.value for m in at.markdown] == ["1-1|all|synthetic", "0-1|0-1|synthetic:0-1", "3-x|all|synthetic"]
    assert len(at.error) == 2
    assert all("\n" not in e.value and "use all classes" in e.value for e in at.error)
    assert "synthetic classes" in at.error[0].value


@pytest.mark.parametrize("page", ["pages/overview.py", "pages/ntk-sweep.py"])
def test_a_bad_class_pair_shows_one_error_on_a_page_with_several_runs(env, page):
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({**SMALL, "classes": "1-1", "ntk.epochs": "0", "ntk.seeds": "1"})
    at.run()
    if page != "pages/overview.py":
        at.switch_page(page)
    at = settle(at)
    assert not at.exception
    assert len(at.error) == 1, [e.value for e in at.error]
    assert at.error[0].value.startswith("Classes `1-1`: synthetic classes")


# ---------------------------------------------------------------- uploads and links

def test_upload_messages_name_the_file_and_what_is_expected(tmp_path):
    assert upload_problem("data.csv") == ("“data.csv” is not an .npz file; expected an .npz file with arrays X "
                                          "(one row per sample) and y (integer labels), as numpy.savez writes.")
    buf = io.BytesIO()
    np.savez(buf, A=np.zeros((5, 2)))
    for blob, why in ((b"not a zip", "is not a valid .npz file"), (buf.getvalue(), "needs arrays X and y")):
        with pytest.raises(EngineError) as info:
            store_npz(blob, "mine.npz", tmp_path)
        message = upload_problem("mine.npz", info.value)
        assert message.startswith("“mine.npz”") and why in message, message
        assert "expected an .npz file with arrays X" in message
        assert str(tmp_path) not in message and "allow_pickle" not in message and "\n" not in message
    assert display_name(str(tmp_path / "mine-0123456789abcdef.npz")) == "mine.npz"


def test_a_link_to_an_upload_missing_here_says_so(env):
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({**SMALL, "data": "theirs-0123456789abcdef.npz"})
    at = settle(at)
    assert not at.exception
    (warning,) = [w for w in at.warning if "not on this server" in w.value]
    shown = at.selectbox(key="data").value  # the first data set offered here
    assert "`theirs.npz`" in warning.value and f"shows {shown} instead" in warning.value
    assert shown == at.selectbox(key="data").options[0]
    settle(at)
    assert any("not on this server" in w.value for w in at.warning)  # stays while the view is the fallback
    others = [o for o in at.selectbox(key="data").options if o != shown]
    if others:
        at.selectbox(key="data").set_value(others[0])
        settle(at)
        assert not any("not on this server" in w.value for w in at.warning)  # until another data set is picked


def test_a_link_to_an_upload_kept_on_this_server_opens_it(env):
    path = str(store_npz(_npz(60), "mine.npz", env / "cache" / "uploads"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({**SMALL, "data": Path(path).name})
    at = settle(at)
    assert not at.exception and not at.warning
    assert at.selectbox(key="data").value == path


def test_qkv_says_before_running_that_it_needs_a_small_n(env):
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({**SMALL, "n": "200", "attention": "qkv"})
    at = settle(at)
    assert not at.exception
    note = " ".join(c.value for c in at.sidebar.caption)
    assert "**qkv** trains W_Q, W_K and W_V" in note and "keep n small" in note and "At n = 200" in note
    at.selectbox(key="attention").set_value("linear")
    at = settle(at)
    assert "qkv" not in " ".join(c.value for c in at.sidebar.caption)


# ---------------------------------------------------------------- render

def test_chart_draws_the_figure_its_reading_note_and_a_csv_button():
    def script():
        import pandas as pd
        import plotly.graph_objects as go

        from ui import render

        data = pd.DataFrame({"width": [16, 64], "distance": [0.5, 0.25]})
        fig = go.Figure(go.Scatter(x=data["width"], y=data["distance"]))
        render.chart(fig, data, "Kernel distance", "Lower is closer to the limit.")
        render.chart(fig, data, "Second chart", "Another sentence.")

    at = AppTest.from_function(script).run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 2
    buttons = at.get("download_button")
    images = ["PNG", "SVG", "PDF"] if export.browser_path() else []  # static images need a Chromium
    assert [b.proto.label for b in buttons] == ["CSV", *images, "CSV", *images]
    assert [c.value for c in at.caption] == ["Lower is closer to the limit.", "Another sentence."]


def test_metric_slots_hold_one_metric_each():
    def script():
        from ui import render

        for slot, (label, value) in zip(render.metric_slots(3), [("κ(G)", 1), ("κ(G)³ (theory, linear)", 2),
                                                                 ("κ of attention Gram (linear, measured)", 3)],
                                            strict=True):
            slot.metric(label, value)

    at = AppTest.from_function(script).run()
    assert [m.label for m in at.metric] == ["κ(G)", "κ(G)³ (theory, linear)", "κ of attention Gram (linear, measured)"]


def test_bad_link_values_are_named_with_what_is_used_instead(env):
    """n = 999999, an unknown width and device: one visible line each, naming the value, what is
    allowed and what the page uses instead (the widgets alone drop them with only a red "!")."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({**SMALL, "n": "999999", "widths": ["16", "99999"], "device": "tpu"})
    at = settle(at)
    assert not at.exception
    texts = [w.value for w in at.warning]
    hi = int(DataSpec.__dataclass_fields__["n"].metadata["setting"].hi)
    assert any("n = `999999`" in t and f"from 10 to {hi}" in t and "uses 200 instead" in t for t in texts), texts
    assert any("widths `99999`" in t and "uses 16 instead" in t for t in texts), texts
    assert any("device `tpu`" in t and "uses auto instead" in t for t in texts), texts
    assert at.number_input(key="n").value == 200 and at.multiselect(key="widths").value == [16]
    at.number_input(key="n").set_value(60)
    settle(at)
    assert not any("This link" in w.value for w in at.warning)  # gone once the user sets the value


def test_without_data_one_line_says_the_pages_run_on_synthetic_data(env):
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(SMALL)
    at = settle(at)
    (note,) = [i for i in at.info if "synthetic data" in i.value]
    assert "python -m engine datasets --fetch mnist" in note.value and "ENGINE_DATA_DIR" in note.value


def test_nets_near_chance_get_a_banner_and_grey_rows():
    """The worst seed decides: MLP-Attn at 12 % on 10 classes is named and greyed, 2L-ReLU is not."""
    def script():
        import pandas as pd
        import streamlit as st

        from ui import render

        rows = pd.DataFrame({"arch": ["relu"] * 2 + ["attn"] * 2, "width": [64] * 4, "seed": [0, 1] * 2,
                             "train_acc": [0.95, 0.97, 0.12, 0.48]})
        bad = render.training_gate(rows, 10, what="distances")
        styled = render.greyed(rows, bad)
        st.session_state["grey"] = [styled._compute().ctx.get((i, 0), []) for i in range(len(rows))]

    at = AppTest.from_function(script).run()
    assert not at.exception
    (banner,) = at.warning
    assert "MLP-Attn, m = 64: 12 % (mean 30 %)" in banner.value and "2L-ReLU" not in banner.value
    assert "10 points of chance (10 %)" in banner.value and "distances" in banner.value
    grey = at.session_state["grey"]
    assert grey[0] == grey[1] == [] and all(g and "9e9e9e" in g[0][1] for g in grey[2:])


def test_a_failed_training_gate_names_the_net_its_seed_and_its_numbers():
    """The engine's ``trained`` flag decides; without it, ``passes_gate`` on test vs K_m ridge."""
    def script():
        import pandas as pd

        from ui import render

        rows = pd.DataFrame({"arch": ["relu", "relu", "relu", "attn"], "data_seed": [0, 0, 0, 0],
                             "seed": [0, 1, 2, 0], "train_acc": [1.0, 1.0, 1.0, 0.9],
                             "test_acc": [0.8, 0.61, 0.79, 0.7], "test_acc_kernel": [0.8, 0.78, 0.8, 0.7]})
        render.gate_failures(rows)  # 2L-ReLU seed 1: 61 % against 78 %, 17 points below
        render.gate_failures(rows.assign(trained=[True, True, False, True]))  # the engine's flag wins
        render.gate_failures(rows.iloc[[0, 3]])  # every net passes: nothing

    at = AppTest.from_function(script).run()
    assert not at.exception
    first, second = (w.value for w in at.warning)
    assert "1 of 4 nets" in first and "2L-ReLU, seed 1: train 100 %, test 61 %, K_m ridge 78 %" in first
    assert "MLP-Attn" not in first and "data draw" not in first
    assert "2L-ReLU, seed 2: train 100 %, test 79 %, K_m ridge 80 %" in second and "seed 1" not in second


def test_every_chart_gets_a_title():
    """A figure without one is titled from the chart's name; a figure's own title or ``title`` wins."""
    def script():
        import pandas as pd
        import plotly.graph_objects as go

        from ui import render

        data = pd.DataFrame({"width": [16, 64], "distance": [0.5, 0.25]})
        fig = go.Figure(go.Scatter(x=data["width"], y=data["distance"]))
        render.chart(fig, data, "kernel distance", "Lower is closer.")
        render.chart(go.Figure(fig).update_layout(title="Its own"), data, "second", "Another.")
        render.chart(fig, data, "third", "A third.", title="Given")

    at = AppTest.from_function(script).run()
    assert not at.exception
    import json

    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert titles == ["Kernel distance", "Its own", "Given"]


def test_a_running_job_is_polled_less_often_as_it_ages():
    """The progress fragment refreshes every POLL_S at first, then no more often than every
    1/POLL_AGE of the run's age, up to POLL_MAX_S; the interval never shrinks as the run ages."""
    from ui.runner import POLL_AGE, POLL_MAX_S, POLL_S, poll_interval

    ages = np.linspace(0, 3600, 7201)
    every = np.array([poll_interval(a) for a in ages])
    assert every[0] == POLL_S and every[-1] == POLL_MAX_S
    assert (np.diff(every) >= 0).all()
    assert (every <= np.maximum(POLL_S, ages / POLL_AGE)).all()  # a refresh at most every 1/POLL_AGE of the age
    assert set(every) == {POLL_S * 2 ** k for k in range(int(np.log2(POLL_MAX_S / POLL_S)) + 1)}  # few reruns


def test_the_partial_chart_averages_the_nets_landed_so_far():
    from ui.partial import expected_nets, partial_data

    def row(arch, seed, attack, excess, draw=0):
        return {"data_seed": draw, "arch": arch, "width": 64, "seed": seed, "attack": attack, "eps": 0.3,
                "reading": "ridge", "flip_excess": excess}

    landed = [({"seed": 0}, [row("relu", 0, "fgsm", 0.1)]), ({"seed": 0}, [row("relu", 0, "pgd", 0.3)]),
              ({"seed": 1}, [row("relu", 1, "fgsm", 0.2)]), ({"seed": 0}, [row("attn", 0, "fgsm", 0.5)])]
    d = partial_data(landed).set_index(["arch", "attack"])
    assert d.loc[("relu", "fgsm"), "excess_points"] == pytest.approx(15.0) and d.loc[("relu", "fgsm"), "nets"] == 2
    assert d.loc[("relu", "pgd"), "nets"] == 1 and d.loc[("attn", "fgsm"), "excess_points"] == pytest.approx(50.0)
    assert partial_data([({}, [{"kappa": 4.0}])]).empty  # rows without a flip excess: counted, not charted
    from engine.experiments.registry import preset

    q = preset("malleability")
    assert expected_nets(q) == len(q.archs) * len(q.widths) * len(q.seeds) and expected_nets(object()) is None


def test_a_verdict_card_leads_with_one_sentence():
    from ui.render import first_sentence

    assert first_sentence("The distance falls from 3 to 1. It falls at every step.") == "The distance falls from 3 to 1."
    assert first_sentence("gap +16 [+5, +27] points, 8 draws") == "gap +16 [+5, +27] points, 8 draws"
