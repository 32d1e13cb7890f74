"""The ``malleability`` experiment: how adversarial perturbation of the training data flips influences.

Protocol (Definition 3.4 of the paper, with every choice it leaves open an option):

1. Train the net on clean data (per network seed); compute the NTK influence matrix I
   (n_test, n) with its trained empirical kernel, on the chosen influence ``target``
   (``true``: each test point's own-class output, the default; ``margin``: own class minus
   the best other class; ``sum``: the label-free sum over outputs, for comparison), and the
   aggregate influence of each training point (mean over test points).
2. Take the top-τ training points by |aggregate influence|.
3. Perturb the training inputs with an attack on the trained model's training loss, in the
   ``space`` the attack lives in (``raw`` pixels, or the ℓ2-``normalized`` rows the networks
   see) with the attack's norm (ℓ∞ or ℓ2) and radius ε in that space's units
   (``perturb="top"``: only the top-τ points move; ``"all"``: every point). For MLP-Attn, C
   is recomputed from the perturbed set, so every feature changes.
4. Recompute features, empirical kernel and influences — with the same trained W by
   default (``retrain=False``), or with a net retrained on the perturbed data.
5. Flip rate (``engine.maths.metrics.flip_rate``): share of the top-τ points whose aggregate
   influence changed sign. Also the per-(test, train)-pair flip rate over the top-τ columns,
   and Spearman ρ (``engine.maths.metrics.rank_correlation``) between the aggregate influences
   before and after over all training points (lower = more malleable).
6. Nulls, on the same top-τ points: the flip rate between two nets that differ only in their
   network seed (no attack), and under a random perturbation of the attack's per-row ℓ2 norm.
   ``flip_excess`` is the attack's flip rate minus the larger null, with a bootstrap interval:
   a flip rate the nulls reach already says nothing about the attack.

Kernel (``influence_kernel``): the trained net's eNTK K_m (default, the paper's) or K∞ of the
same features. Precision (``precision``): training runs in float32; the attack, features and
kernels in float64 by default (rows record ``attack_precision`` and ``kernel_precision``).

Interventions (Curated: remove the top-τ points; Transformed: replace them by their
adversarial versions; Adversarial: the attack on every point) retrain on the changed set and
report test accuracy and how much the influences moved.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import torch

from ..maths.attacks import attack
from ..maths.specs import AttackSpec
from ..runtime.cache import Result
from ..maths.influence import aggregate, top_indices
from .runs import Prepared, Progress, experiment_run, prepare, resumable, sub_progress, tick
from ..maths.metrics import excess_interval, flip_rate, rank_correlation, sign_flipped, summarize
from ..maths.training import accuracy, predict_labels, resolve_loss
from .influence import (at_precision, attack_dtype, clean_run, fit_net, in_space, influence_of, kernel_precision,
                        ntk_accuracy)
from .configs.malleability import MalleabilityConfig

ROW_METRICS = ("flip_rate", "pair_flip_rate", "spearman", "null_seed_flip_rate", "null_seed_spearman",
               "null_random_flip_rate", "null_random_spearman", "flip_excess", "test_acc", "train_acc",
               "test_acc_ntk", "test_acc_kernel", "trained", "test_acc_after", "rel_perturbation", "sgd_lr_limit")


def attack_spec(cfg: MalleabilityConfig, method: str, eps: float, seed: int) -> AttackSpec:
    """The config's attack with one method, radius and seed filled in."""
    return replace(cfg.attack, method=method, eps=float(eps), seed=int(seed))


# ---------------------------------------------------------------- malleability

def example_key(arch: str, method: str, eps: float, what: str) -> str:
    """Array name of the before/after example of one (arch, attack, ε) (first seed)."""
    return f"{arch}|{method}|{float(eps):g}|{what}"


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


def _after(cfg, arch, net, p: Prepared, X, Xt, Xp, seed, cancel):
    """Influence (n_test, n) and test accuracy after the training inputs moved to Xp."""
    if cfg.retrain:
        net_after = fit_net(cfg, arch, Xp.float(), p.y, p.c, p.device, seed, cancel=cancel)
        I1 = influence_of(cfg, at_precision(cfg, net_after), Xp, p.Y, Xt, p.yt)
        return I1, accuracy(net_after, Xt.float(), p.yt)
    I1 = influence_of(cfg, net, Xp, p.Y, Xt, p.yt, X_ref=Xp)
    with torch.no_grad():  # MLP-Attn's test features now use the perturbed set's C
        pred = predict_labels(net.head(net.features(Xt, X_ref=Xp)))
    return I1, float((pred == p.yt).double().mean())


def _measure(cfg, arch, net, p: Prepared, X, Xt, box, spec, I0, agg0, top, loss, seed, null_seed, cancel):
    """Attack, recompute influences, compare with the clean ones (I0, agg0); the same for a
    random perturbation of the same per-row norm (the random null). Returns the row, the
    perturbed inputs, the influences after, and the per-point flips (attack, random null) (k,)."""
    mask = None
    if cfg.perturb == "top":
        mask = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        mask[top] = True
    Xp = attack(net, X, p.y, p.c, spec, loss, mask, box, cancel)
    I1, acc_after = _after(cfg, arch, net, p, X, Xt, Xp, seed, cancel)
    agg1 = aggregate(I1)
    delta = Xp - X
    moved = delta.abs().amax(dim=1) > 0
    rel = (delta.norm(dim=1) / X.norm(dim=1).clamp_min(1e-12))[moved]
    flips = sign_flipped(agg0[top], agg1[top])
    row = {
        "flip_rate": flip_rate(agg0[top], agg1[top]),
        "pair_flip_rate": flip_rate(I0[:, top], I1[:, top]),
        "spearman": rank_correlation(agg0, agg1),
        "test_acc_after": acc_after,
        "rel_perturbation": float(rel.mean()) if rel.numel() else 0.0,
        "max_abs_perturbation": float(delta.abs().max()),
        "max_l2_perturbation": float(delta.norm(dim=1).max()),
        "points_moved": int(moved.sum()),
        "null_random_flip_rate": math.nan, "null_random_spearman": math.nan,
    }
    random_flips = None
    if cfg.nulls:
        Xr = random_perturbation(X, Xp, null_seed)
        aggr = aggregate(_after(cfg, arch, net, p, X, Xt, Xr, seed, cancel)[0])
        random_flips = sign_flipped(agg0[top], aggr[top])
        row.update(null_random_flip_rate=flip_rate(agg0[top], aggr[top]),
                   null_random_spearman=rank_correlation(agg0, aggr))
    return row, Xp, agg1, (flips, random_flips)


def _draws(cfg: MalleabilityConfig) -> tuple[int, ...]:
    return cfg.data_seeds or (cfg.data.seed,)


@experiment_run("malleability")
def run_malleability(cfg: MalleabilityConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
    """Flip rates of NTK influence under attacks on the training data, with their null baselines,
    per (data draw, arch, seed, attack, ε).

    Frame ``rows``: data_seed, arch, seed, attack, eps, norm, space, target, flip_rate (top-τ
    points whose aggregate influence changed sign, over n_top points), pair_flip_rate,
    spearman; the nulls (``cfg.nulls``, on by default), both over the same top-τ points of the
    same net:

    - null_seed_flip_rate / null_seed_spearman: no attack; the net of the next network seed
      of the run (cyclically: seeds s₀ → s₁ → … → s₀, within one data draw) against this
      one, on *this* seed's top-τ points (the points its flip_rate is over). NaN with one seed.
    - null_random_flip_rate / null_random_spearman: the attack's perturbation replaced by a
      random direction of the same ℓ2 norm in every moved row (``random_perturbation``), in
      the same space, re-measured exactly as the attack is.
    - flip_excess = flip_rate − max(null_seed_flip_rate, null_random_flip_rate) (the random
      null alone with one seed), with flip_excess_low / _high: a 95 % percentile bootstrap
      over the tracked points (``engine.maths.metrics.excess_interval``).

    Then test_acc and train_acc (clean net), test_acc_ntk (K∞ ridge on the same features),
    test_acc_kernel (ridge with the trained net's K_m), trained (``engine.maths.gates.passes_gate``:
    test_acc within TRAIN_GATE of test_acc_kernel), test_acc_after, rel_perturbation (mean
    ‖δ‖₂/‖x‖₂ applied, in the attack's space), sgd_lr_limit, attack_precision and
    kernel_precision, and the options that produced them. Frame ``summary``: mean and sd over
    (draw, seed) per (arch, attack, eps), with flip_excess_low / _high from the bootstrap
    over nets and their points. Frame ``interventions`` (when asked): arch, seed,
    intervention, test_acc, influence_change, spearman, flip_rate. Arrays (first draw and
    seed), per (arch, attack, ε) under ``example_key``: ``top_idx``, ``X_clean`` and
    ``X_pert`` (k, d) float32 in the attack's space, ``infl_before`` and ``infl_after`` (n,).
    """
    rows, inter, arrays, flips, metas = [], [], {}, [], []
    draws = _draws(cfg)
    for i, ds in enumerate(draws):
        sub = sub_progress(progress, i / len(draws), (i + 1) / len(draws), f"data draw {ds}") \
            if len(draws) > 1 else progress
        metas.append(_malleability_draw(replace(cfg, data=replace(cfg.data, seed=ds)), data_dir, dev, sub,
                                        cancel, rows, inter, arrays if i == 0 else {}, flips))
    tick(progress, cancel, 1.0, "done")
    frame = pd.DataFrame(rows)
    summary = summarize(frame, ["arch", "attack", "eps"], ROW_METRICS)
    if len(summary):  # the interval of the mean excess: nets and their points resampled together
        keys = list(zip(frame["arch"], frame["attack"], frame["eps"]))
        nan = (math.nan,) * 3
        bounds = {k: excess_interval([f for f, kk in zip(flips, keys) if kk == k]) if cfg.nulls else nan
                  for k in dict.fromkeys(keys)}
        groups = list(zip(summary["arch"], summary["attack"], summary["eps"]))
        summary["flip_excess_low"] = [bounds[k][1] for k in groups]
        summary["flip_excess_high"] = [bounds[k][2] for k in groups]
    inter_frame = pd.DataFrame(inter)
    frames = {"rows": frame, "summary": summary, "interventions": inter_frame,
              "interventions_summary": summarize(inter_frame, ["arch", "intervention"],
                                                 ("test_acc", "influence_change", "spearman", "flip_rate"))}
    meta = {**metas[0], "data_seeds": list(draws)}
    return Result("malleability", {}, frames, arrays, meta)


def _malleability_draw(cfg, data_dir, dev, progress, cancel, rows, inter, arrays, flips) -> dict:
    """One data draw of ``run_malleability``: appends its rows, interventions and per-row flips."""
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample, loss = p.sample, resolve_loss(cfg.train, p.c)
    X32, Xt32, box = in_space(cfg, p)
    X, Xt = X32.to(attack_dtype(cfg)), Xt32.to(attack_dtype(cfg))
    combos = [(a, e) for a in cfg.attacks for e in cfg.eps]
    runs = [(a, s) for a in cfg.archs for s in cfg.seeds]
    ntk_acc, clean_agg, first_row = {}, {}, len(rows)
    for k, (arch, seed) in enumerate(runs):
        span = k / len(runs), (k + 1) / len(runs)
        unit = resumable(f"{arch} seed {seed} draw {cfg.data.seed}", lambda: _malleability_net(
            cfg, p, arch, seed, (X32, Xt32, X, Xt, box), loss, combos, ntk_acc, span, progress, cancel))
        rows += unit["rows"]
        flips += [tuple(f) for f in unit["flips"]]
        inter += unit["inter"]
        clean_agg[(arch, seed)] = unit["agg0"], unit["top"]
        arrays.update(unit["examples"])  # the first seed's only
    _seed_nulls(cfg, rows, flips, first_row, clean_agg)
    return {"image_shape": list(sample.image_shape) if sample.image_shape else None,
            "class_names": list(sample.class_names), "n": sample.n, "n_test": int(sample.X_test.shape[0]),
            "source": sample.source, "shown_seed": cfg.seeds[0], "space": cfg.space,
            "norm": cfg.attack.norm, "target": cfg.target, "adversarial_training": cfg.adversarial_training,
            "storage": cfg.storage, "influence_kernel": cfg.influence_kernel, "precision": cfg.precision,
            "null_seed_pairs": _partners(cfg.seeds)}


def _malleability_net(cfg, p: Prepared, arch, seed, inputs, loss, combos, ntk_acc: dict, span, progress,
                      cancel) -> dict:
    """One (arch, seed) of a draw: the clean net, every (attack, ε) row with its per-point flips,
    the interventions, and the first seed's example arrays. ``inputs``: X32, Xt32 (the attack's
    space, float32), X, Xt (at the attack's precision) and the pixel box."""
    X32, Xt32, X, Xt, box = inputs
    lo, hi = span
    adv = attack_spec(cfg, "pgd", cfg.eps[0], seed) if cfg.adversarial_training else None
    net32 = fit_net(cfg, arch, X32, p.y, p.c, p.device, seed, box, adv,
                    sub_progress(progress, lo, lo + 0.5 * (hi - lo), f"training {arch} seed {seed}"), cancel)
    net = at_precision(cfg, net32)
    if arch not in ntk_acc:  # the K∞ baseline depends on neither seed nor training
        ntk_acc[arch] = ntk_accuracy(cfg, arch, X, Xt, p.Y, p.yt, p.c, p.device)
    I0, clean = clean_run(cfg, net32, net, X32, Xt32, X, Xt, p, ntk_acc[arch])
    agg0 = aggregate(I0)
    top = top_indices(agg0, cfg.tau)
    rows, flips, examples, first_Xp = [], [], {}, None
    for j, (method, eps) in enumerate(combos):
        tick(progress, cancel, lo + (0.5 + 0.3 * j / len(combos)) * (hi - lo), f"{arch} seed {seed}: {method} ε={eps:g}")
        spec = attack_spec(cfg, method, eps, seed)
        row, Xp, agg1, point_flips = _measure(cfg, arch, net, p, X, Xt, box, spec, I0, agg0, top, loss, seed,
                                              _null_seed(seed, j), cancel)
        rows.append({"data_seed": cfg.data.seed, "arch": arch, "seed": seed, "attack": method, "eps": float(eps),
                     **row, **clean, "n_top": int(top.numel()), "norm": cfg.attack.norm, "space": cfg.space,
                     "target": cfg.target, "perturb": cfg.perturb, "retrain": cfg.retrain,
                     "adversarial_training": cfg.adversarial_training, "tau": cfg.tau,
                     "ridge": cfg.ridge, "influence_kernel": cfg.influence_kernel, "init": cfg.init,
                     "attention": cfg.attention if arch == "attn" else None,
                     "optimizer": cfg.train.optimizer, "storage": cfg.storage,
                     "attack_precision": cfg.precision, "kernel_precision": kernel_precision(cfg),
                     "steps": 1 if method == "fgsm" else spec.steps,
                     "step_size": eps if method == "fgsm" else spec.alpha})
        flips.append(point_flips)
        first_Xp = Xp if first_Xp is None else first_Xp
        if seed == cfg.seeds[0]:
            examples.update({example_key(arch, method, eps, "top_idx"): top.cpu().numpy(),
                             example_key(arch, method, eps, "X_clean"): X[top].float().cpu().numpy(),
                             example_key(arch, method, eps, "X_pert"): Xp[top].float().cpu().numpy(),
                             example_key(arch, method, eps, "infl_before"): agg0.cpu().numpy(),
                             example_key(arch, method, eps, "infl_after"): agg1.cpu().numpy()})
    inter = []
    if cfg.interventions:
        tick(progress, cancel, lo + 0.8 * (hi - lo), f"{arch} seed {seed}: interventions")
        inter = _interventions(cfg, arch, seed, net, p, X, Xt, box, agg0, top, clean["test_acc"], first_Xp, loss,
                               cancel)
    return {"rows": rows, "flips": flips, "inter": inter, "agg0": agg0, "top": top, "examples": examples}


def _null_seed(seed: int, combo: int) -> int:
    """Seed of the random null's directions for one net and one (attack, ε)."""
    return (int(seed) * 1_000_003 + 7919 * (combo + 1)) % (2**63 - 1)


def _partners(seeds: tuple[int, ...]) -> dict:
    """The seed null's pairs: each seed → the next one of the run, cyclically (none for one seed)."""
    return {} if len(seeds) < 2 else {int(s): int(seeds[(i + 1) % len(seeds)]) for i, s in enumerate(seeds)}


def _seed_nulls(cfg, rows, flips, first_row, clean_agg) -> None:
    """Fill the seed null and the excess into this draw's rows (rows[first_row:]) in place."""
    partners = _partners(cfg.seeds) if cfg.nulls else {}
    for i in range(first_row, len(rows)):
        row, (attack_flips, random_flips) = rows[i], flips[i]
        agg0, top = clean_agg[(row["arch"], row["seed"])]
        seed_flips = None
        row["null_seed_partner"] = partners.get(row["seed"])
        row["null_seed_flip_rate"] = row["null_seed_spearman"] = math.nan
        if row["null_seed_partner"] is not None:
            other = clean_agg[(row["arch"], row["null_seed_partner"])][0]
            seed_flips = sign_flipped(agg0[top], other[top])
            row["null_seed_flip_rate"] = flip_rate(agg0[top], other[top])
            row["null_seed_spearman"] = rank_correlation(agg0, other)
        flips[i] = (attack_flips, seed_flips, random_flips)
        if cfg.nulls:
            row["flip_excess"], row["flip_excess_low"], row["flip_excess_high"] = excess_interval([flips[i]])
        else:
            row["flip_excess"] = row["flip_excess_low"] = row["flip_excess_high"] = math.nan


def _interventions(cfg, arch, seed, net, p: Prepared, X, Xt, box, agg0, top, acc, X_attacked, loss, cancel):
    """Curated / Transformed / Adversarial retraining, compared with the clean net.

    ``X_attacked``: the training set after the first attack (its top-τ rows replace the
    clean ones in Transformed)."""
    y, Y, yt, c = p.y, p.Y, p.yt, p.c
    out = [{"arch": arch, "seed": seed, "intervention": "none", "test_acc": acc, "influence_change": 0.0,
            "spearman": 1.0, "flip_rate": 0.0}]
    keep = torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
    keep[top] = False
    X_adv_all = attack(net, X, y, c, attack_spec(cfg, "pgd", cfg.eps[0], seed), loss, None, box, cancel)
    X_transformed = X.clone()
    X_transformed[top] = X_attacked[top]
    cases = {"curated": (X[keep], y[keep], Y[keep]), "transformed": (X_transformed, y, Y),
             "adversarial": (X_adv_all, y, Y)}
    for name, (Xn, yn, Yn) in cases.items():
        tick(None, cancel, 0.0, f"{arch}: intervention {name}")
        new = fit_net(cfg, arch, Xn.float(), yn, c, p.device, seed, cancel=cancel)
        agg_new = aggregate(influence_of(cfg, at_precision(cfg, new), Xn, Yn, Xt, yt))
        ref = agg0[keep] if name == "curated" else agg0
        out.append({"arch": arch, "seed": seed, "intervention": name, "test_acc": accuracy(new, Xt.float(), yt),
                    "influence_change": float(torch.linalg.norm(agg_new - ref) / torch.linalg.norm(ref)),
                    "spearman": rank_correlation(ref, agg_new),
                    "flip_rate": None if name == "curated" else flip_rate(agg0[top], agg_new[top])})
    return out
