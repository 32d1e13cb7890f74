"""The paper's whole grid, timed: NTK sweeps and malleability on MNIST- and CIFAR-10-sized
data, 10-class and binary, widths 16 … 4096, FGSM / PGD / MIM.

The data are synthetic at the real sizes (d = 784 and 3072) so that the grid runs where no
data set is present (the GPU machine); pass --dataset-dir to use real files instead.
Prints one JSON object on stdout: seconds per stage and the total. The target on one H200
is under 10 minutes for the full grid; --quick shrinks it for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.data import DataSpec  # noqa: E402
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.malleability import run_malleability
from engine.experiments.sweep import run_ntk_sweep
from engine.maths.specs import TrainSpec


def tasks(args):
    if args.dataset_dir:
        return {"mnist": "mnist", "mnist:3-8": "mnist:3-8", "cifar10": "cifar10",
                "cifar10:automobile-airplane": "cifar10:automobile-airplane"}
    return {"mnist-sized": (784, 10), "mnist-sized binary": (784, 2),
            "cifar10-sized": (3072, 10), "cifar10-sized binary": (3072, 2)}


def spec(task, n, n_test):
    if isinstance(task, str):
        return DataSpec(task, n=n, n_test=n_test)
    d, c = task
    return DataSpec("synthetic", n=n, n_test=n_test, synthetic_d=d, synthetic_kappa=1e3, synthetic_classes=c)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dataset-dir", default=None)
    args = p.parse_args()
    n, n_test, epochs = (200, 50, 5) if args.quick else (1000, 500, 500)
    widths = (16, 64, 256, 1024, 4096)
    timings, t_all = {}, time.perf_counter()
    for name, task in tasks(args).items():
        data = spec(task, n, n_test)
        t0 = time.perf_counter()
        run_ntk_sweep(SweepConfig(data=data, widths=widths, train=TrainSpec(epochs=epochs)),
                      data_dir=args.dataset_dir, device=args.device)
        t1 = time.perf_counter()
        rows = run_malleability(MalleabilityConfig(data=data, width=1024, train=TrainSpec(epochs=min(epochs, 100)),
                                                   attacks=("fgsm", "pgd", "mim"), eps=(0.3,)),
                                data_dir=args.dataset_dir, device=args.device).frames["rows"]
        t2 = time.perf_counter()
        timings[name] = {"ntk_sweep_s": t1 - t0, "malleability_s": t2 - t1,
                         "flip_rates": rows[["arch", "attack", "flip_rate"]].to_dict(orient="records")}
        print(f"{name}: sweep {t1 - t0:.1f} s, malleability {t2 - t1:.1f} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - t_all
    print(f"total {total:.1f} s", file=sys.stderr)
    print(json.dumps({"device": args.device, "n": n, "epochs": epochs, "widths": widths, "tasks": timings,
                      "total_s": total}))


if __name__ == "__main__":
    main()
