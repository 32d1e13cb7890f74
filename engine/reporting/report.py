"""``python -m engine report SPEC.toml``: a grid spec's malleability results as the README's tables.

The README's flip-rate tables are not typed in by hand: ``grids/readme.toml`` lists the
cells, ``python -m engine grid grids/readme.toml`` computes them into the cache, and this
command prints them as Markdown (``readme_tables``), each row read with the
same verdict rule as the Reproduction page. ``--run`` computes missing cells first.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import TYPE_CHECKING, Iterable

from ..runtime.errors import EngineError

if TYPE_CHECKING:  # the cache and the verdicts load pandas: imported when a report is made, not for --help
    import os

    import pandas as pd

    from ..grid.spec import Grid
    from ..runtime.cache import Cache, Result
    from .rule import Side


# ---------------------------------------------------------------- the README's tables

def _cell_pct(v: float, digits: int = 0) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.{digits}f}"


def _cell(text: object) -> str:
    """A spec's text as one Markdown table cell, shown as typed: ``|`` and the characters of emphasis,
    code, links and formulas backslash-escaped (``**bold**`` stays two asterisks), HTML as entities,
    newlines as spaces."""
    text = " ".join(str(text).splitlines()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\|*_`\[\]~$])", r"\\\1", text)


def _flips(side: Side) -> str:
    """One net's flip rate in a verdict with its seed and random nulls."""
    return f"{_cell_pct(side.flip)} ({_cell_pct(side.null_seed)} / {_cell_pct(side.null_random)})"


def _excess(side: Side) -> str:
    """One net's excess flip rate in a verdict with its 95 % interval."""
    return f"{_cell_pct(side.excess)} [{_cell_pct(side.low)}, {_cell_pct(side.high)}]"


def readme_tables(results: Iterable[tuple[str, pd.DataFrame | None]]) -> str:
    """The README's flip-rate tables in Markdown, from malleability results.

    results: (label, summary) pairs in order, ``summary`` the ``summary`` frame of a
    ``run_malleability`` result, or None for a cell not computed yet (its row says so).
    One row per result and attack, read with ``flip_rule`` (the verdict the Reproduction
    page and the protocol table give): each net's flip rate, its seed and random nulls, the
    excess with its 95 % interval, test and K_m-ridge accuracy, the share of seeds through the
    training gate, and the verdict with its reason. Percent throughout.
    """
    from ..maths.metrics import INTERVAL_WORDS
    from .rule import RULE_WORDS, flip_rule, sensitivity_words

    head = ("| setting | attack | 2L-ReLU flip (seed / random null) | MLP-Attn flip (seed / random null) | "
            "excess 2L-ReLU | excess MLP-Attn | test acc. 2L-ReLU / MLP-Attn (K_m ridge) | nets through the gate | "
            "verdict |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for label, summary in results:
        if summary is None or len(summary) == 0:
            lines.append(f"| {_cell(label)} | | not computed yet: run `python -m engine grid` on the spec | | | | | | |")
            continue
        several = {c: c in summary and summary[c].nunique() > 1 for c in ("width", "reading")}
        for key, g in summary.groupby(["attack", "eps", *[c for c in ("width", "reading") if c in summary]],
                                      sort=False):
            v = flip_rule(g, key[0], key[1])
            where = "".join(f", {c} {k}" if c == "reading" else f", m = {k}"
                            for c, k in zip(("width", "reading"), key[2:], strict=False) if several[c])
            setting = f"{_cell(label)}{where}"
            if "relu" not in v:
                lines.append(f"| {setting} | {key[0].upper()} ε = {key[1]:g} | | | | | | | {v['outcome']}: {v['why']} |")
                continue
            n = v["n_nets"]
            relu, attn = v["relu"], v["attn"]
            acc = (f"{_cell_pct(relu.test_acc)} ({_cell_pct(relu.test_acc_kernel)}) / "
                   f"{_cell_pct(attn.test_acc)} ({_cell_pct(attn.test_acc_kernel)})")
            trained = " / ".join("—" if not math.isfinite(side.trained) else f"{round(side.trained * n)} of {n}"
                                 for side in (relu, attn))
            lines.append(f"| {setting} | {key[0].upper()} ε = {key[1]:g} | {_flips(relu)} | "
                         f"{_flips(attn)} | {_excess(relu)} | {_excess(attn)} | {acc} | {trained} | "
                         f"**{v['outcome']}** ({v['role']}): {_cell(v['why'])}"
                         + (f"; {_cell(sensitivity_words(v))}" if v.get("left_out") else "") + " |")
    rule = RULE_WORDS.replace("**", "")
    return ("\n".join(lines) + f"\n\nFlip rates in % of the top-τ points, means over the nets through the training gate; intervals: "
              f"{INTERVAL_WORDS}; verdict: {rule}\n")


def draw_lines(results: Iterable[tuple[str, Result | None]]) -> list[str]:
    """One line per primary verdict cell of the (label, result or None) pairs: the gap of each data draw
    (the ``draws`` frame), the values its interval summarises."""
    out = []
    for label, r in results:
        if r is None or "draws" not in r.frames or r.frames["verdict"].empty:
            continue
        v, d = r.frames["verdict"], r.frames["draws"]
        for _, cell in v[v["role"] == "primary"].iterrows():
            mine = d[(d["width"] == cell["width"]) & (d["reading"] == cell["reading"]) & (d["attack"] == cell["attack"])]
            gaps = ", ".join(f"{int(g.data_seed)}: {100 * g.gap:+.0f}" for g in mine.itertuples())
            out.append(f"Per-draw gaps in points of the primary cell ({_cell(label)}, m = {int(cell['width'])}, reading "
                       f"{cell['reading']}), draw: gap — {gaps}; their mean {100 * cell['gap']:+.0f} "
                       f"[{100 * cell['gap_low']:+.0f}, {100 * cell['gap_high']:+.0f}] over {int(cell['gap_draws'])} "
                       "draws.")
    return out


def _gap(v: pd.Series) -> str:
    text = f"{100 * v['gap']:+.0f} [{100 * v['gap_low']:+.0f}, {100 * v['gap_high']:+.0f}] points"
    return text + (f" ({v['ratio']:.2g}× [{v['ratio_low']:.2g}, {v['ratio_high']:.2g}])"
                   if math.isfinite(float(v["ratio"])) else "")


def findings(found: Iterable[tuple[str, Result | None]], power: Iterable[tuple[str, Result | None]]) -> list[str]:
    """What the README opens on: short sentences generated from the grid's results, each a verdict
    word, a number with its interval and what it was read by. ``found``: (label, result or None) of
    the malleability cells; the first with a primary verdict row speaks (the network cell), with
    its kernel readings at the same width beside it; ``power``: (label, result or None) of the
    alignment cells (the trained eNTK's alignment verdict at its largest width)."""
    out = []
    for _label, r in found:
        v = None if r is None else r.frames.get("verdict")
        if v is None or v.empty or "role" not in v or not (v["role"] == "primary").any():
            continue
        p = v[v["role"] == "primary"].iloc[0]
        draws = f"{int(p['gap_draws'])} data draws" if int(p["gap_draws"]) > 1 else "one data draw"
        out.append(f"**Vulnerability, read by retraining the network (the declared primary): {p['outcome']}.** "
                   f"At m = {int(p['width'])}, MLP-Attn's flip excess over its nulls minus 2L-ReLU's is "
                   f"{_gap(p)} over {draws} (95 % t interval over draws); the paper reports 6–9× in raw flip rates.")
        others = v[(v["width"] == p["width"]) & (v["role"] != "primary")]
        if len(others):
            words = "; ".join(f"{READING_WORDS.get(o['reading'], o['reading'])}: {o['outcome']}, {_gap(o)}"
                              for _, o in others.iterrows())
            out.append(f"**The kernel's readings of the same attack (secondary, Holm):** {words}.")
        break
    for label, r in power:
        v = None if r is None else r.frames.get("verdict")
        if v is None or v.empty:
            continue
        a = v.sort_values("width").iloc[-1]
        out.append(f"**Power, {_cell(label)}: {a['outcome']}.** Centred alignment of the trained eNTK with the labels "
                   f"at m = {int(a['width'])}: MLP-Attn − 2L-ReLU {a['gap']:+.3f} [{a['gap_low']:+.3f}, "
                   f"{a['gap_high']:+.3f}] (paired, {int(a['n_draws'])} draw{'' if int(a['n_draws']) == 1 else 's'}; MLP-Attn {a['attn_mean']:.3f}, "
                   f"2L-ReLU {a['relu_mean']:.3f}).")
    return out


READING_WORDS = {"ridge": "ridge leave-one-out on the trained eNTK (the paper's)",
                 "flow": "its gradient flow for the net's own steps (the kernel regime's prediction)"}


def results(spec: Grid, cache: Cache | None, data_dir: str | os.PathLike | None = None,
            kind: str = "malleability") -> list[tuple[str, Result | None]]:
    """(label, cached result or None) of every ``kind`` cell of a loaded grid spec, in order."""
    out = []
    for cell in spec.cells:
        if cell.kind != kind:
            continue
        try:
            hit = None if cache is None else cache.get(cell.cache_kind, cell.config, data_dir=data_dir)
        except EngineError:  # its data are not here: reported as not computed
            hit = None
        label = f"{cell.block}: {cell.settings}" if cell.block else cell.settings
        out.append((label, hit))
    return out


def protocol_lines(found: list[tuple[str, Result | None]]) -> list[str]:
    """One sentence per block of a grid spec, from its first malleability cell (``found``: ``results``
    of the spec, read once by the caller): the block's label and settings, then the verdict rule's
    outcome and reason (``flip_rule``), or that this cache does not hold it (the Overview states the
    README's protocols with these)."""
    from .rule import flip_rule

    lines, seen = [], set()
    for label, hit in found:
        block, _, settings = label.partition(": ")
        if block in seen or not settings:
            continue
        seen.add(block)
        if hit is None:
            lines.append(f"{block} ({settings}): not in this cache")
            continue
        summary = hit.frames["summary"]
        if "width" in summary:
            summary = summary[summary["width"] == summary["width"].max()]
        readings = list(dict.fromkeys(summary["reading"])) if "reading" in summary else [None]
        for reading in readings:
            v = flip_rule(summary if reading is None else summary[summary["reading"] == reading])
            how = "" if len(readings) < 2 else f", read by {reading}"
            lines.append(f"{block} ({settings}{how}), {v['attack'].upper()} ε = {v['eps']:g}: {v['outcome']} "
                         f"({v['role']}) — {v['why']}")
    return lines


def markdown(spec: Grid, cache: Cache | None, data_dir: str | os.PathLike | None = None) -> str:
    """The spec's tables in Markdown, with a heading naming the spec."""
    found = results(spec, cache, data_dir)
    rows = [(label, None if r is None else r.frames["summary"]) for label, r in found]
    from .rule import PRIMARY_WORDS

    power = results(spec, cache, data_dir, kind="alignment")  # the power half: a paragraph per spec
    head = "".join(f"- {line}\n" for line in findings(found, power))
    text = (f"<!-- python -m engine report {spec.path or spec.name} -->\n" + (f"{head}\n" if head else "")
            + f"Primary reading, declared before the numbers: {PRIMARY_WORDS}.\n\n" + readme_tables(rows))
    text += "".join(f"\n{line}\n" for line in draw_lines(found))
    if power:
        from .alignment import readme_paragraph

        text += "\n" + readme_paragraph(power)
    return text


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    from ..grid import driver as G
    from ..runtime.cache import Cache

    failed = []
    try:
        spec = G.load_spec(a.spec)
        cache = Cache(a.cache_dir)
        if a.run:  # a failed cell is named and exits 4 (as `grid` does); the tables still print
            outcomes = G.run_grid(spec, cache, a.data_dir, workers=a.workers,
                                  progress=None if a.quiet else G.stderr_line)
            failed = [o for o in outcomes if o.status == "failed"]
        print(markdown(spec, cache, a.data_dir))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; finished cells are in the cache, rerun to resume", file=sys.stderr)
        return 130
    for o in failed:
        print(f"failed: cell {o.cell.index} {o.cell.label}: {o.error}", file=sys.stderr)
    return 4 if failed else 0
