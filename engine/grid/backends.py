"""Where grid cells run (``Backend``): a pool of local worker processes, or Ray tasks.

Workers run a cell without a cache (``run_cell``) and return ``Result.to_bytes()`` or one
line; each backend yields ``(cell, ok, bytes or line)`` as cells finish, retries workers
that die, and stops what is still running when the grid is cancelled.
"""

from __future__ import annotations

import enum
import logging
import math
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..experiments.registry import EXPERIMENTS
from ..runtime.budget import Budget
from ..runtime.cache import ENGINE_DIR, PRESENTATION, code_fingerprint, tree_fingerprint
from ..runtime.errors import BadInput, Cancelled, EngineError
from ..runtime.memory import keep_freed_blocks
from .spec import Cell


class Backend(str, enum.Enum):
    """Where cells run; LOCAL is the default."""

    LOCAL = "local"   # a pool of worker processes on this machine
    RAY = "ray"       # one task per cell on a Ray cluster (an existing one, or a local instance)


CONNECT_TIMEOUT_S = 30.0   # seconds to reach a Ray cluster's head; ray.init alone retries for minutes
MAX_CONNECT_TIMEOUT_S = 3600.0
UNPLACEABLE_S = 10.0       # a Ray cluster with no live node that can run a cell for this long ends the grid
PLACEMENT_CHECK_S = 1.0    # how often the driver looks (ray.nodes(): a node joining or dying shows there)
RAY_CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")  # where `ray start` notes the address "auto" means
# An HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its
# client server) answers with a SETTINGS frame of its own at once; anything else does not.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def connect_timeout(value) -> float:
    """A connect timeout in seconds, checked: finite, > 0 and at most ``MAX_CONNECT_TIMEOUT_S``."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        t = math.nan
    if isinstance(value, bool) or not (math.isfinite(t) and 0 < t <= MAX_CONNECT_TIMEOUT_S):
        raise BadInput(f"connect timeout must be a number of seconds > 0 and <= {MAX_CONNECT_TIMEOUT_S:g}, "
                       f"got {value!r}")
    return t


def _host_port(address: str) -> tuple[str, int]:
    text = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT with a port "
                       "in 1-65535")
    return host, int(port)


def _target(address: str | None) -> str | None:
    """The HOST:PORT ray.init will connect to for ``address``, or None where it starts a local
    instance (or "auto" finds no note of a running cluster: it then fails at once by itself)."""
    if address and address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS")  # ray.init(None) and ray.init("auto") both follow it
    if env and env != "auto":
        return env
    if address == "auto":
        try:
            return RAY_CURRENT_CLUSTER.read_text().strip() or None
        except OSError:
            return None
    return None


def check_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, within ``timeout`` seconds and in one line naming it, a Ray address where no Ray
    head answers: nothing listens, the host is unknown or unreachable, or what listens is no gRPC
    server. ray.init itself retries silently for minutes against a closed port and without end
    against a listener that never speaks. With ``RAY_USE_TLS`` set, only the TCP connect is tried."""
    host, port = _host_port(address)
    deadline = time.monotonic() + timeout
    connected, later = False, ""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            connected = True
            if os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true"):
                return
            s.sendall(_H2_HELLO)
            got = b""
            while len(got) < 9:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(9 - len(got))
                if not chunk:
                    break
                got += chunk
        if len(got) == 9 and got[3] == 4:  # the frame type of SETTINGS
            return
        why = "something listens there, but no Ray head: it does not answer in gRPC"
    except socket.gaierror as exc:
        why = f"the host {host!r} is unknown ({exc.strerror or exc})"
    except TimeoutError:  # socket.timeout
        why = (f"something listens there but gave no gRPC answer within {timeout:g} s" if connected
               else f"no answer within {timeout:g} s")
        later = " (or raise --connect-timeout for a slow network)"
    except OSError as exc:  # refused, unreachable, reset
        why = f"{'the connection broke' if connected else 'nothing listens there'} ({exc.strerror or exc})"
    raise BadInput(f"cannot reach a Ray cluster at {address}: {why}; start its head (ray start --head "
                   f"prints the address) or fix --address{later}")



def _die_with_parent() -> None:
    """Linux: this worker gets SIGTERM when the process that started it dies, so a driver killed from
    outside leaves no worker computing cells nobody will collect (the pool's own shutdown covers Ctrl-C)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:  # another libc: the pool's shutdown still ends workers on a normal exit
            pass


def _init_worker(threads: int) -> None:
    import torch

    _die_with_parent()
    keep_freed_blocks()  # a worker process runs experiments: the allocator the CLI runs them with
    torch.set_num_threads(threads)
    # The grid's thread count, not one read from the load: the count changes the last bits of
    # a result, and both backends must give the same bits (meta["threads"] says "ENGINE_THREADS").
    os.environ["ENGINE_THREADS"] = str(threads)
    code_fingerprint()  # now, so that an edit to the engine while the grid runs is noticed


def run_cell(kind: str, config, data_dir, device: str, threads: int,
             max_seconds: float) -> tuple[bool, bytes | str]:
    """Run one cell without a cache, in a worker: ``(True, Result.to_bytes())`` or
    ``(False, one line)`` for an engine error (data missing, over budget, ...). A crash of the
    process itself is the backend's to retry."""
    _init_worker(threads)
    try:
        res = EXPERIMENTS[kind].run(config, None, data_dir, device, None, budget=Budget(max_seconds))
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
    connect_timeout: float = CONNECT_TIMEOUT_S  # the driver's only: seconds to reach a Ray cluster

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
    target = _target(address)
    if target is not None:
        check_address(target, job.connect_timeout)
    with tempfile.TemporaryDirectory(prefix="engine-grid-") as folder:
        shutil.copytree(ENGINE_DIR, Path(folder) / "engine", ignore=shutil.ignore_patterns("__pycache__"))
        if tree_fingerprint(Path(folder) / "engine", PRESENTATION) != code_fingerprint():
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
    need = {"CPU": job.threads, **({"GPU": 1} if device == "cuda" else {})}
    task = ray.remote(run_cell).options(num_cpus=job.threads, num_gpus=1 if device == "cuda" else 0,
                                        max_retries=retries, retry_exceptions=False)
    limit = workers or len(todo)
    queue, running = deque(todo), {}
    checked, stuck_since = -math.inf, None
    try:
        while queue or running:
            while queue and len(running) < limit:
                cell = queue.popleft()
                running[task.remote(*job.args(cell, device))] = cell
                started(cell)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            _cancelled(cancel)
            now = time.monotonic()
            if not ready and now - checked >= PLACEMENT_CHECK_S:  # Ray would wait for a node forever
                checked = now
                nodes = _live_nodes(ray)
                stuck_since = None if _fits(nodes, need) else (stuck_since or now)
                if stuck_since is not None and now - stuck_since >= UNPLACEABLE_S:
                    left = sorted([*running.values(), *queue], key=lambda c: c.index)
                    why = _unplaceable(need, nodes, left)
                    for cell in left:  # each one failed (exit 4): the finished ones are in the cache
                        yield cell, False, why
                    return
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


def _live_nodes(ray) -> list[dict]:
    """The total resources of each live node of the cluster (a dead node stays listed, not alive)."""
    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def _fits(nodes: list[dict], need: dict) -> bool:
    """Whether one of ``nodes`` has ``need`` (CPU, GPU) in all: busy or not, it can run a cell."""
    return any(all(n.get(k, 0) >= v for k, v in need.items()) for n in nodes)


def _unplaceable(need: dict, nodes: list[dict], left: list[Cell]) -> str:
    """One line: what a cell needs, what the live nodes have, and the cells not run."""
    needs = " and ".join(f"{v:g} {k}" for k, v in need.items())
    have = "; ".join(", ".join(f"{n.get(k, 0):g} {k}" for k in need) for n in nodes) or "none"
    return (f"not run: no live Ray node can run a cell (each needs {needs}; live nodes have: {have}) for "
            f"{UNPLACEABLE_S:g} s; cells {', '.join(str(c.index) for c in left)} were not run; finished cells "
            "are in the cache, so running the grid again resumes")


BACKENDS = {Backend.LOCAL: _local, Backend.RAY: _ray}

