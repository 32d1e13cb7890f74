"""``python -m engine report SPEC.toml``: a grid spec's malleability results as the README's tables.

The README's flip-rate tables are not typed in by hand: ``grids/readme.toml`` lists the
cells, ``python -m engine grid grids/readme.toml`` computes them into the cache, and this
command prints them as Markdown (``engine.paper.readme_tables``), each row read with the
same verdict rule as the Reproduction page. ``--run`` computes missing cells first.
"""

from __future__ import annotations

import argparse
import sys

from .cache import Cache, Result
from .errors import EngineError


def results(spec, cache: Cache | None, data_dir=None) -> list[tuple[str, Result | None]]:
    """(label, cached result or None) of every malleability cell of a loaded grid spec, in order."""
    out = []
    for cell in spec.cells:
        if cell.kind != "malleability":
            continue
        try:
            hit = None if cache is None else cache.get(cell.cache_kind, cell.config, data_dir=data_dir)
        except EngineError:  # its data are not here: reported as not computed
            hit = None
        label = f"{cell.block}: {cell.settings}" if cell.block else cell.settings
        out.append((label, hit))
    return out


def markdown(spec, cache: Cache | None, data_dir=None) -> str:
    """The spec's tables in Markdown, with a heading naming the spec."""
    from .paper import readme_tables

    rows = [(label, None if r is None else r.frames["summary"]) for label, r in results(spec, cache, data_dir)]
    return f"<!-- python -m engine report {spec.path or spec.name} -->\n" + readme_tables(rows)


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="a grid spec's malleability results as the README's Markdown tables",
                       description="Print the flip-rate tables of a grid spec (e.g. grids/readme.toml) in "
                                   "Markdown, from the cache; cells not computed yet are listed as such. "
                                   "--run computes them first (as `grid` does).")
    p.add_argument("spec", help="grid spec file, e.g. grids/readme.toml")
    p.add_argument("--run", action="store_true", help="compute the cells missing from the cache first")
    p.add_argument("--workers", type=int, default=1, help="--run: worker processes (default: 1)")
    p.add_argument("--data-dir", default=None, help="folder holding the data sets")
    p.add_argument("--cache-dir", default=None, help="cache folder (default: the engine's)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def command(a: argparse.Namespace) -> int:
    from . import grid as G

    try:
        spec = G.load_spec(a.spec)
        cache = Cache(a.cache_dir)
        if a.run:
            G.run_grid(spec, cache, a.data_dir, workers=a.workers, progress=None if a.quiet else G.stderr_line)
        print(markdown(spec, cache, a.data_dir))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
