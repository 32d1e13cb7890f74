"""The malleability experiment's rows, declared once: one typed row per (data draw, arch, width,
seed, attack, ε, reading), the per-point flips behind its excess, and the frames made of them
(``rows``, ``summary``, ``verdict``, ``draws``), built in this one place; the verdict's rule is
``engine.experiments.verdict``'s.

Each row is a ``FlipRow``; its fields are the frame's columns in order, so a page or a report
reads a column that a dataclass declares (``FlipRow.flip_excess``'s docstring is its field
comment here), not a string made up elsewhere. The metrics themselves (flip rate, rank
correlation, the excess with its interval, the gap between architectures) are
``engine.maths.metrics``'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from .._lazy import LazyModule
from ..maths.gates import GATE_SHARE
from ..maths.metrics import (
    draw_means,
    excess_interval,
    flip_rate,
    gap_interval,
    holm,
    rank_correlation,
    sign_flipped,
    summarize,
)
from .verdict import GAPS, flip_rule, roles, sensitivity_words

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows

if TYPE_CHECKING:
    from .readings import ReadOut
    from .recipes import Reading

GROUP = ["arch", "width", "attack", "eps", "reading"]  # one summary row per group, over (draw, seed)
VERDICT = ("width", "attack", "eps", "reading")         # one verdict row per group, both architectures
NULL_KINDS = ("partner seed", "seed-free", "one seed", "off")


@dataclass
class FlipRow:
    """One measured attack, read one way, on one net. Shares are fractions in [0, 1]."""

    data_seed: int
    arch: str
    width: int
    seed: int
    attack: str
    eps: float
    reading: str                 # ridge, flow or retrain (``engine.experiments.recipes``)
    flip_rate: float             # tracked points whose aggregate influence changed sign under the attack
    pair_flip_rate: float        # (test, tracked point) pairs whose influence changed sign
    spearman: float              # rank correlation of aggregate influences before and after
    spearman_points: int         # over how many training points (ridge: all n; flow, retrain: the tracked)
    null_seed_flip_rate: float   # the partner seed's net against this one, no attack (NaN: see null_seed_kind)
    null_seed_spearman: float
    null_seed_partner: int | None
    null_seed_kind: str          # NULL_KINDS: partner seed; seed-free (the reading cannot differ between seeds,
    #                              e.g. K∞ of fixed features: no seed null, the random null alone); one seed; off
    null_random_flip_rate: float  # the attack's per-row ℓ2 norms in random directions
    null_random_spearman: float
    flip_excess: float           # flip_rate − the larger null, with its 95 % bootstrap interval over points
    flip_excess_low: float
    flip_excess_high: float
    test_acc: float              # the clean net's
    train_acc: float
    test_acc_ntk: float          # ridge with K∞ of the same features
    test_acc_kernel: float       # ridge with the trained net's own K_m
    trained: bool                # the training gate (``engine.maths.gates.passes_gate``)
    sgd_lr_limit: float
    weight_movement: float       # ‖W − W₀‖_F / ‖W₀‖_F of the clean net
    test_acc_after: float        # of the predictor the reading describes, after the attack
    rel_perturbation: float      # mean ‖δ‖₂ / ‖x‖₂ over moved rows, in the attack's space
    max_abs_perturbation: float
    max_l2_perturbation: float
    points_moved: int
    n_top: int
    exact_for: str               # the training the reading is exact for
    objective_match: bool        # whether this net's training is that one
    norm: str
    space: str
    target: str
    perturb: str
    retrain: bool
    adversarial_training: bool
    tau: float
    ridge: float
    influence_kernel: str
    init: str
    attention: str | None
    optimizer: str
    train_precision: str         # the training GEMMs' (TrainSpec.train_precision)
    loss: str
    lr: float
    epochs: int
    storage: str
    attack_precision: str
    kernel_precision: str
    steps: int
    step_size: float


COLUMNS = tuple(f.name for f in fields(FlipRow))
METRICS = ("flip_rate", "pair_flip_rate", "spearman", "null_seed_flip_rate", "null_seed_spearman",
           "null_random_flip_rate", "null_random_spearman", "flip_excess", "test_acc", "train_acc",
           "test_acc_ntk", "test_acc_kernel", "trained", "test_acc_after", "rel_perturbation", "sgd_lr_limit",
           "weight_movement", "objective_match")


DRAW_COLUMNS = (*VERDICT, "data_seed", "excess_attn", "excess_relu", "gap", "nets_attn", "nets_relu")
VERDICT_COLUMNS = (*VERDICT, "role", "outcome", "why", "excess_attn", "excess_attn_low", "excess_attn_high",
                   "excess_relu", "excess_relu_low", "excess_relu_high", "gap", "gap_low", "gap_high", "gap_p",
                   "gap_p_holm", "gap_draws", "ratio", "ratio_low", "ratio_high", "trained_attn", "trained_relu",
                   "n_nets", "n_draws", "left_out", "gap_all", "gap_all_low", "gap_all_high", "objective_match",
                   "holds", "sensitivity")


def with_gaps(summary: pd.DataFrame, verdict: pd.DataFrame) -> pd.DataFrame:
    """The summary with the verdict frame's gap columns (``engine.experiments.verdict.GAPS``) on both
    architectures' rows of each (width, attack, ε, reading); NaN (empty text) where there is none."""
    out = summary.copy()
    if not len(out):
        return out
    by = verdict.set_index(list(VERDICT)) if len(verdict) else None
    for c in GAPS:
        text = c in ("role", "left_out")
        out[c] = [(by.at[k, c] if text else float(by.at[k, c])) if by is not None and k in by.index
                  else ("" if text else math.nan) for k in zip(*(out[v] for v in VERDICT), strict=True)]
    return out


def frame(rows: list[dict]) -> pd.DataFrame:
    """The ``rows`` frame: one row per ``FlipRow`` (stored as dicts), columns in field order."""
    return pd.DataFrame([asdict(FlipRow(**r)) for r in rows], columns=list(COLUMNS))


def kept(rows: pd.DataFrame, by: list[str] | tuple[str, ...] = GROUP) -> pd.Series:
    """Which rows a cell's pooled estimate uses: the nets through the training gate, unless fewer than
    ``GATE_SHARE`` of the group's nets pass (then the cell "did not train" and every net is shown)."""
    trained = rows["trained"].astype(bool)
    share = trained.groupby([rows[c] for c in by], sort=False).transform("mean")
    return trained | (share < GATE_SHARE)


def _net_names(rows: pd.DataFrame) -> str:
    return ", ".join(f"{'MLP-Attn' if a == 'attn' else '2L-ReLU'} draw {d} seed {s}"
                     for a, d, s in zip(rows["arch"], rows["data_seed"], rows["seed"], strict=True))


def summary(rows: pd.DataFrame, flips: list, nulls: bool) -> pd.DataFrame:
    """Mean and sd over the (draw, seed) nets of each ``GROUP`` through the training gate (``kept``), with
    the pooled excess's interval (``engine.maths.metrics.excess_interval``: draws the unit; ``flips``: one
    (attack, seed null, random null) per row of ``rows``, in order); ``trained_mean`` is the share of
    *all* the group's nets through the gate, ``n_nets`` all of them, ``n_left_out`` those below it."""
    if rows.empty:
        return summarize(rows, GROUP, METRICS)
    keep = kept(rows)
    out = summarize(rows[keep], GROUP, METRICS)
    groups = list(zip(*(out[c] for c in GROUP), strict=True))
    everyone = rows.groupby(GROUP, sort=False)
    out["trained_mean"] = [float(everyone.get_group(g)["trained"].astype(bool).mean()) for g in groups]
    out["n_nets"] = [int(len(everyone.get_group(g))) for g in groups]
    out["n_left_out"] = [int((~keep[everyone.get_group(g).index]).sum()) for g in groups]
    bounds = {}
    for g in groups:
        idx = [i for i in everyone.get_group(g).index if keep[i]]
        bounds[g] = (excess_interval([flips[i] for i in idx], draws=list(rows.loc[idx, "data_seed"])) if nulls
                     else (math.nan,) * 3)
    out["flip_excess_mean"] = [bounds[g][0] for g in groups]
    out["flip_excess_low"] = [bounds[g][1] for g in groups]
    out["flip_excess_high"] = [bounds[g][2] for g in groups]
    out["n_draws"] = [int(everyone.get_group(g)["data_seed"].nunique()) for g in groups]
    return out


def _cell(rows: pd.DataFrame, flips: list, mask: pd.Series) -> dict:
    """The gap of one verdict cell over the rows where ``mask`` holds, and each side's excess."""
    side = {a: rows[(rows["arch"] == a) & mask] for a in ("attn", "relu")}
    units = {a: [flips[i] for i in s.index] for a, s in side.items()}
    draws = {a: list(s["data_seed"]) for a, s in side.items()}
    out: dict[str, Any] = {"gap": gap_interval(units["attn"], units["relu"], draws["attn"], draws["relu"])}
    for a in ("attn", "relu"):
        out[a] = excess_interval(units[a], draws=draws[a])
        out[f"means_{a}"] = draw_means(units[a], draws[a]) if units[a] else {}
        out[f"nets_{a}"] = side[a].groupby("data_seed").size().to_dict()
    return out


def verdict(rows: pd.DataFrame, flips: list, nulls: bool,
            summ: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``verdict`` frame — one row per (width, attack, ε, reading) with both architectures — and the
    ``draws`` frame (one row per cell and data draw: each side's mean excess over its nets in that draw
    and their gap, the values the interval summarises).

    Each verdict row: each side's pooled excess and interval, the gap (MLP-Attn's excess minus 2L-ReLU's,
    paired within draws) with its interval, p-value and Holm-adjusted p (over the secondary cells), the
    ratio with Fieller's interval only where 2L-ReLU's excess interval excludes zero
    (``engine.maths.metrics``), over the nets through the training gate (``kept``), with ``left_out``
    naming the others and ``gap_all*`` the gap with them; ``role`` (``engine.experiments.verdict.roles``);
    ``outcome`` and ``why`` from ``flip_rule`` on the cell's summary, and ``holds`` = outcome "holds".
    ``summ``: ``summary(rows, flips, nulls)`` where the caller has it already (computed here otherwise)."""
    if not nulls or rows.empty or not {"attn", "relu"} <= set(rows["arch"]):
        return pd.DataFrame(columns=list(VERDICT_COLUMNS)), pd.DataFrame(columns=list(DRAW_COLUMNS))
    keep = kept(rows)
    out, per_draw = [], []
    for key, g in rows.groupby(list(VERDICT), sort=False):
        if not {"attn", "relu"} <= set(g["arch"]):
            continue
        mask = keep[g.index]
        c = _cell(g, flips, mask)
        gap, left = c["gap"], g[~mask]
        every = _cell(g, flips, mask | True)["gap"] if len(left) else gap
        cell = dict(zip(VERDICT, key, strict=True))
        out.append({**cell, "excess_attn": c["attn"].value, "excess_attn_low": c["attn"].low,
                    "excess_attn_high": c["attn"].high, "excess_relu": c["relu"].value,
                    "excess_relu_low": c["relu"].low, "excess_relu_high": c["relu"].high,
                    "gap": gap.difference, "gap_low": gap.low, "gap_high": gap.high, "gap_p": gap.p,
                    "gap_draws": gap.n_draws, "ratio": gap.ratio, "ratio_low": gap.ratio_low,
                    "ratio_high": gap.ratio_high,
                    "trained_attn": float(g[g["arch"] == "attn"]["trained"].astype(bool).mean()),
                    "trained_relu": float(g[g["arch"] == "relu"]["trained"].astype(bool).mean()),
                    "n_nets": int(len(g)), "n_draws": int(g["data_seed"].nunique()), "left_out": _net_names(left),
                    "gap_all": every.difference, "gap_all_low": every.low, "gap_all_high": every.high,
                    "objective_match": bool(g["objective_match"].astype(bool).all())})
        for d in c["means_attn"]:
            if d in c["means_relu"]:
                per_draw.append({**cell, "data_seed": d, "excess_attn": c["means_attn"][d],
                                 "excess_relu": c["means_relu"][d], "gap": c["means_attn"][d] - c["means_relu"][d],
                                 "nets_attn": int(c["nets_attn"].get(d, 0)), "nets_relu": int(c["nets_relu"].get(d, 0))})
    table = pd.DataFrame(out)
    if table.empty:
        return pd.DataFrame(columns=list(VERDICT_COLUMNS)), pd.DataFrame(columns=list(DRAW_COLUMNS))
    table["role"] = roles(table)
    secondary = table["role"] != "primary"
    table["gap_p_holm"] = table["gap_p"]
    table.loc[secondary, "gap_p_holm"] = holm(table.loc[secondary, "gap_p"])
    summ = with_gaps(summary(rows, flips, nulls) if summ is None else summ, table)
    rules = [flip_rule(summ[(summ["width"] == r["width"]) & (summ["reading"] == r["reading"])], r["attack"], r["eps"])
             for _, r in table.iterrows()]
    table["outcome"] = [v["outcome"] for v in rules]
    table["why"] = [v["why"] for v in rules]
    table["holds"] = table["outcome"] == "holds"
    table["sensitivity"] = [sensitivity_words(v) for v in rules]
    return table[list(VERDICT_COLUMNS)], pd.DataFrame(per_draw, columns=list(DRAW_COLUMNS))


# ---------------------------------------------------------------- one attack's flip row and its nulls

def random_perturbation(X: torch.Tensor, X_attacked: torch.Tensor, seed: int) -> torch.Tensor:
    """The random null's inputs: X (n, d) plus, in every row the attack moved, a uniformly random
    direction with exactly that row's ℓ2 perturbation norm ‖x'_i − x_i‖₂; unmoved rows stay
    bit-for-bit. Same space, dtype and device as X; drawn on the CPU from ``seed``.

    Not clipped to the pixel box (clipping would shrink the norm it is compared at), so a raw
    image may leave [0, 1] slightly; the networks see the row normalised either way."""
    r = (X_attacked - X).norm(dim=1, keepdim=True)
    g = torch.Generator().manual_seed(int(seed))
    u = torch.randn(X.shape, generator=g, dtype=torch.float64).to(X.device, X.dtype)
    u = u / u.norm(dim=1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    return torch.where(r > 0, X + u * r, X)


def flip_row(r: Reading, clean: ReadOut, after: ReadOut, rand: ReadOut | None, partner: ReadOut | None,
              top: torch.Tensor, nulls: bool, partner_seed: int | None) -> tuple[dict, tuple]:
    """A reading's flip rates, nulls and excess for one attack; and its per-point flips
    (attack, seed null or None, random null or None) over the top points."""
    b0, b1 = clean.at(top), after.at(top)
    every = r.name == "ridge"  # the ridge reading has every point: its ρ is over all of them
    spear = (lambda u, v: rank_correlation(u.agg, v.agg)) if every else (lambda u, v: rank_correlation(u.at(top), v.at(top)))
    row = {"flip_rate": flip_rate(b0, b1), "pair_flip_rate": flip_rate(clean.columns(top), after.columns(top)),
           "spearman": spear(clean, after), "spearman_points": int(clean.agg.numel() if every else top.numel()),
           "null_seed_flip_rate": math.nan, "null_seed_spearman": math.nan, "null_seed_partner": partner_seed,
           "null_seed_kind": "off" if not nulls else "one seed", "null_random_flip_rate": math.nan,
           "null_random_spearman": math.nan}
    attack_flips, seed_flips, random_flips = sign_flipped(b0, b1), None, None
    if partner is not None:
        other = partner.at(top)
        if torch.equal(other.cpu(), b0.cpu()):
            row["null_seed_kind"] = "seed-free"
        else:
            seed_flips = sign_flipped(b0, other)
            row.update(null_seed_kind="partner seed", null_seed_flip_rate=flip_rate(b0, other),
                       null_seed_spearman=spear(clean, partner))
    if rand is not None:
        random_flips = sign_flipped(b0, rand.at(top))
        row.update(null_random_flip_rate=flip_rate(b0, rand.at(top)), null_random_spearman=spear(clean, rand))
    excess = excess_interval([(attack_flips, seed_flips, random_flips)]) if nulls else (math.nan,) * 3
    row["flip_excess"], row["flip_excess_low"], row["flip_excess_high"] = excess
    return row, (attack_flips, seed_flips, random_flips)


def null_seed(seed: int, combo: int) -> int:
    """Seed of the random null's directions for one net and one (attack, ε)."""
    return (int(seed) * 1_000_003 + 7919 * (combo + 1)) % (2**63 - 1)


def seed_partners(seeds: tuple[int, ...]) -> dict[int, int]:
    """The seed null's pairs: each seed → the next one of the run, cyclically (none for one seed)."""
    return {} if len(seeds) < 2 else {int(s): int(seeds[(i + 1) % len(seeds)]) for i, s in enumerate(seeds)}
