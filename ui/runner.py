"""Get an experiment result for a page: from the job manager, the disk cache, or a new job.

``obtain`` never blocks for long and never leaves a blank: a progress bar appears as soon as
a job is queued or running, quick runs finish within ``INLINE_WAIT_S`` and render at once,
longer ones keep a progress bar with stage text, ETA and a Cancel button in a fragment that
polls the job's state (every ``POLL_S`` seconds at first, less often as the run ages:
``poll_interval``) and reruns the page when it is done. Jobs live in the
server's ``JobManager``, so they survive widget changes, page switches and closed tabs, and
two tabs asking for the same config share one job. After a failure or a cancel, one click on
"Try again" / "Run again", in any tab, starts the run again (the buttons submit in their
``on_click`` callback, so the click counts even if the page draws differently next time); runs
built of independent units (each architecture and seed; for the scaling law each κ, model and
width) resume from the units they had finished (``engine.experiments.runs.resumable``).
"""

from __future__ import annotations

import time
from typing import Callable

import streamlit as st

from engine.runtime.budget import duration
from engine.runtime.cache import Result
from engine.runtime.errors import EngineError
from engine.runtime.jobs import Job, JobManager, JobState
from ui.common import get_cache, get_manager, plain, shared
from ui.links import link_refused
from ui.partial import expected_nets, partial_ui

INLINE_WAIT_S = 3.0   # wait this long for a fresh job before handing over to the polling fragment
POLL_S = 2.0          # progress bar refresh at first: each redraw costs the run CPU time
POLL_MAX_S = 16.0     # ... and at most, once the run has taken POLL_AGE times that
POLL_AGE = 5.0        # a refresh interval never exceeds 1/POLL_AGE of the run's age (see poll_interval)
DRAW_S = 0.25         # progress bar refresh while waiting inline
CANCEL_WAIT_S = 1.0   # after Cancel, wait this long for the run to stop before redrawing the page
CANCEL_COLUMNS = (5, 1)  # widths of the progress bar's column and of Cancel's, to its right
CANCEL_NOTE = ("Cancel keeps the architectures and seeds (for the scaling law: the widths) the run finished; "
               "Run again resumes from them.")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def _status(job: Job) -> str:
    """The progress bar's text: label, stage, percent, elapsed time and ETA."""
    if job.cancelling:
        state = "cancelling…"
    elif job.state is JobState.QUEUED:
        state = "waiting for a free worker"
    else:
        state = job.stage
    eta = job.eta_s()
    left = "estimating time left" if eta is None else f"about {_duration(eta)} left"
    return f"**{plain(job.label)}** — {state} · {job.frac:.0%} · {_duration(job.elapsed_s())} elapsed · {left}"


def poll_interval(elapsed_s: float) -> float:
    """Seconds between progress refreshes of a run that has taken ``elapsed_s`` so far.

    The longest of POLL_S, 2·POLL_S, 4·POLL_S, … up to ``POLL_MAX_S`` that is at most
    1/``POLL_AGE`` of the run's age (``POLL_S`` while the run is young): a long run is redrawn
    rarely (each redraw, the server's fragment and the browser's repaint, takes CPU from the
    run), and its bar moves by at most a few percent of the run between redraws."""
    every = POLL_S
    while every * 2 <= POLL_MAX_S and elapsed_s >= POLL_AGE * every * 2:
        every *= 2
    return every


def polled(body: Callable, age_s: float, *args) -> None:
    """``body(*args, every)`` as a fragment rerun every ``every = poll_interval(age_s)`` seconds.
    The body asks for a page rerun (``st.rerun(scope="app")``) once ``poll_interval`` of the
    run's age differs from ``every``: the page then draws it again at the longer interval."""
    every = poll_interval(age_s)
    st.fragment(body, run_every=every)(*args, every)


def _progress(key: str) -> None:
    """The running job's progress bar and Cancel button, and what it finished so far (``ui.partial``),
    refreshed every ``poll_interval``."""
    job = get_manager().get_key(key)
    polled(_progress_bar, job.elapsed_s() if job is not None else 0.0, key)


def _bar_and_cancel(job: Job) -> tuple:
    """The progress bar where the run button was, and a narrow column to its right for Cancel:
    a double click on the run button lands on the bar, not on Cancel. Returns both columns."""
    bar, stop = st.columns(CANCEL_COLUMNS, vertical_alignment="top")
    bar.progress(job.frac, text=_status(job))
    return bar, stop


def _progress_bar(key: str, every: float) -> None:
    manager = get_manager()
    job = manager.get_key(key)
    if job is None or job.done or poll_interval(job.elapsed_s()) != every:
        st.rerun(scope="app")  # done: draw the result; or older: redraw at the longer interval
    bar, stop = _bar_and_cancel(job)
    if job.cancelling:
        return  # no second Cancel; the bar says "cancelling…" until the run stops
    # no tooltip: it would open over the bar's text, whose end is the ETA; a caption says it instead
    if stop.button("Cancel", key=f"cancel.{key[:16]}"):
        manager.cancel(key)
        job.wait(CANCEL_WAIT_S)  # a run that checks its flag between steps stops well within this
        st.rerun(scope="app")
    bar.caption(CANCEL_NOTE)
    partial_ui(job, st.session_state.get(f"nets.{key}"))


def _warn_plain(message: str) -> None:
    """A corrupt cache entry's message (it names a file) as text."""
    st.warning(plain(message))


def _submit(manager: JobManager, kind: str, cfg, fn, label: str, data_dir, kwargs: dict) -> None:
    """Button callback: (re)submit; replaces a failed or cancelled job, joins a live one."""
    manager.submit(kind, cfg, fn, label, data_dir=data_dir, **kwargs)


def obtain(kind: str, fn: Callable[..., Result], cfg, label: str, auto: bool = True,
           button: str = "Run", note: str = "", data_dir=None) -> Result | None:
    """The result of ``fn(cfg, ...)``, or None while it is being computed or waits for a click.

    kind: the cache kind ``fn`` stores under (its first argument to ``cached_run``).
    auto: start at once when nothing is cached (quick settings); otherwise show ``button``. A
        link whose values the page or the sidebar refused (``ui.links.link_refused``) never
        starts a run by itself: the button waits.
    data_dir: the data folder, part of the result's identity (``config_key``) and passed to
        ``fn``; None for the engine's default.
    Engine errors appear as one-line ``st.error`` boxes, a failed run's with a "Try again"
    button; a cancelled run shows a note with a "Run again" button.
    """
    manager, cache = get_manager(), get_cache()
    try:
        key = manager.key(kind, cfg, data_dir)  # fingerprints the data, so it can fail
    except EngineError as exc:
        st.error(plain(exc))
        return None
    job = manager.get_key(key)
    if job is not None and job.state is JobState.DONE:
        return job.result
    if job is None or job.done:
        hit = cache.get(kind, cfg, on_corrupt=_warn_plain, data_dir=data_dir)
        if hit is not None:
            return hit
    st.session_state[f"nets.{key}"] = expected_nets(cfg)  # the partial chart's "k of N nets"
    slot = st.empty()  # one place for the button, the progress bar, the error, or nothing
    kwargs = dict(cache=cache, device=shared().device)
    args = (manager, kind, cfg, fn, label, data_dir, kwargs)
    if job is None and auto and link_refused():  # the link asked for something else: the user decides
        auto, note = False, (f"This link asked for settings this page did not take (said above), so the run "
                             f"waits for a click. {note}").strip()
    if job is None and auto:
        job = manager.submit(kind, cfg, fn, label, data_dir=data_dir, **kwargs)
    elif job is None:
        with slot.container():
            if note:
                st.caption(note)
            st.button(button, key=f"run.{key[:16]}", type="primary", on_click=_submit, args=args)
        return None
    elif job.done:
        _ended(slot, job, label, key, args)
        return None
    if job.state is JobState.RUNNING and job.elapsed_s() >= INLINE_WAIT_S:  # not fresh: no inline redraws
        with slot.container():
            _progress(key)
        return None
    deadline = time.monotonic() + INLINE_WAIT_S
    with slot.container():  # on screen at once, not after the inline wait; as wide as it stays after
        _bar_and_cancel(job)
    while not job.wait(max(0.0, min(DRAW_S, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            with slot.container():
                _progress(key)
            return None
        with slot.container():
            _bar_and_cancel(job)
    if job.state is JobState.DONE:
        slot.empty()
        return job.result
    _ended(slot, job, label, key, args)
    return None


def _ended(slot, job: Job, label: str, key: str, args: tuple) -> None:
    """A failed or cancelled job: its message and one button that starts a fresh run."""
    with slot.container():
        if job.state is JobState.FAILED:
            st.error(plain(job.error))
            st.button("Try again", key=f"retry.{key[:16]}", on_click=_submit, args=args)
        else:
            st.info(f"{plain(label)}: cancelled.")
            st.button("Run again", key=f"again.{key[:16]}", on_click=_submit, args=args)


def peek(kind: str, cfg, data_dir=None) -> Result | None:
    """A finished result if one exists (memory or disk), without starting anything."""
    try:
        job = get_manager().get(kind, cfg, data_dir)
    except EngineError:  # no key without the data; `obtain` says why
        return None
    if job is not None and job.state is JobState.DONE:
        return job.result
    return get_cache().get(kind, cfg, on_corrupt=_warn_plain, data_dir=data_dir)


def obtain_planned(fn: Callable[..., Result], cfg, label: str, button: str = "Run", wait: bool = False,
                   why: str = "") -> Result | None:
    """``obtain`` with the engine's plan for ``cfg`` on the sidebar's device: it starts by itself
    when quick (unless ``wait``), waits for ``button`` when longer, and never starts when over
    the dashboard's limits (one error says what to change). ``why`` goes before the plan's
    note. ``fn.kind`` is the cache kind."""
    from ui.configs import plan as plan_of

    p = plan_of(cfg, shared().device)
    if not p.allowed:
        st.error(p.note)
        return None
    return obtain(fn.kind, fn, cfg, label, auto=p.auto and not wait, button=button,
                  note=f"{why} {p.note}".strip())


def _submit_all(manager: JobManager, runs: list, kwargs: dict) -> None:
    """Button callback of ``obtain_together``: one job per waiting run."""
    for fn, cfg, label in runs:
        manager.submit(fn.kind, cfg, fn, label, **kwargs)


def obtain_together(runs: list[tuple[Callable[..., Result], object, str]], button: str = "Measure",
                    why: str = "") -> list[Result | None]:
    """Results of several runs, in order, that never start by themselves: one click starts them all.

    runs: ``(fn, cfg, label)`` each; ``fn.kind`` is the cache kind. A run already finished (in
    memory or on disk) is returned at once; a queued, running, failed or cancelled one shows
    what ``obtain`` shows for it (progress bar, or its message and button) and gives None; the
    rest give None and share one ``button`` whose note gives their summed engine estimate on
    the sidebar's device (``why`` goes before it). When one of those is over the dashboard's
    limits nothing is offered: one error says what to change.
    """
    from ui.configs import plan as plan_of

    manager = get_manager()
    out, waiting = [], []
    for fn, cfg, label in runs:
        hit = peek(fn.kind, cfg)
        job = None
        if hit is None:
            try:
                job = manager.get(fn.kind, cfg)  # fingerprints the data, so it can fail
            except EngineError as exc:
                st.error(plain(exc))
                return [None] * len(runs)
        if job is not None:
            hit = obtain(fn.kind, fn, cfg, label, auto=False)
        elif hit is None:
            waiting.append((fn, cfg, label))
        out.append(hit)
    if waiting:
        plans = [plan_of(cfg, shared().device) for _, cfg, _ in waiting]
        refused = [p.note for p in plans if not p.allowed]
        if refused:
            st.error(refused[0])
            return out
        seconds = sum(p.seconds for p in plans)
        names = ", ".join(label for *_, label in waiting)
        st.caption(f"{why} {names} — about {duration(seconds)} of work here in all (the engine's "
                   "estimate); they run in the background once started.".lstrip())
        key = manager.key(waiting[0][0].kind, waiting[0][1])
        kwargs = dict(cache=get_cache(), device=shared().device)
        st.button(button, key=f"run.together.{key[:16]}", type="primary", on_click=_submit_all,
                  args=(manager, waiting, kwargs))
    return out
