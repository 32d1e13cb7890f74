"""``make bundle``: remake the shipped bundle of default results (``engine.runtime.bundle``).

    python -m ui.bundle [--out bundle] [--datasets mnist,fashion-mnist]

Opens every page of the dashboard at its defaults (Streamlit's AppTest, in this process, on a
fresh cache folder), once per data set, with every run a page would start by itself or on one
click started at once (the Overview's "measure them here" and Task alignment's causal design clicked; runs a page holds back as
minutes of work, and anything over the dashboard's limits, stay out), waits for them, and copies the finished cache entries into
``--out`` under their cache keys, with ``index.json``. The pages decide what is computed, so
the bundle holds exactly what a newcomer's first look at each page asks for, and nothing is
listed twice. Entries are keyed by the code fingerprint: after any edit under ``engine/`` the
bundle is refused until this is run again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("mnist", "fashion-mnist")  # the sidebar's default and the image's (Debian ships Fashion-MNIST)
ONE_CLICK = {"pages/alignment.py"}  # the causal design along training: the page's last section, a minute of work


def pages() -> list[str]:
    """Every page file of the navigation, Overview first."""
    return ["pages/overview.py"] + sorted(f"pages/{p.name}" for p in (ROOT / "pages").glob("*.py")
                                          if p.name != "overview.py")


def open_all(dataset: str) -> list[str]:
    """Open every page on ``dataset`` and wait for what it starts; returns one line per problem."""
    from streamlit.testing.v1 import AppTest

    from ui.common import get_manager

    problems = []
    for page in pages():
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=3600)
        at.query_params["data"] = dataset
        at.run()
        if page != "pages/overview.py":
            at.switch_page(page)
        at.run()
        for button in [b for b in at.button if str(b.key).startswith("run.together.")]:
            button.click().run()  # the Overview's "measure them here": it starts nothing by itself
        if page in ONE_CLICK:  # a section the page leads with that waits for one click (about a minute)
            for button in [b for b in at.button if str(b.key).startswith("run.")]:
                button.click().run()
        while at.get("progress"):
            for job in [j for j in get_manager().jobs() if not j.done]:
                job.wait()
            at.run()
        problems += [f"{dataset} {page}: {e.value}" for e in at.exception]
        problems += [f"{dataset} {page}: {e.value}" for e in at.error]
        print(f"  {dataset:14s} {page}", file=sys.stderr, flush=True)
    return problems


def add_grid(spec_path: Path, source: Path | None, cache_dir: Path) -> list[str]:
    """Copy the results of a grid spec's cells (``grids/readme.toml``: the README's story, which no page
    starts by itself) from ``source`` (the cache ``python -m engine grid`` filled; default the engine's)
    into ``cache_dir``, so the Overview can open on them; returns one line per cell not found there."""
    from engine.data import resolve_data_dir
    from engine.grid.driver import load_spec
    from engine.runtime.cache import Cache

    spec, data_dir = load_spec(spec_path), resolve_data_dir(None)
    src, dst, missing = Cache(source), Cache(cache_dir), []
    for cell in spec.cells:
        hit = src.get(cell.cache_kind, cell.config, data_dir=data_dir)
        if hit is None:
            missing.append(f"{spec_path.name} cell {cell.index} ({cell.label}) is not in {src.directory}: run "
                           f"`python -m engine grid {spec_path}` first")
            continue
        dst.put(hit, cell.config, data_dir)
    return missing


def copy_out(cache_dir: Path, out: Path, merge: bool = False) -> dict:
    """The finished entries of ``cache_dir`` (checkpoints left out) as ``out/<key>.npz``, and
    the index; files of an older bundle are removed (``merge``: the entries of ``out``'s index made
    by this very code are kept beside the new ones)."""
    from engine.runtime.cache import CHECKPOINT_PREFIX, ENGINE_VERSION, Cache, Result, code_fingerprint

    cache = Cache(cache_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = {}
    if merge and (out / "index.json").is_file():
        old = json.loads((out / "index.json").read_text())
        if old.get("code") == code_fingerprint():
            entries = {k: v for k, v in old.get("entries", {}).items() if (out / f"{k}.npz").is_file()}
    for key in sorted(k for k in cache._store.iterkeys() if not str(k).startswith(CHECKPOINT_PREFIX)):
        blob = cache._store.get(key)
        kind = Result.from_bytes(blob).kind
        (out / f"{key}.npz").write_bytes(blob)
        entries[key] = {"kind": kind, "file": f"{key}.npz", "bytes": len(blob)}
    for old in out.glob("*.npz"):
        if old.stem not in entries:
            old.unlink()
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    index = {"code": code_fingerprint(), "engine": ENGINE_VERSION, "made": made,
             "entries": entries}
    tmp = out / "index.json.tmp"
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / "index.json")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ui.bundle", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bundle", help="the bundle folder (default: bundle/)")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="data sets to open the pages on (default: %(default)s; one missing here is skipped)")
    parser.add_argument("--grid", type=Path, default=ROOT / "grids" / "readme.toml",
                        help="a grid spec whose computed cells are shipped too (default: %(default)s)")
    parser.add_argument("--grid-cache", type=Path, default=None,
                        help="the cache the grid was computed into (default: the engine's)")
    parser.add_argument("--grid-only", action="store_true",
                        help="only add the grid's cells to the bundle in --out (made by this code), opening no page")
    args = parser.parse_args(argv)
    from engine.runtime.cache import DEFAULT_CACHE_DIR

    grid_cache = args.grid_cache or Path(os.environ.get("ENGINE_CACHE_DIR") or DEFAULT_CACHE_DIR)  # before the override
    if args.grid_only:  # add the grid's cells to a bundle this code made, opening no page
        with tempfile.TemporaryDirectory(prefix="bundle-cache-") as tmp:
            os.environ["ENGINE_CACHE_DIR"], os.environ["ENGINE_BUNDLE_DIR"] = tmp, ""
            problems = add_grid(args.grid, grid_cache, Path(tmp))
            index = copy_out(Path(tmp), args.out, merge=True)
        print(f"{len(index['entries'])} result(s) in {args.out}", file=sys.stderr)
        for line in problems:
            print(f"problem: {line}", file=sys.stderr)
        return 1 if problems else 0
    from engine.data import available_datasets, resolve_data_dir
    from engine.runtime import budget

    present = {i.name for i in available_datasets(resolve_data_dir(None)) if i.available}
    wanted = [d.strip() for d in args.datasets.split(",") if d.strip()]
    with tempfile.TemporaryDirectory(prefix="bundle-cache-") as tmp:
        os.environ["ENGINE_CACHE_DIR"], os.environ["ENGINE_BUNDLE_DIR"] = tmp, ""  # made afresh, none served
        budget.QUICK_SECONDS = budget.DASHBOARD_SECONDS  # every run a click would start, started
        problems = []
        for dataset in wanted:
            if dataset not in present:
                print(f"skipped {dataset}: not in the data folder here", file=sys.stderr)
                continue
            problems += open_all(dataset)
        problems += add_grid(args.grid, grid_cache, Path(tmp))
        index = copy_out(Path(tmp), args.out)
    total = sum(e["bytes"] for e in index["entries"].values())
    print(f"{len(index['entries'])} result(s), {total / 2**20:.1f} MiB, in {args.out} for code "
          f"{index['code'][:12]}", file=sys.stderr)
    for line in problems:
        print(f"problem: {' '.join(str(line).split())}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
