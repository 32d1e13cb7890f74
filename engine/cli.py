"""``python -m engine``: the engine without a browser, for scripts, sweeps and cache warming.

Every experiment of ``engine.experiments.registry.EXPERIMENTS`` is a command of the same name, and its
flags are generated from its config dataclass (``engine.runtime.settings``): the
default, bounds, unit and help shown by ``--help`` are the ones the engine validates, and
``--preset quick|paper`` starts from a named instance of the same dataclass. Results go to
stdout (``--json`` for one JSON object), progress to stderr. Exit codes: 0 ok, 2 bad
arguments or over budget, 3 data missing or corrupt, 130 cancelled.

Building the parser, ``--help``, a refused value and ``--estimate``'s arithmetic load no torch,
numpy or pandas (the configs and estimates are torch-free, ``engine.experiments.configs``); a
command imports what it computes with when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from . import doctor
from .experiments.registry import EXPERIMENTS, NESTED, Experiment, get
from .reporting import report
from .runtime import budget as B, memory
from .runtime.errors import EngineError
from .runtime.settings import add_arguments, from_args
from .runtime.stream import jsonable, landing, records


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
    p.add_argument("--cache-dir", help="result cache folder (default: $ENGINE_CACHE_DIR, else ./cache in a checkout "
                   "or ~/.cache/influence-malleability/results when installed)")
    p.add_argument("--no-cache", action="store_true", help="compute without reading or writing the cache")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _values(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _add_config(p: argparse.ArgumentParser, exp: Experiment, preset: str | None) -> None:
    preset = preset if preset in exp.presets else "default"
    base = exp.presets[preset]
    p.add_argument("--preset", choices=sorted(exp.presets), default=preset,
                   help="start from a named configuration (flags override it)")
    for name in exp.nested:
        add_arguments(p, NESTED[name], defaults=_values(getattr(base, name)))
    add_arguments(p, exp.config, defaults=_values(base))
    p.add_argument("--max-seconds", type=float, default=B.DEFAULT_SECONDS,
                   help=f"refuse runs estimated above this many seconds (default: {B.DEFAULT_SECONDS:g})")
    p.add_argument("--max-gib", type=float, default=None,
                   help="refuse runs estimated above this memory (default: 80%% of available memory)")
    p.add_argument("--estimate", action="store_true", help="print the run's estimated time and memory only")
    p.add_argument("--stream", action="store_true", help="JSON lines on stdout: each finished unit's rows as it "
                   "lands ({\"unit\", \"rows\"}), then the --json object")


def build_parser(preset: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("datasets", help="which data sets are available here and where")
    _add_common(p)
    p.add_argument("--fetch", metavar="NAME", help="download (or unpack) mnist, fashion-mnist or cifar10 first")

    for name, exp in EXPERIMENTS.items():  # one command per registry record, flags from its config
        p = sub.add_parser(name, help=exp.help, description=exp.help)
        _add_common(p)
        _add_config(p, exp, preset)

    p = sub.add_parser("bench", help="speed figures measured side by side (ratios, not timings)")
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute on a 2-core CPU")
    p.add_argument("--scale", action="store_true", help="n = 8000 steps against their floors")
    p.add_argument("--estimates", action="store_true", help="each experiment's dashboard default (quick preset): "
                   "the command line's estimate against the run's wall time, each in a fresh process")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-page", action="store_true", help="skip the dashboard render benchmark")
    p.add_argument("--out", metavar="FILE", help="append each part's row to this JSON-lines file as it is measured")
    p.add_argument("--peer", choices=["neural-tangents"], help="also time neural-tangents' empirical NTK "
                   "(the Python in $ENGINE_NT_PYTHON; skipped with its reason otherwise)")
    p.add_argument("--timeout", type=float, metavar="S", help="seconds per part (default 300 quick, 1200 full)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    _add_grid(sub)  # the grid command: see its block at the end of this file
    _add_figure(sub, preset)  # the figure command: see the figures block
    doctor.add_parser(sub)  # device, memory and two kernel timings (engine.doctor)
    report.add_parser(sub)  # a grid spec's flip rates as the README's tables (engine.reporting.report)
    return parser


def config_from_args(exp: Experiment, a: argparse.Namespace):
    """The config the parsed flags describe (nested configs built from their own flags)."""
    nested = {name: from_args(NESTED[name], a) for name in exp.nested}
    return from_args(exp.config, a, **nested)


def cmd_bench(a, progress) -> dict:
    from . import bench

    if a.estimates:
        from .experiments import calibration

        return calibration.run(progress=progress, out=a.out)
    return bench.run(quick=a.quick, device=a.device, page=not a.no_page, progress=progress, scale=a.scale,
                     out=a.out, peer=a.peer, timeout=a.timeout)


def cmd_datasets(a) -> dict:
    from .data import available_datasets, fetch_dataset, resolve_data_dir

    if a.fetch:
        print(f"{a.fetch}: files in {fetch_dataset(a.fetch, a.data_dir)}", file=sys.stderr)
    root = resolve_data_dir(a.data_dir)
    infos = available_datasets(a.data_dir)
    return {"data_dir": str(root), "datasets": [dataclasses.asdict(i) for i in infos]}


def _estimate_only(exp: Experiment, cfg, device: str = "cpu") -> dict:
    """The estimate on the reference CPU and as seconds here now, for a run in its own process on
    the device it would go to (``engine.runtime.speed.seconds_here``: this machine's speed now on
    the threads the run would get, plus its imports). No torch is loaded where no GPU can be there
    (``engine.runtime.device.device_type``) and this machine's calibration holds: the factor is
    then a numpy GEMM's converted by it (``engine.runtime.gemm``), or ``$ENGINE_SPEED_FACTOR``."""
    from .runtime.device import device_type
    from .runtime.speed import seconds_here

    est = exp.estimate(cfg)
    images = str(getattr(getattr(cfg, "data", None), "dataset", "")).split(":")[0].lower() in B.TORCHVISION_DECODES
    here = seconds_here(est.seconds, device_type(device), images)
    on = "" if here["threads"] is None else f" on {here['threads']} thread(s)"
    return {"estimate_seconds": est.seconds, "estimate_bytes": est.bytes, **here,
            "describe": f"{B.Estimate(here['estimate_seconds_here'], est.bytes).describe()} at this machine's "
                        f"speed now ({here['speed_factor']:.2g}× the reference CPU's {B.duration(est.seconds)}{on}, "
                        f"and {here['import_seconds']:.1f} s of imports)"}


def _run(exp: Experiment, cfg, a, progress):
    from .runtime.cache import Cache

    limit = None if a.max_gib is None else B.gib_limit(a.max_gib)  # NaN, inf, 1e300: one line, exit 2
    budget = B.Budget(B.seconds_limit(a.max_seconds), limit)
    cache = None if a.no_cache else Cache(a.cache_dir)
    listen = (lambda unit, rows: print(json.dumps(jsonable({"unit": unit, "rows": rows})), flush=True)) \
        if getattr(a, "stream", False) else None
    with landing(listen):
        return exp.run(cfg, cache, a.data_dir, a.device, progress, budget=budget)


def run_command(name: str, a, progress) -> dict:
    exp = get(name)
    cfg = config_from_args(exp, a)
    if a.estimate:
        return _estimate_only(exp, cfg, a.device)
    res = _run(exp, cfg, a, progress)
    out = dict(res.meta.get("summary", {})) if name == "spectrum" else {}
    for i, frame in enumerate(exp.tables):  # --json: every frame the pages draw, each under its own name
        df = res.frames.get(frame)
        if df is not None and not (df.empty and i > 0):
            alias = i == 0 and name != "spectrum" and not ((a.json or a.stream) and "rows" in res.frames)
            out["rows" if alias else frame] = records(df)
    if a.json or a.stream:
        out.update({frame: records(df) for frame, df in res.frames.items() if frame not in out})
    if name != "spectrum":
        out["meta"] = res.meta
    out["config"] = res.config
    out["provenance"] = getattr(res, "provenance", None)
    out["cached"] = res.cached
    return out


def _print_human(out: dict) -> None:
    if "rows" in out:
        import pandas as pd

        print(pd.DataFrame(out["rows"]).to_string(index=False))
        for extra in ("summary", "verdict", "interventions", "interventions_summary", "fit"):
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
    memory.keep_freed_blocks()  # an entry point: the process's allocator is ours to tune (ENGINE_MALLOC_KEEP)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_preset_of(argv))
    a = parser.parse_args(argv)
    if a.command == "grid":  # its own output and exit codes (4: some cells failed)
        return cmd_grid(a)
    if a.command == "doctor":  # prints its own report (human lines or --json)
        return doctor.command(a)
    if a.command == "report":  # Markdown on stdout
        return report.command(a)
    try:
        if a.command == "datasets":
            out = cmd_datasets(a)
        elif a.command == "bench":
            out = cmd_bench(a, _StderrProgress(a.quiet))
        elif a.command == "figure":
            out = cmd_figure(a, _StderrProgress(a.quiet))
        else:
            out = run_command(a.command, a, _StderrProgress(a.quiet))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    if a.json or getattr(a, "stream", False):
        print(json.dumps(jsonable(out), indent=None))
    else:
        _print_human(out)
    return 0


# ---------------------------------------------------------------- grid (engine.grid.driver)

def _add_grid(sub) -> None:
    """``grid SPEC.toml``: every cell of a grid spec into the cache, on local processes or Ray."""
    p = sub.add_parser("grid", help="run every cell of a grid spec (TOML) into the cache, locally or on Ray",
                       description="Run every cell of a grid spec (grids/*.toml) and write each result into "
                                   "the cache; cells already there are not recomputed. Exit codes: 0 all "
                                   "cells ok, 4 some failed (listed; the others are kept), 2 bad spec.")
    p.add_argument("spec", help="grid spec file, e.g. grids/quick.toml")
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local: a pool of worker processes here (default); ray: one task per cell on a cluster")
    p.add_argument("--address", help="ray: the cluster, auto or HOST:PORT of its head (default: start a "
                                     "local Ray instance)")
    from .grid.backends import CONNECT_TIMEOUT_S

    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S,
                   help=f"ray: seconds to reach the cluster at --address before failing in one line "
                        f"(default: {CONNECT_TIMEOUT_S:g})")
    p.add_argument("--workers", type=int, help="local: worker processes (default: cores / threads); "
                                               "ray: most cells in flight (default: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per cell, the same on both "
                                                          "backends so that CPU results agree bit for bit (default: 1)")
    p.add_argument("--retries", type=int, default=3, help="times a cell whose worker died runs again (default: 3)")
    p.add_argument("--max-seconds", type=float, default=math.inf,
                   help="refuse cells estimated above this many seconds (default: no limit; --dry-run shows them)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cells with the estimated time and memory of each and in total; compute nothing")
    _add_common(p)


def cmd_grid(a) -> int:
    import contextlib
    import os

    from .grid import driver as G
    from .runtime.cache import Cache

    workers = a.workers or max(1, (os.cpu_count() or 1) // max(1, a.threads))
    try:
        spec = G.load_spec(a.spec)
        cache = None if a.no_cache else Cache(a.cache_dir)
        if a.dry_run:
            table = G.plan(spec, cache, a.data_dir)
            out = {**G.totals(table, workers), "plan": records(table)}
            if a.json:
                print(json.dumps(jsonable(out)))
                return 0
            shown = table.assign(estimate=table["estimate_s"].map(B.duration),
                                 memory=table["memory_gib"].map(lambda g: f"{g * 1024:.0f} MiB"),
                                 note=table["note"].map(lambda t: t if len(t) <= 48 else t[:47] + "…"))
            print(shown[["cell", "kind", "settings", "status", "estimate", "memory", "note"]].to_string(index=False))
            print(f"\ntotal: {out['cells']} cells, {out['cached']} cached, {out['cannot_run']} cannot run here "
                  f"(see note); about {B.duration(out['estimate_seconds'])} of work in all, "
                  f"{B.duration(out['estimate_seconds_left'])} left to run here, about "
                  f"{B.duration(out['wall_seconds_left'])} on {workers} workers; peak about {out['peak_gib']:.2f} GiB "
                  "(estimates for the reference 2-core CPU; a GPU is faster)")
            return 0
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the result only; Ray prints notes there
            outcomes = G.run_grid(spec, cache, a.data_dir, a.backend, a.address, a.workers, a.device,
                                  a.threads, a.retries, a.max_seconds, None if a.quiet else G.stderr_line,
                                  connect_timeout=a.connect_timeout)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; finished cells are in the cache, rerun to resume", file=sys.stderr)
        return 130
    out = G.summary(outcomes)
    for r in out["results"]:
        if r["status"] == "failed":
            print(f"failed: cell {r['cell']} {spec.cells[r['cell']].label}: {r['error']}", file=sys.stderr)
    if a.json:
        print(json.dumps(jsonable(out)))
    else:
        for r in out["results"]:
            print(f"{r['cell']:>4}  {r['status']:8s}  {spec.cells[r['cell']].label}")
        print(f"{out['cells']} cells: {out['computed']} computed, {out['cached']} cached, {out['failed']} failed")
    return 4 if out["failed"] else 0


# ---------------------------------------------------------------- figures (engine.reporting.export)
# ``figure KIND [the experiment's flags] --out FILE.{png,svg,pdf}`` renders a page's main chart.

def _add_figure(sub, preset: str | None) -> None:
    """``figure KIND``: one sub-command per experiment with a main figure, with its own flags."""
    from .reporting import export

    p = sub.add_parser("figure", help="render a page's main chart to PNG, SVG or PDF (headless Chromium)",
                       description="Render the main chart of a dashboard page to a file for slides, from the "
                                   "cache or by computing the experiment first. The file's suffix picks the "
                                   "format: .png, .svg or .pdf. Kinds: " + "; ".join(
                                       f"{e.name}: {e.figure_help}" for e in EXPERIMENTS.values() if e.figure))
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for name, exp in EXPERIMENTS.items():
        if exp.figure is None:
            continue
        q = kinds.add_parser(name, aliases=list(exp.aliases), help=exp.figure_help,
                             description=f"{exp.figure_help}; the flags are those of `{name}`, from the page's own "
                                         "defaults (the quick preset) unless --preset says otherwise.")
        _add_common(q)
        _add_config(q, exp, preset or "quick")  # what the page opens on, read from the cache or the bundle
        q.add_argument("--out", required=True, help="output file: .png, .svg or .pdf")
        q.add_argument("--plot", dest="fig_metric", default=None,
                       help="ntk: the sweep metric drawn (default prediction_gap_init, as on the page; "
                            "kernel_dist_init is the Frobenius distance, blind to κ); regime: lin_gap (default), "
                            "pattern_change, k_inf_gap or weight_movement")
        q.add_argument("--width-px", dest="fig_width", type=int, default=export.WIDTH_PX,
                       help=f"image width in CSS pixels (default: {export.WIDTH_PX})")
        q.add_argument("--height-px", dest="fig_height", type=int, default=None,
                       help="image height in CSS pixels (default: the chart's own for PNG and SVG, 16:9 of the width for PDF)")
        q.add_argument("--png-scale", dest="fig_scale", type=float, default=export.SCALE,
                       help=f"PNG pixel density (default: {export.SCALE:g})")
        q.add_argument("--talk", action="store_true", help="slide-sized text and thicker lines on a 16:9 slide "
                       f"({export.SLIDE_PX[0]} x {export.SLIDE_PX[1]} unless --width-px / --height-px say otherwise)")


def cmd_figure(a, progress) -> dict:
    """Compute (or read from the cache) the kind's experiment, draw its main chart, write the file."""
    from .reporting import export

    exp = get(a.kind)
    out = export.check_output_path(a.out)  # a bad suffix, folder or unwritable place fails before any work
    fmt = export.format_of(out)
    cfg = config_from_args(exp, a)
    cfg = cfg if exp.view is None else exp.view(cfg)  # what the page derives (its snapshots, …): the page's chart
    if a.estimate:
        return _estimate_only(exp, cfg, a.device)
    res = _run(exp, cfg, a, progress)
    fig = exp.main_figure(res, a.fig_metric)
    if a.talk:  # as the page's Presentation mode and its slide buttons: the settings line, 16:9
        fig = export.talk_style(fig)
    fig = export.slide(fig, export.settings_line(res.config))
    width, height = a.fig_width, a.fig_height
    if a.talk and height is None and width == export.WIDTH_PX:
        width, height = export.SLIDE_PX
    path = export.write_image(fig, a.out, width, height, a.fig_scale)
    return {"figure": str(path), "kind": exp.name, "format": fmt, "bytes": path.stat().st_size,
            "title": fig.layout.title.text, "cached": res.cached, "config": res.config}
