"""``python -m engine``: the engine without a browser, for scripts, sweeps and cache warming.

Results go to stdout (``--json`` for machine-readable output), progress to stderr.
Exit codes: 0 ok, 2 bad arguments, 3 data missing or corrupt, 130 cancelled.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import pandas as pd

from .cache import Cache
from .data import DataSpec, available_datasets, fetch_dataset, resolve_data_dir
from .errors import EngineError
from .experiments import SpectrumConfig, SweepConfig, run_ntk_sweep, run_spectrum
from .malleability import MalleabilityConfig, run_malleability
from .scaling import ScalingConfig, run_scaling
from .training import TrainSpec


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _jsonable(obj):
    """NaN/inf become null so that stdout is strict JSON."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if obj is pd.NA:
        return None
    return obj


def _records(df: pd.DataFrame) -> list[dict]:
    return _jsonable(df.astype(object).where(df.notna(), None).to_dict(orient="records"))


class _StderrProgress:
    """Prints a stage line to stderr whenever the stage or the whole percent changes."""

    def __init__(self, quiet: bool):
        self.quiet, self.last = quiet, None

    def __call__(self, frac: float, stage: str) -> None:
        key = (int(frac * 100), stage.split(":")[0])
        if not self.quiet and key != self.last:
            self.last = key
            print(f"[{frac * 100:5.1f}%] {stage}", file=sys.stderr, flush=True)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="data set folder (default: $ENGINE_DATA_DIR or the user cache)")
    p.add_argument("--cache-dir", help="result cache folder (default: $ENGINE_CACHE_DIR or ./cache)")
    p.add_argument("--no-cache", action="store_true", help="compute without reading or writing the cache")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _add_data(p: argparse.ArgumentParser, n: int, n_test: int) -> None:
    p.add_argument("--dataset", default="mnist",
                   help="mnist, fashion-mnist, cifar10, synthetic, NAME:A-B for a binary pair, or a .npz path")
    p.add_argument("--n", type=int, default=n, help="training points")
    p.add_argument("--n-test", type=int, default=n_test, help="test points")
    p.add_argument("--seed", type=int, default=0, help="data draw seed (and network seed unless --seeds)")
    p.add_argument("--no-normalize", action="store_true", help="do not l2-normalise rows")
    p.add_argument("--synthetic-d", type=int, default=64)
    p.add_argument("--synthetic-kappa", type=float, default=100.0)
    p.add_argument("--synthetic-decay", default="geometric")


def _add_train(p: argparse.ArgumentParser, epochs: int) -> None:
    p.add_argument("--epochs", type=int, default=epochs, help="0 means no training")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--weight-decay", type=float, default=1e-3)
    p.add_argument("--loss", default="auto", choices=["auto", "ce", "mse"])
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd"],
                   help="adam with coupled L2 decay (paper), adamw, or plain sgd (the NTK setting)")
    p.add_argument("--snapshot-epochs", type=_ints, default=(), help="epochs at which the kernel is measured")


def _data_spec(a) -> DataSpec:
    return DataSpec(dataset=a.dataset, n=a.n, n_test=a.n_test, seed=a.seed, normalize=not a.no_normalize,
                    synthetic_d=a.synthetic_d, synthetic_kappa=a.synthetic_kappa,
                    synthetic_decay=a.synthetic_decay)


def _train_spec(a) -> TrainSpec:
    return TrainSpec(epochs=a.epochs, lr=a.lr, batch_size=a.batch_size, weight_decay=a.weight_decay,
                     loss=a.loss, optimizer=a.optimizer, snapshot_epochs=a.snapshot_epochs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("datasets", help="which data sets are available here and where")
    _add_common(p)
    p.add_argument("--fetch", metavar="NAME", help="download (or unpack) mnist, fashion-mnist or cifar10 first")

    p = sub.add_parser("spectrum", help="Gram spectrum, condition numbers and width thresholds")
    _add_common(p)
    _add_data(p, n=400, n_test=1)
    p.add_argument("--attention", default="linear", help="linear, stacked:K, truncated:R, softmax:T, qkv")
    p.add_argument("--rank-rtol", type=float, default=None, help="numerical rank tolerance relative to λ_max")
    p.add_argument("--eps", type=float, default=0.1, help="ε of the v1 threshold κ⁶/ε²")
    p.add_argument("--growth", type=_ints, default=(), help="prefix sizes for κ against n, e.g. 50,100,200")

    p = sub.add_parser("ntk-sweep", help="kernel and function distance to K∞ across widths")
    _add_common(p)
    _add_data(p, n=400, n_test=200)
    _add_train(p, epochs=0)
    p.add_argument("--widths", type=_ints, default=(16, 64, 256, 1024, 4096))
    p.add_argument("--archs", type=_names, default=("relu", "attn"))
    p.add_argument("--attention", default="linear", help="linear, stacked:K, truncated:R, softmax:T, qkv")
    p.add_argument("--seeds", type=_ints, default=None, help="network seeds (default: --seed)")
    p.add_argument("--init-std", type=float, default=1.0)
    p.add_argument("--ridge", type=float, default=1e-3, help="relative ridge of the NTK regression")

    p = sub.add_parser("malleability", help="influence flip rates under attacks on the training data")
    _add_common(p)
    _add_data(p, n=500, n_test=100)
    _add_train(p, epochs=100)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--archs", type=_names, default=("relu", "attn"))
    p.add_argument("--attention", default="linear", help="linear, stacked:K, truncated:R, softmax:T, qkv")
    p.add_argument("--init-std", type=float, default=1.0)
    p.add_argument("--attack", type=_names, default=("pgd",), help="fgsm, pgd, mim (comma-separated)")
    p.add_argument("--eps", type=float, default=0.05, help="l-inf radius in pixel units")
    p.add_argument("--eps-sweep", type=_floats, default=None, help="several radii, e.g. 0.01,0.05,0.1,0.3")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-size", type=float, default=None, help="default 2.5*eps/steps")
    p.add_argument("--random-start", action="store_true")
    p.add_argument("--momentum", type=float, default=1.0, help="MIM decay")
    p.add_argument("--tau", type=float, default=0.1, help="share of points tracked (top by |influence|)")
    p.add_argument("--ridge", type=float, default=1e-3, help="kernel ridge λ, relative to mean diag K")
    p.add_argument("--perturb", default="top", choices=["top", "all"], help="which training points move")
    p.add_argument("--retrain", action="store_true", help="retrain on the perturbed data before re-measuring")
    p.add_argument("--adversarial-training", action="store_true", help="train on PGD examples")
    p.add_argument("--interventions", action="store_true", help="Curated / Transformed / Adversarial retraining")
    p = sub.add_parser("scaling", help="width needed to stay near K∞ against κ, with the fitted exponent")
    _add_common(p)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--kappas", type=_floats, default=(2.0, 4.0, 8.0, 16.0, 32.0))
    p.add_argument("--decay", default="geometric")
    p.add_argument("--archs", type=_names, default=("relu", "attn"))
    p.add_argument("--attentions", type=_names, default=("linear",), help="e.g. linear,stacked:2,truncated:8")
    p.add_argument("--target", type=float, default=0.1, help="kernel distance to stay within")
    p.add_argument("--measure", default="trained", choices=["trained", "init", "movement"])
    p.add_argument("--min-width", type=int, default=16)
    p.add_argument("--max-width", type=int, default=2**15)
    p.add_argument("--seeds", type=_ints, default=(0,))
    p.add_argument("--seed", type=int, default=0, help="data seed")
    _add_train(p, epochs=50)

    p = sub.add_parser("bench", help="speed figures measured side by side (ratios, not timings)")
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute on a 2-core CPU")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-page", action="store_true", help="skip the dashboard render benchmark")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return parser


def cmd_bench(a, progress) -> dict:
    from . import bench

    return bench.run(quick=a.quick, device=a.device, page=not a.no_page, progress=progress)


def cmd_datasets(a) -> dict:
    if a.fetch:
        print(f"{a.fetch}: files in {fetch_dataset(a.fetch, a.data_dir)}", file=sys.stderr)
    root = resolve_data_dir(a.data_dir)
    infos = available_datasets(a.data_dir)
    return {"data_dir": str(root), "datasets": [vars(i) if hasattr(i, "__dict__") else i._asdict() for i in infos]}


def cmd_spectrum(a, cache, progress) -> dict:
    cfg = SpectrumConfig(data=_data_spec(a), attention=a.attention, rtol=a.rank_rtol, eps=a.eps,
                         growth_ns=a.growth)
    res = run_spectrum(cfg, cache, a.data_dir, a.device, progress)
    out = dict(res.meta["summary"])
    if a.growth:
        out["growth"] = _records(res.frames["growth"])
    out["cached"] = res.cached
    return out


def cmd_ntk_sweep(a, cache, progress) -> dict:
    seeds = a.seeds if a.seeds else (a.seed,)
    cfg = SweepConfig(data=_data_spec(a), widths=a.widths, archs=a.archs, attention=a.attention,
                      seeds=seeds, train=_train_spec(a), init_std=a.init_std, ridge=a.ridge)
    res = run_ntk_sweep(cfg, cache, a.data_dir, a.device, progress)
    out = {"rows": _records(res.frames["rows"]), "meta": res.meta, "cached": res.cached}
    if a.snapshot_epochs:
        out["trajectory"] = _records(res.frames["trajectory"])
    return out


def cmd_malleability(a, cache, progress) -> dict:
    cfg = MalleabilityConfig(
        data=_data_spec(a), archs=a.archs, width=a.width, attention=a.attention, seed=a.seed,
        train=_train_spec(a), init_std=a.init_std, attacks=a.attack, eps=a.eps_sweep or (a.eps,),
        steps=a.steps, step_size=a.step_size, random_start=a.random_start, momentum=a.momentum,
        tau=a.tau, ridge=a.ridge, perturb=a.perturb, retrain=a.retrain,
        adversarial_training=a.adversarial_training, interventions=a.interventions)
    res = run_malleability(cfg, cache, a.data_dir, a.device, progress)
    out = {"rows": _records(res.frames["rows"]), "meta": res.meta, "cached": res.cached}
    if a.interventions:
        out["interventions"] = _records(res.frames["interventions"])
    return out


def cmd_scaling(a, cache, progress) -> dict:
    cfg = ScalingConfig(n=a.n, d=a.d, kappas=a.kappas, decay=a.decay, archs=a.archs, attentions=a.attentions,
                        target=a.target, measure=a.measure, min_width=a.min_width, max_width=a.max_width,
                        seeds=a.seeds, seed=a.seed, train=_train_spec(a))
    res = run_scaling(cfg, cache, None, a.device, progress)
    return {"rows": _records(res.frames["widths"]), "fit": _records(res.frames["fit"]), "cached": res.cached}


COMMANDS = {"spectrum": cmd_spectrum, "ntk-sweep": cmd_ntk_sweep, "malleability": cmd_malleability,
            "scaling": cmd_scaling}


def _print_human(out: dict) -> None:
    if "rows" in out:
        print(pd.DataFrame(out["rows"]).to_string(index=False))
        for extra in ("interventions", "fit"):
            if not out.get(extra):
                continue
            print()
            print(pd.DataFrame(out[extra]).to_string(index=False))
    elif "datasets" in out:
        print(f"data dir: {out['data_dir']}")
        for d in out["datasets"]:
            print(f"  {d['name']:14s} {'yes' if d['available'] else 'no ':4s} {d['where'] or d['reason']}")
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        if a.command == "datasets":
            out = cmd_datasets(a)
        elif a.command == "bench":
            out = cmd_bench(a, _StderrProgress(a.quiet))
        else:
            fn = COMMANDS[a.command]
            cache = None if a.no_cache else Cache(a.cache_dir)
            out = fn(a, cache, _StderrProgress(a.quiet))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    if a.json:
        print(json.dumps(_jsonable(out), indent=None))
    else:
        _print_human(out)
    return 0
