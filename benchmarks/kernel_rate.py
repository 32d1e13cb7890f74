"""A kernel as a fraction of its GEMM rate, for one or more checkouts side by side.

    python benchmarks/kernel_rate.py [--kernel kinf|entk] [--tree DIR ...] [--n 300 1000 4000 8000]
                                     [--m 1024 4096] [--threads 1 2] [--rounds 3] [--d 784]

Each (tree, n, m, threads) is measured in a fresh process that imports that tree's engine,
on n ℓ2-normalised random rows (d = 784), against a reference 2048³ GEMM into a buffer it
reuses (so its rate has no page faults in it; the kernel's fresh K does), run alternately (a
warm-up each, then 5 pairs at n ≤ 1000 and 3 above), medians of wall and of CPU time. The
fraction counts the FLOPs the kernel needs at the GEMM's rate:

- ``kinf``: K∞ (``infinite_ntk``, float64 rows) against the float64 GEMM; half of X Xᵀ,
  n²·d FLOPs: fraction = n²·d / t(K∞) / (2·2048³ / t(GEMM)).
- ``entk``: the closed-form empirical NTK at width m (``empirical_ntk_features``, float32
  rows, the net of ``engine.bench.cases.entk_case``) against the float32 GEMM; the FLOPs of
  ``engine.bench.cases.entk_flops`` (Φ Wᵀ, half of S Sᵀ, half of Φ Φᵀ). ``--m`` applies here.

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
kernel, n, m, d, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
if kernel == "kinf":
    from engine.maths.kinf import infinite_ntk
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X /= X.norm(dim=1, keepdim=True)
    run, flops, dtype = (lambda: infinite_ntk(X)), float(n * n * d), torch.float64  # half of X Xᵀ
else:
    from engine.bench.cases import entk_case, entk_flops
    from engine.maths.ntk import empirical_ntk_features
    phi, head = entk_case(n, m, d, torch.device("cpu"))
    run, flops, dtype = (lambda: empirical_ntk_features(head, phi)), entk_flops(n, m, d), torch.float32
M = torch.randn(2048, 2048, generator=g, dtype=dtype)
O = torch.empty_like(M)  # the reference writes into memory already faulted in: the GEMM's own rate
fns = {"kernel": run, "gemm": lambda: torch.mm(M, M, out=O)}
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
    t_k, t_g = (statistics.median(times[k][clock]) for k in ("kernel", "gemm"))
    out[clock] = flops / t_k / (2 * 2048**3 / t_g)
out["kernel_seconds"] = statistics.median(times["kernel"]["wall"])
out["gemm_gflops"] = 2 * 2048**3 / statistics.median(times["gemm"]["wall"]) / 1e9
print(json.dumps(out))
"""


def measure(tree: Path, kernel: str, n: int, m: int, d: int, threads: int) -> dict:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", CHILD, kernel, str(n), str(m), str(d), str(threads)], cwd=tree,
                         env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise SystemExit(f"{tree}: {kernel} n = {n}, m = {m}, threads = {threads} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", choices=("kinf", "entk"), default="kinf")
    p.add_argument("--tree", type=Path, action="append", help="a checkout (default: this one)")
    p.add_argument("--n", type=int, nargs="+", default=[300, 1000, 4000, 8000])
    p.add_argument("--m", type=int, nargs="+", default=[1024, 4096], help="widths (entk only)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--d", type=int, default=784)
    p.add_argument("--json", action="store_true", help="one JSON line per (tree, n, threads)")
    a = p.parse_args()
    trees = [t.resolve() for t in (a.tree or [Path(__file__).resolve().parents[1]])]
    widths = a.m if a.kernel == "entk" else [0]
    for threads in a.threads:
        for n in a.n:
            for m in widths:
                runs = {t: [] for t in trees}
                for _ in range(a.rounds):
                    for t in trees:
                        runs[t].append(measure(t, a.kernel, n, m, a.d, threads))
                for t in trees:
                    row = {k: statistics.median(r[k] for r in runs[t]) for k in runs[t][0]}
                    size = {"n": n, **({"m": m} if a.kernel == "entk" else {})}
                    if a.json:
                        print(json.dumps({"kernel": a.kernel, "tree": str(t), **size, "threads": threads, **row}),
                              flush=True)
                    else:
                        print(f"{a.kernel} threads {threads}  " + "  ".join(f"{k} {v:5d}" for k, v in size.items())
                              + f"  {t.name:>12}: {row['cpu']:.2f} of the GEMM (wall {row['wall']:.2f}; "
                              f"kernel {row['kernel_seconds'] * 1e3:.1f} ms, GEMM {row['gemm_gflops']:.0f} GFLOP/s)",
                              flush=True)


if __name__ == "__main__":
    main()
