"""Grids of experiments: the Cartesian product of a few settings, run on local processes or on Ray.

A grid spec is a TOML file (``grids/*.toml``) holding one block, or several as ``[[grid]]``:

    kind     an experiment command of the CLI: spectrum, ntk-sweep, malleability, scaling, ...
    preset   the named config the block starts from (default: the dataclass's defaults)
    base     settings every cell of the block shares
    axes     setting -> list of values; the block's cells are their Cartesian product
    exclude  list of rules, each setting -> value (or list of values); a cell matching
             every entry of one rule is left out

Settings are config fields; nested ones are dotted (``data.dataset``, ``train.optimizer``,
``attack.norm``). A scalar given for a tuple setting is a 1-tuple, so ``seeds = [0, 1, 2]``
as an axis makes three cells of one seed each. Every cell is built, hence validated, when the
spec is read: a bad spec is one ``BadInput`` line naming its key before anything runs.

``run_grid`` takes the cells already in the cache from it (a grid resumes where it stopped)
and runs the others on a backend (``Backend``): a pool of local worker processes (the
default) or one Ray task per cell on a cluster. Workers run a cell without a cache and
return ``Result.to_bytes()``; the driver alone writes the cache, after checking that the
worker ran the driver's engine code on the same data, so no node shares a cache folder and
no entry is ever partial. A worker that dies is retried (Ray's ``max_retries``; the local
pool is rebuilt). Each cell runs with a fixed number of torch threads, so on a CPU both
backends give the same results bit for bit (``digest`` compares them; frame columns in
``VOLATILE`` time the run and are left out).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import tomllib
import typing
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from .budget import GIB, Budget, duration
from .cache import (ENGINE_DIR, Cache, Result, canonical, provenance_of, code_fingerprint, config_key,
                    tree_fingerprint)
from .calibration import estimate
from .cli import COMMANDS, PRESETS
from .errors import BadInput, Cancelled, DataMissing, EngineError
from .settings import meta

GRIDS_DIR = ENGINE_DIR.parent / "grids"   # the specs the dashboard lists ($ENGINE_GRIDS_DIR overrides)
VOLATILE = ("seconds",)                   # frame columns holding wall times: differ between any two runs
SPEC_KEYS = ("name", "description", "grid")
BLOCK_KEYS = ("kind", "preset", "base", "axes", "exclude", "label")
STATES = ("cached", "running", "failed", "to do")  # what the dashboard shows per cell


class Backend(str, enum.Enum):
    """Where cells run; LOCAL is the default."""

    LOCAL = "local"   # a pool of worker processes on this machine
    RAY = "ray"       # one task per cell on a Ray cluster (an existing one, or a local instance)


# ---------------------------------------------------------------- the spec

@dataclass(frozen=True)
class Cell:
    """One experiment of a grid: a config of a CLI kind, and the axis values that made it."""

    index: int                         # position in the grid (results are listed in this order)
    kind: str                          # CLI command name: spectrum, ntk-sweep, malleability, scaling
    choices: tuple[tuple[str, Any], ...]  # (axis, value) of this cell, in axis order
    config: Any                        # the experiment's frozen config dataclass
    block: str = ""                    # its block's label, when the spec gives one

    @property
    def cache_kind(self) -> str:
        """The kind its run function stores under (``run_*.kind``)."""
        return COMMANDS[self.kind].run.kind

    @property
    def settings(self) -> str:
        """The axis values in words, e.g. ``data.dataset=mnist train.optimizer=sgd``."""
        return " ".join(f"{k}={_show(v)}" for k, v in self.choices) or "(base)"

    @property
    def label(self) -> str:
        return f"{self.kind}{f' [{self.block}]' if self.block else ''} {self.settings}"


@dataclass(frozen=True)
class Grid:
    name: str
    description: str
    path: str            # the spec file ("" when parsed from a dict)
    sha: str             # SHA-256 of the spec's text: a run started from the page checks it
    cells: tuple[Cell, ...]


def _show(v) -> str:
    return ",".join(str(e) for e in v) if isinstance(v, tuple) else str(v)


def _flat(table, where: str, prefix: str = "") -> dict:
    """A TOML table with nested tables (``data.dataset = ...`` unquoted) as dotted keys."""
    if not isinstance(table, dict):
        raise BadInput(f"{where} must be a table of settings, got {table!r}")
    out = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, where, name + "."))
        else:
            out[name] = v
    return out


def _owner(cls, dotted: str, where: str):
    """(dataclass that holds the setting, field name) of a dotted setting name of ``cls``."""
    head, _, rest = dotted.partition(".")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    known = sorted([n for n, f in fields.items() if "setting" in f.metadata]
                   + [f"{n}.*" for n, f in fields.items() if dataclasses.is_dataclass(f.default)])
    f = fields.get(head)
    if rest and f is not None and dataclasses.is_dataclass(f.default) and "." not in rest:
        owner, name = type(f.default), rest
    elif not rest and f is not None and "setting" in f.metadata:
        owner, name = cls, head
    else:
        raise BadInput(f"{where}: unknown setting {dotted!r} of {cls.__name__}; known: {', '.join(known)}")
    try:
        m = meta(owner, name)
    except KeyError:
        raise BadInput(f"{where}: unknown setting {dotted!r} of {cls.__name__}; known: "
                       f"{', '.join(known)}") from None
    if not m.cli:
        raise BadInput(f"{where}: {dotted!r} is set by the experiment itself and cannot be chosen")
    return owner, name


def _coerce(owner, name: str, value):
    """A TOML value as the setting holds it: lists as tuples, a scalar as a 1-tuple for tuple
    settings, integers as floats for float settings (1 and 1.0 must give one cache key)."""
    t = typing.get_type_hints(owner)[name]
    args = typing.get_args(t)
    if type(None) in args:  # X | None
        t = next(a for a in args if a is not type(None))
    as_float = lambda v: float(v) if isinstance(v, int) and not isinstance(v, bool) else v  # noqa: E731
    if typing.get_origin(t) is tuple:
        elem = typing.get_args(t)[0]
        items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        return tuple(as_float(v) for v in items) if elem is float else items
    if isinstance(value, list):
        return tuple(value)  # not a tuple setting: validation says so in its own words
    return as_float(value) if t is float else value


def _build(cls, base, values: dict):
    """``base`` with dotted settings replaced (nested configs rebuilt, so each validates)."""
    top, nested = {}, {}
    for k, v in values.items():
        head, _, rest = k.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = v
        else:
            top[k] = v
    for head, changes in nested.items():
        top[head] = dataclasses.replace(getattr(base, head), **changes)
    return dataclasses.replace(base, **top) if top else base


def _block_cells(block: dict, w: str) -> list[tuple[str, tuple, Any]]:
    """(kind, choices, config) of every cell of one block, in axis order."""
    if not isinstance(block.get("label", ""), str):
        raise BadInput(f"{w}label: must be text, got {block['label']!r}")
    unknown = sorted(set(block) - set(BLOCK_KEYS))
    if unknown:
        raise BadInput(f"{w}{unknown[0]}: unknown key; a block takes {', '.join(BLOCK_KEYS)}")
    kind = block.get("kind")
    if kind not in COMMANDS:
        raise BadInput(f"{w}kind: unknown kind {kind!r}; allowed: {', '.join(COMMANDS)}")
    cmd = COMMANDS[kind]
    preset = block.get("preset", "default")
    if preset not in PRESETS[cmd.preset]:
        raise BadInput(f"{w}preset: unknown preset {preset!r} of {kind}; allowed: "
                       f"{', '.join(sorted(PRESETS[cmd.preset]))}")
    cls, start = cmd.config, PRESETS[cmd.preset][preset]

    def values(table: dict, where: str, listed: bool) -> dict:
        out = {}
        for k, v in _flat(table, where).items():
            owner, name = _owner(cls, k, f"{where}.{k}")
            if listed:
                if not isinstance(v, list) or not v:
                    raise BadInput(f"{where}.{k}: an axis is a non-empty list of values, got {v!r}")
                out[k] = [_coerce(owner, name, e) for e in v]
            else:
                out[k] = _coerce(owner, name, v)
        return out

    base = values(block.get("base", {}), f"{w}base", False)
    try:
        start = _build(cls, start, base)
    except (BadInput, TypeError, ValueError) as exc:
        raise BadInput(f"{w}base: {exc}") from None
    axes = values(block.get("axes", {}), f"{w}axes", True)
    for k, vs in axes.items():  # each value alone first, so that an error names its axis
        for v in vs:
            try:
                _build(cls, start, {k: v})
            except (BadInput, TypeError, ValueError) as exc:
                raise BadInput(f"{w}axes.{k} = {_show(v)}: {exc}") from None
    rules = block.get("exclude", [])
    if isinstance(rules, dict):
        rules = [rules]
    if not isinstance(rules, list):
        raise BadInput(f"{w}exclude must be a list of rules ([[exclude]] tables), got {rules!r}")
    excludes = []
    for j, rule in enumerate(rules):
        rule = _flat(rule, f"{w}exclude[{j}]")
        if not rule:
            raise BadInput(f"{w}exclude[{j}]: an empty rule would exclude every cell")
        one = {}
        for k, v in rule.items():
            if k not in axes:
                raise BadInput(f"{w}exclude[{j}].{k}: not an axis of this block; axes: {', '.join(axes) or 'none'}")
            owner, name = _owner(cls, k, f"{w}exclude[{j}].{k}")
            one[k] = [_coerce(owner, name, e) for e in (v if isinstance(v, list) else [v])]  # a list: any of
        excludes.append(one)
    cells = []
    for combo in itertools.product(*axes.values()):
        choices = tuple(zip(axes, combo))
        if any(all(dict(choices)[k] in vs for k, vs in rule.items()) for rule in excludes):
            continue
        try:
            cfg = _build(cls, start, dict(choices))
        except (BadInput, TypeError, ValueError) as exc:
            raise BadInput(f"{w}cell {' '.join(f'{k}={_show(v)}' for k, v in choices)}: {exc}") from None
        cells.append((kind, choices, cfg))
    return cells


def parse_spec(doc: dict, name: str = "grid", path: str = "", sha: str = "") -> Grid:
    """A ``Grid`` from a parsed TOML document; raises ``BadInput`` (one line naming the key)."""
    unknown = sorted(set(doc) - set(SPEC_KEYS) - set(BLOCK_KEYS))
    if unknown:
        raise BadInput(f"{unknown[0]}: unknown key; a spec takes {', '.join(SPEC_KEYS + BLOCK_KEYS)}")
    top = {k: doc[k] for k in BLOCK_KEYS if k in doc}
    if "grid" in doc:
        if top:
            raise BadInput(f"{sorted(top)[0]}: belongs inside a [[grid]] block when the spec has [[grid]] blocks")
        blocks = doc["grid"]
        if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
            raise BadInput("grid: must be a non-empty list of [[grid]] blocks")
        named = [(f"grid[{i}].", b) for i, b in enumerate(blocks)]
    else:
        named = [("", top)]
    cells, seen = [], set()
    for w, block in named:
        for kind, choices, cfg in _block_cells(block, w):
            ident = json.dumps([kind, canonical(cfg)], sort_keys=True, default=str)
            if ident not in seen:  # the same config twice (two blocks) is one cell
                seen.add(ident)
                cells.append(Cell(len(cells), kind, choices, cfg, block.get("label", "")))
    for k in ("name", "description"):
        if k in doc and not isinstance(doc[k], str):
            raise BadInput(f"{k}: must be text, got {doc[k]!r}")
    return Grid(str(doc.get("name", name)), str(doc.get("description", "")), path, sha, tuple(cells))


def load_spec(path: str | os.PathLike) -> Grid:
    """Read and check a grid spec file; raises ``BadInput`` with one line naming the bad key."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"grid spec {p}: cannot be read ({exc.strerror or exc})") from None
    try:
        doc = tomllib.loads(text.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"grid spec {p}: not valid TOML ({' '.join(str(exc).split())})") from None
    try:
        return parse_spec(doc, p.stem, str(p), hashlib.sha256(text).hexdigest())
    except BadInput as exc:
        raise BadInput(f"grid spec {p}: {' '.join(str(exc).split())}") from None


def grids_dir() -> Path:
    """Where the dashboard looks for specs: ``$ENGINE_GRIDS_DIR``, else the repository's ``grids/``."""
    return Path(os.environ.get("ENGINE_GRIDS_DIR") or GRIDS_DIR)


def spec_files(folder: str | os.PathLike | None = None) -> list[Path]:
    """The ``*.toml`` specs of a folder (default ``grids_dir()``), sorted by name."""
    return sorted(Path(folder or grids_dir()).glob("*.toml"))


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


# ---------------------------------------------------------------- the worker side

def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    code_fingerprint()  # now, so that an edit to the engine while the grid runs is noticed


def run_cell(kind: str, config, data_dir, device: str, threads: int,
             max_seconds: float) -> tuple[bool, bytes | str]:
    """Run one cell without a cache, in a worker: ``(True, Result.to_bytes())`` or
    ``(False, one line)`` for an engine error (data missing, over budget, ...). A crash of the
    process itself is the backend's to retry."""
    _init_worker(threads)
    try:
        res = COMMANDS[kind].run(config, None, data_dir, device, None, budget=Budget(max_seconds))
        return True, res.to_bytes()
    except EngineError as exc:
        return False, " ".join(str(exc).split())
    except Exception as exc:  # a bug, but the grid goes on and says which cell in one line
        return False, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


@dataclass(frozen=True)
class _Job:
    """What every cell's worker call shares."""

    data_dir: str | None
    device: str
    threads: int
    max_seconds: float

    def args(self, cell: Cell, device: str | None = None) -> tuple:
        return (cell.kind, cell.config, self.data_dir, device or self.device, self.threads, self.max_seconds)


Done = tuple[Cell, bool, bytes | str]   # a finished cell: (cell, ok, result bytes or one-line error)
Started = Callable[[Cell], None]


def _cancelled(cancel) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled: the grid stopped; finished cells are in the cache")


def _local(todo: list[Cell], job: _Job, workers: int, retries: int, address, cancel,
           started: Started) -> Iterator[Done]:
    """Cells on a pool of ``workers`` spawned processes; a pool whose worker died is rebuilt
    and the cells it held go again (each at most ``retries`` more times)."""
    if address:
        raise BadInput("--address is for the ray backend; the local backend runs on this machine")
    ctx = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    queue, tries = deque(todo), Counter()
    while queue:
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(job.threads,))
        running, broken, ok = {}, False, False
        try:
            while running or (queue and not broken):
                while queue and not broken and len(running) < workers:
                    cell = queue.popleft()
                    running[pool.submit(run_cell, *job.args(cell))] = cell
                    started(cell)
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                _cancelled(cancel)
                for fut in done:
                    cell = running.pop(fut)
                    try:
                        yield (cell, *fut.result())
                    except BrokenProcessPool:
                        broken = True
                        tries[cell.index] += 1
                        if tries[cell.index] > retries:
                            yield cell, False, f"its worker process died {tries[cell.index]} times"
                        else:
                            queue.append(cell)
            ok = True
        finally:
            if not ok:  # cancelled or interrupted: stop the cells still running
                for p in list(getattr(pool, "_processes", {}).values()):
                    p.kill()
            pool.shutdown(wait=True, cancel_futures=True)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise BadInput("the ray backend needs Ray: pip install ray==2.60.0 (see requirements.txt)") from None
    return ray


def _ray(todo: list[Cell], job: _Job, workers: int | None, retries: int, address, cancel,
         started: Started) -> Iterator[Done]:
    """One Ray task per cell on the cluster at ``address`` (``auto``, HOST:PORT), or on a
    local instance started here. A copy of the engine package travels with the job as its
    ``working_dir``, so nodes need the requirements, not this checkout, and every worker runs
    the driver's code (with ``py_modules`` instead, Ray would put the driver's current folder
    first on the path of workers on its own node). GPU cells ask for one GPU each."""
    ray = _import_ray()
    with tempfile.TemporaryDirectory(prefix="engine-grid-") as folder:
        shutil.copytree(ENGINE_DIR, Path(folder) / "engine", ignore=shutil.ignore_patterns("__pycache__"))
        if tree_fingerprint(Path(folder) / "engine") != code_fingerprint():
            raise BadInput("the engine changed while the grid started; run it again")
        local = {} if address else {"num_cpus": workers or os.cpu_count(), "include_dashboard": False,
                                    "_node_ip_address": "127.0.0.1"}
        try:
            ray.init(address=address or None, runtime_env={"working_dir": folder}, log_to_driver=False,
                     logging_level=logging.WARNING, **local)
        except Exception as exc:  # ConnectionError, ValueError, RuntimeError: all mean "no cluster here"
            hint = ("; a cluster with token authentication also needs RAY_AUTH_MODE=token and its token "
                    "(~/.ray/auth_token or RAY_AUTH_TOKEN) here" if address else "")
            raise BadInput(f"cannot start Ray{' at ' + address if address else ''}: "
                           f"{(str(exc).strip().splitlines() or [''])[0]}{hint}") from None
        try:
            yield from _ray_tasks(ray, todo, job, workers, retries, cancel, started)
        finally:
            ray.shutdown()


def _ray_tasks(ray, todo: list[Cell], job: _Job, workers: int | None, retries: int, cancel,
               started: Started) -> Iterator[Done]:
    """Submit (at most ``workers`` in flight), collect as they finish; cancel what is left."""
    gpus = ray.cluster_resources().get("GPU", 0)
    device = job.device
    if device == "auto":
        device = "cuda" if gpus >= 1 else "cpu"
    if device == "cuda" and gpus < 1:
        raise BadInput("--device cuda: the Ray cluster has no GPU")
    task = ray.remote(run_cell).options(num_cpus=job.threads, num_gpus=1 if device == "cuda" else 0,
                                        max_retries=retries, retry_exceptions=False)
    limit = workers or len(todo)
    queue, running = deque(todo), {}
    try:
        while queue or running:
            while queue and len(running) < limit:
                cell = queue.popleft()
                running[task.remote(*job.args(cell, device))] = cell
                started(cell)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            _cancelled(cancel)
            for ref in ready:
                cell = running.pop(ref)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as exc:  # retries spent, node lost, ...
                    out = (False, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
                yield (cell, *out)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)


BACKENDS = {Backend.LOCAL: _local, Backend.RAY: _ray}


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
             on_cell: Callable[..., None] | None = None) -> list[Outcome]:
    """Run every cell not yet in ``cache`` and store its result there; one ``Outcome`` per
    cell, in cell order.

    backend: ``Backend.LOCAL`` (default; ``workers`` processes, default ``cpu_count //
        threads``) or ``Backend.RAY`` (``address`` of a cluster, or a local instance; at most
        ``workers`` tasks in flight when given). threads: torch threads per cell (the same on
        both backends, so CPU results agree bit for bit). retries: times a cell whose worker
        died runs again. max_seconds: refuse cells estimated above it.
    progress(frac, line): one line per finished cell with the ETA over the cells left.
    cancel: ``.is_set()`` stops the grid (cells running are killed; nothing partial is kept).
    on_cell(cell, state, error): "cached", "running", "computed" or "failed" as they happen.
    A cell whose data are missing fails at once; the others still run.
    """
    backend = Backend(backend)
    if threads < 1 or retries < 0 or (workers is not None and workers < 1):
        raise BadInput("threads and workers must be at least 1, retries at least 0")
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
        where = None if data_dir is None else str(Path(data_dir).expanduser().resolve())  # workers' cwd differs
        job = _Job(where, device, threads, max_seconds)
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
    return result.frames.get(COMMANDS[kind].frames[0], pd.DataFrame())


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
