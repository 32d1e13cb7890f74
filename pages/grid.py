"""Grid: every cell of a grid spec as cached / running / failed / to do, and a local run in the background."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import streamlit as st

from engine.grid import driver as G, spec as S
from engine.runtime.budget import duration
from engine.runtime.errors import EngineError
from engine.runtime.jobs import JobState
from ui import configs, render
from ui.common import get_cache, get_manager, plain, shared
from ui.runner import obtain

BOUND = configs.BOUND
REFRESH_S = 3.0   # the cell table redraws this often, so that running cells show while a grid runs
CLI = "python -m engine grid grids/{name} --backend ray --address auto"


@st.cache_resource(show_spinner=False)
def tracker(sha: str) -> G.Tracker:
    """The live cell states of runs of one spec (by content), one per server process."""
    return G.Tracker()


def spec_ui(files: list[Path]) -> tuple[Path, int]:
    c1, c2 = st.columns([3, 1])
    name = c1.selectbox("Grid spec", [f.name for f in files], key="grid.spec", **BOUND,
                        help=f"The TOML specs in `{S.grids_dir()}`.")
    workers = c2.number_input("Local worker processes", 1, max(1, os.cpu_count() or 1), max(1, os.cpu_count() or 1),
                              key="grid.workers", **BOUND,
                              help="Cells run side by side, one process each, one torch thread each.")
    return next(f for f in files if f.name == name), int(workers)


@st.fragment(run_every=REFRESH_S)
def cells_view(grid: G.Grid, workers: int, states_of: G.Tracker) -> None:
    table = G.plan(grid, get_cache(), None, states_of.states())
    t = G.totals(table, workers)
    c = st.columns(4)
    c[0].metric("Cells", t["cells"])
    c[1].metric("Cached", t["cached"])
    c[2].metric("Left to run here", t["cells"] - t["cached"] - t["cannot_run"],
                help="Not in the cache, data present.")
    c[3].metric("Estimated time left", duration(t["wall_seconds_left"]),
                help=f"On {workers} worker processes; {duration(t['estimate_seconds_left'])} of work in all "
                     f"(every cell: {duration(t['estimate_seconds'])}). Estimates are for the reference "
                     "2-core CPU; a GPU is faster.")
    st.caption(f"Cells: {plain(G.describe_cells(table))}.")  # spec text shown as typed
    shown = table.assign(estimate=table["estimate_s"].map(duration),
                         memory=table["memory_gib"].map(lambda g: f"{g * 1024:.0f} MiB"))
    st.dataframe(shown[["cell", "kind", "settings", "status", "estimate", "memory", "note"]], hide_index=True,
                 width="stretch")


def _again(key: str, run: G.GridRun, fn, label: str, device: str) -> None:
    """Button callback: forget the finished run and start a fresh one (it resumes from the cache)."""
    manager = get_manager()
    manager.forget(key)
    manager.submit("grid", run, fn, label, cache=get_cache(), device=device)


st.title("Grid")
st.markdown(
    "A grid is a list of experiment settings (a TOML file in `grids/`): the Cartesian product of a few "
    "axes, such as data set × optimiser, each cell one run of an existing experiment. Every finished "
    "cell lands in the engine's cache, so the other pages and the command line read it, and a grid "
    "stopped half-way resumes where it stopped.")
files = S.spec_files()
if not files:
    st.info(f"No grid specs (`*.toml`) in `{S.grids_dir()}`.")
    st.stop()
path, workers = spec_ui(files)
try:
    grid = G.load_spec(path)
except EngineError as exc:
    st.error(plain(exc))
    st.stop()
if grid.description:
    st.caption(plain(grid.description))
states = tracker(grid.sha)
cells_view(grid, workers, states)

run = G.GridRun(str(path), grid.sha)
fn = functools.partial(G.run_grid_job, tracker=states, workers=workers)
table = G.plan(grid, get_cache(), None, states.states())
t = G.totals(table, workers)
label = f"Grid {grid.name}, {t['cells'] - t['cached']} cells"
note = (f"{t['cells'] - t['cached'] - t['cannot_run']} cells to run here, about {duration(t['wall_seconds_left'])} "
        f"on {workers} worker processes; they run in the background, so the page can be left.")
res = obtain("grid", fn, run, label, auto=False,
             button="Resume the grid" if t["cached"] else "Start the grid", note=note)
if res is not None:
    m = res.meta
    st.success(f"Last run: {m['computed']} computed, {m['cached']} from the cache, {m['failed']} failed "
               "(the table says why).")
    st.button("Run again (resumes from the cache)", key="grid.again", on_click=_again,
              args=(get_manager().key("grid", run), run, fn, label, shared().device))
job = get_manager().get("grid", run)
if job is not None and job.state is JobState.RUNNING:
    st.caption("Running cells show as such in the table above, which refreshes every few seconds.")

st.info("Cluster runs start from the command line, not from this page: "
        f"`{CLI.format(name=path.name)}` sends one Ray task per cell to the cluster; results land in the "
        "cache of the machine that ran the command (`--cache-dir`, else `$ENGINE_CACHE_DIR`). Point this "
        "dashboard's `ENGINE_CACHE_DIR` at that folder to see them here.", icon=":material/dns:")

st.header("A cell's result")
cached = table[table["status"] == "cached"]
if cached.empty:
    st.caption("No cell of this grid is in the cache yet.")
else:
    pick = st.selectbox("Cell", list(cached["cell"]), key="grid.cell", **BOUND,
                        format_func=lambda i: grid.cells[i].label)
    cell = grid.cells[int(pick)]
    result = get_cache().get(cell.cache_kind, cell.config, on_corrupt=st.warning)
    if result is not None:
        st.dataframe(G.rows(result, cell.kind), hide_index=True)
        render.settings(result.config, "Settings of this cell")
