"""The ``malleability`` experiment: how adversarial perturbation of the training data flips influences.

Protocol (Definition 3.4 of the paper, with every choice it leaves open an option):

1. Train the net on clean data (per width and network seed); compute the NTK influence matrix I
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
   before and after (ridge: over all training points; flow and retrain: over the tracked ones).
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

Readings (``readings``; ``engine.experiments.readings``): the same attack on the same tracked
points, with the same perturbed data, read as the kernel's ridge leave-one-out (``ridge``, the
paper's), as its gradient-flow leave-one-out for the net's own steps (``flow``), and as the
network's own leave-one-out by retraining (``retrain``): one row per reading, each with its own
nulls and excess. The tracked points are the top-τ of the ridge influence, whatever the reading.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from .._lazy import LazyModule
from ..maths.attacks import attack
from ..maths.influence import aggregate, top_indices
from ..maths.metrics import flip_rate, rank_correlation, summarize
from ..maths.specs import AttackSpec
from ..maths.training import accuracy, predict_labels, resolve_loss
from ..runtime.cache import Result
from ..runtime.cores import side_by_side
from ..runtime.errors import BadInput
from ..runtime.stream import landed
from . import flips as F
from .configs.malleability import MalleabilityConfig
from .flips import random_perturbation, seed_partners
from .influence import (
    at_precision,
    attack_dtype,
    clean_run,
    fit_net,
    fresh_net,
    in_space,
    influence_of,
    kernel_precision,
    kernels_of,
    ntk_accuracy,
)
from .readings import ReadOut, Trained, read
from .recipes import NetRecipe, Reading, net_recipe, reading_of
from .runs import Prepared, Progress, experiment_run, prepare, resumable, shape, sub_progress, tick

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows

if TYPE_CHECKING:
    import numpy as np

    from ..maths.heads import CancelFlag
    from .configs.alignment import AlignmentConfig
    from .runs import DataDir

    Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float] | None]

ROW_METRICS = F.METRICS
# Row fields that are NaN by definition where they were not measured: a null with nulls off or one
# seed (or a seed-free reading), the excess then, ρ of a constant influence vector, an intervention's ρ.
NAN_OK = ("null_seed_flip_rate", "null_seed_spearman", "null_random_flip_rate", "null_random_spearman",
          "flip_excess", "flip_excess_low", "flip_excess_high", "spearman")


def attack_spec(cfg: MalleabilityConfig | AlignmentConfig, method: str, eps: float, seed: int) -> AttackSpec:
    """The attack of a config (anything with an ``attack`` AttackSpec) with one method, radius and seed filled in."""
    return replace(cfg.attack, method=method, eps=float(eps), seed=int(seed))


def example_key(arch: str, method: str, eps: float, what: str) -> str:
    """Array name of the before/after example of one (arch, attack, ε) (first width and seed)."""
    return f"{arch}|{method}|{float(eps):g}|{what}"


def _draws(cfg: MalleabilityConfig) -> tuple[int, ...]:
    return cfg.data_seeds or (cfg.data.seed,)


@experiment_run("malleability")
def run_malleability(cfg: MalleabilityConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                     cancel: CancelFlag | None) -> Result:
    """Flip rates of NTK influence under attacks on the training data, with their null baselines,
    per (data draw, arch, width, seed, attack, ε, reading).

    Frame ``rows``: one ``engine.experiments.flips.FlipRow`` each (its fields are the columns and
    say what each is): the flip rate over the top-τ points, the per-pair flip rate, Spearman ρ;
    the nulls (``cfg.nulls``, on by default), both over the same top-τ points of the same net:

    - null_seed_*: no attack; the net of the next network seed of the run (cyclically: seeds
      s₀ → s₁ → … → s₀, within one data draw and width) read the same way against this one, on
      *this* seed's top-τ points. NaN with one seed, and where the reading cannot differ between
      seeds (``null_seed_kind`` "seed-free": K∞ of fixed features is the same for every seed).
    - null_random_*: the attack's perturbation replaced by a random direction of the same ℓ2
      norm in every moved row (``random_perturbation``), re-measured exactly as the attack is.
    - flip_excess = flip_rate − max(seed null, random null) (the random null alone where there is
      no seed null), with flip_excess_low / _high: a 95 % percentile bootstrap over the tracked
      points (``engine.maths.metrics.excess_interval``).

    Then the clean net's accuracies, its K∞ and K_m ridge baselines and the training gate, its
    weight movement, test_acc_after (the predictor the reading describes, after the attack), the
    perturbation's size, what the reading is exact for and whether this training is that, and
    the options that produced them. Frame ``summary``: mean and sd over the (draw, seed) nets through
    the training gate per (arch, width, attack, ε, reading) with the pooled excess interval (data
    draws the unit: ``engine.maths.metrics.INTERVAL_WORDS``). Frame ``verdict``: per (width, attack, ε,
    reading) the gap between MLP-Attn's and 2L-ReLU's excess with its interval, its role (primary or
    secondary) and the rule's outcome (``engine.experiments.flips.verdict``, ``engine.experiments.verdict``).
    Frame ``draws``: per cell and data draw, each side's mean excess and their gap. Frame ``interventions`` (when asked): arch, width,
    seed, intervention, test_acc, influence_change, spearman, flip_rate. Arrays (first draw,
    width and seed, with the ridge reading), per (arch, attack, ε) under ``example_key``:
    ``top_idx``, ``X_clean`` and ``X_pert`` (k, d) float32 in the attack's space, ``infl_before``
    and ``infl_after`` (n,).
    """
    rows: list[dict] = []
    flips: list[tuple] = []
    inter: list[dict] = []
    arrays: dict[str, np.ndarray] = {}
    metas = []
    draws = _draws(cfg)
    for i, ds in enumerate(draws):
        sub = sub_progress(progress, i / len(draws), (i + 1) / len(draws), f"data draw {ds}") \
            if len(draws) > 1 else progress
        metas.append(_malleability_draw(replace(cfg, data=replace(cfg.data, seed=ds)), data_dir, dev, sub,
                                        cancel, rows, flips, inter, arrays if i == 0 else {}))
    tick(progress, cancel, 1.0, "done")
    frame = F.frame(rows)
    inter_frame = pd.DataFrame(inter)
    summ = F.summary(frame, flips, cfg.nulls)
    verdict, per_draw = F.verdict(frame, flips, cfg.nulls, summ)
    frames = {"rows": frame, "summary": F.with_gaps(summ, verdict), "verdict": verdict,
              "draws": per_draw,
              "interventions": inter_frame,
              "interventions_summary": summarize(inter_frame, ["arch", "width", "intervention"],
                                                 ("test_acc", "influence_change", "spearman", "flip_rate"))}
    meta = {**metas[0], "data_seeds": list(draws)}
    return Result("malleability", {}, frames, arrays, meta)


def _malleability_draw(cfg: MalleabilityConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                       cancel: CancelFlag | None, rows: list[dict], flips: list[tuple], inter: list[dict],
                       arrays: dict[str, np.ndarray]) -> dict:
    """One data draw of ``run_malleability``: appends its rows, per-row flips and interventions."""
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample, loss = p.sample, resolve_loss(cfg.train, p.c)
    if "flow" in cfg.readings and loss != "mse":
        raise BadInput(f"reading 'flow' follows MSE training; this task trains with {loss}: add --loss mse or drop "
                       "flow from --reading")
    X32, Xt32, box = in_space(cfg, p)
    dtype = attack_dtype(reading_of(cfg))
    inputs = (X32, Xt32, X32.to(dtype), Xt32.to(dtype), box)
    cells = [(a, w) for a in cfg.archs for w in cfg.widths]
    for k, (arch, width) in enumerate(cells):
        fresh: list[bool]
        span, fresh = (k / len(cells), (k + 1) / len(cells)), []

        def compute(arch: str = arch, width: int = width, span: tuple[float, float] = span,
                    fresh: list[bool] = fresh) -> dict:
            fresh.append(True)  # its units land as they finish; a checkpoint's land whole below
            return measure_cell(cfg, p, arch, width, inputs, loss, span=span, progress=progress, cancel=cancel)

        unit = resumable({"arch": arch, "width": width, "draw": cfg.data.seed}, compute,
                         shape(rows=list, flips=list, inter=list, examples=dict), nan_ok=NAN_OK)
        if not fresh:
            landed({"data_seed": cfg.data.seed, "arch": arch, "width": width, "from": "checkpoint"}, unit["rows"])
        rows += unit["rows"]
        flips += [tuple(f) for f in unit["flips"]]
        inter += unit["inter"]
        if width == cfg.widths[0]:
            arrays.update(unit["examples"])
    return {"image_shape": list(sample.image_shape) if sample.image_shape else None,
            "class_names": list(sample.class_names), "n": sample.n, "n_test": int(sample.X_test.shape[0]),
            "source": sample.source, "shown_seed": cfg.seeds[0], "shown_width": cfg.widths[0], "space": cfg.space,
            "norm": cfg.attack.norm, "target": cfg.target, "adversarial_training": cfg.adversarial_training,
            "storage": cfg.storage, "influence_kernel": cfg.influence_kernel, "precision": cfg.precision,
            "readings": list(cfg.readings), "loss": loss, "null_seed_pairs": seed_partners(cfg.seeds)}


def train_net(cfg: MalleabilityConfig, p: Prepared, recipe: NetRecipe, X32: torch.Tensor,
              box: tuple[float, float] | None, progress: Progress | None = None, cancel: CancelFlag | None = None,
              adversarial: AttackSpec | None = None) -> Trained:
    """The recipe's net trained on X32 (float32, the attack's space), kept with its copy at the
    config's precision and its initial weights."""
    net32 = fit_net(recipe, X32, p.y, p.c, p.device, box, adversarial=adversarial, progress=progress, cancel=cancel)
    W0 = fresh_net(recipe, X32, p.c, p.device).mlp.W.detach()
    return Trained(recipe, net32, at_precision(reading_of(cfg), net32), W0)


def measure_cell(cfg: MalleabilityConfig, p: Prepared, arch: str, width: int, inputs: Inputs, loss: str,
                 *, span: tuple[float, float] = (0.0, 1.0), progress: Progress | None = None,
                 cancel: CancelFlag | None = None) -> dict:
    """One (arch, width) of a draw, every seed, each net measured as soon as it and its seed null's
    partner are trained (so its rows land early: ``engine.runtime.stream``): the clean net and its
    readings, then every (attack, ε) with every reading, its nulls and per-point flips, the
    interventions and the first seed's example arrays. ``inputs``: X32, Xt32 (the attack's space,
    float32), X, Xt (at the attack's precision) and the pixel box. Returns JSON-able pieces
    (``runs.resumable``)."""
    X32, Xt32, X, Xt, box = inputs
    lo, hi = span
    ridge, readings = reading_of(cfg, "ridge"), [reading_of(cfg, name) for name in cfg.readings]
    ntk_acc = ntk_accuracy(net_recipe(cfg, arch, width, 0), ridge, X, Xt, p.Y, p.yt, p.c, p.device)
    nets, ridges, tops, kernels, base = {}, {}, {}, {}, {}
    seeds = list(cfg.seeds)
    step = (hi - lo) / len(seeds)

    def trained(seed: int, at: float) -> None:  # a net, its clean ridge reading and its top-τ points, once
        if seed in nets:
            return
        adv = attack_spec(cfg, "pgd", cfg.eps[0], seed) if cfg.adversarial_training else None
        t = train_net(cfg, p, net_recipe(cfg, arch, width, seed), X32, box,
                      sub_progress(progress, at, at + 0.2 * step, f"training {arch} m={width} seed {seed}"), cancel, adv)
        I0, row, kernels[seed] = clean_run(ridge, t.net32, t.net, X32, Xt32, X, Xt, p, ntk_acc)
        nets[seed], base[seed] = t, {**row, "weight_movement": t.weight_movement()}
        ridges[seed] = ReadOut(torch.arange(X.shape[0], device=I0.device), I0, aggregate(I0))
        tops[seed] = top_indices(ridges[seed].agg, cfg.tau)

    partners = seed_partners(cfg.seeds) if cfg.nulls else {}
    combos = [(m, e) for m in cfg.attacks for e in cfg.eps]
    rows, flips, inter, examples = [], [], [], {}
    for i, seed in enumerate(seeds):
        at = lo + i * step
        partner = partners.get(seed)
        side_by_side([lambda s=s, at=at: trained(s, at) for s in dict.fromkeys((seed, partner)) if s is not None
                      and s not in nets])
        t, top, first_Xp = nets[seed], tops[seed], None
        clean, null = {}, {}  # every reading of this net, and of its seed null's partner, on this net's points
        for r in readings:
            if r.name == "ridge":
                clean[r.name], null[r.name] = ridges[seed], None if partner is None else ridges[partner]
                continue
            tick(progress, cancel, at + 0.4 * step, f"{arch} m={width} seed {seed}: {r.name} reading")
            clean[r.name] = read(r, t, p, X, Xt, top, kernels=kernels[seed], cancel=cancel)
            null[r.name] = None if partner is None else read(r, nets[partner], p, X, Xt, top,
                                                             kernels=kernels[partner], cancel=cancel)
        for j, (method, eps) in enumerate(combos):
            tick(progress, cancel, at + (0.5 + 0.45 * j / len(combos)) * step,
                 f"{arch} m={width} seed {seed}: {method} ε={eps:g}")
            spec = attack_spec(cfg, method, eps, seed)
            measured = _measure(cfg, p, t, X, Xt, box, spec, top, loss, F.null_seed(seed, j), readings, cancel)
            first_Xp = measured["Xp"] if first_Xp is None else first_Xp
            landing = []
            for r in readings:
                row, unit = F.flip_row(r, clean[r.name], measured["after"][r.name], measured["random"].get(r.name),
                                      null[r.name], top, cfg.nulls, partner)
                landing.append({"data_seed": cfg.data.seed, "arch": arch, "width": width, "seed": seed,
                                "attack": method, "eps": float(eps), "reading": r.name, **row, **base[seed],
                                **measured["stats"], "test_acc_after": measured["acc_after"].get(r.name, math.nan),
                                "n_top": int(top.numel()), "exact_for": r.exact_for(),
                                "objective_match": r.matches(cfg.train, loss, base[seed]["train_acc"] >= 1.0),
                                **_settings(cfg, arch, loss, spec)})
                flips.append(unit)
            rows += landing
            landed({"data_seed": cfg.data.seed, "arch": arch, "width": width, "seed": seed, "attack": method,
                    "eps": float(eps)}, landing)
            if seed == seeds[0] and "ridge" in cfg.readings:
                agg0, agg1 = clean["ridge"].agg, measured["after"]["ridge"].agg
                examples.update({example_key(arch, method, eps, "top_idx"): top.cpu().numpy(),
                                 example_key(arch, method, eps, "X_clean"): X[top].float().cpu().numpy(),
                                 example_key(arch, method, eps, "X_pert"): measured["Xp"][top].float().cpu().numpy(),
                                 example_key(arch, method, eps, "infl_before"): agg0.cpu().numpy(),
                                 example_key(arch, method, eps, "infl_after"): agg1.cpu().numpy()})
        if cfg.interventions:
            tick(progress, cancel, at + 0.95 * step, f"{arch} m={width} seed {seed}: interventions")
            assert first_Xp is not None  # attacks and eps are never empty (``validate``)
            inter += _interventions(cfg, t, p, X, Xt, box, ridges[seed].agg, top, base[seed]["test_acc"],
                                    first_Xp, loss, cancel)
    return {"rows": rows, "flips": flips, "inter": inter, "examples": examples}


def _measure(cfg: MalleabilityConfig, p: Prepared, t: Trained, X: torch.Tensor, Xt: torch.Tensor,
             box: tuple[float, float] | None, spec: AttackSpec, top: torch.Tensor, loss: str, null_seed: int,
             readings: list[Reading], cancel: CancelFlag | None) -> dict:
    """Attack the training set, then read every reading at the top points on the attacked set and
    (``cfg.nulls``) on a random perturbation of the same per-row norms. Kernels are those of the
    clean net (of one retrained on the changed set with ``cfg.retrain``), shared by the readings."""
    mask = None
    if cfg.perturb == "top":
        mask = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        mask[top] = True
    Xp = attack(t.net, X, p.y, p.c, spec, loss, mask, box, cancel)
    delta = Xp - X
    moved = delta.abs().amax(dim=1) > 0
    rel = (delta.norm(dim=1) / X.norm(dim=1).clamp_min(1e-12))[moved]
    stats = {"rel_perturbation": float(rel.mean()) if rel.numel() else 0.0,
             "max_abs_perturbation": float(delta.abs().max()), "max_l2_perturbation": float(delta.norm(dim=1).max()),
             "points_moved": int(moved.sum())}
    after, acc = _read_changed(cfg, p, t, Xp, Xt, top, readings, cancel)
    random = _read_changed(cfg, p, t, random_perturbation(X, Xp, null_seed), Xt, top, readings, cancel)[0] \
        if cfg.nulls else {}
    return {"Xp": Xp, "after": after, "random": random, "acc_after": acc, "stats": stats}


def _read_changed(cfg: MalleabilityConfig, p: Prepared, t: Trained, Xs: torch.Tensor, Xt: torch.Tensor,
                  top: torch.Tensor, readings: list[Reading], cancel: CancelFlag | None) -> tuple[dict, dict]:
    """Every reading on the changed training set Xs, and the accuracy after of the predictor each describes."""
    if cfg.retrain:  # the kernels of a net retrained on Xs (attention over its own training set)
        net32 = fit_net(t.recipe, Xs.float(), p.y, p.c, p.device, cancel=cancel)
        kernel_net, x_ref = Trained(t.recipe, net32, at_precision(reading_of(cfg), net32), t.W0), None
        acc = accuracy(net32, Xt.float(), p.yt)
    else:
        kernel_net, x_ref = t, Xs
        with torch.no_grad():  # MLP-Attn's test features now use the perturbed set's C
            acc = float((predict_labels(t.net.head(t.net.features(Xt, X_ref=Xs))) == p.yt).double().mean())
    shared = kernels_of(readings[0], kernel_net.net, Xs, Xt, x_ref) \
        if any(r.name != "retrain" for r in readings) else None
    out, accs = {}, {}
    for r in readings:
        out[r.name] = read(r, kernel_net if r.name != "retrain" else t, p, Xs, Xt, top,
                           X_ref=x_ref if r.name != "retrain" else Xs, kernels=shared, cancel=cancel)
        accs[r.name] = out[r.name].test_acc if r.name == "retrain" else acc
    return out, accs


def _settings(cfg: MalleabilityConfig, arch: str, loss: str, spec: AttackSpec) -> dict:
    """The options every row records beside its numbers."""
    return {"norm": cfg.attack.norm, "space": cfg.space, "target": cfg.target, "perturb": cfg.perturb,
            "retrain": cfg.retrain, "adversarial_training": cfg.adversarial_training, "tau": cfg.tau,
            "ridge": cfg.ridge, "influence_kernel": cfg.influence_kernel, "init": cfg.init,
            "attention": cfg.attention if arch == "attn" else None, "optimizer": cfg.train.optimizer,
            "train_precision": cfg.train.train_precision, "loss": loss,
            "lr": cfg.train.lr, "epochs": cfg.train.epochs, "storage": cfg.storage,
            "attack_precision": cfg.precision, "kernel_precision": kernel_precision(reading_of(cfg)),
            "steps": 1 if spec.method == "fgsm" else spec.steps,
            "step_size": spec.eps if spec.method == "fgsm" else spec.alpha}


def _interventions(cfg: MalleabilityConfig, t: Trained, p: Prepared, X: torch.Tensor, Xt: torch.Tensor,
                   box: tuple[float, float] | None, agg0: torch.Tensor, top: torch.Tensor, acc: float,
                   X_attacked: torch.Tensor, loss: str, cancel: CancelFlag | None) -> list[dict]:
    """Curated / Transformed / Adversarial retraining, compared with the clean net (ridge reading).

    ``X_attacked``: the training set after the first attack (its top-τ rows replace the
    clean ones in Transformed)."""
    y, Y, yt, c, rec, r = p.y, p.Y, p.yt, p.c, t.recipe, reading_of(cfg)
    key = {"arch": rec.arch, "width": rec.width, "seed": rec.seed}
    out = [{**key, "intervention": "none", "test_acc": acc, "influence_change": 0.0, "spearman": 1.0,
            "flip_rate": 0.0}]
    keep = torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
    keep[top] = False
    X_adv_all = attack(t.net, X, y, c, attack_spec(cfg, "pgd", cfg.eps[0], rec.seed), loss, None, box, cancel)
    X_transformed = X.clone()
    X_transformed[top] = X_attacked[top]
    cases = {"curated": (X[keep], y[keep], Y[keep]), "transformed": (X_transformed, y, Y),
             "adversarial": (X_adv_all, y, Y)}
    for name, (Xn, yn, Yn) in cases.items():
        tick(None, cancel, 0.0, f"{rec.arch}: intervention {name}")
        new = fit_net(rec, Xn.float(), yn, c, p.device, cancel=cancel)
        agg_new = aggregate(influence_of(r, at_precision(r, new), Xn, Yn, Xt, yt))
        ref = agg0[keep] if name == "curated" else agg0
        out.append({**key, "intervention": name, "test_acc": accuracy(new, Xt.float(), yt),
                    "influence_change": float(torch.linalg.norm(agg_new - ref) / torch.linalg.norm(ref)),
                    "spearman": rank_correlation(ref, agg_new),
                    "flip_rate": None if name == "curated" else flip_rate(agg0[top], agg_new[top])})
    return out
