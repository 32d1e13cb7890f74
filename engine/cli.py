"""``python -m engine``: the engine without a browser, for scripts, sweeps and cache warming.

Every experiment flag is generated from its config dataclass (``engine.settings``): the
default, bounds, unit and help shown by ``--help`` are the ones the engine validates, and
``--preset quick|paper`` starts from a named instance of the same dataclass. Results go to
stdout (``--json`` for one JSON object), progress to stderr. Exit codes: 0 ok, 2 bad
arguments or over budget, 3 data missing or corrupt, 130 cancelled.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from . import budget as B
from .attacks import AttackSpec
from .cache import Cache
from .data import DataSpec, available_datasets, fetch_dataset, resolve_data_dir
from .errors import EngineError
from .experiments import PRESETS as EXP_PRESETS
from .experiments import SpectrumConfig, SweepConfig, run_ntk_sweep, run_spectrum
from .malleability import PRESETS as MALL_PRESETS
from .malleability import MalleabilityConfig, run_malleability
from .scaling import PRESETS as SCALING_PRESETS
from .scaling import ScalingConfig, run_scaling
from .settings import add_arguments, from_args
from .training import TrainSpec

PRESETS = {kind: dict(p) for kind, p in {**EXP_PRESETS, **MALL_PRESETS, **SCALING_PRESETS}.items()}
NESTED = {"data": DataSpec, "train": TrainSpec, "attack": AttackSpec}


@dataclass(frozen=True)
class Command:
    config: type                  # the config dataclass whose settings are the flags
    run: Callable                 # run_*(cfg, cache, data_dir, device, progress, budget=...)
    preset: str                   # key of its presets in PRESETS
    help: str
    frames: tuple[str, ...]       # result frames printed, the first as "rows"


COMMANDS = {
    "spectrum": Command(SpectrumConfig, run_spectrum, "spectrum",
                        "Gram spectrum, condition numbers and width thresholds", ("growth",)),
    "ntk-sweep": Command(SweepConfig, run_ntk_sweep, "sweep",
                         "kernel and function distances to K∞ across widths, per seed", ("rows", "summary")),
    "malleability": Command(MalleabilityConfig, run_malleability, "malleability",
                            "influence flip rates under attacks on the training data",
                            ("rows", "summary", "interventions", "interventions_summary")),
    "scaling": Command(ScalingConfig, run_scaling, "scaling",
                       "width needed to stay near K∞ against κ, with the fitted exponent",
                       ("widths", "fit", "curve")),
}


def _jsonable(obj):
    """NaN/inf become null so that stdout is strict JSON."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
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


def _values(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _add_config(p: argparse.ArgumentParser, cmd: Command, preset: str) -> None:
    base = PRESETS[cmd.preset].get(preset) or cmd.config()
    p.add_argument("--preset", choices=sorted(PRESETS[cmd.preset]), default=preset,
                   help="start from a named configuration (flags override it)")
    for name, cls in NESTED.items():
        if any(f.name == name for f in dataclasses.fields(cmd.config)):
            add_arguments(p, cls, defaults=_values(getattr(base, name)))
    add_arguments(p, cmd.config, defaults=_values(base))
    p.add_argument("--max-seconds", type=float, default=B.DEFAULT_SECONDS,
                   help=f"refuse runs estimated above this many seconds (default: {B.DEFAULT_SECONDS:g})")
    p.add_argument("--max-gib", type=float, default=None,
                   help="refuse runs estimated above this memory (default: 80%% of available memory)")
    p.add_argument("--estimate", action="store_true", help="print the run's estimated time and memory only")


def build_parser(preset: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("datasets", help="which data sets are available here and where")
    _add_common(p)
    p.add_argument("--fetch", metavar="NAME", help="download (or unpack) mnist, fashion-mnist or cifar10 first")

    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        _add_common(p)
        _add_config(p, cmd, preset if preset in PRESETS[cmd.preset] else "default")

    p = sub.add_parser("bench", help="speed figures measured side by side (ratios, not timings)")
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute on a 2-core CPU")
    p.add_argument("--scale", action="store_true", help="n = 8000 steps against their floors")
    p.add_argument("--estimates", action="store_true", help="run-time estimates against measured runs")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-page", action="store_true", help="skip the dashboard render benchmark")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return parser


for _cmd in COMMANDS.values():  # "default" is the dataclass's own defaults
    PRESETS[_cmd.preset].setdefault("default", _cmd.config())


def config_from_args(cmd: Command, a: argparse.Namespace):
    """The config the parsed flags describe (nested configs built from their own flags)."""
    nested = {name: from_args(cls, a) for name, cls in NESTED.items()
              if any(f.name == name for f in dataclasses.fields(cmd.config))}
    return from_args(cmd.config, a, **nested)


def cmd_bench(a, progress) -> dict:
    from . import bench

    if a.estimates:
        from . import calibration

        return calibration.run(progress=progress)
    return bench.run(quick=a.quick, device=a.device, page=not a.no_page, progress=progress, scale=a.scale)


def cmd_datasets(a) -> dict:
    if a.fetch:
        print(f"{a.fetch}: files in {fetch_dataset(a.fetch, a.data_dir)}", file=sys.stderr)
    root = resolve_data_dir(a.data_dir)
    infos = available_datasets(a.data_dir)
    return {"data_dir": str(root), "datasets": [dataclasses.asdict(i) for i in infos]}


def run_command(name: str, a, progress) -> dict:
    from .calibration import estimate

    cmd = COMMANDS[name]
    cfg = config_from_args(cmd, a)
    est = estimate(cfg)
    if a.estimate:
        return {"estimate_seconds": est.seconds, "estimate_bytes": est.bytes, "describe": est.describe()}
    limit = None if a.max_gib is None else int(a.max_gib * B.GIB)
    cache = None if a.no_cache else Cache(a.cache_dir)
    res = cmd.run(cfg, cache, a.data_dir, a.device, progress, budget=B.Budget(a.max_seconds, limit))
    out = dict(res.meta.get("summary", {})) if name == "spectrum" else {}
    for i, frame in enumerate(cmd.frames):
        df = res.frames.get(frame)
        if df is None or (df.empty and i > 0):
            continue
        out["rows" if i == 0 and name != "spectrum" else frame] = _records(df)
    if name != "spectrum":
        out["meta"] = res.meta
    out["config"] = res.config
    out["provenance"] = getattr(res, "provenance", None)
    out["cached"] = res.cached
    return out


def _print_human(out: dict) -> None:
    if "rows" in out:
        print(pd.DataFrame(out["rows"]).to_string(index=False))
        for extra in ("summary", "interventions", "interventions_summary", "fit"):
            if out.get(extra):
                print(f"\n{extra}:")
                print(pd.DataFrame(out[extra]).to_string(index=False))
    elif "datasets" in out:
        print(f"data dir: {out['data_dir']}")
        for d in out["datasets"]:
            print(f"  {d['name']:14s} {'yes' if d['available'] else 'no ':4s} {d['where'] or d['reason']}")
    else:
        for k, v in out.items():
            if k not in ("config", "provenance"):
                print(f"{k}: {v}")


def _preset_of(argv: list[str]) -> str | None:
    for i, v in enumerate(argv):
        if v == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
        if v.startswith("--preset="):
            return v.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_preset_of(argv))
    a = parser.parse_args(argv)
    try:
        if a.command == "datasets":
            out = cmd_datasets(a)
        elif a.command == "bench":
            out = cmd_bench(a, _StderrProgress(a.quiet))
        else:
            out = run_command(a.command, a, _StderrProgress(a.quiet))
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
