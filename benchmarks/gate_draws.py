"""Does a lazy protocol train on every data draw? The training gate over many draws (issue 41 item 3).

    python benchmarks/gate_draws.py [--draws 0-7] [--widths 64,1024,4096] [--protocols 20x16,40x24]
                                    [--seeds 0,1,2] [--out FILE.jsonl]

For each protocol (EPOCHSxLR of plain SGD on MSE, antisymmetric init, as the malleability ``network``
preset and ``retrain-loo`` train), each data draw of 200 MNIST digits (100 test), each width and network
seed, both nets (2L-ReLU and centred MLP-Attn) are trained on the clean data and put through the
training gate (``engine.maths.gates.passes_gate``: test accuracy within 10 points of ridge regression
with the net's own trained K_m) exactly as ``engine.experiments.malleability.measure_cell`` does. One
JSON line per net, then a table of the share of nets through the gate per (protocol, arch, width),
with the worst draw. No attack is run: the gate depends on the clean training alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ints(text: str) -> list[int]:
    if "-" in text and "," not in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(v) for v in text.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", default="0-7")
    ap.add_argument("--widths", default="64,1024,4096")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--protocols", default="40x24", help="EPOCHSxLR,… of lazy SGD on MSE")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from engine.bench.timing import machine_info
    from engine.experiments.configs.malleability import PRESETS
    from engine.experiments.influence import clean_run, in_space, ntk_accuracy
    from engine.experiments.malleability import train_net
    from engine.experiments.recipes import net_recipe, reading_of
    from engine.experiments.runs import prepare

    base = PRESETS["malleability"]["network"]
    out = open(args.out, "a") if args.out else None
    rows = []
    print(json.dumps({"machine": machine_info(), "load": os.getloadavg()[0]}), flush=True)
    for proto in args.protocols.split(","):
        epochs, lr = proto.split("x")
        for ds in _ints(args.draws):
            cfg = replace(base, data=replace(base.data, seed=ds, dataset="mnist"), widths=tuple(_ints(args.widths)),
                          seeds=tuple(_ints(args.seeds)), train=replace(base.train, epochs=int(epochs), lr=float(lr)))
            p = prepare(cfg.data, os.environ.get("ENGINE_DATA_DIR"), "cpu", None, None)
            X32, Xt32, box = in_space(cfg, p)
            X, Xt = X32.double(), Xt32.double()
            ridge = reading_of(cfg, "ridge")
            for arch in cfg.archs:
                for width in cfg.widths:
                    ntk_acc = ntk_accuracy(net_recipe(cfg, arch, width, 0), ridge, X, Xt, p.Y, p.yt, p.c, p.device)
                    for seed in cfg.seeds:
                        t0 = time.perf_counter()
                        t = train_net(cfg, p, net_recipe(cfg, arch, width, seed), X32, box)
                        _, row, _ = clean_run(ridge, t.net32, t.net, X32, Xt32, X, Xt, p, ntk_acc)
                        rec = {"protocol": proto, "draw": ds, "arch": arch, "width": width, "seed": seed,
                               "train_acc": row["train_acc"], "test_acc": row["test_acc"],
                               "test_acc_kernel": row["test_acc_kernel"], "trained": row["trained"],
                               "seconds": round(time.perf_counter() - t0, 2)}
                        rows.append(rec)
                        line = json.dumps(rec)
                        print(line, flush=True)
                        if out:
                            out.write(line + "\n")
                            out.flush()
            del p
            torch.set_num_threads(torch.get_num_threads())
    import pandas as pd

    df = pd.DataFrame(rows)
    table = df.groupby(["protocol", "arch", "width"]).agg(nets=("trained", "size"), passed=("trained", "mean"),
                                                          test=("test_acc", "mean"), kernel=("test_acc_kernel", "mean"))
    worst = df.groupby(["protocol", "arch", "width", "draw"])["trained"].mean().groupby(level=[0, 1, 2]).min()
    table["worst_draw_share"] = worst
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
