"""Get an experiment result for a page: from the job manager, the disk cache, or a new job.

``obtain`` never blocks for long: quick runs finish within ``INLINE_WAIT_S`` and render at
once; longer ones show a progress bar with stage text, ETA and a Cancel button in a
fragment that polls the job every ``POLL_S`` seconds and reruns the page when it is done.
Jobs live in the server's ``JobManager``, so they survive widget changes, page switches and
closed tabs, and two tabs asking for the same config share one job.
"""

from __future__ import annotations

from typing import Callable

import streamlit as st

from engine.cache import Result, config_key
from engine.jobs import JobState
from ui.common import get_cache, get_manager, shared

INLINE_WAIT_S = 3.0   # wait this long for a fresh job before showing a progress bar
POLL_S = 0.7          # progress bar refresh


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "estimating…"
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


@st.fragment(run_every=POLL_S)
def _progress(key: str) -> None:
    job = get_manager().get_key(key)
    if job is None or job.done:
        st.rerun(scope="app")
    state = "waiting for a free worker" if job.state is JobState.QUEUED else job.stage
    st.progress(job.frac, text=f"**{job.label}** — {state} · {job.frac:.0%} · "
                               f"{_duration(job.elapsed_s())} elapsed · about {_duration(job.eta_s())} left")
    if st.button("Cancel", key=f"cancel.{key[:16]}", help="Stop this run; nothing is cached"):
        get_manager().cancel(key)
        st.rerun(scope="app")


def obtain(kind: str, fn: Callable[..., Result], cfg, label: str, auto: bool = True,
           button: str = "Run", note: str = "") -> Result | None:
    """The result of ``fn(cfg, ...)``, or None while it is being computed or waits for a click.

    kind: the cache kind ``fn`` stores under (its first argument to ``cached_run``).
    auto: start at once when nothing is cached (quick settings); otherwise show ``button``.
    Engine errors appear as one-line ``st.error`` boxes.
    """
    manager, cache = get_manager(), get_cache()
    key = config_key(kind, cfg)
    job = manager.get_key(key)
    if job is not None and job.state is JobState.DONE:
        return job.result
    if job is None or job.done:
        hit = cache.get(kind, cfg, on_corrupt=st.warning)
        if hit is not None:
            return hit
    if job is not None and job.state is JobState.FAILED:
        st.error(job.error)
        if not st.button("Try again", key=f"retry.{key[:16]}"):
            return None
        job = None
    elif job is not None and job.state is JobState.CANCELLED:
        st.info(f"{label}: cancelled.")
        if not st.button("Run again", key=f"again.{key[:16]}"):
            return None
        job = None
    if job is None:
        if not auto:
            if note:
                st.caption(note)
            if not st.button(button, key=f"run.{key[:16]}", type="primary"):
                return None
        job = manager.submit(kind, cfg, fn, label, cache=cache, device=shared().device)
    if job.wait(INLINE_WAIT_S):
        if job.state is JobState.DONE:
            return job.result
        if job.state is JobState.FAILED:
            st.error(job.error)
        else:
            st.info(f"{label}: cancelled.")
        return None
    _progress(key)
    return None


def peek(kind: str, cfg) -> Result | None:
    """A finished result if one exists (memory or disk), without starting anything."""
    job = get_manager().get(kind, cfg)
    if job is not None and job.state is JobState.DONE:
        return job.result
    return get_cache().get(kind, cfg, on_corrupt=st.warning)
