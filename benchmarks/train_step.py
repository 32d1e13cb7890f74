"""One training step and one epoch of the default shapes on one thread: autograd against the
closed-form gradient in float32 and bfloat16, each against bare float32 GEMMs of the same shapes
(issue 36 item 2).

    python benchmarks/train_step.py [--rounds 9] [--epochs 10] [--out FILE.json]

Shapes: n = 200 rows of d = 784 (random in [0, 1], as the bench's training case), the ntk-sweep's
widths 16, 64, 256, 1024, 4096 stacked into one head (Σm = 5456), 10 classes (cross-entropy, so
the block-diagonal readout has k·c = 50 columns), mini-batches of 128 (the quick presets'), Adam
(lr 1e-3, coupled L2 1e-3, fused), torch on one thread.

- ``step``: one batch of 128 rows and the optimiser's step, through the objects
  ``engine.maths.training.optimise`` drives: ``AutogradBatches`` over ``autograd_head`` (the
  reference; in bfloat16 under autocast too) and ``grads.StackedHead``.
- ``epoch``: ``train_many`` over ``--epochs`` epochs less ``train_many`` over none (the setup:
  features, stacking, the loss at init), divided by the epochs: batches of 128 and 72 rows.
- ``gemm``: the step's four GEMMs alone, float32, into buffers they reuse: φ_b Wᵀ (B×784×5456),
  relu(H) A (B×5456×50), G Aᵀ (B×50×5456) and dHᵀ φ_b (5456×B×784).

GFLOP/s count those four GEMMs' FLOPs, 2·B·(2·d·Σm + 2·Σm·k·c) per step; "of GEMM" is the bare
GEMMs' time over the step's (for bfloat16 it may pass 1: its GEMMs are faster than float32's).
Cases alternate within each round, after a warm-up each; medians over rounds of wall time and of
this thread's CPU time (the steadier one beside other work). The CPU model and the load average
before and after are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from engine.maths.grads import StackedHead, autocast
from engine.maths.models import Net
from engine.maths.specs import TrainSpec
from engine.maths.training import OPTIMIZER_FNS, AutogradBatches, autograd_head, targets, train_many

N, D, C, B = 200, 784, 10, 128
WIDTHS = (16, 64, 256, 1024, 4096)
SPEC = TrainSpec(lr=1e-3, weight_decay=1e-3, batch_size=B)  # Adam with coupled L2, the paper's


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def gemm_flops(rows: int, m: int, cols: int) -> float:
    return 2.0 * rows * (2 * D * m + 2 * m * cols)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.rand(N, D, generator=g), torch.randint(0, C, (N,), generator=g)


def stacked(X):
    nets = [Net("relu", X, w, C, seed=0) for w in WIDTHS]
    with torch.no_grad():
        phi = nets[0].features(X)
    W = torch.nn.Parameter(torch.cat([net.mlp.W.detach() for net in nets]))
    return phi, W, torch.block_diag(*[net.mlp.readout() for net in nets])


def step_fn(kind: str, precision: str, X, y):
    """One batch and one optimiser step of ``kind`` (autograd or closed) at ``precision``."""
    phi, W, A = stacked(X)
    spec = replace(SPEC, train_precision=precision)
    opt = OPTIMIZER_FNS[spec.optimizer]([W], lr=spec.lr, weight_decay=spec.weight_decay)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    batches: StackedHead | AutogradBatches
    if kind == "closed":
        batches = StackedHead(phi, y, targets(y, C), W, A, len(WIDTHS), "ce", C, None, precision)
    else:
        batches = AutogradBatches(autograd_head(phi, y, W, A, len(WIDTHS), "ce", C),
                                  lambda: opt.zero_grad(set_to_none=False), None, autocast(precision, "cpu"), W.dtype)
    batches.epoch(order)

    def run():
        batches.step(0, B)
        opt.step()
    return run


def epoch_fns(gradient: str, precision: str, X, y, epochs: int):
    spec = replace(SPEC, train_precision=precision)

    def run(e):
        nets = [Net("relu", X, w, C, seed=0) for w in WIDTHS]
        t = time.perf_counter(), time.thread_time()
        train_many(nets, X, y, C, replace(spec, epochs=e), gradient=gradient)
        return time.perf_counter() - t[0], time.thread_time() - t[1]
    return (lambda: run(epochs)), (lambda: run(0))


def bare_gemms(rows: int):
    """The step's four float32 GEMMs at batch ``rows``, into reused buffers."""
    g = torch.Generator().manual_seed(2)
    m, cols = sum(WIDTHS), len(WIDTHS) * C
    phi, W, A = torch.rand(rows, D, generator=g), torch.randn(m, D, generator=g), torch.randn(m, cols, generator=g)
    H, out, G = torch.empty(rows, m), torch.empty(rows, cols), torch.randn(rows, cols, generator=g)
    dR, dW = torch.empty(rows, m), torch.empty(m, D)

    def run():
        torch.mm(phi, W.T, out=H)
        torch.mm(H, A, out=out)
        torch.mm(G, A.T, out=dR)
        torch.mm(dR.T, phi, out=dW)
    return run


def timed(fn):
    t = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - t[0], time.thread_time() - t[1]


def median(pairs):
    return statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    torch.set_num_threads(1)
    X, y = data()
    load0 = os.getloadavg()
    cases = [("autograd", "float32"), ("closed", "float32"), ("closed", "bfloat16"), ("autograd", "bfloat16")]
    steps = {f"{k} {pr}": step_fn(k, pr, X, y) for k, pr in cases}
    steps["gemm"] = bare_gemms(B)
    tails = bare_gemms(N - B)
    epochs = {f"{k} {pr}": epoch_fns(k, pr, X, y, a.epochs) for k, pr in cases}
    st: dict[str, list] = {k: [] for k in steps}
    ep: dict[str, list] = {k: [] for k in epochs}
    ep["gemm"] = []
    for fn in steps.values():
        fn()
    for r in range(a.rounds + 1):  # round 0 warms up the epochs
        for k, fn in steps.items():
            st[k].append(timed(fn))
        for k, (full, none) in epochs.items():
            (w1, c1), (w0, c0) = full(), none()
            ep[k].append(((w1 - w0) / a.epochs, (c1 - c0) / a.epochs))
        ep["gemm"].append(tuple(x + z for x, z in zip(timed(steps["gemm"]), timed(tails), strict=True)))
        if r == 0:
            for v in (*st.values(), *ep.values()):
                v.clear()
    load1 = os.getloadavg()
    m = sum(WIDTHS)
    flops = {"step": gemm_flops(B, m, len(WIDTHS) * C), "epoch": gemm_flops(N, m, len(WIDTHS) * C)}
    rows = []
    for what, table in (("step", st), ("epoch", ep)):
        gw, gc = median(table["gemm"])
        for k, v in table.items():
            w, c = median(v)
            rows.append({"what": what, "case": k, "ms": 1e3 * w, "cpu_ms": 1e3 * c, "gflops": flops[what] / w / 1e9,
                         "gflops_cpu": flops[what] / c / 1e9, "of_gemm": gw / w, "of_gemm_cpu": gc / c,
                         "speedup_vs_autograd_cpu": median(table["autograd float32"])[1] / c})
    head = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in load1],
            "rounds": a.rounds, "epochs": a.epochs, "shapes": {"n": N, "d": D, "widths": WIDTHS, "classes": C, "batch": B}}
    print(json.dumps(head))
    print(f"{'':6} {'case':18} {'ms':>7} {'cpu ms':>7} {'GFLOP/s':>8} {'(cpu)':>7} {'of GEMM':>8} {'(cpu)':>6} {'× autograd':>10}")
    for r in rows:
        print(f"{r['what']:6} {r['case']:18} {r['ms']:7.2f} {r['cpu_ms']:7.2f} {r['gflops']:8.1f} {r['gflops_cpu']:7.1f} "
              f"{r['of_gemm']:8.2f} {r['of_gemm_cpu']:6.2f} {r['speedup_vs_autograd_cpu']:10.2f}")
    if a.out:
        a.out.write_text(json.dumps({**head, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
