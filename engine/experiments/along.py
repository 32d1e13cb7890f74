"""Flip rates along training: the vulnerability half measured at the same snapshots as the alignment.

The ``alignment`` experiment asks whether leaving the kernel regime raises a net's kernel–target
alignment (the "power" side of the paper's title). This module measures, at the very same snapshot
epochs and nets, how easily that net's influence is manipulated (the "vulnerability" side), so that
one figure shows both per architecture.

At each snapshot epoch t of the largest width, with the head's weights W(t) in place:

- the ridge reading: exact kernel-ridge leave-one-out influence on the net's own K_m(t)
  (``engine.experiments.readings.read``, the malleability experiment's reading), its top-τ points;
- the attack: PGD on the training loss of the net at W(t), moving only the top-τ rows
  (``engine.maths.attacks.attack``, in the config's space), the influence read again on the
  perturbed set (MLP-Attn's attention over it, as in ``malleability``);
- the random null: the same per-row ℓ2 norms in random directions
  (``engine.experiments.malleability.random_perturbation``);
- the seed null: no attack, the next network seed's net at the same epoch read against this one
  on this seed's top-τ points (paired after every seed has run: ``seed_nulls``).

The flip excess is the flip rate minus the larger null, with its bootstrap interval over nets and
points (``engine.maths.metrics.excess_interval``), exactly as on the Malleability page.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..maths.attacks import attack
from ..maths.influence import aggregate, top_indices
from ..maths.metrics import excess_interval, flip_rate, sign_flipped
from ..maths.training import predict_labels
from .influence import attack_dtype, in_space
from .malleability import attack_spec, random_perturbation, seed_partners
from .readings import fresh_net, influence_of
from .recipes import Reading, net_recipe
from .runs import Prepared, check_finite


def reading(cfg) -> Reading:
    """The one reading along training: ridge leave-one-out on the net's own K_m(t), float64."""
    return Reading("ridge", "entk", cfg.target, cfg.ridge, "float64", cfg.precision)


def snapshot_flips(cfg, p: Prepared, arch: str, width: int, seed: int, epoch: int, W: torch.Tensor,
                   loss: str, cancel=None) -> dict:
    """One snapshot of one net: its clean aggregate influence (n,), its top-τ points, and the per-point
    sign flips of the attack and of the random null over them (JSON-able lists), with the attack's
    size and the accuracy of the net at W(t) before and after (MLP-Attn attends over the changed set)."""
    r = reading(cfg)
    X32, Xt32, box = in_space(cfg, p)
    X, Xt = X32.to(attack_dtype(r)), Xt32.to(attack_dtype(r))
    net = fresh_net(net_recipe(cfg, arch, width, seed), X32, p.c, p.device)
    with torch.no_grad():
        net.mlp.W.copy_(W)
    net = net.to(attack_dtype(r))  # our own copy: converted in place
    I0 = influence_of(r, net, X, p.Y, Xt, p.yt)
    check_finite(I0, f"the influence of {arch} m={width} at epoch {epoch}")
    agg0 = aggregate(I0)
    top = torch.sort(top_indices(agg0, cfg.tau)).values
    mask = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
    mask[top] = True
    spec = attack_spec(cfg, "pgd", cfg.eps, int(seed) * 100_003 + int(epoch))  # random start per net and epoch
    Xp = attack(net, X, p.y, p.c, spec, loss, mask, box, cancel)
    after = aggregate(influence_of(r, net, Xp, p.Y, Xt, p.yt, X_ref=Xp))
    Xr = random_perturbation(X, Xp, int(seed) * 7919 + int(epoch) + 1)
    rand = aggregate(influence_of(r, net, Xr, p.Y, Xt, p.yt, X_ref=Xr))
    with torch.no_grad():
        acc = float((predict_labels(net(Xt)) == p.yt).double().mean())
        acc_after = float((predict_labels(net.head(net.features(Xt, X_ref=Xp))) == p.yt).double().mean())
    delta = (Xp - X)[top]
    return {"agg": agg0.cpu().tolist(), "top": top.cpu().tolist(),
            "attack": sign_flipped(agg0[top], after[top]).tolist(),
            "random": sign_flipped(agg0[top], rand[top]).tolist(),
            "flip_rate": flip_rate(agg0[top], after[top]), "null_random_flip_rate": flip_rate(agg0[top], rand[top]),
            "test_acc": acc, "test_acc_after": acc_after,
            "rel_perturbation": float((delta.norm(dim=1) / X[top].norm(dim=1).clamp_min(1e-12)).mean())}


def seed_nulls(snaps: list[dict], seeds: tuple[int, ...]) -> list[dict]:
    """Pair every snapshot with the next seed's at the same (draw, arch, width, epoch), cyclically
    (``malleability``'s pairing), and add its seed null's per-point flips (None with one seed)."""
    by_key = {(s["data_seed"], s["arch"], s["width"], s["epoch"], s["seed"]): s for s in snaps}
    partner = seed_partners(seeds)
    out = []
    for s in snaps:
        other = by_key.get((s["data_seed"], s["arch"], s["width"], s["epoch"], partner.get(s["seed"], -1)))
        if other is None:
            out.append({**s, "seed_null": None, "null_seed_partner": None, "null_seed_flip_rate": math.nan})
            continue
        top = np.asarray(s["top"], dtype=int)
        mine, theirs = np.asarray(s["agg"])[top], np.asarray(other["agg"])[top]
        out.append({**s, "seed_null": sign_flipped(mine, theirs).tolist(), "null_seed_partner": other["seed"],
                    "null_seed_flip_rate": flip_rate(mine, theirs)})
    return out


def frames(snaps: list[dict], alignment: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``flips_training`` rows (one per draw, arch, width, seed, epoch: flip rate, both nulls, the
    net's own excess with its interval, beside its alignment at that epoch) and their summary per
    (arch, width, epoch): alignment mean ± sd and the pooled excess with its interval over (draw,
    seed) nets and their points, the draws resampled first."""
    rows = []
    for s in snaps:
        unit = (s["attack"], s["seed_null"], s["random"])
        ex = excess_interval([unit])
        rows.append({k: s[k] for k in ("data_seed", "arch", "width", "seed", "epoch", "test_acc", "test_acc_after",
                                      "rel_perturbation", "null_seed_partner", "flip_rate", "null_random_flip_rate")}
                    | {"n_top": len(s["top"]), "null_seed_flip_rate": s["null_seed_flip_rate"],
                       "flip_excess": ex.value, "flip_excess_low": ex.low, "flip_excess_high": ex.high})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, frame
    keys = ["data_seed", "arch", "width", "seed", "epoch"]
    frame = frame.merge(alignment[[*keys, "alignment", "kernel_dist"]], on=keys, how="left")
    summary = []
    for (arch, width, epoch), g in frame.groupby(["arch", "width", "epoch"], sort=True):
        mine = [s for s in snaps if (s["arch"], s["width"], s["epoch"]) == (arch, width, epoch)]
        ex = excess_interval([(s["attack"], s["seed_null"], s["random"]) for s in mine],
                             draws=[s["data_seed"] for s in mine])
        summary.append({"arch": arch, "width": int(width), "epoch": int(epoch),
                        "alignment_mean": float(g["alignment"].mean()), "alignment_sd": float(g["alignment"].std()),
                        **{f"{c}_mean": float(g[c].mean()) for c in ("flip_rate", "null_seed_flip_rate",
                                                                     "null_random_flip_rate")},
                        "flip_excess": ex.value, "flip_excess_low": ex.low, "flip_excess_high": ex.high,
                        "n_nets": int(len(g))})
    return frame, pd.DataFrame(summary)
