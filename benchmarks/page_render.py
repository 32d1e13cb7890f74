"""Render time of a dashboard page with a cold result cache against the same view once cached.

Runs the NTK-convergence page through Streamlit's AppTest twice in one process with one
fresh cache folder: first cold (the sweep is computed), then in a new session (the result
comes from the job manager or the disk cache). Prints one JSON line; `python -m engine
bench` runs this script in its own process so that the engine never imports streamlit.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def render_seconds(query: dict) -> float:
    from streamlit.testing.v1 import AppTest

    t0 = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params.update(query)
    at.run()
    at.switch_page("pages/ntk-sweep.py")
    at.run()
    while at.get("progress"):  # background job still running: poll like the browser does
        time.sleep(0.2)
        at.run()
    if at.exception:
        raise SystemExit(f"page raised: {at.exception[0].value}")
    return time.perf_counter() - t0


def main() -> None:
    from streamlit.runtime.pages_manager import PagesManager

    init = PagesManager.__init__

    def steady(self, *a, **k):  # see tests/test_app.py: start in the server's steady state
        init(self, *a, **k)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = steady
    query = {"data": "synthetic", "n": "200", "n_test": "100", "widths": ["16", "64", "256", "1024"]}
    with tempfile.TemporaryDirectory(prefix="page-render-") as folder:
        os.environ["ENGINE_CACHE_DIR"] = folder
        cold = render_seconds(query)
        warm = render_seconds(query)
    print(json.dumps({"page_render_cold_s": cold, "page_render_warm_s": warm,
                      "page_render_speedup": cold / warm}))


if __name__ == "__main__":
    main()
