"""What watching a run costs it: the same width sweep computed by the dashboard's server with its
page open in Chromium, and with the tab closed right after the click.

    .venv/bin/python benchmarks/polling.py [--repeat 2] [--epochs 300] [--modes watched,unwatched]

(``--modes watched`` alone, run from two checkouts in turn, compares their progress fragments;
see RESULTS.md.)

The sweep's rows record the seconds each architecture and seed took to compute inside the
server (``seconds`` per width); their sum is the run's compute time, measured where it runs.
Watched and unwatched runs alternate, each on a fresh cache folder, so a load that comes and
goes hits both alike; the figure is the ratio of their medians. A ratio near 1 says polling a
running job (the page's fragment reads the job's state every few seconds) takes nothing
measurable from the run. Each run also reports the server's CPU seconds and the rest of the machine's (the browser's,
on an otherwise idle machine). Prints one JSON object; needs Debian's chromium and playwright.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
RUN_BUTTON = '[data-testid="stMain"] [data-testid="stBaseButton-primary"]'


def _server(folder: Path):
    """``streamlit run app.py`` on a free port with its own cache; returns (process, url)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, ENGINE_CACHE_DIR=str(folder / "cache"), ENGINE_DATA_DIR=str(folder / "no-data"))
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env,
                            stdout=open(folder / "streamlit.log", "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                log = (folder / 'streamlit.log').read_text()[-1000:]
                raise SystemExit(f"streamlit did not start: {log}") from None
            time.sleep(0.5)
    raise SystemExit("streamlit did not answer its health check in 5 minutes")


def _sweep_seconds(folder: Path, wait_s: float) -> float | None:
    """The compute seconds of the one ntk-sweep result in the folder's cache, once it is there."""
    from engine.runtime.cache import CHECKPOINT_PREFIX, Cache, Result

    cache = Cache(folder / "cache")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for key in list(cache._store.iterkeys()):
            if str(key).startswith(CHECKPOINT_PREFIX):
                continue
            result = Result.from_bytes(cache._store.get(key))
            if result.kind == "ntk-sweep":
                return float(result.frames["rows"]["seconds"].sum())
        time.sleep(1.0)
    return None


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds every core of this machine has been busy (not idle or waiting) since boot."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def one_run(watched: bool, query: dict, wait_s: float) -> dict:
    """Open the NTK page on ``query``, start its sweep, and keep watching it or close the tab.
    Returns the sweep's compute seconds, the server's CPU seconds and everything else's (the
    browser's, mostly) over the run."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="polling-") as tmp:
        folder = Path(tmp)
        proc, url = _server(folder)
        server0, busy0, t0 = _process_cpu_s(proc.pid), _machine_busy_s(), time.perf_counter()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM,
                                            args=["--headless", "--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(f"{url}/ntk?{urlencode(query, doseq=True)}")
                page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stNumberInput"]', timeout=300_000)
                for _ in range(600):  # a run over 30 s waits for its button; a shorter one starts by itself
                    if page.locator(RUN_BUTTON).count():
                        page.locator(RUN_BUTTON).first.click()
                        break
                    if page.locator('[data-testid="stProgress"]').count():
                        break
                    page.wait_for_timeout(500)
                page.wait_for_timeout(3000)  # the job is submitted to the server's job manager
                if not watched:
                    page.close()
                seconds = _sweep_seconds(folder, wait_s)
                server, busy, wall = _process_cpu_s(proc.pid) - server0, _machine_busy_s() - busy0, \
                    time.perf_counter() - t0
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
    return {"sweep_s": seconds, "wall_s": wall, "server_cpu_s": server, "other_cpu_s": busy - server}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="watched/unwatched pairs")
    ap.add_argument("--epochs", type=int, default=300, help="training epochs of the sweep (sets its length)")
    ap.add_argument("--wait", type=float, default=1800, help="seconds to wait for one run at most")
    ap.add_argument("--modes", default="watched,unwatched",
                    help="comma-separated: watched, unwatched (one of them alone: e.g. to compare two checkouts' "
                         "watched runs, alternating)")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if not modes or set(modes) - {"watched", "unwatched"}:
        raise SystemExit(f"--modes takes watched and/or unwatched, got {a.modes!r}")
    # synthetic data, so no download; 3 seeds x 2 widths x 2 nets: long enough to be polled many times
    query = {"data": "synthetic", "n": "300", "n_test": "100", "widths": ["1024", "4096"],
             "ntk.epochs": str(a.epochs), "ntk.seeds": "3"}
    runs = {m: [] for m in modes}
    for _ in range(a.repeat):
        for mode in modes:
            runs[mode].append(one_run(mode == "watched", query, a.wait))
    ok = {m: [r["sweep_s"] for r in v if r["sweep_s"] is not None] for m, v in runs.items()}
    out = {"query": query, "runs": runs,
           "watched_over_unwatched": (statistics.median(ok["watched"]) / statistics.median(ok["unwatched"])
                                      if ok.get("watched") and ok.get("unwatched") else None),
           "cpu_count": os.cpu_count()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
