"""The empirical NTK on each count path side by side: the measured choice against fp32 counts (issue 36 item 4).

    python benchmarks/count_path.py [--tree DIR ...] [--n 1000 4000] [--m 256 1024 4096]
                                    [--threads 1 2] [--rounds 5] [--out rows.jsonl]

For each tree, thread count and (n, m), one fresh process that imports that tree's engine
computes the closed-form eNTK (``empirical_ntk_features``, float32 rows of
``engine.bench.cases.entk_case``, d = 784) with ``ENGINE_COUNT_DTYPE`` = ``auto`` (the measured
choice), ``float32`` and ``int8`` in turn: one warm-up call each (the probe runs there), then
``--rounds`` rounds alternating the three, medians of wall and CPU time. A row gives each
path's time over float32's in the same process (target: ``auto`` at most 1.05 at every n and
m), the path ``auto`` took and the probe's rates at that tile. The kernels of the three paths
are compared bit for bit. Pass an older checkout as a second ``--tree`` (e.g. ``git archive
HEAD engine | tar -x -C /tmp/before``) for a before/after pair; trees alternate per (n, m).

``--tiles`` times one 500 x 2000 tile of this tree's count path instead (one thread, CPU time,
alternately, medians): each path's GEMM alone, the GEMM with the shipped conversion
(``count_product``) and with the old one (the float64 tile multiplied by the int32 or float32
counts, one mixed-dtype pass), so the conversion's cost shows beside the GEMM's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

PATHS = ("auto", "float32", "int8")
CHILD = r"""
import json, os, statistics, sys, time
import torch
n, m, threads, rounds, paths = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
torch.set_num_threads(threads)
from engine.bench.cases import entk_case
from engine.maths import counts
from engine.maths.ntk import empirical_ntk_features
phi, head = entk_case(n, m, 784, torch.device("cpu"))
kernels, times = {}, {p: {"wall": [], "cpu": []} for p in paths}
for p in paths:  # warm-up: the probe times the tile's paths in the first call
    os.environ[counts.COUNT_ENV] = p
    kernels[p] = empirical_ntk_features(head, phi)
for _ in range(rounds):
    for p in paths:
        os.environ[counts.COUNT_ENV] = p
        w, c = time.perf_counter(), time.process_time()
        empirical_ntk_features(head, phi)
        times[p]["wall"].append(time.perf_counter() - w)
        times[p]["cpu"].append(time.process_time() - c)
os.environ[counts.COUNT_ENV] = "auto"
report = counts.count_path_report("cpu")
out = {p: {k: statistics.median(v) for k, v in t.items()} for p, t in times.items()}
out["same_bits"] = all(torch.equal(kernels[p], kernels["float32"]) for p in paths)
out["shapes"] = report.get("shapes", {})
out["base_choice"] = report["count_dtype"]
print(json.dumps(out))
"""


TILES = r"""
import json, statistics, sys, time
import torch
from engine.maths.counts import count_product, gemm_counts
torch.set_num_threads(1)
rows, cols, rounds = 500, 2000, int(sys.argv[1])
g = torch.Generator().manual_seed(0)
G = torch.rand(rows, cols, generator=g)
out = torch.empty(rows, cols, dtype=torch.float64)
for m in map(int, sys.argv[2:]):
    S1 = torch.randint(0, 2, (rows, m), generator=g, dtype=torch.int8)
    S2 = torch.randint(0, 2, (cols, m), generator=g, dtype=torch.int8)
    row = {"m": m}
    for name, dtype in (("float32", torch.float32), ("int8", torch.int8)):
        a, b, work = S1.to(dtype), S2.to(dtype), {}
        fns = {"gemm": lambda: gemm_counts(a, b), "shipped": lambda: count_product(G, a, b, out, work),
               "old": lambda: out.copy_(G).mul_(gemm_counts(a, b)).div_(m)}
        t = {k: [] for k in fns}
        for f in fns.values():
            f()
        for _ in range(rounds):
            for k, f in fns.items():
                c = time.thread_time()
                f()
                t[k].append(time.thread_time() - c)
        row[name] = {k: statistics.median(v) for k, v in t.items()}
    print(json.dumps(row), flush=True)
"""


def tiles(widths: list[int], rounds: int, sink) -> None:
    out = subprocess.run([sys.executable, "-c", TILES, str(rounds), *map(str, widths)], capture_output=True,
                         text=True, timeout=1800, cwd=Path(__file__).resolve().parents[1])
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    print("one 500 x 2000 tile, 1 thread, CPU ms: GEMM alone, + the shipped conversion, + the old one")
    for line in out.stdout.splitlines():
        r = json.loads(line)
        if sink:
            sink.write(json.dumps({"tile": "500 x 2000", "threads": 1, "load": os.getloadavg()[0], **r}) + "\n")
        print(f"m {r['m']:5d}  " + "  ".join(
            f"{k}: GEMM {v['gemm'] * 1e3:6.2f}, shipped +{(v['shipped'] - v['gemm']) * 1e3:5.2f}, "
            f"old +{(v['old'] - v['gemm']) * 1e3:5.2f}" for k, v in r.items() if k != "m"), flush=True)


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    simd = [f for f in flags if f.startswith(("avx", "amx")) or f in ("fma",)]
    return {"cpu": model, "simd": simd, "cores": os.cpu_count(), "load": os.getloadavg()}


def measure(tree: Path, n: int, m: int, threads: int, rounds: int) -> dict:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(m), str(threads), str(rounds), *PATHS],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"{tree}: n = {n}, m = {m}, threads = {threads} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, action="append", help="a checkout (default: this one)")
    p.add_argument("--n", type=int, nargs="+", default=[1000, 4000])
    p.add_argument("--m", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, help="append a machine line and one JSON line per row")
    p.add_argument("--tiles", action="store_true", help="time one tile's GEMM and conversions instead")
    a = p.parse_args()
    trees = [t.resolve() for t in (a.tree or [Path(__file__).resolve().parents[1]])]
    sink = a.out.open("a") if a.out else None
    if sink:
        sink.write(json.dumps({"machine": machine()}) + "\n")
    print(machine())
    if a.tiles:
        tiles(a.m, a.rounds, sink)
        return
    print("ratios: each path's median time / float32's, CPU time (wall)")
    for threads in a.threads:
        for n in a.n:
            for m in a.m:
                for t in trees:
                    r = measure(t, n, m, threads, a.rounds)
                    row = {"tree": str(t), "n": n, "m": m, "threads": threads, "load": os.getloadavg()[0], **r}
                    if sink:
                        sink.write(json.dumps(row) + "\n")
                        sink.flush()
                    fp = r["float32"]
                    ratio = "  ".join(f"{k} {r[k]['cpu'] / fp['cpu']:.2f} ({r[k]['wall'] / fp['wall']:.2f})"
                                      for k in PATHS if k != "float32")
                    took = next((v["fastest"] for k, v in r["shapes"].items() if f" {m} @ " in k), r["base_choice"])
                    print(f"threads {threads}  n {n:5d}  m {m:5d}  {t.name:>10}: fp32 {fp['cpu'] * 1e3:7.1f} ms CPU  "
                          f"{ratio}  auto took {took}  same bits {r['same_bits']}", flush=True)


if __name__ == "__main__":
    main()
