"""K∞ (``infinite_ntk``) as a fraction of the float64 GEMM rate, for one or more checkouts side by side.

    python benchmarks/kinf_rate.py [--tree DIR ...] [--n 300 1000 4000 8000] [--threads 1 2]
                                   [--rounds 3] [--d 784]

Each (tree, n, threads) is measured in a fresh process that imports that tree's engine: K∞ of
n ℓ2-normalised random rows (d = 784, float64) and the reference, a 2048³ float64 GEMM into a
buffer it reuses (so its rate has no page faults in it; K∞'s fresh K does), run
alternately (a warm-up each, then 5 pairs at n ≤ 1000 and 3 above), medians of wall and of
CPU time. The fraction counts the FLOPs K∞ needs, half of X Xᵀ (n²·d), at the GEMM's rate:

    fraction = n²·d / t(K∞) / (2·2048³ / t(GEMM)).

Trees are measured in turn, ``--rounds`` times over (a load that comes and goes hits each
alike); the table gives the median over rounds. The default tree is this checkout; pass a
worktree of an older commit as a second ``--tree`` for a before/after pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, math, statistics, sys, time
import torch
n, d, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
from engine.maths.kinf import infinite_ntk
g = torch.Generator().manual_seed(0)
X = torch.randn(n, d, generator=g, dtype=torch.float64)
X /= X.norm(dim=1, keepdim=True)
M = torch.randn(2048, 2048, generator=g, dtype=torch.float64)
O = torch.empty_like(M)  # the reference writes into memory already faulted in: the GEMM's own rate
fns = {"kinf": lambda: infinite_ntk(X), "gemm": lambda: torch.mm(M, M, out=O)}
times = {k: {"wall": [], "cpu": []} for k in fns}
for k, f in fns.items():
    f()
for _ in range(5 if n <= 1000 else 3):
    for k, f in fns.items():
        w, c = time.perf_counter(), time.process_time()
        f()
        times[k]["wall"].append(time.perf_counter() - w)
        times[k]["cpu"].append(time.process_time() - c)
out = {}
for clock in ("wall", "cpu"):
    t_k, t_g = (statistics.median(times[k][clock]) for k in ("kinf", "gemm"))
    out[clock] = n * n * d / t_k / (2 * 2048**3 / t_g)
out["kinf_seconds"] = statistics.median(times["kinf"]["wall"])
out["gemm_gflops"] = 2 * 2048**3 / statistics.median(times["gemm"]["wall"]) / 1e9
print(json.dumps(out))
"""


def measure(tree: Path, n: int, d: int, threads: int) -> dict:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(d), str(threads)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise SystemExit(f"{tree}: n = {n}, threads = {threads} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, action="append", help="a checkout (default: this one)")
    p.add_argument("--n", type=int, nargs="+", default=[300, 1000, 4000, 8000])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--d", type=int, default=784)
    p.add_argument("--json", action="store_true", help="one JSON line per (tree, n, threads)")
    a = p.parse_args()
    trees = [t.resolve() for t in (a.tree or [Path(__file__).resolve().parents[1]])]
    for threads in a.threads:
        for n in a.n:
            runs = {t: [] for t in trees}
            for _ in range(a.rounds):
                for t in trees:
                    runs[t].append(measure(t, n, a.d, threads))
            for t in trees:
                row = {k: statistics.median(r[k] for r in runs[t]) for k in runs[t][0]}
                if a.json:
                    print(json.dumps({"tree": str(t), "n": n, "threads": threads, **row}), flush=True)
                else:
                    print(f"threads {threads}  n {n:5d}  {t.name:>12}: {row['cpu']:.2f} of the GEMM "
                          f"(wall {row['wall']:.2f}; K∞ {row['kinf_seconds'] * 1e3:.1f} ms, "
                          f"GEMM {row['gemm_gflops']:.0f} GFLOP/s)", flush=True)


if __name__ == "__main__":
    main()
