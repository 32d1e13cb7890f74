"""Grid throughput: cells per minute on the local backend with 1 and 2 workers and on a Ray
head on loopback, side by side, and the paper grid's --dry-run estimate on this machine.

Each run is ``python -m engine grid`` in its own process on the same small grid (synthetic
data, so no files are needed) with a fresh cache, so every cell is computed; the wall time
includes starting the workers (a spawned Python with torch per local worker, a Ray worker
per CPU). Backends run interleaved ``--repeat`` times and the best wall time counts, since
other work on a shared machine only slows a run down. All runs must give the same digests (``engine.grid.driver.digest``). The Ray head is
started here with ``ray start --head --block`` in its own session and every process of that
session is killed at the end (not ``ray stop``, which would stop any Ray on the machine).
Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as `python benchmarks/grid.py` from anywhere

from engine.grid.loopback import free_port, session_pids  # noqa: E402

SPEC = """
name = "bench"
kind = "ntk-sweep"
preset = "quick"
base."data.dataset" = "synthetic"
base."data.n" = 200
base."data.n_test" = 100
base."train.epochs" = {epochs}
base.widths = [16, 256, 1024]
base.seeds = [0]
axes."data.synthetic_kappa" = [10.0, 100.0, 1000.0, 10000.0]
axes.archs = ["relu", "attn"]
"""
# loopback only; no token authentication, so that head and drivers agree whatever ~/.ray holds
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def grid(src: Path, *args) -> tuple[dict, float]:
    """One ``python -m engine grid`` run of the engine copy in ``src``: its JSON and wall seconds."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "engine", "grid", *map(str, args), "--json", "--quiet"],
                       cwd=src, env={**os.environ, **ENV}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"grid {' '.join(map(str, args))} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=200, help="training epochs of each cell (default 200)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each backend, interleaved; the best counts "
                                                          "(default 2: other work on the machine only slows runs down)")
    ap.add_argument("--data-dir", default=os.environ.get("ENGINE_DATA_DIR"),
                    help="data folder for the paper grid's dry run (default: $ENGINE_DATA_DIR)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gb", dir="/tmp"))
    spec = tmp / "bench.toml"
    spec.write_text(SPEC.format(epochs=args.epochs))
    src = tmp / "src"  # a copy: edits to the checkout meanwhile must not change the engine under the runs
    shutil.copytree(ROOT / "engine", src / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    out, digests = {"cells": None, "load_average_before": os.getloadavg()[0], "runs": {}}, {}

    def record(name: str, obj: dict, wall: float) -> None:
        out["cells"] = obj["cells"]
        best = out["runs"].get(name, {}).get("wall_s", float("inf"))
        out["runs"][name] = {"wall_s": round(min(wall, best), 2),
                             "cells_per_min": round(60 * obj["computed"] / min(wall, best), 2)}
        digests[name] = [r["digest"] for r in obj["results"]]
        print(f"{name}: {obj['computed']} cells in {wall:.1f} s", file=sys.stderr, flush=True)

    port = free_port()
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={tmp / 'ray'}", "--object-store-memory=200000000",
         f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"],
        env={**os.environ, **ENV}, stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (tmp / "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"ray head did not start: {(tmp / 'head.log').read_text()[-500:]}")
            time.sleep(0.3)
        for i in range(args.repeat):  # interleaved, each with a fresh cache: every cell computed
            for workers in (1, 2):
                record(f"local_{workers}_workers",
                       *grid(src, spec, "--workers", workers, "--cache-dir", tmp / f"l{workers}_{i}"))
            record("ray_local_head_2_cpus", *grid(src, spec, "--backend", "ray", "--address",
                                                   f"127.0.0.1:{port}", "--cache-dir", tmp / f"r{i}"))
    finally:
        for pid in session_pids(head.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        head.wait(timeout=30)
    out["identical_results"] = len({tuple(d) for d in digests.values()}) == 1
    out["load_average_after"] = os.getloadavg()[0]

    data = ["--data-dir", args.data_dir] if args.data_dir else []
    paper, _ = grid(src, ROOT / "grids" / "paper.toml", "--dry-run", "--workers", "2", *data, "--cache-dir", tmp / "p")
    out["paper_dry_run"] = {k: paper[k] for k in ("cells", "cannot_run", "estimate_seconds", "estimate_seconds_left",
                                                  "wall_seconds_left", "peak_gib", "workers")}
    out["paper_dry_run"]["cells_here"] = [{k: p[k] for k in ("cell", "kind", "settings", "estimate_s")}
                                          for p in paper["plan"] if not p["note"]]
    out["cpus"] = os.cpu_count()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
