"""Every dashboard default run, idle, with glibc keeping freed blocks and without, alternated (issue 36 item 3).

    python benchmarks/default_runs.py [--runs retrain-loo,influence,...] [--rounds 1] [--out FILE.jsonl]
                                      [--preset malleability:network]

Each row is one run of an experiment's ``quick`` preset (the page's default) on MNIST in a fresh
process (MNIST from ``$ENGINE_DATA_DIR`` where torchvision cannot download), timed inside it around ``EXPERIMENTS[name].run`` (the imports before it, torch's 1-2 s, are
not counted: the dashboard's server has paid them once), with its wall and CPU time and the engine's
estimate at this machine's speed. ``keep``: the engine's entry points (``engine.runtime.memory.keep_freed_blocks``);
``default``: glibc's own malloc (``ENGINE_MALLOC_KEEP=0``). The two alternate within a round; the
table gives each run's wall times and their ratio, beside the CPU and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("influence", "malleability", "ntk-sweep", "scaling", "dynamics", "alignment", "retrain-loo")
CHILD = """
import json, os, sys, time
from engine.experiments.registry import EXPERIMENTS, preset
from engine.runtime import memory, speed
memory.keep_freed_blocks()  # as the CLI and the dashboard do (import engine leaves malloc alone); ENGINE_MALLOC_KEEP decides
name, which = sys.argv[1], sys.argv[2]
rec, cfg = EXPERIMENTS[name], preset(name, which)
import torch  # noqa: F401  (loaded before the clock starts, as in the dashboard's server)
estimate = rec.estimate(cfg).seconds * speed.speed_factor("cpu")
t, c = time.perf_counter(), time.process_time()
rec.run(cfg, cache=None, data_dir=os.environ.get("ENGINE_DATA_DIR"))
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c, "estimate_s": estimate}))
"""


def cpu_name() -> str:
    """The CPU's model and SIMD flags, as every figure in RESULTS.md names them (``engine.bench.timing``)."""
    from engine.bench.timing import machine_info  # loads torch here, never in the timed children

    info = machine_info()
    return f"{info['cpu_model']} ({' '.join(info['cpu_flags']) or 'no listed SIMD flags'})"


def one(name: str, which: str, mode: str) -> dict:
    env = {**os.environ, "ENGINE_MALLOC_KEEP": "1" if mode == "keep" else "0"}
    load = os.getloadavg()[0]
    p = subprocess.run([sys.executable, "-c", CHILD, name, which], cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{name} {which} ({mode}) failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return {"run": name, "preset": which, "mode": mode, "load_before": load, **json.loads(p.stdout.splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--preset", action="append", default=[], help="NAME:PRESET, run after the quick ones")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    bad = [p for p in args.preset if p.count(":") != 1]
    if bad:
        parser.error(f"--preset {bad[0]!r}: expected NAME:PRESET, e.g. malleability:network")
    jobs = [(r, "quick") for r in args.runs.split(",") if r] + [tuple(p.split(":", 1)) for p in args.preset]
    cpu = cpu_name()
    print(f"{cpu}, {len(os.sched_getaffinity(0))} usable cores, load {os.getloadavg()[0]:.2f} at the start")
    rows = []
    for r in range(args.rounds):
        for name, which in jobs:
            for mode in (("keep", "default") if r % 2 == 0 else ("default", "keep")):
                row = one(name, which, mode)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps({**row, "cpu": cpu}) + "\n")
    print("| run | preset | keep: wall s | CPU s | estimate ÷ wall | default malloc: wall s | default ÷ keep |")
    print("|---|---|---|---|---|---|---|")
    for name, which in jobs:
        keep = [x for x in rows if (x["run"], x["preset"], x["mode"]) == (name, which, "keep")]
        base = [x for x in rows if (x["run"], x["preset"], x["mode"]) == (name, which, "default")]
        k = sorted(x["wall_s"] for x in keep)[len(keep) // 2]
        b = sorted(x["wall_s"] for x in base)[len(base) // 2]
        kc = sorted(x["cpu_s"] for x in keep)[len(keep) // 2]
        est = keep[0]["estimate_s"]
        print(f"| {name} | {which} | {k:.1f} | {kc:.1f} | {est / k:.2f} | {b:.1f} | {b / k:.2f}× |")
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
