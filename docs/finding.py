"""The README's opening figures, drawn from the README grid's network cell in the cache (no run).

    python docs/finding.py [--cache-dir DIR] [--data-dir DIR]

Writes ``docs/finding-width.png`` (the network's flip excess against width, one line per net and
reading, 95 % intervals over data draws) and ``docs/finding-draws.png`` (the gap of each data draw
beside its pooled interval), the charts the Overview opens on (``ui.findings``), each with its
settings line. Needs the cell computed (``python -m engine grid grids/readme.toml``) and Chromium for
kaleido; exits 2 with one line otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args(argv)
    from engine.data import resolve_data_dir
    from engine.grid.driver import load_spec
    from engine.reporting import export, plots, report
    from engine.runtime.cache import Cache

    found = report.results(load_spec(ROOT / "grids" / "readme.toml"), Cache(a.cache_dir), resolve_data_dir(a.data_dir))
    net = next((r for _, r in found if r is not None and "draws" in r.frames
                and (r.frames["verdict"]["role"] == "primary").any()), None)
    if net is None:
        print("error: the README grid's network cell is not in this cache; run python -m engine grid "
              "grids/readme.toml first", file=sys.stderr)
        return 2
    v = net.frames["verdict"]
    attack, eps = str(v["attack"].iloc[0]), float(v["eps"].iloc[0])
    p = v[v["role"] == "primary"].iloc[0]
    words = f"primary (retraining, m = {int(p['width'])}): {p['outcome']}"
    width = plots.excess_width_fig(plots.excess_width_data(net.frames["summary"], attack, eps), net.config.get("attention"))
    draws = plots.draw_gaps_fig(plots.draw_gaps_data(v, net.frames["draws"], attack, eps))
    for fig, name, title in ((width, "finding-width.png", "Flip excess over the larger null against width, by reading"),
                             (draws, "finding-draws.png", "MLP-Attn's excess minus 2L-ReLU's, per data draw")):
        export.write_image(export.titled(fig, title, export.settings_line(net.config, words)), ROOT / "docs" / name,
                           1600, 900)
        print(ROOT / "docs" / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
