"""The power half of the paper's title in words: the Reproduction page's row, the Overview's sentence
and the README's paragraph, each from an ``alignment`` result's ``verdict`` frame (the rule is
``engine.maths.alignment.verdict``; this module only words it)."""

from __future__ import annotations

import math

import pandas as pd

from ..maths.alignment import VERDICT_WORDS
from .paper import Verdict

CLAIM = "data-dependent kernel reduces approximation error"
PAPER_CLAIM = ("title and abstract: the data-dependent kernel \"can reduce approximation error by aligning with "
               "task structure\" (no number reported)")


def _largest(verdict: pd.DataFrame) -> pd.Series | None:
    return None if verdict is None or verdict.empty else verdict.sort_values("width").iloc[-1]


def measured_words(v: pd.Series) -> str:
    """One verdict row as text: both alignments, the gap against the spread, the accuracies."""
    return (f"m = {int(v['width'])}: A(K_m, YYᵀ) 2L-ReLU {v['relu_mean']:.3f} ± {v['relu_sd']:.3f}, MLP-Attn "
            f"{v['attn_mean']:.3f} ± {v['attn_sd']:.3f} (gap {v['gap']:+.3f}, spread {v['spread']:.3f}); K_m ridge "
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
        status = "partly"  # better aligned, but within the spread or at a lower accuracy
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


def _interval(v: pd.Series) -> str:
    return f"{100 * v['flip_excess']:+.0f} [{100 * v['flip_excess_low']:+.0f}, {100 * v['flip_excess_high']:+.0f}] points"


ALONG_RULE = ("alignment rose when its change exceeds the larger sd over seeds and draws; the flip excess rose when "
              "the last snapshot's interval lies above zero and above the first snapshot's excess.")


def along_sentence(summary: pd.DataFrame | None, rule: bool = True) -> str:
    """Both halves along training, per architecture, first snapshot to last (``flips_training_summary``):
    how the alignment moved beside how the flip excess over the larger null moved; ``rule``: the
    rule after it (``ALONG_RULE``)."""
    if summary is None or summary.empty:
        return "Flip rates along training were not measured in this run (--no-flips)."
    parts = []
    for arch, g in summary.sort_values("epoch").groupby("arch", sort=False):
        a, b = g.iloc[0], g.iloc[-1]
        name = "MLP-Attn" if arch == "attn" else "2L-ReLU"
        spread = max(a["alignment_sd"], b["alignment_sd"]) if math.isfinite(a["alignment_sd"]) else 0.0
        power = b["alignment_mean"] - a["alignment_mean"] > spread
        vulnerable = b["flip_excess_low"] > max(0.0, a["flip_excess"])
        both = {(True, True): "both rose", (True, False): "alignment rose, the flip excess did not",
                (False, True): "the flip excess rose, alignment did not", (False, False): "neither rose"}
        parts.append(f"{name} (m = {int(b['width'])}), epoch {int(a['epoch'])} → {int(b['epoch'])}: alignment "
                     f"{a['alignment_mean']:.3f} → {b['alignment_mean']:.3f}, flip excess {_interval(a)} → "
                     f"{_interval(b)}: {both[power, vulnerable]}")
    return "Along training: " + "; ".join(parts) + "." + (f" Rule: {ALONG_RULE}" if rule else "")


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.1f} %"


def readme_paragraph(results) -> str:
    """The README's paragraph on the power half, from (label, result or None) pairs of alignment
    cells: per cell, the alignment of K∞ and of the trained K_m per net, k at C(k) = 0.9, the
    K_m ridge accuracy, the verdict with its rule, and both halves along training (``along_sentence``)
    where the cell measured flips."""
    parts, along_any = [], False
    for label, r in results:
        if r is None:
            parts.append(f"{label}: not computed yet (run `python -m engine grid grids/readme.toml`).")
            continue
        s, kinf, v = r.frames["summary"], r.frames["kinf"], _largest(r.frames["verdict"])
        width = int(s["width"].max())
        at = s[s["width"] == width].set_index("arch")
        k = kinf.groupby("arch")["align"].mean()
        nets = "; ".join(
            f"{'MLP-Attn' if a == 'attn' else '2L-ReLU'} A(K∞) = {k.get(a, math.nan):.3f}, A(K_m) = "
            f"{at.loc[a, 'align_trained_mean']:.3f} ± {at.loc[a, 'align_trained_sd']:.3f}, C(k) reaches 0.9 at "
            f"k = {at.loc[a, 'k90_trained_mean']:.0f} of {r.meta['n']}, K_m ridge test acc. "
            f"{_pct(at.loc[a, 'test_acc_kernel_trained_mean'])}" for a in at.index)
        verdict = "" if v is None else f" Verdict: **{v['outcome']}** ({v['why']})."
        along = r.frames.get("flips_training_summary")
        along_any |= along is not None and not along.empty
        along = "" if along is None or along.empty else " " + along_sentence(along, rule=False)
        parts.append(f"{label} (m = {width}, {int(at['n_seeds'].min())} (seed, draw) pairs): {nets}.{verdict}{along}")
    rule = VERDICT_WORDS.replace("**", "")
    return ("**The power half — data-dependent kernel aligns better with the task?** Centred kernel–target "
            "alignment A(K, YYᵀ) of the trained eNTK, mean ± sd over seeds and data draws. "
            + " ".join(parts) + f" Rule: {rule}" + (f" Along training, {ALONG_RULE}" if along_any else "") + "\n")
