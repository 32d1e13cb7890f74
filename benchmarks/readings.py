"""What each influence reading of ``malleability`` costs, side by side, and the floor of the retraining.

    python benchmarks/readings.py [--dataset mnist] [--widths 64 1024 4096] [--seeds 0 1 2] [--threads 2]

Runs the ``network`` preset (lazy SGD on MSE, antisymmetric init, centred MLP-Attn, ℓ2 PGD; its
n, τ and epochs) three times in fresh processes, alternating: ridge alone, ridge + flow, and ridge
+ flow + retrain, without a cache, and prints each run's wall and CPU time, the ratio of each to
ridge alone, and the engine's estimate beside it. The retraining's floor is its FLOPs (each batched
model's forward and weight-gradient GEMMs over every step: 6 · n · d · Σ heads · m · epochs per
net, the heads being the clean run's 1 + points and 1 + k per attack and null) at this machine's
fp32 GEMM rate of the same shape, measured here: no implementation can retrain faster. The CPU,
the threads and the load are printed with the figures (a number is only readable beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, resource, sys, time
from dataclasses import replace
import torch
from engine.data import DataSpec
from engine.experiments.registry import preset
from engine.experiments.malleability import run_malleability
from engine.experiments.configs.malleability import estimate_malleability
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
cfg = preset("malleability", "network")
cfg = replace(cfg, data=replace(cfg.data, dataset=args["dataset"]), widths=tuple(args["widths"]),
              seeds=tuple(args["seeds"]), readings=tuple(args["readings"]))
t0, c0 = time.perf_counter(), time.process_time()
run_malleability(cfg, data_dir=args["data_dir"])
print(json.dumps({"readings": args["readings"], "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "estimate_s": estimate_malleability(cfg).seconds, "n": cfg.data.n, "k": cfg.n_tracked,
                  "epochs": cfg.train.epochs, "steps": cfg.train.epochs * -(-cfg.data.n // cfg.train.batch_size)}))
"""
GEMM = r"""
import sys, time, torch
b, d, m, threads = (int(v) for v in sys.argv[1:5])
torch.set_num_threads(threads)
x, w = torch.randn(b, d), torch.randn(m, d)
for _ in range(2):
    x @ w.T
t, reps = time.perf_counter(), 5
for _ in range(reps):
    x @ w.T
print(2 * b * d * m * reps / (time.perf_counter() - t))
"""


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--data-dir", default=os.environ.get("ENGINE_DATA_DIR"))
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 1024, 4096])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(f"# {_cpu()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start, {a.threads} threads")
    rows = []
    for readings in (["ridge"], ["ridge", "flow"], ["ridge", "flow", "retrain"]):
        arg = json.dumps({"readings": readings, "threads": a.threads, "dataset": a.dataset, "data_dir": a.data_dir,
                          "widths": a.widths, "seeds": a.seeds})
        out = subprocess.run([sys.executable, "-c", CHILD, arg], cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["wall_s"]
    last = rows[-1]
    d = 784  # MNIST rows; the features keep the input's dimension
    rate = float(subprocess.run([sys.executable, "-c", GEMM, "128", str(d), str(64 * max(a.widths)), str(a.threads)],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    heads = (1 + 2 * last["k"]) + 2 * (1 + last["k"])  # clean (own and the seed null's points), attack, random null
    flops = 6 * last["n"] * d * heads * sum(a.widths) * last["epochs"] * 2 * len(a.seeds)  # × 2 archs
    print(f"# fp32 GEMM rate here {rate / 1e9:.0f} GFLOP/s; retraining floor {flops / rate:.0f} s "
          f"({flops:.2e} FLOP); load {os.getloadavg()[0]:.1f} at the end")
    for r in rows:
        print(f"{'+'.join(r['readings']):22s} wall {r['wall_s']:7.1f} s ({r['wall_s'] / base:4.1f}x ridge)  "
              f"cpu {r['cpu_s']:7.1f} s  estimate {r['estimate_s']:7.1f} s ({r['estimate_s'] / r['wall_s']:.2f}x)")
    print(f"# measured {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
