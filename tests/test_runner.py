"""ui.runner.obtain through Streamlit's AppTest: run, cancel, run again, failures, two tabs.

The page is a tiny script that calls ``obtain`` with a slow fake run (a real function that
checks its cancel flag every 50 ms and reports progress). Tabs are AppTest instances; they
share the server's job manager as browser tabs do (``st.cache_resource``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.runtime.cache import Result
from engine.runtime.errors import BadInput, Cancelled, EngineError

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Slow:
    token: str   # a fresh one per test: the job manager is shared by the whole process


class SlowRun:
    """A fake run_*: reports progress and checks `cancel` every 50 ms until `gate` opens (30 s at most)."""

    def __init__(self, fail_first: bool = False):
        self.gate = threading.Event()
        self.calls = 0
        self.fail_first = fail_first

    def __call__(self, cfg: Slow, progress=None, cancel=None, **kwargs) -> Result:
        self.calls += 1
        if self.fail_first and self.calls == 1:
            raise BadInput("the first try fails")
        for step in range(600):
            if cancel.is_set():
                raise Cancelled("cancelled by the user")
            if self.gate.is_set():
                return Result("slow", {}, meta={"token": cfg.token, "steps": step})
            progress(step / 600, f"step {step}")
            time.sleep(0.05)
        raise EngineError("the gate never opened")


def page(fn, cfg):
    import streamlit as st

    from ui.runner import obtain

    res = obtain("slow", fn, cfg, "Slow run", auto=False, button="Start")
    if res is not None:
        st.success(f"finished {res.meta['token']}")


@pytest.fixture()
def env(tmp_path, monkeypatch):
    import ui.runner

    monkeypatch.setattr(ui.runner, "INLINE_WAIT_S", 0.3)  # hand over to the fragment sooner
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ENGINE_DATA_DIR", str(tmp_path / "no-data"))
    return tmp_path


def tab(fn, cfg) -> AppTest:
    from ui.common import Shared

    at = AppTest.from_function(page, args=(fn, cfg), default_timeout=30)
    at.session_state["shared"] = Shared(base="synthetic")
    return at.run()


def button(at: AppTest, label: str):
    found = [b for b in at.button if b.label == label]
    assert found, f"no {label!r} button; buttons: {[b.label for b in at.button]}"
    return found[0]


def labels(at: AppTest) -> list[str]:
    return [b.label for b in at.button]


def finished(at: AppTest, timeout: float = 20.0) -> AppTest:
    deadline = time.monotonic() + timeout
    while not at.success and time.monotonic() < deadline:
        time.sleep(0.2)
        at.run()
    assert at.success and "finished" in at.success[0].value
    assert not at.get("progress") and not at.info and not at.error
    return at


def running(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert at.get("progress"), "a live job shows a progress bar"
    assert "Slow run" in at.get("progress")[0].proto.text
    assert labels(at) == ["Cancel"]


def cancelled(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert any("cancelled" in i.value for i in at.info)
    assert labels(at) == ["Run again"] and not at.get("progress")


def test_run_cancel_run_again_finish_in_one_tab(env):
    fn, cfg = SlowRun(), Slow(uuid.uuid4().hex)
    at = tab(fn, cfg)
    assert labels(at) == ["Start"] and not at.get("progress")
    button(at, "Start").click().run()
    running(at)
    button(at, "Cancel").click().run()
    cancelled(at)                                     # in the very run of the click, not later
    at.run()
    cancelled(at)                                     # and it stays so until asked
    button(at, "Run again").click().run()             # one click
    running(at)
    assert fn.calls == 2
    fn.gate.set()
    finished(at)
    at.run()
    assert at.success and fn.calls == 2               # the result is served, not rerun


def test_a_second_tab_shares_the_job_and_can_run_it_again(env):
    fn, cfg = SlowRun(), Slow(uuid.uuid4().hex)
    one = tab(fn, cfg)
    button(one, "Start").click().run()
    running(one)
    two = tab(fn, cfg)
    running(two)                                      # the same job, not a second one
    assert fn.calls == 1
    button(two, "Cancel").click().run()
    cancelled(two)
    cancelled(one.run())
    button(two, "Run again").click().run()            # one click in the other tab
    running(two)
    running(one.run())
    assert fn.calls == 2
    button(one, "Cancel").click().run()               # cancelled from the first tab this time
    cancelled(one)
    cancelled(two.run())
    button(one, "Run again").click().run()
    running(one)
    button(two, "Run again").click().run()            # a stale "Run again" joins the live job
    running(two)
    assert fn.calls == 3
    fn.gate.set()
    finished(one)
    finished(two)
    assert fn.calls == 3


def test_a_failure_is_retried_with_one_click(env):
    fn, cfg = SlowRun(fail_first=True), Slow(uuid.uuid4().hex)
    at = tab(fn, cfg)
    button(at, "Start").click().run()
    assert at.error and at.error[0].value == "the first try fails"
    assert labels(at) == ["Try again"] and not at.get("progress")
    other = tab(fn, cfg)
    assert other.error and labels(other) == ["Try again"]
    button(other, "Try again").click().run()
    running(other)
    fn.gate.set()
    finished(other)
    finished(at.run())


def test_a_quick_run_renders_in_the_same_run(env):
    fn, cfg = SlowRun(), Slow(uuid.uuid4().hex)
    fn.gate.set()
    at = tab(fn, cfg)
    button(at, "Start").click().run()
    assert at.success and not at.get("progress") and not at.button  # the inline progress bar is gone


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


SERVER_PAGE = """
import time
from pathlib import Path

from engine.runtime.cache import Result
from engine.runtime.errors import Cancelled
from ui.runner import obtain


def loop(cfg, progress=None, cancel=None, **kwargs):
    Path({marker!r}).write_text("running")
    for step in range(600):                   # 60 s unless cancelled
        if cancel.is_set():
            raise Cancelled("cancelled")
        progress(step / 600, "looping")
        time.sleep(0.1)
    Path({marker!r}).write_text("done")
    return Result("loop", {{}})


obtain("loop", loop, {{"token": {token!r}}}, "Loop")
"""


@pytest.mark.slow
def test_streamlit_stops_on_sigterm_without_finishing_a_running_job(tmp_path):
    """A real `streamlit run` with a job running: SIGTERM ends the process, and the job's 600 steps
    never reach their end (its marker never says "done"). Counted in work, not seconds;
    pytest-timeout bounds a server that never exits."""
    websockets = pytest.importorskip("websockets.sync.client")
    from streamlit.proto.BackMsg_pb2 import BackMsg

    marker = tmp_path / "running"
    script = tmp_path / "page.py"
    script.write_text(SERVER_PAGE.format(marker=str(marker), token=uuid.uuid4().hex))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ENGINE_CACHE_DIR": str(tmp_path / "cache"),
           "ENGINE_DATA_DIR": str(tmp_path / "no-data")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(script), "--server.headless=true",
         "--server.address=127.0.0.1", f"--server.port={port}", "--browser.gatherUsageStats=false",
         "--server.fileWatcherType=none"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.3)
        msg = BackMsg()
        msg.rerun_script.query_string = ""
        with websockets.connect(f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=["streamlit"]) as ws:
            ws.send(msg.SerializeToString())        # what a browser sends to run the page
            while not marker.exists():
                assert proc.poll() is None and time.monotonic() < deadline, "the job did not start"
                try:
                    ws.recv(timeout=0.2)
                except TimeoutError:
                    pass
            time.sleep(0.5)
            proc.terminate()                        # SIGTERM, with the tab still connected
            proc.wait()
        assert marker.read_text() == "running"      # the run did not go on to its end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
