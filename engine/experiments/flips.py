"""The malleability experiment's rows, declared once: one typed row per (data draw, arch, width,
seed, attack, ε, reading), the per-point flips behind its excess, and the frames made of them
(``rows``, ``summary``, ``verdict``), built in this one place.

Each row is a ``FlipRow``; its fields are the frame's columns in order, so a page or a report
reads a column that a dataclass declares (``FlipRow.flip_excess``'s docstring is its field
comment here), not a string made up elsewhere. The metrics themselves (flip rate, rank
correlation, the excess with its interval, the gap between architectures) are
``engine.maths.metrics``'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import pandas as pd

from ..maths.metrics import excess_interval, gap_interval, summarize

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


GAPS = ("gap", "gap_low", "gap_high", "ratio", "ratio_low", "ratio_high")


def with_gaps(summary: pd.DataFrame, verdict: pd.DataFrame) -> pd.DataFrame:
    """The summary with the gap between the architectures' excesses (``verdict``'s ``GAPS``) on
    both architectures' rows of each (width, attack, ε, reading); NaN where there is none."""
    out = summary.copy()
    if not len(out):
        return out
    by = verdict.set_index(list(VERDICT)) if len(verdict) else None
    for c in GAPS:
        out[c] = [float(by.at[k, c]) if by is not None and k in by.index else math.nan
                  for k in zip(*(out[v] for v in VERDICT), strict=True)]
    return out


def frame(rows: list[dict]) -> pd.DataFrame:
    """The ``rows`` frame: one row per ``FlipRow`` (stored as dicts), columns in field order."""
    return pd.DataFrame([asdict(FlipRow(**r)) for r in rows], columns=list(COLUMNS))


def summary(rows: pd.DataFrame, flips: list, nulls: bool) -> pd.DataFrame:
    """Mean and sd over (draw, seed) per ``GROUP``, with the pooled excess's interval: the nets'
    tracked points resampled within each net, the nets within each draw, and the draws (``flips``:
    one (attack, seed null, random null) per row of ``rows``, in order)."""
    out = summarize(rows, GROUP, METRICS)
    if not len(out):
        return out
    keys = [(d, *g) for d, g in zip(rows["data_seed"], zip(*(rows[c] for c in GROUP), strict=True), strict=True)]
    bounds = {}
    for key in dict.fromkeys(k[1:] for k in keys):
        units = [(f, k[0]) for f, k in zip(flips, keys, strict=True) if k[1:] == key]
        bounds[key] = (excess_interval([u for u, _ in units], draws=[d for _, d in units]) if nulls
                       else (math.nan,) * 3)
    groups = list(zip(*(out[c] for c in GROUP), strict=True))
    out["flip_excess_low"] = [bounds[g][1] for g in groups]
    out["flip_excess_high"] = [bounds[g][2] for g in groups]
    draws = rows.groupby(GROUP, sort=False)["data_seed"].nunique()
    out["n_draws"] = [int(draws[g]) for g in groups]
    return out



def verdict(rows: pd.DataFrame, flips: list, nulls: bool) -> pd.DataFrame:
    """One row per (width, attack, ε, reading) with both architectures: each one's excess, the gap
    (MLP-Attn's excess minus 2L-ReLU's) with its interval pooled over draws, seeds and points, and
    the ratio with its interval only where 2L-ReLU's excess interval excludes zero
    (``engine.maths.metrics.gap_interval``); ``holds``: the gap's interval lies above zero and both
    nets passed the training gate on every seed."""
    cols = [*VERDICT, "excess_attn", "excess_relu", "gap", "gap_low", "gap_high", "ratio", "ratio_low",
            "ratio_high", "trained_attn", "trained_relu", "n_nets", "n_draws", "objective_match", "holds"]
    if not nulls or rows.empty or not {"attn", "relu"} <= set(rows["arch"]):
        return pd.DataFrame(columns=cols)
    out = []
    for key, g in rows.groupby(list(VERDICT), sort=False):
        side = {a: g[g["arch"] == a] for a in ("attn", "relu")}
        if any(s.empty for s in side.values()):
            continue
        units = {a: [flips[i] for i in s.index] for a, s in side.items()}
        draws = {a: list(s["data_seed"]) for a, s in side.items()}
        gap = gap_interval(units["attn"], units["relu"], draws["attn"], draws["relu"])
        trained = {a: bool(s["trained"].astype(bool).all()) for a, s in side.items()}
        out.append({**dict(zip(VERDICT, key, strict=True)),
                    "excess_attn": float(side["attn"]["flip_excess"].mean()),
                    "excess_relu": float(side["relu"]["flip_excess"].mean()),
                    "gap": gap.difference, "gap_low": gap.low, "gap_high": gap.high, "ratio": gap.ratio,
                    "ratio_low": gap.ratio_low, "ratio_high": gap.ratio_high, "trained_attn": trained["attn"],
                    "trained_relu": trained["relu"], "n_nets": int(len(g)), "n_draws": int(g["data_seed"].nunique()),
                    "objective_match": bool(g["objective_match"].astype(bool).all()),
                    "holds": bool(gap.low > 0 and all(trained.values()))})
    return pd.DataFrame(out, columns=cols)

