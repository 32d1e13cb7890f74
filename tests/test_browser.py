"""The dashboard in a real Chromium: start-up, every page at two screen sizes, a cancelled run.

Starts ``streamlit run app.py`` the way ``make run`` does (same config file) on a free local
port with a fresh cache folder and checks, in order:

* the first seconds after a fresh start never show Streamlit's raw page list (``app,
  influence, ntk, …``) and end with the titled page list and the page;
* every page listed in app.py renders at 1280 × 800 and 1920 × 1080 without an exception or
  an error box, with its charts, and with no cut-off button, metric or widget label and no
  multiselect chip out of sight;
* on the NTK page, settings heavy enough to wait for a click run, cancel, run again and finish;
* a deep link as a fresh server's first request is routed through app.py.

Screenshots go to the test's tmp folder (printed; ``BROWSER_SHOTS=dir`` copies them there
too). Skips where /usr/bin/chromium or the playwright package is missing; never downloads a
browser. Small synthetic settings keep the whole module to a few minutes on two cores.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlencode, urlparse

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SIZES = ((1280, 800), (1920, 1080))
RAW_NAMES = {"app"} | {p.stem for p in (ROOT / "pages").glob("*.py")}  # what v1 mode would list
# Small synthetic settings: every page's runs start by themselves and take seconds.
SMALL = [("data", "synthetic"), ("n", "40"), ("n_test", "10"), ("widths", "16"), ("widths", "64"),
         ("ntk.seeds", "1"), ("ntk.epochs", "10"), ("influence.epochs", "10"), ("mall.epochs", "5"),
         ("mall.seeds", "1"), ("mall.steps", "3"), ("repro.epochs", "5"), ("repro.mall_epochs", "5"),
         ("repro.steps", "3"), ("scaling.kappas", "2.0"), ("scaling.kappas", "8.0"), ("scaling.epochs", "10"),
         ("scaling.max_width", "1024"), ("scaling.seeds", "2")]
# The cancel test's server pins this machine's speed factor (ENGINE_SPEED_FACTOR) at HEAVY_SPEED,
# so a sweep of about 6 s on the reference CPU is planned at over two minutes and waits for a
# click (above QUICK_SECONDS), yet runs long enough to be cancelled midway and short enough to
# run again to the end; the kernel heatmaps below it stay small (ntk.width) and start by themselves.
HEAVY_SPEED = "10"
HEAVY = [("data", "synthetic"), ("n", "200"), ("n_test", "10"), ("widths", "16"), ("widths", "4096"),
         ("ntk.seeds", "2"), ("ntk.epochs", "400"), ("ntk.width", "16")]
RUN_TIMEOUT_S = 240
TABLE_PAGES = {"Grid"}  # a status table of the grid's cells, no chart

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent")]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is absent")
from ui import nav  # noqa: E402  (after the skips: the pages come from the registry)


def app_pages() -> dict[str, str]:
    """Title → URL path of every page app.py routes (``ui.nav.pages``, from the registry; the
    default page has the empty path). Fails if two pages would share a path."""
    pages = {p.title: p.url_path for p in nav.pages()}
    assert len(set(pages.values())) == len(pages), pages
    return pages


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(tmp: Path, **extra_env: str):
    """``streamlit run app.py`` with its own cache (and ``extra_env``); yields the base URL once
    it is healthy."""
    port = _free_port()
    # what starts by itself must not depend on how loaded the machine running the tests is (as in conftest)
    env = dict(os.environ, **{"ENGINE_CACHE_DIR": str(tmp / "cache"), "ENGINE_DATA_DIR": str(tmp / "no-data"),
                              "ENGINE_SPEED_FACTOR": "1", **extra_env})
    log = tmp / "streamlit.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # start-up only; a server that exits fails at once
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("screenshots")
    print(f"\nscreenshots in {folder}")
    yield folder
    if os.environ.get("BROWSER_SHOTS"):
        shutil.copytree(folder, os.environ["BROWSER_SHOTS"], dirs_exist_ok=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with streamlit_server(tmp_path_factory.mktemp("server")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


# ---------------------------------------------------------------- helpers

def _busy(page) -> bool:
    """A run in progress: a progress bar, or a Cancel button (a run stopping)."""
    return bool(page.locator('[data-testid="stProgress"]').count()
                or page.get_by_role("button", name="Cancel").count())


def _settle(page, timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Wait until the page is drawn (sidebar inputs) and no run is in progress for 1.5 s."""
    page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stNumberInput"]', timeout=60_000)
    quiet = 0.0  # no deadline of our own: a slow machine is slow, and pytest-timeout bounds a hang
    while quiet < 1.5:
        page.wait_for_timeout(300)
        quiet = 0.0 if _busy(page) else quiet + 0.3
    page.wait_for_timeout(800)  # the last charts finish drawing


def _page_link_texts(page) -> list[str]:
    """Labels of the sidebar's page links (without their icons' ligature names)."""
    links = page.locator('[data-testid="stSidebar"] [data-testid="stPageLink"] [data-testid="stMarkdownContainer"]')
    return [t.strip() for t in links.all_inner_texts()]


def _raw_list_shown(page) -> set[str]:
    """Names of Streamlit's raw `pages/` list visible in the sidebar, if any (file stems, as
    written: "overview", "ntk"; the real list says "Overview", "NTK convergence")."""
    texts = page.locator('[data-testid="stSidebarNav"]').all_inner_texts() + _page_link_texts(page)
    words = {w.strip() for t in texts for w in t.split("\n") if w.strip()}
    return words & RAW_NAMES


CUT_OFF_JS = """() => {
  const cut = [];
  const main = document.querySelector('[data-testid="stMain"]');
  const texts = main.querySelectorAll('[data-testid="stMetricLabel"] p, [data-testid="stMetricLabel"] div,'
    + ' button p, [data-testid="stWidgetLabel"] p, [data-testid="stCheckbox"] p, [data-testid="stPageLink"] p');
  for (const el of texts) {
    if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) cut.push('text: ' + el.innerText);
  }
  for (const box of main.querySelectorAll('[data-testid="stMultiSelectTagsContainer"]')) {
    const r = box.getBoundingClientRect();
    for (const chip of box.querySelectorAll('[data-tag]')) {
      const c = chip.getBoundingClientRect();
      if (c.right > r.right + 1 || c.bottom > r.bottom + 1) cut.push('chip: ' + chip.innerText);
    }
  }
  return cut;
}"""


def _screenshot(page, path: Path, size: tuple[int, int]) -> None:
    """The viewport as a user sees it, and, when the shots are kept (BROWSER_SHOTS), the whole
    page (the viewport stretched to it: seconds per page, for a review, not for a check)."""
    page.mouse.move(1, size[1] - 1)  # no hover toolbar over a chart's title
    page.screenshot(path=str(path.with_suffix(".png")))
    if not os.environ.get("BROWSER_SHOTS"):
        return
    height = page.evaluate("() => document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": size[0], "height": min(max(height, size[1]), 8000)})
    page.wait_for_timeout(600)
    page.screenshot(path=str(path.with_name(path.name + "_full.png")))
    page.set_viewport_size({"width": size[0], "height": size[1]})


def _no_errors(page, what: str) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, f"{what} shows an exception"
    errors = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
    assert not errors, f"{what} shows an error: {errors}"


# ---------------------------------------------------------------- tests

def test_a_fresh_server_never_shows_the_raw_page_list(server, browser, shots):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{server}/?{urlencode(SMALL)}")  # the first request this server sees
    t0, titles = time.monotonic(), list(app_pages())
    frame = 0
    while _page_link_texts(page) != titles:
        assert not _raw_list_shown(page), f"raw page list at {time.monotonic() - t0:.1f} s: {_raw_list_shown(page)}"
        if frame < 12:
            page.screenshot(path=str(shots / f"startup_{frame:02d}.png"))
            frame += 1
        page.wait_for_timeout(250)
    assert not _raw_list_shown(page)
    page.screenshot(path=str(shots / "startup_done.png"))
    _settle(page)
    assert not _raw_list_shown(page)
    assert page.locator('[data-testid="stSidebarNav"]').count() == 0  # Streamlit's own list stays hidden
    _no_errors(page, "overview after start-up")
    page.close()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_page_renders_without_cut_off_labels(server, browser, shots, size):
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    for title, path in app_pages().items():
        page.goto(f"{server}/{path}?{urlencode(SMALL)}")
        _settle(page)
        assert urlparse(page.url).path.strip("/") == path, f"{title}: landed on {page.url}"
        # settings that wait for a click (the Grid page's button would run the whole paper grid)
        if title not in TABLE_PAGES and not page.locator('[data-testid="stPlotlyChart"]').count():
            primary = page.locator('[data-testid="stMain"] [data-testid="stBaseButton-primary"]')
            if primary.count():
                primary.first.click()
                _settle(page)
        name = re.sub(r"\W+", "-", title.lower())
        _screenshot(page, shots / f"{name}_{size[0]}x{size[1]}", size)
        _no_errors(page, title)
        if title not in TABLE_PAGES:
            assert page.locator('[data-testid="stPlotlyChart"] .js-plotly-plot').count() >= 1, f"{title} shows no chart"
        assert page.locator('[data-testid="stSidebar"] [data-testid="stNumberInput"]').count() >= 3
        assert _page_link_texts(page) == list(app_pages())
        cut = page.evaluate(CUT_OFF_JS)  # covers the CSV buttons, metric labels and chips
        assert not cut, f"{title} at {size[0]}x{size[1]}: {cut}"
    page.close()


def test_every_page_opens_on_its_chart_from_the_shipped_bundle(browser, shots, tmp_path, mnist_dir):
    """A newcomer's first look: a fresh server (empty cache) with the shipped bundle/ on the real digits
    shows every page's main chart at its defaults without starting a single run (no progress bar at any
    moment). The time to the chart lives in benchmarks/page_render.py; a stale bundle fails here, with
    the fix (make bundle), since every page would then compute its defaults."""
    with streamlit_server(tmp_path, ENGINE_BUNDLE_DIR=str(ROOT / "bundle"), ENGINE_DATA_DIR=str(mnist_dir)) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        for title, path in app_pages().items():
            if title in TABLE_PAGES:
                continue
            page.goto(f"{url}/{path}")
            page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stNumberInput"]', timeout=60_000)
            seen_busy, quiet = False, 0.0
            while quiet < 2.0:  # drawn, and nothing started for 2 s
                page.wait_for_timeout(250)
                busy = _busy(page)
                seen_busy |= busy
                quiet = 0.0 if busy else quiet + 0.25
            _no_errors(page, title)
            assert not seen_busy, f"{title} started a run at its defaults: the bundle lacks it (make bundle)"
            assert page.locator('[data-testid="stPlotlyChart"] .js-plotly-plot').count() >= 1, f"{title} shows no chart"
            name = re.sub(r"\W+", "-", title.lower())
            _screenshot(page, shots / f"bundled-{name}", (1280, 800))
        page.close()


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """A server that takes this machine to be HEAVY_SPEED times slower than the reference CPU."""
    with streamlit_server(tmp_path_factory.mktemp("slow-server"), ENGINE_SPEED_FACTOR=HEAVY_SPEED) as url:
        yield url


def test_a_heavy_run_can_be_cancelled_and_run_again(slow_server, browser, shots):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(slow_server)  # a fresh server's first request is routed through app.py (tested below)
    _settle(page)
    page.goto(f"{slow_server}/ntk-sweep?{urlencode(HEAVY)}")
    _settle(page)  # the small kernel run below the sweep starts by itself; let it finish
    run = page.get_by_role("button", name="Run the sweep")
    assert run.count() == 1, "heavy settings should wait for a click"
    assert not _busy(page)
    run.click()
    cancel = page.get_by_role("button", name="Cancel")
    cancel.wait_for(timeout=30_000)
    assert page.locator('[data-testid="stProgress"]').count() >= 1
    page.screenshot(path=str(shots / "ntk_running.png"))
    cancel.click()
    page.get_by_text("cancelled").first.wait_for(timeout=60_000)
    page.screenshot(path=str(shots / "ntk_cancelled.png"))
    page.get_by_role("button", name="Run again").click()
    page.locator('[data-testid="stProgress"]').first.wait_for(timeout=30_000)
    page.locator('[data-testid="stPlotlyChart"] .js-plotly-plot').first.wait_for(timeout=RUN_TIMEOUT_S * 1000)
    _settle(page)
    page.screenshot(path=str(shots / "ntk_finished.png"))
    _no_errors(page, "ntk after run, cancel, run again")
    assert page.get_by_text("cancelled").count() == 0
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 4
    page.close()


@pytest.mark.parametrize("path,heading", [("spectrum", "Spectrum"), ("ntk-sweep", "NTK convergence")])
def test_a_deep_link_as_the_first_request_is_routed_through_app_py(browser, shots, tmp_path, path, heading):
    """A fresh server's first request runs in Streamlit's v1 mode (ui.nav.ensure_entry); it
    still shows the linked page, with the sidebar and the link's settings. ntk-sweep: a page whose
    URL path is not the experiment's old file stem (tests/test_registry.py checks them all)."""
    with streamlit_server(tmp_path) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{url}/{path}?{urlencode(SMALL)}")
        t0 = time.monotonic()
        while _page_link_texts(page) != list(app_pages()):
            assert not _raw_list_shown(page), f"raw page list at {time.monotonic() - t0:.1f} s"
            assert time.monotonic() - t0 < 60
            page.wait_for_timeout(250)
        _settle(page)
        page.screenshot(path=str(shots / f"deep_link_{path}.png"))
        _no_errors(page, f"{path} as the first request")
        assert "Page not found" not in page.locator("body").inner_text()
        assert urlparse(page.url).path.rstrip("/").endswith(f"/{path}"), page.url
        assert page.get_by_role("heading", name=heading).count() >= 1
        assert page.locator('[data-testid="stSidebar"] [data-testid="stNumberInput"]').count() >= 3
        n_input = page.locator('[data-testid="stSidebar"] [data-testid="stNumberInput"] input').first
        assert n_input.input_value() == "40"  # the link's settings survive the re-route
        if path == "spectrum":
            assert "40 / 40" in " ".join(page.locator('[data-testid="stMetric"]').all_inner_texts())
        n_input.fill("30")  # and a changed widget writes the URL, so the view can be shared
        n_input.press("Enter")
        page.wait_for_function("() => window.location.search.includes('n=30')", timeout=30_000)
        _settle(page)
        if path == "spectrum":
            assert "30 / 30" in " ".join(page.locator('[data-testid="stMetric"]').all_inner_texts())
        page.close()


# Malleability settings whose run takes a few tens of seconds here (six nets of 1000 epochs) and, on the slow
# server, waits for a click: long enough for the progress fragment to draw what landed before the end.
STREAMED = [("data", "synthetic"), ("n", "120"), ("n_test", "20"), ("widths", "1024"), ("mall.seeds", "3"),
            ("mall.epochs", "1000"), ("mall.steps", "3")]


def test_a_running_malleability_run_draws_the_nets_that_landed(slow_server, browser, shots):
    """Results as they land (engine.runtime.stream, ui.partial): while the run's progress bar is up, a chart
    of the nets finished so far appears, labelled "k of N nets", and the page's chart replaces it at the end."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(slow_server)
    _settle(page)
    page.goto(f"{slow_server}/malleability?{urlencode(STREAMED)}")
    _settle(page)
    run = page.get_by_role("button", name="Run the attacks")
    assert run.count() == 1, "these settings should wait for a click on the slow server"
    run.click()
    partial = page.get_by_text(re.compile(r"the \d+ of 6 nets finished"))  # the partial chart's caption
    partial.first.wait_for(timeout=RUN_TIMEOUT_S * 1000)
    assert _busy(page), "the partial chart appeared only after the run ended"
    page.screenshot(path=str(shots / "malleability_partial.png"))
    _settle(page)
    _no_errors(page, "malleability after a streamed run")
    assert page.get_by_text(re.compile(r"the \d+ of 6 nets finished")).count() == 0
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 1
    page.close()
