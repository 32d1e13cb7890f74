"""The retraining reading's masked SGD in the features' span against weight space, side by side.

    python benchmarks/retrain_span.py [--widths 1024 4096] [--heads 21] [--epochs 5] [--rounds 3]

``engine.maths.loo.train_masked`` trains k heads (a full run and k − 1 leave-one-out copies, as the
``retrain`` reading and ``retrain-loo`` do) as one batched model. For plain SGD it keeps W = s·W₀ + Cᵀφ
and takes each step as one (B, n)·(n, Σm) product (``in_span``), instead of the weight-space step's
two (B, d)·(d, Σm) products. This times both on MNIST's shapes (n = 200, d = 784, 10 classes, batch
128, the ``network`` preset's lazy SGD), alternated within each round, and prints the median wall and
CPU time of each and their ratio, with the CPU, the threads and the load (a ratio is readable only
beside them). The first call of each is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--heads", type=int, default=21, help="batched heads: 1 full run + 20 tracked points")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    from engine.maths.loo import train_masked
    from engine.maths.models import Net
    from engine.maths.specs import TrainSpec

    n, d, k = 200, 784, args.heads
    g = torch.Generator().manual_seed(0)
    X, y = torch.rand(n, d, generator=g), torch.randint(0, 10, (n,), generator=g)
    keep = torch.ones(k, n, dtype=torch.bool)
    for j in range(1, k):
        keep[j, j] = False
    spec = TrainSpec(epochs=args.epochs, optimizer="sgd", lr=24.0, weight_decay=0.0, loss="mse")
    print(f"{cpu_name()}, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.2f} at the start; "
          f"n = {n}, d = {d}, {k} heads, {args.epochs} epochs of batch {spec.batch_size}")
    print("| m | span wall s | weights wall s | weights ÷ span (wall) | span CPU s | weights CPU s |")
    print("|---|---|---|---|---|---|")
    for m in args.widths:
        net = Net("relu", X, m, 10, seed=1, init="antisymmetric")
        phi = net.features(X).detach()
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(args.rounds + 1):
            for span in ((True, False) if r % 2 == 0 else (False, True)):
                wall, cpu = time.perf_counter(), time.process_time()
                train_masked(phi, y, 10, [net.mlp] * k, keep, spec, in_span=span)
                if r:
                    times[span].append((time.perf_counter() - wall, time.process_time() - cpu))
        med = {s: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for s, v in times.items()}
        print(f"| {m} | {med[True][0]:.2f} | {med[False][0]:.2f} | {med[False][0] / med[True][0]:.1f}× | "
              f"{med[True][1]:.2f} | {med[False][1]:.2f} |")
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
