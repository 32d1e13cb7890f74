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
  (``engine.experiments.flips.random_perturbation``);
- the seed null: no attack, the next network seed's net at the same epoch read against this one
  on this seed's top-τ points (paired after every seed has run: ``seed_nulls``).

The flip excess is the flip rate minus the larger null, with its bootstrap interval over nets and
points (``engine.maths.metrics.excess_interval``), exactly as on the Malleability page.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..maths.attacks import attack
from ..maths.influence import aggregate, top_indices
from ..maths.metrics import draw_interval, excess_interval, flip_rate, sign_flipped
from ..maths.training import predict_labels
from .flips import random_perturbation, seed_partners
from .influence import attack_dtype, in_space
from .malleability import attack_spec
from .readings import fresh_net, influence_of
from .recipes import Reading, net_recipe
from .runs import Prepared, check_finite

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from ..maths.models import Net
    from .configs.alignment import AlignmentConfig


def reading(cfg: AlignmentConfig) -> Reading:
    """The one reading along training: ridge leave-one-out on the net's own K_m(t), float64."""
    return Reading("ridge", "entk", cfg.target, cfg.ridge, "float64", cfg.precision)


def snapshot_flips(cfg: AlignmentConfig, p: Prepared, arch: str, width: int, seed: int, epoch: int, W: torch.Tensor,
                   loss: str, *, cancel: CancelFlag | None = None) -> dict:
    """One snapshot of one net: its clean aggregate influence (n,), its top-τ points, and the per-point
    sign flips of the attack and of the random null over them (JSON-able lists), with the attack's
    size and the accuracy of the net at W(t) before and after (MLP-Attn attends over the changed set)."""
    return flips_at(cfg, p, arch, width, seed, epoch, W, W, reading(cfg), loss, cancel=cancel)


def _net_at(cfg: AlignmentConfig, p: Prepared, arch: str, width: int, seed: int, W: torch.Tensor, r: Reading) -> Net:
    X32 = in_space(cfg, p)[0]
    net = fresh_net(net_recipe(cfg, arch, width, seed), X32, p.c, p.device)
    with torch.no_grad():
        net.mlp.W.copy_(W)
    return net.to(attack_dtype(r))  # our own copy: converted in place


def flips_at(cfg: AlignmentConfig, p: Prepared, arch: str, width: int, seed: int, epoch: int, W_kernel: torch.Tensor,
             W_attack: torch.Tensor, r: Reading, loss: str, *, cancel: CancelFlag | None = None) -> dict:
    """The attack of one cell of the causal design: the influence read by ``r`` on the kernel of the
    net with head W_kernel (``r.kernel`` "kinf": K∞ of the same features, which W does not change), its
    top-τ points, a PGD attack on the training loss of the net with head W_attack moving those rows,
    the influence read again on the attacked set and on a random perturbation of the same per-row
    norms. The attack's random start is drawn from (seed, epoch), the same for every cell of a snapshot."""
    X32, Xt32, box = in_space(cfg, p)
    X, Xt = X32.to(attack_dtype(r)), Xt32.to(attack_dtype(r))
    net = _net_at(cfg, p, arch, width, seed, W_kernel, r)
    attacker = net if W_attack is W_kernel else _net_at(cfg, p, arch, width, seed, W_attack, r)
    I0 = influence_of(r, net, X, p.Y, Xt, p.yt)
    check_finite(I0, f"the influence of {arch} m={width} at epoch {epoch}")
    agg0 = aggregate(I0)
    top = torch.sort(top_indices(agg0, cfg.tau)).values
    mask = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
    mask[top] = True
    spec = attack_spec(cfg, "pgd", cfg.eps, int(seed) * 100_003 + int(epoch))  # random start per net and epoch
    Xp = attack(attacker, X, p.y, p.c, spec, loss, mask, box, cancel)
    after = aggregate(influence_of(r, net, Xp, p.Y, Xt, p.yt, X_ref=Xp))
    Xr = random_perturbation(X, Xp, int(seed) * 7919 + int(epoch) + 1)
    rand = aggregate(influence_of(r, net, Xr, p.Y, Xt, p.yt, X_ref=Xr))
    with torch.no_grad():
        acc = float((predict_labels(attacker(Xt)) == p.yt).double().mean())
        acc_after = float((predict_labels(attacker.head(attacker.features(Xt, X_ref=Xp))) == p.yt).double().mean())
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
    frame = frame.merge(alignment[[*keys, "alignment", *(d for d in DISTANCES if d in alignment)]], on=keys,
                        how="left")
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


# ---------------------------------------------------------------- the causal design along training

KERNELS = ("K_m(0)", "K_m(t)", "K∞")      # the kernel that reads the influence
ATTACKERS = ("epoch 0", "epoch t")        # the net whose training loss the attack climbs
DESIGN_KEYS = ["data_seed", "arch", "width", "seed", "epoch", "kernel", "attacker"]


def design_flips(cfg: AlignmentConfig, p: Prepared, arch: str, width: int, seed: int,
                 snapshots: dict[int, torch.Tensor], W0: torch.Tensor, own: dict[int, dict], loss: str,
                 *, cancel: CancelFlag | None = None) -> list[dict]:
    """Every cell of the causal design of one net at every snapshot t: the influence read on K_m(0),
    K_m(t) or K∞ (``KERNELS``) × the attack climbing the loss of the epoch-0 or the epoch-t net
    (``ATTACKERS``), each as ``flips_at``. ``own``: the along-training snapshots already measured
    (K_m(t) read, epoch-t attacker), reused. Cells that are the same computation are computed once:
    (K_m(0), epoch 0) and (K∞, epoch 0) at every t, and every cell at t = 0, where W(t) = W(0)."""
    kinf = Reading("ridge", "kinf", cfg.target, cfg.ridge, "float64", cfg.precision)
    out, fixed = [], {}
    for e, We in sorted(snapshots.items()):
        for kernel in KERNELS:
            for attacker in ATTACKERS:
                late = e > 0 and (kernel == "K_m(t)" or attacker == "epoch t")
                if kernel == "K_m(t)" and attacker == "epoch t" and e in own:
                    cell = own[e]
                elif late:
                    r = kinf if kernel == "K∞" else reading(cfg)
                    cell = flips_at(cfg, p, arch, width, seed, e, We if kernel == "K_m(t)" else W0,
                                    We if attacker == "epoch t" else W0, r, loss, cancel=cancel)
                else:  # the same at every snapshot: K_m(0) or K∞ read, the epoch-0 net attacked
                    base = "K∞" if kernel == "K∞" else "K_m(0)"
                    if base not in fixed:
                        fixed[base] = flips_at(cfg, p, arch, width, seed, 0, W0, W0,
                                               kinf if base == "K∞" else reading(cfg), loss, cancel=cancel)
                    cell = fixed[base]
                out.append({"data_seed": None, "arch": arch, "width": width, "seed": seed, "epoch": e,
                            "kernel": kernel, "attacker": attacker, **cell})
    return out


def design_frames(cells: list[dict], seeds: tuple[int, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``flips_design`` rows (one per net, snapshot, kernel and attacker: flip rate, both nulls, the
    net's excess with its interval) and their summary per (arch, width, epoch, kernel, attacker): the
    pooled excess over (draw, seed) nets with draws the unit (``excess_interval``). The seed null pairs
    each net with the next seed's at the same cell (its clean influence on this net's points); K∞ of
    parameter-free features is the same for every seed, so its seed null is none ("seed-free")."""
    by = {tuple(c[k] for k in DESIGN_KEYS): c for c in cells}
    partner = seed_partners(seeds)
    rows, units = [], []
    for c in cells:
        key = [c[k] for k in DESIGN_KEYS]
        key[3] = partner.get(c["seed"], -1)
        other = by.get(tuple(key))
        top = np.asarray(c["top"], dtype=int)
        seed_null = None
        if other is not None and c["kernel"] != "K∞":
            seed_null = sign_flipped(np.asarray(c["agg"])[top], np.asarray(other["agg"])[top]).tolist()
        unit = (c["attack"], seed_null, c["random"])
        ex = excess_interval([unit])
        units.append(unit)
        rows.append({k: c[k] for k in DESIGN_KEYS} | {
            "flip_rate": c["flip_rate"], "null_random_flip_rate": c["null_random_flip_rate"],
            "null_seed_flip_rate": math.nan if seed_null is None else float(np.mean(seed_null)),
            "flip_excess": ex.value, "flip_excess_low": ex.low, "flip_excess_high": ex.high,
            "test_acc": c["test_acc"], "rel_perturbation": c["rel_perturbation"], "n_top": len(c["top"])})
    frame = pd.DataFrame(rows)
    summary = []
    if not frame.empty:
        for key, g in frame.groupby(["arch", "width", "epoch", "kernel", "attacker"], sort=True):
            ex = excess_interval([units[i] for i in g.index], draws=list(g["data_seed"]))
            summary.append(dict(zip(["arch", "width", "epoch", "kernel", "attacker"], key, strict=True))
                           | {"flip_excess": ex.value, "flip_excess_low": ex.low, "flip_excess_high": ex.high,
                              "flip_rate_mean": float(g["flip_rate"].mean()), "n_nets": int(len(g)),
                              "n_draws": int(g["data_seed"].nunique())})
    return frame, pd.DataFrame(summary)


DESIGN_RULE = ("per net, at the last snapshot T against the first: the kernel's effect is the change in its flip "
               "excess when the influence is read on K_m(T) instead of K_m(0), averaged over the two attackers; the "
               "attacker's effect is the change when the attack climbs the epoch-T net's loss instead of the epoch-0 "
               "net's, averaged over the two kernels; each pooled over nets with data draws the unit (95 % t "
               "interval over draw means; within one draw, over its nets). The excess follows an effect whose "
               "interval excludes zero: the kernel's movement, the attacker's training, both or neither.")


def design_effects(frame: pd.DataFrame) -> pd.DataFrame:
    """``DESIGN_RULE`` per architecture from the ``flips_design`` rows: the kernel's and the attacker's
    effects on the flip excess (fractions) with their intervals, the kernel regime's reading (K∞ against
    K_m(T), both attacked through the epoch-T net) with its interval, and ``follows``."""
    cols = ["arch", "width", "first", "last", "kernel_effect", "kernel_low", "kernel_high", "attacker_effect",
            "attacker_low", "attacker_high", "kinf_minus_km", "kinf_low", "kinf_high", "n_nets", "n_draws", "follows"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for (arch, width), g in frame.groupby(["arch", "width"], sort=True):
        first, last = int(g["epoch"].min()), int(g["epoch"].max())
        at = g[g["epoch"] == last].pivot_table(index=["data_seed", "seed"], columns=["kernel", "attacker"],
                                                values="flip_excess", aggfunc="first")
        if last == first or at.empty:
            continue
        x = {(k, a): at[(k, a)] for k in KERNELS for a in ATTACKERS if (k, a) in at}
        kernel = ((x[("K_m(t)", "epoch 0")] - x[("K_m(0)", "epoch 0")])
                  + (x[("K_m(t)", "epoch t")] - x[("K_m(0)", "epoch t")])) / 2
        attacker = ((x[("K_m(0)", "epoch t")] - x[("K_m(0)", "epoch 0")])
                    + (x[("K_m(t)", "epoch t")] - x[("K_m(t)", "epoch 0")])) / 2
        kinf = x[("K∞", "epoch t")] - x[("K_m(t)", "epoch t")]
        draws = list(at.index.get_level_values("data_seed"))
        k, a, q = (draw_interval(v, draws) for v in (kernel, attacker, kinf))
        moves = [name for name, (_, lo, hi, _) in (("kernel", k), ("attacker", a))
                 if math.isfinite(lo) and (lo > 0 or hi < 0)]
        out.append({"arch": arch, "width": int(width), "first": first, "last": last,
                    "kernel_effect": k[0], "kernel_low": k[1], "kernel_high": k[2],
                    "attacker_effect": a[0], "attacker_low": a[1], "attacker_high": a[2],
                    "kinf_minus_km": q[0], "kinf_low": q[1], "kinf_high": q[2], "n_nets": int(len(at)),
                    "n_draws": k[3], "follows": {2: "both", 0: "neither"}.get(len(moves), (moves or [""])[0])})
    return pd.DataFrame(out, columns=cols)


DISTANCES = {  # training-frame column -> what it measures (engine.maths.ridge)
    "kernel_dist": "‖K_m(t) − K∞‖_F / ‖K∞‖_F",
    "kernel_dist_whitened": "the whitened distance ‖(K∞+λI)^-½ (K_m(t) − K∞) (K∞+λI)^-½‖₂",
    "prediction_gap": "the ridge prediction gap ‖f_KRR(K_m(t)) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖",
}
ASSOCIATION_WORDS = ("Spearman's ρ between a net's distance from K∞ at a snapshot and its flip excess there (ridge "
                     "on K_m(t), the epoch-t net attacked), over every net and snapshot, for each distance; 95 % "
                     "percentile interval from 2000 resamples of whole nets (each net's snapshots together)")


def association(flips: pd.DataFrame, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """``ASSOCIATION_WORDS`` per distance (``DISTANCES``, those in the frame) and architecture, and over
    both: the direct test of "malleability is the signature of leaving the kernel regime" (ρ > 0 where
    it is). ``flips``: the ``flips_training`` rows (columns data_seed, arch, seed, epoch, flip_excess
    and the distances)."""
    from scipy.stats import spearmanr

    cols = ["distance", "arch", "rho", "low", "high", "n_points", "n_nets"]
    out = []
    for distance in (d for d in DISTANCES if d in flips):
        for arch, g in [*flips.groupby("arch", sort=True), ("both", flips)]:
            g = g.dropna(subset=[distance, "flip_excess"])
            nets = [h[[distance, "flip_excess"]].to_numpy() for _, h in g.groupby(["data_seed", "arch", "seed"])]
            if len(g) < 3 or len(nets) < 2:
                continue
            if np.ptp(g[distance]) == 0 or np.ptp(g["flip_excess"]) == 0:  # ρ is undefined on a constant column
                out.append({"distance": distance, "arch": arch, "rho": math.nan, "low": math.nan, "high": math.nan,
                            "n_points": int(len(g)), "n_nets": len(nets)})
                continue
            rho = float(spearmanr(g[distance], g["flip_excess"]).statistic)
            rng, boot = np.random.default_rng(seed), []
            for _ in range(resamples):
                pick = np.concatenate([nets[i] for i in rng.integers(0, len(nets), len(nets))])
                if np.ptp(pick[:, 0]) > 0 and np.ptp(pick[:, 1]) > 0:
                    boot.append(spearmanr(pick[:, 0], pick[:, 1]).statistic)
            low, high = (np.percentile(boot, [2.5, 97.5]) if boot else (math.nan, math.nan))
            out.append({"distance": distance, "arch": arch, "rho": rho, "low": float(low), "high": float(high),
                        "n_points": int(len(g)), "n_nets": len(nets)})
    return pd.DataFrame(out, columns=cols)
