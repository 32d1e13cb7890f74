"""The Reproduction page's protocol-sensitivity grids: one table per claim, a verdict per cell
(``engine.reporting.protocols``), a link per cell to the page that shows it (``ui.links``), and one
button that runs the missing cells as background jobs, with their live progress and Cancel.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.experiments.malleability import run_malleability
from engine.experiments.sweep import run_ntk_sweep
from engine.reporting import protocols
from engine.runtime.budget import duration
from engine.runtime.errors import EngineError
from engine.runtime.jobs import JobState
from ui import configs, links
from ui.common import get_cache, get_manager, plain
from ui.runner import peek, poll_interval, polled

RUNS = {"flip": run_malleability, "kernel": run_ntk_sweep}
PAGE_NAMES = {"malleability": "Malleability", "ntk-sweep": "NTK convergence"}  # Variant.page: the URL path



def _submit(kind: str, fn, cells: dict, device: str) -> None:
    """Button callback: one background job per missing config (config -> label)."""
    manager, cache = get_manager(), get_cache()
    for cfg, label in cells.items():
        manager.submit(kind, cfg, fn, f"Protocol cell: {label}", cache=cache, device=device)


def _live(claim: str, keys: tuple[str, ...]) -> None:
    """Progress of a claim's running cells, refreshed every ``poll_interval`` of the oldest."""
    polled(_live_bar, _age([get_manager().get_key(k) for k in keys]), claim, keys)


def _age(jobs: list) -> float:
    """Seconds the oldest of ``jobs`` (None where gone) has run."""
    return max((j.elapsed_s() for j in jobs if j is not None), default=0.0)


def _live_bar(claim: str, keys: tuple[str, ...], every: float) -> None:
    """Redraws the page when one of the runs ends (or at a longer interval as they age)."""
    manager = get_manager()
    jobs = [manager.get_key(k) for k in keys]
    if any(j is None or j.done for j in jobs) or poll_interval(_age(jobs)) != every:
        st.rerun(scope="app")
    st.progress(sum(j.frac for j in jobs) / len(jobs), text=f"{len(jobs)} run(s) of this grid in progress")
    if st.button("Cancel these runs", key=f"protocols.cancel.{claim}"):
        for k in keys:
            manager.cancel(k)
        st.rerun(scope="app")


def sensitivity_ui(claim: str, variants: list[protocols.Variant], what: str, device: str) -> None:
    """A claim's grid: verdict and numbers of every cached cell, links, and one button for the rest
    (background jobs on ``device``, started by a click only)."""
    st.subheader(protocols.CLAIMS[claim])
    st.caption(f"{what} Verdict: {protocols.RULES[claim]}")
    kind, fn, manager = RUNS[claim].kind, RUNS[claim], get_manager()
    results, jobs, missing, rows = {}, {}, {}, []
    for v in variants:
        if v.config not in results:
            results[v.config] = peek(kind, v.config)
            try:
                jobs[v.config] = manager.get(kind, v.config)
            except EngineError as exc:  # the data cannot be read: the sections above say why
                st.caption(f"Not available: {plain(exc)}")
                return
        res, job = results[v.config], jobs[v.config]
        row = protocols.cell(v, None if res is None else res.frames["summary"])
        if res is None and job is not None and not job.done:
            row["verdict"] = f"running ({job.frac:.0%})" if job.state is JobState.RUNNING else "queued"
        elif res is None and job is not None and job.error:
            row["verdict"], row["why"] = job.state.value, job.error
        if res is None and (job is None or job.done) and v.config not in missing:
            missing[v.config] = " · ".join(str(c) for k, c in v.choices.items() if k != "metric")
        link = links.of(v)
        note = ", ".join(f"{k} = {val}" for k, val in link.unlinked.items())
        rows.append({**row, "settings": link.url, "not in the link": note})
    table = pd.DataFrame(rows)
    counts = table["verdict"].value_counts()
    st.markdown(" · ".join(f"**{word}**: {counts.get(word, 0)}" for word in protocols.VERDICTS)
                + f" · not yet measured: {len(table) - sum(counts.get(w, 0) for w in protocols.VERDICTS)}"
                + f" (of {len(table)} cells)")
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        "settings": st.column_config.LinkColumn(
            "settings", display_text=f"open on {PAGE_NAMES[variants[0].page]}",
            help="Opens the page with the settings of this cell (in a new tab)"),
        "not in the link": st.column_config.TextColumn(
            help="Settings that page has no control for; the cell used these")})
    live = tuple(j.key for j in jobs.values() if j is not None and not j.done)
    if live:
        _live(claim, live)
    if not missing:
        return
    plans = [configs.plan(cfg, device) for cfg in missing]
    blocked = [p for p in plans if not p.allowed]
    if blocked:
        st.warning(f"{len(missing)} run(s) not started: {blocked[0].note}")
        return
    st.button(f"Run the {len(missing)} missing run(s): about {duration(sum(p.seconds for p in plans))} in total",
              key=f"protocols.run.{claim}", on_click=_submit, args=(kind, fn, missing, device),
              help="Background jobs, two at a time; the table fills in as they finish.")
