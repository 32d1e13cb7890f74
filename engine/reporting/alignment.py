"""The power half of the paper's title in words: the Reproduction page's row, the Overview's sentence
and the README's paragraph, each from an ``alignment`` result's ``verdict`` frame (the rule is
``engine.maths.alignment.verdict``; this module only words it)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

import pandas as pd

from ..maths import alignment as AL
from ..maths.alignment import VERDICT_WORDS
from ..maths.metrics import draw_interval
from .paper import Verdict

if TYPE_CHECKING:
    from ..runtime.cache import Result

CLAIM = "data-dependent kernel reduces approximation error"
PAPER_CLAIM = ("title and abstract: the data-dependent kernel \"can reduce approximation error by aligning with "
               "task structure\" (no number reported)")


def _largest(verdict: pd.DataFrame) -> pd.Series | None:
    return None if verdict is None or verdict.empty else verdict.sort_values("width").iloc[-1]


def measured_words(v: pd.Series) -> str:
    """One verdict row as text: both alignments, the paired gap with its interval, the accuracies."""
    return (f"m = {int(v['width'])}: A(K_m, YYᵀ) 2L-ReLU {v['relu_mean']:.3f} ± {v['relu_sd']:.3f}, MLP-Attn "
            f"{v['attn_mean']:.3f} ± {v['attn_sd']:.3f} (paired gap {v['gap']:+.3f} [{v['gap_low']:+.3f}, "
            f"{v['gap_high']:+.3f}], {_draws(int(v['n_draws']))}); K_m ridge "
            f"test acc. {100 * v['relu_acc']:.1f} % / {100 * v['attn_acc']:.1f} %; {v['outcome']}")


def verdict_alignment(verdict: pd.DataFrame | None, dataset: str = "") -> Verdict:
    """The Reproduction page's row "data-dependent kernel reduces approximation error", read at the
    largest width of an alignment result's ``verdict`` frame (None: not measured)."""
    v = _largest(verdict)
    where = f" on {dataset}" if dataset else ""
    if v is None:
        return Verdict(CLAIM, PAPER_CLAIM, "not measured", "not measured",
                       f"Run `python -m engine alignment`{where} to measure it.")
    status = {"holds": "agrees", "fails": "disagrees"}.get(v["outcome"], "not measured")
    if v["outcome"] == "fails" and v["gap"] > 0:
        status = "partly"  # better aligned on average, but the interval reaches zero or the accuracy is lower
    words = (f"MLP-Attn's trained kernel is better aligned with the labels than 2L-ReLU's{where}: {v['why']}."
             if v["outcome"] == "holds" else
             f"MLP-Attn's trained kernel is not measurably better aligned with the labels{where}: {v['why']}.")
    return Verdict(CLAIM, PAPER_CLAIM, measured_words(v), status, words)


def power_sentence(verdict: pd.DataFrame | None, dataset: str = "") -> str:
    """The Overview's sentence on the power half (the vulnerability half is the flip rates')."""
    v = _largest(verdict)
    if v is None:
        return "The power half (does the data-dependent kernel align better with the task?) is not measured yet."
    where = f" on {dataset}" if dataset else ""
    if v["outcome"] == "holds":
        return (f"Power: MLP-Attn's trained kernel aligns better with the labels than 2L-ReLU's{where} "
                f"(A = {v['attn_mean']:.2f} against {v['relu_mean']:.2f} at m = {int(v['width'])}), at no loss of "
                "K_m ridge accuracy.")
    return (f"Power: MLP-Attn's trained kernel does not align measurably better with the labels than 2L-ReLU's"
            f"{where} (A = {v['attn_mean']:.2f} against {v['relu_mean']:.2f} at m = {int(v['width'])}; "
            f"{v['why']}).")


def _draws(n: int) -> str:
    return f"{n} draw" + ("" if n == 1 else "s")


def _interval(mean: float, lo: float, hi: float, scale: float = 100.0, fmt: str = "+.0f") -> str:
    def num(v: float) -> str:  # no "-0": a value that rounds to zero gets one more decimal, or is zero
        text = f"{scale * v:{fmt}}"
        if float(text) != 0:
            return text
        finer = f"{scale * v:+.{int(fmt[-2]) + 1}f}"  # fmt is "+.Nf"
        return finer if float(finer) != 0 else f"{0.0:{fmt}}"

    if not math.isfinite(lo):
        return f"{num(mean)} (no interval)"
    return f"{num(mean)} [{num(lo)}, {num(hi)}]"


ALONG_RULE = ("each net is compared with itself, first snapshot against last (paired): alignment, the flip excess "
              "and the kernel's distance from K∞ rose (fell) where the 95 % t interval of the change, over the data "
              "draws' means (over the nets with one draw), lies above (below) zero; the excess moved with the kernel "
              "where both rose and the within-net rank correlation of the two across snapshots has an interval "
              "above zero.")


def _direction(lo: float, hi: float) -> str:
    return "rose" if lo > 0 else "fell" if hi < 0 else "no change beyond its interval"


def along_changes(nets: pd.DataFrame | None) -> pd.DataFrame:
    """Both halves along training as paired changes per architecture at its largest width, from the
    per-net ``flips_training`` frame (draw, arch, width, seed, epoch, alignment, kernel_dist, flip_excess):
    for each of alignment, flip excess and kernel distance the mean change first → last snapshot over
    the nets with its interval (``engine.maths.metrics.draw_interval``: draws the unit) and its
    direction; ``together``: the mean within-net Spearman ρ of kernel distance and flip excess across
    snapshots with its interval. One row per architecture; empty when nothing was measured."""
    cols = ["arch", "width", "first", "last", "n_nets", "n_draws"]
    if nets is None or nets.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for arch, g in nets.groupby("arch", sort=False):
        g = g[g["width"] == g["width"].max()]
        first, last = g["epoch"].min(), g["epoch"].max()
        row = {"arch": arch, "width": int(g["width"].max()), "first": int(first), "last": int(last)}
        per_net = []
        for (d, _seed), n in g.groupby(["data_seed", "seed"], sort=True):
            n = n.sort_values("epoch")
            a, b = n.iloc[0], n.iloc[-1]
            rho = n["kernel_dist"].corr(n["flip_excess"], method="spearman") if len(n) > 2 else math.nan
            per_net.append({"draw": d, "alignment": b["alignment"] - a["alignment"],
                            "flip_excess": b["flip_excess"] - a["flip_excess"],
                            "kernel_dist": b["kernel_dist"] - a["kernel_dist"], "together": rho,
                            "alignment_first": a["alignment"], "alignment_last": b["alignment"],
                            "flip_excess_first": a["flip_excess"], "flip_excess_last": b["flip_excess"]})
        per = pd.DataFrame(per_net)
        row["n_nets"], row["n_draws"] = len(per), int(per["draw"].nunique())
        for c in ("alignment", "flip_excess", "kernel_dist", "together"):
            m, lo, hi, _ = draw_interval(per[c], per["draw"])
            row.update({f"{c}_change": m, f"{c}_low": lo, f"{c}_high": hi, f"{c}_direction": _direction(lo, hi)})
        for c in ("alignment_first", "alignment_last", "flip_excess_first", "flip_excess_last"):
            row[c] = float(per[c].mean())
        out.append(row)
    return pd.DataFrame(out)


def along_sentence(nets: pd.DataFrame | None, rule: bool = True) -> str:
    """Both halves along training, per architecture, in words generated by ``ALONG_RULE`` from paired
    changes (``along_changes`` of the per-net ``flips_training`` frame); ``rule``: the rule after it."""
    ch = along_changes(nets)
    if ch.empty:
        return "Flip rates along training were not measured in this run (--no-flips)."
    parts = []
    for _, c in ch.iterrows():
        name = "MLP-Attn" if c["arch"] == "attn" else "2L-ReLU"
        scope = "one draw" if c["n_draws"] <= 1 else f"{c['n_draws']} draws"
        moved = (c["flip_excess_direction"] == "rose" and c["kernel_dist_direction"] == "rose"
                 and c["together_low"] > 0)
        tail = ("; the excess moved with the kernel's distance from K∞" if moved else
                "; the excess did not move with the kernel's distance from K∞" if c["flip_excess_direction"] == "rose"
                else "")
        parts.append(
            f"{name} (m = {c['width']}, {c['n_nets']} nets, {scope}), epoch {c['first']} → {c['last']}: alignment "
            f"{c['alignment_first']:.3f} → {c['alignment_last']:.3f}, change "
            f"{_interval(c['alignment_change'], c['alignment_low'], c['alignment_high'], 1.0, '+.3f')} "
            f"({c['alignment_direction']}); flip excess {100 * c['flip_excess_first']:+.0f} → "
            f"{100 * c['flip_excess_last']:+.0f} points, change "
            f"{_interval(c['flip_excess_change'], c['flip_excess_low'], c['flip_excess_high'])} "
            f"({c['flip_excess_direction']}); kernel distance change "
            f"{_interval(c['kernel_dist_change'], c['kernel_dist_low'], c['kernel_dist_high'], 1.0, '+.3f')} "
            f"({c['kernel_dist_direction']}){tail}")
    return "Along training: " + "; ".join(parts) + "." + (f" Rule: {ALONG_RULE}" if rule else "")


FOLLOWS_WORDS = {"kernel": "follows the kernel's movement, not the attacker's training",
                 "attacker": "follows the attacker's training, not the kernel's movement",
                 "both": "follows both the kernel's movement and the attacker's training",
                 "neither": "follows neither the kernel's movement nor the attacker's training beyond its interval"}


def design_sentence(effects: pd.DataFrame | None, rule: bool = True) -> str:
    """One sentence per net from ``engine.experiments.along.design_effects`` (``along.DESIGN_RULE``):
    what the flip excess follows, the two effects with their intervals, and K∞'s reading beside K_m(T)'s."""
    from ..experiments.along import DESIGN_RULE

    if effects is None or effects.empty:
        return "The causal design was not run (alignment --design)."
    parts = []
    for _, e in effects.iterrows():
        name = "MLP-Attn" if e["arch"] == "attn" else "2L-ReLU"
        scope = "one draw" if e["n_draws"] <= 1 else f"{e['n_draws']} draws"
        parts.append(f"{name} (m = {e['width']}, {e['n_nets']} nets, {scope}): the flip excess "
                     f"{FOLLOWS_WORDS.get(e['follows'], e['follows'])} — reading K_m({e['last']}) instead of "
                     f"K_m({e['first']}) changes it by {_interval(e['kernel_effect'], e['kernel_low'], e['kernel_high'])} "
                     f"points, attacking the epoch-{e['last']} net instead of the epoch-{e['first']} one by "
                     f"{_interval(e['attacker_effect'], e['attacker_low'], e['attacker_high'])}; K∞'s reading "
                     f"differs from K_m({e['last']})'s by {_interval(e['kinf_minus_km'], e['kinf_low'], e['kinf_high'])}")
    return "The causal design: " + "; ".join(parts) + "." + (f" Rule: {DESIGN_RULE}" if rule else "")


DISTANCE_NAMES = {"kernel_dist": "Frobenius distance", "kernel_dist_whitened": "whitened distance",
                  "prediction_gap": "prediction gap"}


def association_sentence(table: pd.DataFrame | None) -> str:
    """The association between the kernel's distance from K∞ and the flip excess, per distance and
    net (``along.association``), and where the distances disagree (intervals excluding 0 with opposite
    signs, or one excluding 0 where another does not)."""
    from ..experiments.along import ASSOCIATION_WORDS

    if table is None or table.empty:
        return "The association of kernel movement with the flip excess was not measured (--no-flips)."
    if "distance" not in table:  # a result from before the distances were several
        table = table.assign(distance="kernel_dist")
    parts: list[str] = []
    signs: dict[str, dict[str, int]] = {}
    for distance, g in table.groupby("distance", sort=False):
        cells = []
        for _, a in g.iterrows():
            name = {"attn": "MLP-Attn", "relu": "2L-ReLU"}.get(a["arch"], "both nets")
            cells.append(f"{name} ρ = {a['rho']:+.2f} [{a['low']:+.2f}, {a['high']:+.2f}]" if math.isfinite(a["rho"])
                         else f"{name} ρ undefined (a constant column)")
            if math.isfinite(a["rho"]):
                signs.setdefault(name, {})[str(distance)] = 1 if a["low"] > 0 else -1 if a["high"] < 0 else 0
        parts.append(f"{DISTANCE_NAMES.get(str(distance), distance)}: " + ", ".join(cells))
    first = table.iloc[0]
    split = [name for name, by in signs.items() if len(set(by.values())) > 1]
    settled = [name for name, by in signs.items() if len(by) > 1 and set(by.values()) != {0}]
    note = (f" The distances disagree for {', '.join(split)}." if split else
            " No distance's association excludes zero." if signs and not settled else
            " The distances agree in sign." if settled else "")
    return (f"Distance from K∞ against the flip excess (per architecture {first['n_nets']} nets, "
            f"{first['n_points']} snapshots): "
            + "; ".join(parts) + "." + note + f" ({ASSOCIATION_WORDS}.)")


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.1f} %"


def _favours(side: str) -> str:
    return {"attn": "favours MLP-Attn", "relu": "favours 2L-ReLU"}.get(side, "neither")


def readme_paragraph(results: Iterable[tuple[str, Result | None]]) -> str:
    """The README's power half, from (label, result or None) pairs of alignment cells: a table with a
    row per cell and net (the alignment of K∞ and of the trained K_m, k at C(k) = 0.9, the K_m ridge
    accuracy, the cell's verdict), the rule once under it, then both halves along training per cell
    (``along_sentence``, paired changes) where the cell measured flips."""
    rows, along, missing, by_metric, design = [], [], [], [], []
    for label, r in results:
        if r is None:
            missing.append(label)
            continue
        s, kinf, v = r.frames["summary"], r.frames["kinf"], _largest(r.frames["verdict"])
        width = int(s["width"].max())
        at = s[s["width"] == width].set_index("arch")
        k = kinf.groupby("arch")["align"].mean()
        verdict = "" if v is None else f"**{v['outcome']}**: {v['why']}"
        for a in at.index:
            rows.append(f"| {label} | {'MLP-Attn' if a == 'attn' else '2L-ReLU'} | {width} | "
                        f"{int(at.loc[a, 'n_seeds'])} | {k.get(a, math.nan):.3f} | {at.loc[a, 'align_trained_mean']:.3f} "
                        f"± {at.loc[a, 'align_trained_sd']:.3f} | {at.loc[a, 'k90_trained_mean']:.0f} of {r.meta['n']} | "
                        f"{_pct(at.loc[a, 'test_acc_kernel_trained_mean'])} | {verdict if a == 'attn' else ''} |")
        table = AL.power_metrics(r.frames["rows"], r.frames["curves"])
        if len(table):
            by_metric.append(f"- {label}: " + "; ".join(
                (f"{t.metric} not reached by either curve at the sizes measured" if t.favours == "unmeasured" else
                 f"{t.metric} {t.diff:+.3g} [{t.low:+.3g}, {t.high:+.3g}] ({_favours(t.favours)})")
                for t in table.itertuples()) + f". {AL.disagreement(table)}")
        nets = r.frames.get("flips_training")
        if nets is not None and not nets.empty:
            along.append(f"- {label}: {along_sentence(nets, rule=False)}")
            assoc = r.frames.get("association")
            if assoc is not None and not assoc.empty:
                along.append(f"- {label}: {association_sentence(assoc)}")
        effects = r.frames.get("design_effects")
        if effects is not None and not effects.empty:
            design.append(f"- {label}: {design_sentence(effects, rule=False)}")
    head = ("**The power half — does the data-dependent kernel align better with the task?** Centred kernel–target "
            "alignment A(K, YYᵀ) of the trained eNTK, mean ± sd over (seed, draw) nets.\n\n"
            "| cell | net | m | nets | A(K∞) | A(K_m) | k at C(k) = 0.9 | K_m ridge test acc. | verdict |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    text = head + "\n".join(rows) + f"\n\nRule: {VERDICT_WORDS.replace('**', '')}\n"
    if by_metric:
        text += ("\nBy every metric (MLP-Attn − 2L-ReLU, paired within draws, 95 % t interval over draws; "
                 f"{', '.join(f'{k}: {w}' for k, (_, _, w) in AL.POWER_METRICS.items())}):\n\n"
                 + "\n".join(by_metric) + "\n")
    if along:
        text += "\nBoth halves along training (the flip excess of the ridge reading on K_m(t)):\n\n" + "\n".join(along)
        text += f"\n\nRule: {ALONG_RULE}\n"
    if design:
        from ..experiments.along import DESIGN_RULE

        text += "\nWhat the excess follows along training (the causal design):\n\n" + "\n".join(design)
        text += f"\n\nRule: {DESIGN_RULE}\n"
    if missing:
        text += "\nNot computed yet (run `python -m engine grid grids/readme.toml`): " + "; ".join(missing) + ".\n"
    return text
