"""Grids of experiments: the Cartesian product of a few settings, run on local processes or on Ray.

Specs (TOML, ``grids/*.toml``) are read by ``engine.grid.spec``; the backends live in
``engine.grid.backends``. ``run_grid`` takes the cells already in the cache from it (a grid
resumes where it stopped) and runs the others on a backend (``Backend``): a pool of local
worker processes (the default) or one Ray task per cell on a cluster. Workers run a cell
without a cache and return ``Result.to_bytes()``; the driver alone writes the cache, after
checking that the worker ran the driver's engine code on the same data, so no node shares a
cache folder and no entry is ever partial. A worker that dies is retried (Ray's
``max_retries``; the local pool is rebuilt). Each cell runs with a fixed number of torch
threads, so on a CPU both backends give the same results bit for bit (``digest`` compares
them; frame columns in ``VOLATILE`` time the run and are left out).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from ..data.folders import expand_path
from ..experiments.calibration import estimate
from ..experiments.registry import EXPERIMENTS
from ..runtime.budget import GIB, duration, seconds_limit
from ..runtime.cache import Cache, Result, canonical, code_fingerprint, config_key, provenance_of
from ..runtime.errors import BadInput, DataMissing, EngineError
from .backends import BACKENDS, CONNECT_TIMEOUT_S, Backend, _Job, connect_timeout as check_timeout
from .spec import Cell, Grid, load_spec

VOLATILE = ("seconds",)                   # frame columns holding wall times: differ between any two runs
STATES = ("cached", "running", "failed", "to do")  # what the dashboard shows per cell


# ---------------------------------------------------------------- status and estimates

def _why_not(exc: EngineError) -> str:
    return f"data missing: {exc}" if isinstance(exc, DataMissing) else str(exc)


def _lookup(cell: Cell, cache: Cache | None, data_dir) -> tuple[Result | None, str | None]:
    """(cached result or None, why the cell cannot run here or None); never downloads."""
    try:
        if cache is None:
            config_key(cell.cache_kind, cell.config, data_dir)  # are the data here?
            return None, None
        return cache.get(cell.cache_kind, cell.config, data_dir=data_dir), None
    except EngineError as exc:  # the data cannot be fingerprinted: missing, corrupt, bad name
        return None, _why_not(exc)


def plan(grid: Grid, cache: Cache | None = None, data_dir=None,
         states: dict[int, tuple[str, str | None]] | None = None) -> pd.DataFrame:
    """One row per cell: cell, kind, settings, status (one of ``STATES``), note, estimate_s,
    memory_gib. ``states`` (a ``Tracker``'s) marks cells running or failed in a live run; a
    cell in the cache is ``cached`` whatever it says. Estimates are the reference 2-core CPU's."""
    rows = []
    states = states or {}
    for cell in grid.cells:
        est = estimate(cell.config)
        try:
            config_key(cell.cache_kind, cell.config, data_dir)  # are the data here? (no download)
            hit, why = cache is not None and (cell.cache_kind, cell.config, data_dir) in cache, None
        except EngineError as exc:
            hit, why = False, _why_not(exc)
        state, error = states.get(cell.index, (None, None))
        status = "cached" if hit else state if state in ("running", "failed") else "to do"
        note = error if status == "failed" else why or ""
        rows.append({"cell": cell.index, "kind": cell.kind + (f" [{cell.block}]" if cell.block else ""),
                     "settings": cell.settings,
                     "status": status, "note": note, "estimate_s": est.seconds, "memory_gib": est.bytes / GIB})
    return pd.DataFrame(rows, columns=["cell", "kind", "settings", "status", "note", "estimate_s", "memory_gib"])


def totals(table: pd.DataFrame, workers: int = 1) -> dict:
    """Estimated seconds of all cells, and of those left to run here (not cached, data
    present) serially and over ``workers`` processes; the peak memory of ``workers`` cells at
    once (the largest ones). A ``plan`` table in, plain numbers out."""
    blocked = (table["status"] != "cached") & (table["status"] != "failed") & (table["note"] != "")
    left = table[(table["status"] != "cached") & ~blocked]
    peak = table["memory_gib"].nlargest(max(1, workers)).sum() if len(table) else 0.0
    return {"cells": len(table), "cached": int((table["status"] == "cached").sum()),
            "cannot_run": int(blocked.sum()), "estimate_seconds": float(table["estimate_s"].sum()),
            "estimate_seconds_left": float(left["estimate_s"].sum()),
            "wall_seconds_left": _wall(list(left["estimate_s"]), workers),
            "peak_gib": float(peak), "workers": workers}


def _wall(seconds: list[float], workers: int) -> float:
    """Wall time of jobs of these lengths on ``workers`` slots, longest first (greedy)."""
    slots = [0.0] * max(1, workers)
    for s in sorted(seconds, reverse=True):
        slots[slots.index(min(slots))] += s
    return max(slots)



# ---------------------------------------------------------------- the driver

@dataclass
class Outcome:
    cell: Cell
    status: str                      # "computed", "cached" or "failed"
    result: Result | None = None
    error: str | None = None


class Tracker:
    """Cell states of a live run (``run_grid``'s ``on_cell``), read by a page while it runs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._states: dict[int, tuple[str, str | None]] = {}

    def __call__(self, cell: Cell, state: str, error: str | None = None) -> None:
        with self._lock:
            self._states[cell.index] = (state, error)

    def clear(self) -> None:
        with self._lock:
            self._states.clear()

    def states(self) -> dict[int, tuple[str, str | None]]:
        with self._lock:
            return dict(self._states)


def _store(cell: Cell, blob: bytes, cache: Cache | None, data_dir, code: str) -> Result:
    """Decode a worker's result, check it was made by this engine on this data, store it."""
    result = Result.from_bytes(blob)
    mine = provenance_of(cell.config, data_dir, allow_download=False)
    theirs = result.provenance or {}
    if theirs.get("code") != code:
        raise BadInput(f"the worker ran other engine code ({str(theirs.get('code'))[:12]} against "
                       f"{code[:12]} here); the engine changed while the grid ran: run it again")
    if theirs.get("data") != mine["data"]:
        raise BadInput("the worker read other data than this machine (its data fingerprints differ); "
                       "give the workers the same data files")
    if cache is not None:
        cache.put(result, cell.config, data_dir)
    result.cached = False
    return result


def run_grid(grid: Grid, cache: Cache | None, data_dir=None, backend: Backend | str = Backend.LOCAL,
             address: str | None = None, workers: int | None = None, device: str = "auto",
             threads: int = 1, retries: int = 3, max_seconds: float = math.inf,
             progress: Callable[[float, str], None] | None = None, cancel=None,
             on_cell: Callable[..., None] | None = None,
             connect_timeout: float = CONNECT_TIMEOUT_S) -> list[Outcome]:
    """Run every cell not yet in ``cache`` and store its result there; one ``Outcome`` per
    cell, in cell order (the cells start longest first, by their estimates).

    backend: ``Backend.LOCAL`` (default; ``workers`` processes, default ``cpu_count //
        threads``) or ``Backend.RAY`` (``address`` of a cluster, or a local instance; at most
        ``workers`` tasks in flight when given). threads: torch threads per cell (the same on
        both backends, so CPU results agree bit for bit). retries: times a cell whose worker
        died runs again. max_seconds: refuse cells estimated above it. connect_timeout:
        seconds to reach the Ray cluster at ``address`` before failing in one line naming it.
    progress(frac, line): one line per finished cell with the ETA over the cells left.
    cancel: ``.is_set()`` stops the grid (cells running are killed; nothing partial is kept).
    on_cell(cell, state, error): "cached", "running", "computed" or "failed" as they happen.
    A cell whose data are missing fails at once; the others still run.
    """
    if backend not in [b.value for b in Backend]:  # a str enum: members and their values both match
        raise BadInput(f"unknown backend {backend!r}; allowed: {', '.join(b.value for b in Backend)}")
    backend = Backend(backend)
    if threads < 1 or retries < 0 or (workers is not None and workers < 1):
        raise BadInput("threads and workers must be at least 1, retries at least 0")
    max_seconds = seconds_limit(max_seconds)
    connect_timeout = check_timeout(connect_timeout)
    note = on_cell or (lambda *a: None)
    say = progress or (lambda f, s: None)
    code = code_fingerprint()
    outcomes: dict[int, Outcome] = {}
    todo = []
    for cell in grid.cells:
        hit, why = _lookup(cell, cache, data_dir)
        if hit is not None:
            outcomes[cell.index] = Outcome(cell, "cached", hit)
        elif why is not None:
            outcomes[cell.index] = Outcome(cell, "failed", error=why)
        else:
            todo.append(cell)
    for o in outcomes.values():
        note(o.cell, o.status, o.error)
    n = len(grid.cells)
    est = {c.index: estimate(c.config).seconds for c in todo}
    todo.sort(key=lambda c: -est[c.index])  # longest first, as _wall's greedy assumes (results stay in cell order)
    here = max(1, (os.cpu_count() or 1) // threads)  # a cluster's size is unknown until it is reached
    slots = workers or (len(todo) or 1 if backend is Backend.RAY and address else here)
    failed = sum(o.status == "failed" for o in outcomes.values())
    say(len(outcomes) / max(n, 1),
        f"grid {grid.name}: {n} cells, {n - len(todo) - failed} cached, {failed} failed before running, "
        f"{len(todo)} to run on {backend.value} (about {duration(_wall(list(est.values()), slots))})")
    for o in sorted(outcomes.values(), key=lambda o: o.cell.index):
        if o.status == "failed":
            say(len(outcomes) / max(n, 1), f"[{o.cell.index + 1:>3}/{n}] failed   {o.cell.label}: {o.error}")
    if todo:
        t0, est_done = time.monotonic(), 0.0
        where = None if data_dir is None else str(expand_path(data_dir, "data folder").resolve())  # workers' cwd differs
        job = _Job(where, device, threads, max_seconds, connect_timeout)
        run = BACKENDS[backend]
        for cell, ok, payload in run(todo, job, workers if backend is Backend.RAY else slots, retries,
                                     address, cancel, lambda c: note(c, "running")):
            if ok:
                try:
                    outcome = Outcome(cell, "computed", _store(cell, payload, cache, data_dir, code))
                except EngineError as exc:
                    outcome = Outcome(cell, "failed", error=str(exc))
            else:
                outcome = Outcome(cell, "failed", error=payload)
            outcomes[cell.index] = outcome
            note(cell, outcome.status, outcome.error)
            est_done += est[cell.index]
            left = sum(est[c.index] for c in todo if c.index not in outcomes)
            elapsed = time.monotonic() - t0
            eta = left * elapsed / est_done if est_done > 0 else None
            what = outcome.error if outcome.status == "failed" else f"{elapsed:.0f} s in"
            say(len(outcomes) / n, f"[{len(outcomes):>3}/{n}] {outcome.status:8s} {cell.label}: {what}"
                f" · ETA {'unknown' if eta is None else duration(eta)}")
    return [outcomes[c.index] for c in grid.cells]


# ---------------------------------------------------------------- what comes out

def rows(result: Result, kind: str) -> pd.DataFrame:
    """A result's main table: the first frame its CLI command prints (spectrum: its summary)."""
    if kind == "spectrum":
        return pd.DataFrame([result.meta.get("summary", {})])
    return result.frames.get(EXPERIMENTS[kind].tables[0], pd.DataFrame())


def digest(result: Result) -> str:
    """SHA-256 (hex) of what a result says: frames without ``VOLATILE`` columns (values and
    dtypes, numbers by their bytes), arrays by their bytes, and meta. Equal digests: the
    same result bit for bit."""
    h = hashlib.sha256()

    def feed(name: str, values) -> None:
        arr = np.asarray(values)
        h.update(f"\0{name}\0{arr.dtype}\0{arr.shape}\0".encode())
        if arr.dtype.kind in "biufc":
            h.update(np.ascontiguousarray(arr).tobytes())
        else:
            h.update(json.dumps(arr.tolist(), default=str).encode())

    for name in sorted(result.frames):
        df = result.frames[name]
        df = df.drop(columns=[c for c in VOLATILE if c in df.columns])
        feed(f"{name}.columns", [str(c) for c in df.columns])
        feed(f"{name}.index", df.index.to_numpy())
        for col in df.columns:
            feed(f"{name}.{col}", df[col].to_numpy())
    for name in sorted(result.arrays):
        feed(f"array.{name}", result.arrays[name])
    h.update(json.dumps(result.meta, sort_keys=True, default=str).encode())
    return h.hexdigest()


def summary(outcomes: list[Outcome]) -> dict:
    """``{"cells", "computed", "cached", "failed", "results": [...]}``, each result with the
    cell's config, its rows (``rows``), status, error and ``digest``; JSON-able but for NaN."""
    results = []
    for o in outcomes:
        entry = {"cell": o.cell.index, "kind": o.cell.kind, "block": o.cell.block,
                 "choices": {k: list(v) if isinstance(v, tuple) else v for k, v in o.cell.choices},
                 "status": o.status, "config": canonical(o.cell.config), "rows": None, "digest": None,
                 "error": o.error}
        if o.result is not None:
            df = rows(o.result, o.cell.kind)
            entry["rows"] = df.astype(object).where(df.notna(), None).to_dict(orient="records")
            entry["digest"] = digest(o.result)
        results.append(entry)
    count = Counter(o.status for o in outcomes)
    return {"cells": len(outcomes), "computed": count["computed"], "cached": count["cached"],
            "failed": count["failed"], "results": results}


# ---------------------------------------------------------------- the dashboard's background run

@dataclass(frozen=True)
class GridRun:
    """A dashboard run of a spec file on local workers: a ``JobManager`` job's config, hence
    its identity (one live run per spec content, however many workers it was given)."""

    path: str        # the spec file
    sha: str         # its content when the page showed it


def run_grid_job(run: GridRun, progress=None, cancel=None, cache: Cache | None = None, data_dir=None,
                 device: str = "auto", tracker: Tracker | None = None, workers: int = 1) -> Result:
    """``run_grid`` on the local backend with ``workers`` processes, for a page's background
    job. Result (kind "grid"): frame ``cells`` (``plan`` columns with the final status) and
    meta {cells, computed, cached, failed}. Failed cells do not fail the job; a changed spec
    file does."""
    grid = load_spec(run.path)
    if grid.sha != run.sha:
        raise BadInput(f"grid spec {run.path} changed since the page read it; reload the page")
    if tracker is not None:
        tracker.clear()
    outcomes = run_grid(grid, cache, data_dir, Backend.LOCAL, workers=workers, device=device,
                        progress=progress, cancel=cancel, on_cell=tracker)
    table = plan(grid, cache, data_dir, {o.cell.index: (o.status, o.error) for o in outcomes})
    out = summary(outcomes)
    return Result("grid", canonical(run), {"cells": table}, {},
                  {k: out[k] for k in ("cells", "computed", "cached", "failed")})


def describe_cells(table: pd.DataFrame) -> str:
    """Counts per status in words, e.g. "3 cached, 1 failed, 8 to do"."""
    counts = table["status"].value_counts()
    return ", ".join(f"{int(counts[s])} {s}" for s in STATES if s in counts) or "no cells"


def stderr_line(frac: float, line: str) -> None:
    """The CLI's progress printer: every line as it comes."""
    print(line, file=sys.stderr, flush=True)
