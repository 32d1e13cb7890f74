"""The dashboard in a real Chromium: every page renders its Plotly charts without an exception.

Starts ``streamlit run app.py`` on a free local port with a fresh cache folder, opens each
page at its defaults, waits until its background runs are done and its charts are drawn,
and saves a screenshot per page to ``artifacts/screenshots/`` (git-ignored). Skips where
/usr/bin/chromium or the playwright package is missing; never downloads a browser.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "artifacts" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
# A deep link first: a fresh server must still route it through app.py (see ui.common.ensure_entry).
PAGES = {"ntk": "ntk", "overview": "", "spectrum": "spectrum", "influence": "influence",
         "malleability": "malleability", "scaling": "scaling", "reproduction": "reproduction"}
PAGE_TIMEOUT_MS = 120_000

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent")]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is absent")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    env = dict(os.environ, ENGINE_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    if (SHARED_DATA / "MNIST" / "raw").exists():
        env["ENGINE_DATA_DIR"] = str(SHARED_DATA)
    log = tmp_path_factory.mktemp("log") / "streamlit.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def _settle(page) -> None:
    """Wait for at least one drawn Plotly chart and no running job's progress bar."""
    page.wait_for_selector('[data-testid="stPlotlyChart"] .js-plotly-plot', timeout=PAGE_TIMEOUT_MS)
    deadline = time.monotonic() + PAGE_TIMEOUT_MS / 1000
    while page.locator('[data-testid="stProgress"]').count() and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    page.wait_for_selector('[data-testid="stPlotlyChart"] .js-plotly-plot', timeout=PAGE_TIMEOUT_MS)
    page.wait_for_timeout(1500)  # let the last charts finish drawing


def test_every_page_renders(server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 2600})
    for name, path in PAGES.items():
        page.goto(f"{server}/{path}")
        _settle(page)
        assert page.locator('[data-testid="stException"]').count() == 0, f"{name} shows an exception"
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0, f"{name} shows an error"
        assert page.locator('[data-testid="stPlotlyChart"]').count() >= 1
        assert page.locator('[data-testid="stSidebar"] [data-testid="stNumberInput"]').count() >= 3
        page.screenshot(path=str(SHOTS / f"{name}.png"))
    page.close()


def test_shared_link_restores_the_view_and_widgets_write_the_url(server, browser):
    page = browser.new_page(viewport={"width": 1440, "height": 1200})
    page.goto(f"{server}/spectrum?n=120&spectrum.eps=0.05")
    _settle(page)
    n_input = page.locator('[data-testid="stSidebar"] [data-testid="stNumberInput"] input').first
    assert n_input.input_value() == "120"
    assert "120 / 120" in page.locator('[data-testid="stMetric"]').all_inner_texts()[3]
    n_input.fill("90")
    n_input.press("Enter")
    page.wait_for_function("() => window.location.search.includes('n=90')", timeout=30_000)
    _settle(page)
    assert "90 / 90" in page.locator('[data-testid="stMetric"]').all_inner_texts()[3]
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()
