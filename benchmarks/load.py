"""Each default run idle and beside busy processes, the engine's thread choice against the old
fixed one, alternated, with wall and CPU time (issue 36 item 1).

    python benchmarks/load.py --out benchmarks/cpu_load.jsonl [--runs influence,malleability] [--rounds 1]

A busy process is one thread of numpy float32 GEMMs (a browser, another job). Each row is one
run of ``python -m engine KIND --no-cache`` at its defaults:

- ``engine``: today's engine (OpenMP waits passively; the run takes the cores free at its start);
- ``fixed``: the old behaviour, every core and spinning waits (``ENGINE_THREADS`` = the usable
  cores, ``OMP_WAIT_POLICY=ACTIVE``),

each idle and beside 1 and 2 busy processes, the conditions alternated within a round. The
table at the end gives each condition's wall and CPU time as a ratio to the same mode's idle
run of the same round; the target is at most 3× the idle wall time beside two busy
processes on 2 cores (fair share is 2×) and no more CPU time than idle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("influence", "ntk-sweep", "malleability", "scaling", "dynamics", "retrain-loo")
BUSY = ("import numpy as np\n"
        "a = np.random.rand(512, 512).astype(np.float32)\n"
        "while True: a @ a\n")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def one(kind: str, mode: str, busy: int, timeout: float) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if mode == "fixed":
        env.update(ENGINE_THREADS=str(len(os.sched_getaffinity(0))), OMP_WAIT_POLICY="ACTIVE")
    else:
        env.pop("ENGINE_THREADS", None)
        env.pop("OMP_WAIT_POLICY", None)
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY], env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
                for _ in range(busy)]
    try:
        time.sleep(1.0 if busy else 0.0)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "engine", kind, "--no-cache"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row = {"run": kind, "mode": mode, "busy": busy, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "ok": p.returncode == 0}
    if p.returncode:
        row["error"] = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
    return row


def table(rows: list[dict]) -> str:
    out = ["| run | mode | idle wall s | idle CPU s | beside 1: wall × | CPU × | beside 2: wall × | CPU × |",
           "|---|---|---|---|---|---|---|---|"]
    for kind in dict.fromkeys(r["run"] for r in rows):
        for mode in ("fixed", "engine"):
            mine = [r for r in rows if r["run"] == kind and r["mode"] == mode and r["ok"]]
            idle = [r for r in mine if r["busy"] == 0]
            if not idle:
                continue
            w0 = sorted(r["wall_s"] for r in idle)[len(idle) // 2]
            c0 = sorted(r["cpu_s"] for r in idle)[len(idle) // 2]
            cells = [kind, mode, f"{w0:.1f}", f"{c0:.1f}"]
            for b in (1, 2):
                at = [r for r in mine if r["busy"] == b]
                if at:
                    w = sorted(r["wall_s"] for r in at)[len(at) // 2]
                    c = sorted(r["cpu_s"] for r in at)[len(at) // 2]
                    cells += [f"{w / w0:.2f}", f"{c / c0:.2f}"]
                else:
                    cells += ["—", "—"]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="fixed,engine")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    head = {"cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M")}
    print(json.dumps(head), flush=True)
    rows = []
    for _ in range(args.rounds):
        for kind in args.runs.split(","):
            for busy in (0, 1, 2):
                for mode in args.modes.split(","):
                    row = {**one(kind, mode, busy, args.timeout), "cpu_model": head["cpu"]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with args.out.open("a") as f:
                            f.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
