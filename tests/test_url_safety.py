"""Text from a URL, a file name or a spec is shown as typed, and a link's page settings are
checked like the sidebar's.

Streamlit's warnings, captions and errors render Markdown: a link value such as
``[Session expired: log in again](http://…)`` would put a link inside the app's own warning,
and ``![x](http://host/b.png)`` would make every visitor's browser fetch that image. A page
setting the page's widget drops (``mall.eps=0.07``, ``ntk.lr=nan``) gets one line naming it,
and the page then waits for a click instead of starting a run with its defaults.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import steady_app_state

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = {"data": "synthetic", "n": "40", "n_test": "10", "widths": ["16"]}
LINK = "[Session expired: log in again](http://evil.example/login)"
PIXEL = "![x](http://evil.example/b.png)"


@pytest.fixture()
def env(tmp_path, monkeypatch):
    from ui.common import get_manager

    steady_app_state(monkeypatch, tmp_path / "cache", tmp_path / "no-data")
    yield tmp_path
    get_manager().shutdown(cancel=True, wait=True)  # runs a page started are not needed to the end
    get_manager.clear()  # the next test's server gets a fresh manager


def _outside_code(markdown: str) -> tuple[str, list[str]]:
    """CommonMark's reading of inline code: (the text outside code spans, its backslash escapes
    kept; the contents of the code spans). A span opens at a run of backticks not escaped and
    closes at the next run of exactly that length; its content is shown as typed (one space
    stripped from each end where both have one), never linked."""
    outside, spans, i = [], [], 0
    while i < len(markdown):
        run = re.match(r"\\.|`+", markdown[i:])
        close = run and run[0][0] == "`" and re.compile(rf"(?<!`){run[0]}(?!`)").search(markdown, i + len(run[0]))
        if close:
            body = markdown[i + len(run[0]):close.start()]
            spans.append(body[1:-1] if len(body) > 2 and body[0] == body[-1] == " " and body.strip() else body)
            i = close.end()
        else:  # an escape, a backtick run with no partner (literal text), or any other character
            outside.append(run[0] if run else markdown[i])
            i += len(run[0]) if run else 1
    return "".join(outside), spans


def _live(markdown: str) -> list[str]:
    """The link, image, autolink and HTML openings a Markdown renderer would act on, outside code
    spans: ``[``, ``](``, ``![`` and ``<`` unless backslash-escaped (CommonMark shows those as
    typed), and ``http:``, ``www.`` and ``a@b`` escaped or not (GitHub's autolinker reads the text
    after its escapes are resolved: ``www\\.host`` is a link again). A code span is never linked."""
    outside, _ = _outside_code(markdown)
    return (re.findall(r"\]\(|!\[|\[|<", re.sub(r"\\.", "", outside))
            + re.findall(r"https?:|www\.|\w@\w", re.sub(r"\\(.)", r"\1", outside), flags=re.IGNORECASE))


def _shown(at: AppTest) -> list[str]:
    """Every Markdown string the page rendered: warnings, errors, infos, captions, markdown."""
    out = []
    for kind in ("warning", "error", "info", "caption", "markdown", "success"):
        out += [e.value for e in at.get(kind)]
    return out


def _unescaped(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def _app(query: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    return at.run()


@pytest.mark.parametrize("key, value", [("data", LINK), ("data", PIXEL), ("n", LINK), ("widths", PIXEL),
                                        ("classes", LINK), ("data", "<img src=http://evil.example/b.png>")])
def test_url_text_reaches_the_page_as_text(env, key, value):
    """The value is named on the page (one line says the link asked for it) and every element
    that names it has no live link, image or HTML in its Markdown."""
    at = _app({**SMALL, key: value})
    assert not at.exception
    naming = [m for m in _shown(at) if "evil.example" in m]
    assert naming, _shown(at)  # the page does say what the link asked for
    for m in naming:
        assert _live(m) == [], m
        assert value in _unescaped(m)  # shown as typed


@pytest.mark.parametrize("value", [PIXEL, "www.evil.example.com"])
def test_a_page_setting_from_the_url_is_shown_as_text(env, value):
    at = _app({**SMALL})
    at.switch_page("pages/malleability.py")
    at.query_params["mall.norm"] = value
    at.run()
    naming = [m for m in _shown(at) if "evil.example" in m]
    assert naming and all(_live(m) == [] for m in naming), naming


AUTOLINKED = ("http://evil.example.com/login", "www.evil.example.com")  # GitHub's autolinker makes these links


@pytest.mark.parametrize("key, value", [("data", AUTOLINKED[0]), ("data", AUTOLINKED[1]), ("data", "x@evil.example.com"),
                                        ("n", AUTOLINKED[1]), ("widths", AUTOLINKED[0]),
                                        ("classes", AUTOLINKED[1] + "-3"), ("data", "www.evil.example.com.npz")])
def test_url_values_that_would_be_autolinked_are_shown_as_code(env, key, value):
    """Escaping ``:`` and ``.`` does not stop GitHub's autolinker (it reads the text after the
    escapes): every line that names such a value shows it as inline code, as typed, and has no
    link opening outside its code spans."""
    at = _app({**SMALL, key: value})
    assert not at.exception
    naming = [m for m in _shown(at) if "evil.example" in m]
    assert naming, _shown(at)
    for m in naming:
        assert _live(m) == [], m
        assert value in _outside_code(m)[1], m  # the value itself, in a code span


@pytest.mark.parametrize("value", [LINK, PIXEL, *AUTOLINKED, "a@evil.example.com", "x`y", "`www.evil.example.com`",
                                   "``a```", " spaced ", "<b>x</b> *y* $z$ :red[w] \\", "a\nb", ""])
def test_verbatim_shows_any_value_as_one_code_span_as_typed(value):
    """One code span whose content is the value (lines joined): a backtick in it cannot close the
    span early, nothing is left outside it to be read as Markdown."""
    from ui.text import verbatim

    outside, spans = _outside_code(verbatim(value))
    assert outside == "" and spans == [" ".join(value.splitlines()) or "  "], (verbatim(value), spans)


@pytest.mark.parametrize("page", ["pages/ntk-sweep.py", "pages/spectrum.py"])
def test_typed_classes_from_the_url_are_text_in_the_pages_settings_line(env, page):
    """Classes typed into the URL reach the pages' Markdown (the error that names them): a
    backtick there must not close a code span and open a link. (The typed attention of the
    pages' settings lines goes through the same ``plain``; AppTest cannot carry a selectbox's
    typed new option into the next run, so it is not driven here.)"""
    at = _app({**SMALL, "classes": "x`" + PIXEL + "`"})
    at.switch_page(page)
    at.run()
    naming = [m for m in _shown(at) if "evil.example" in m]
    assert naming and all(_live(m) == [] for m in naming), naming


def test_the_escaping_helper_against_a_renderer_free_reading():
    """``plain`` escapes what makes links, images, HTML, formulas and emphasis, keeps the text
    readable, and stays one line. (An autolink literal, ``www.host`` or ``http://host``, survives
    any escaping: a value that may hold one is shown with ``verbatim``.)"""
    from ui.common import plain

    for text in (LINK, PIXEL, "<b>x</b> & $x$ *y* `z` :red[w] | \\", "a\nb"):
        assert [o for o in _live(plain(text)) if o in ("[", "](", "![", "<")] == []  # no link, image or HTML syntax
        assert _unescaped(plain(text)) == " ".join(text.splitlines())
    assert plain("mnist:3-8, n = 200 (test 0.5)") == "mnist:3-8, n = 200 (test 0.5)"  # readable as it was


def test_report_cells_escape_pipes_html_and_newlines():
    """A spec label with ``|``, HTML and a newline stays one cell of one row in the report."""
    from engine.reporting.report import readme_tables

    table = readme_tables([("a | b <img src=x onerror=y>\nc", None)])
    head, rule, row = table.split("\n\n")[0].splitlines()
    cells = re.split(r"(?<!\\)\|", row)[1:-1]
    assert len(cells) == len(re.split(r"(?<!\\)\|", head)[1:-1]) == 9
    assert cells[0].strip() == "a \\| b &lt;img src=x onerror=y&gt; c"
    assert "<" not in row


def test_report_labels_print_literally_not_as_markdown():
    """A spec label's ``**bold**``, ``_x_``, backticks, links and formulas are backslash-escaped in
    the report's Markdown: a renderer shows the label as typed, with no emphasis or link."""
    from engine.reporting.report import readme_tables

    label = "**bold** _it_ `code` [a](http://evil.example) ~s~ $x$ \\"
    row = [r for r in readme_tables([(label, None)]).splitlines() if r.startswith("| **") or "bold" in r][0]
    cell = re.split(r"(?<!\\)\|", row)[1].strip()
    assert _unescaped(cell) == label
    assert re.findall(r"[*_`\[\]~$]", re.sub(r"\\.", "", cell)) == []  # each one escaped


# ---------------------------------------------------------------- page settings in a URL

def _jobs() -> list:
    from ui.common import get_manager

    return get_manager().jobs()


def _link_lines(at: AppTest) -> list[str]:
    return [w.value for w in at.warning if w.value.startswith("This link")]


def test_refused_malleability_settings_are_named_and_start_nothing(env):
    """The issue's link: four values the page does not take, four lines naming each with what is
    allowed (the setting's declared limits, or the page's choices) and what is used; no run
    starts by itself, a button waits. The same page with the link's values left out starts
    its run by itself (the control: the refusal is what stops it)."""
    bad = {"mall.eps": "0.07", "mall.steps": "100000", "mall.norm": "l3", "mall.tau": "5"}
    at = _app({**SMALL})
    at.switch_page("pages/malleability.py")
    at.query_params.update(bad)
    at.run()
    assert not at.exception
    lines = _link_lines(at)
    assert len(lines) == 4, lines
    expect = {"`mall.eps` = `0.07`": "not among this page's choices", "`mall.steps` = `100000`": "<= 1000",
              "`mall.norm` = `l3`": "one of linf, l2", "`mall.tau` = `5`": "<= 1"}
    for asked, allowed in expect.items():
        assert any(asked in t and allowed in t and "so the page uses" in t for t in lines), (asked, lines)
    assert _jobs() == []
    assert any(str(b.key or "").startswith("run.") for b in at.button)
    at.run()  # a rerun: the link's values are gone from the URL, the lines and the wait stay
    assert len(_link_lines(at)) == 4 and _jobs() == []

    control = _app({**SMALL})
    control.switch_page("pages/malleability.py")
    control.run()
    assert _link_lines(control) == [] and len(_jobs()) == 1


def test_refused_ntk_settings_are_named_and_start_nothing(env):
    at = _app({**SMALL})
    at.switch_page("pages/ntk-sweep.py")
    at.query_params.update({"ntk.epochs": "-5", "ntk.lr": "nan"})
    at.run()
    assert not at.exception
    lines = _link_lines(at)
    assert any("`ntk.epochs` = `-5`" in t and ">= 0" in t for t in lines), lines
    assert any("`ntk.lr` = `nan`" in t and "> 0" in t for t in lines), lines
    assert _jobs() == []
    at.number_input(key="ntk.epochs").set_value(3)  # the user sets the refused value: its line goes
    at.run()
    assert not any("ntk.epochs" in t for t in _link_lines(at))
    assert any("ntk.lr" in t for t in _link_lines(at))


def test_a_valid_page_link_is_taken_without_a_line(env):
    at = _app({**SMALL})
    at.switch_page("pages/malleability.py")
    at.query_params.update({"mall.eps": "0.1", "mall.norm": "l2", "mall.steps": "5", "mall.tau": "0.2"})
    at.run()
    assert not at.exception and _link_lines(at) == []
    assert at.radio(key="mall.norm").value == "l2" and at.select_slider(key="mall.tau").value == 0.2


def test_the_flow_reading_with_adam_is_one_line_from_a_link_or_a_click(env):
    """``/malleability?mall.readings=flow`` (flow follows plain SGD on MSE; the page's optimiser is
    Adam): the page stops under its controls with the config's refusal in one line, no traceback
    and no run. Picking flow by hand goes the same way, and picking SGD and MSE then runs."""
    at = _app({**SMALL})
    at.switch_page("pages/malleability.py")
    at.query_params["mall.readings"] = "flow"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (line,) = [e.value for e in at.error]
    assert "flow" in line and "sgd" in line.lower() and "\n" not in line
    assert _jobs() == []

    click = _app({**SMALL})
    click.switch_page("pages/malleability.py")
    click.run()
    click.multiselect(key="mall.readings").set_value(["ridge", "flow"]).run()
    assert not click.exception and len(click.error) == 1 and "flow" in click.error[0].value
    click.selectbox(key="mall.optimizer").set_value("sgd").run()
    click.radio(key="mall.loss").set_value("mse").run()
    assert not click.exception and not click.error, [e.value for e in click.error]
