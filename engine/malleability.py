"""Influence and its malleability under adversarial perturbation of the training data.

Protocol (Definition 3.4 of the paper, with this project's documented choices):

1. Train the net on clean data; compute the NTK influence matrix I (n_test, n) with its
   trained empirical kernel, and the aggregate influence of each training point (mean
   over test points).
2. Take the top-τ training points by |aggregate influence|.
3. Perturb the training inputs with an ℓ∞ attack on the trained model's training loss
   (``perturb="top"``: only those points move; ``"all"``: every point). For MLP-Attn, C
   is recomputed from the perturbed set, so every feature changes.
4. Recompute features, empirical kernel and influences — with the same trained W by
   default (``retrain=False``), or with a net retrained on the perturbed data.
5. Flip rate: share of the top-τ points whose aggregate influence changed sign. Also the
   per-(test, train)-pair flip rate over the top-τ columns, and Spearman ρ between the
   aggregate influences before and after over all training points (lower = more malleable).

Interventions (Curated: remove the top-τ points; Transformed: replace them by their
adversarial versions; Adversarial: PGD on every point) retrain on the changed set and report
test accuracy and how much the influences moved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import pandas as pd
import scipy.stats
import torch

from .attacks import AttackSpec, attack
from .cache import Cache, Result, cached_run
from .data import DataSpec
from .errors import BadInput
from .experiments import Prepared, _check_archs, _tick, prepare
from .influence import aggregate, net_influence, top_indices
from .models import ARCHS, Net, check_width, parse_attention
from .training import TrainSpec, accuracy, n_outputs, predict_labels, resolve_loss, train

Progress = Callable[[float, str], None]
PERTURB = ("top", "all")


@dataclass(frozen=True)
class InfluenceConfig:
    data: DataSpec = DataSpec(n=300, n_test=100)
    archs: tuple[str, ...] = ARCHS
    width: int = 1024
    attention: str = "linear"
    seed: int = 0                      # network init and batch order
    train: TrainSpec = TrainSpec(epochs=100)
    init_std: float = 1.0
    ridge: float = 1e-3                # λ of the kernel ridge, relative to mean diag K


@dataclass(frozen=True)
class MalleabilityConfig:
    data: DataSpec = DataSpec(n=500, n_test=100)
    archs: tuple[str, ...] = ARCHS
    width: int = 1024
    attention: str = "linear"
    seed: int = 0
    train: TrainSpec = TrainSpec(epochs=100)
    init_std: float = 1.0
    attacks: tuple[str, ...] = ("pgd",)   # any of fgsm, pgd, mim
    eps: tuple[float, ...] = (0.05,)      # ℓ∞ radii (pixels in [0, 1]); several make an ε sweep
    steps: int = 20                       # PGD / MIM iterations
    step_size: float | None = None        # None: 2.5·ε/steps
    random_start: bool = False            # PGD random start
    momentum: float = 1.0                 # MIM decay
    tau: float = 0.1                      # share of training points tracked (top by |influence|)
    ridge: float = 1e-3                   # λ of the kernel ridge, relative to mean diag K
    perturb: str = "top"                  # "top": only the top-τ points move; "all": every point
    retrain: bool = False                 # False: re-evaluate the trained net's kernel on perturbed inputs
    adversarial_training: bool = False    # train on PGD examples (every epoch) instead of clean data
    interventions: bool = False           # also run Curated / Transformed / Adversarial retraining


def _validate(cfg) -> None:
    check_width(cfg.width)
    _check_archs(cfg.archs)
    parse_attention(cfg.attention)
    if not cfg.ridge > 0:
        raise BadInput(f"ridge λ must be > 0, got {cfg.ridge!r}")
    if isinstance(cfg, MalleabilityConfig):
        if not cfg.attacks or not cfg.eps:
            raise BadInput("attacks and eps must not be empty")
        if cfg.perturb not in PERTURB:
            raise BadInput(f"unknown perturbed set {cfg.perturb!r}; allowed: {', '.join(PERTURB)}")
        if not 0 < cfg.tau <= 1:
            raise BadInput(f"tau must lie in (0, 1], got {cfg.tau!r}")
        for a in cfg.attacks:
            for e in cfg.eps:
                _attack_spec(cfg, a, e)


def _attack_spec(cfg: MalleabilityConfig, method: str, eps: float) -> AttackSpec:
    return AttackSpec(method, eps, cfg.steps, cfg.step_size, cfg.random_start, cfg.momentum, cfg.seed)


def _fresh_net(cfg, arch, X_ref, c, dev) -> Net:
    return Net(arch, X_ref, cfg.width, n_outputs(c), cfg.seed, cfg.init_std, cfg.attention,
               cfg.data.normalize).to(dev)


def _fit(cfg, arch, X, y, c, dev, box=None, adversarial: AttackSpec | None = None,
         progress: Progress | None = None, cancel=None) -> Net:
    """A net trained on (X, y); with ``adversarial``, on that attack's examples each epoch."""
    net = _fresh_net(cfg, arch, X, c, dev)
    loss = resolve_loss(cfg.train, c)

    def attacked(epoch):  # a fresh attack on the current net every epoch
        return attack(net, X, y, c, replace(adversarial, seed=adversarial.seed + epoch), loss, None, box)

    train(net, X, y, c, cfg.train, cfg.seed, progress, cancel, None if adversarial is None else attacked)
    return net


def _signs_differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((torch.sign(a) != torch.sign(b)).double().mean())


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(scipy.stats.spearmanr(a.cpu().numpy(), b.cpu().numpy()).statistic)


def _sub(progress, lo, hi, prefix):
    if progress is None:
        return None
    return lambda f, s: progress(lo + f * (hi - lo), f"{prefix}: {s}")


# ---------------------------------------------------------------- influence

def run_influence(cfg: InfluenceConfig, cache: Cache | None = None, data_dir=None, device: str = "cpu",
                  progress: Progress | None = None, cancel=None) -> Result:
    """Influence matrices of trained nets on one draw.

    Arrays: ``{arch}_I`` (n_test, n) float64 (see ``engine.influence`` for the sign),
    ``X`` (n, d) and ``X_test`` float32 raw inputs, ``y``, ``y_test``. Frame ``aggregate``:
    arch, train_index, label, influence (mean over test points). Frame ``summary``: arch,
    test_acc, train_acc. Meta: image_shape, class_names.
    """
    _validate(cfg)

    def compute() -> Result:
        p = prepare(cfg.data, data_dir, device, progress, cancel)
        dev, sample, X, y, Xt, yt, c, Y = p.device, p.sample, p.X, p.y, p.Xt, p.yt, p.c, p.Y
        arrays = {"X": sample.X.float().numpy(), "y": sample.y.numpy(),
                  "X_test": sample.X_test.float().numpy(), "y_test": sample.y_test.numpy()}
        agg_rows, summary = [], []
        for k, arch in enumerate(cfg.archs):
            lo, hi = k / len(cfg.archs), (k + 1) / len(cfg.archs)
            net = _fit(cfg, arch, X, y, c, dev, progress=_sub(progress, lo, lo + 0.9 * (hi - lo), f"training {arch}"),
                       cancel=cancel)
            _tick(progress, cancel, lo + 0.9 * (hi - lo), f"influence of {arch}")
            I = net_influence(net, X, Y, Xt, cfg.ridge)
            arrays[f"{arch}_I"] = I.cpu().numpy()
            agg = aggregate(I).cpu().numpy()
            agg_rows.append(pd.DataFrame({"arch": arch, "train_index": np.arange(sample.n),
                                          "label": sample.y.numpy(), "influence": agg}))
            summary.append({"arch": arch, "test_acc": accuracy(net, Xt, yt), "train_acc": accuracy(net, X, y)})
        _tick(progress, cancel, 1.0, "done")
        meta = {"image_shape": list(sample.image_shape) if sample.image_shape else None,
                "class_names": list(sample.class_names), "source": sample.source}
        return Result("influence", {}, {"aggregate": pd.concat(agg_rows, ignore_index=True),
                                        "summary": pd.DataFrame(summary)}, arrays, meta)

    return cached_run("influence", cfg, compute, cache)


# ---------------------------------------------------------------- malleability

def _measure(cfg, arch, net, p: Prepared, spec, I0, agg0, top, loss, cancel):
    """Attack, recompute influences, and compare with the clean ones (I0, agg0)."""
    X, y, Y, Xt, yt, c = p.X, p.y, p.Y, p.Xt, p.yt, p.c
    mask = None
    if cfg.perturb == "top":
        mask = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        mask[top] = True
    Xp = attack(net, X, y, c, spec, loss, mask, p.sample.box)
    if cfg.retrain:
        net_after = _fit(cfg, arch, Xp, y, c, p.device, cancel=cancel)
        I1 = net_influence(net_after, Xp, Y, Xt, cfg.ridge)
        acc_after = accuracy(net_after, Xt, yt)
    else:
        I1 = net_influence(net, Xp, Y, Xt, cfg.ridge, X_ref=Xp)
        with torch.no_grad():  # MLP-Attn's test features now use the perturbed set's C
            pred = predict_labels(net.head(net.features(Xt, X_ref=Xp)))
        acc_after = float((pred == yt).double().mean())
    agg1 = aggregate(I1)
    moved = (Xp - X).abs().amax(dim=1)
    row = {
        "flip_rate": _signs_differ(agg0[top], agg1[top]),
        "pair_flip_rate": _signs_differ(I0[:, top], I1[:, top]),
        "spearman": _spearman(agg0, agg1),
        "test_acc_after": acc_after,
        "max_abs_perturbation": float(moved.max()),
        "points_moved": int((moved > 0).sum()),
    }
    return row, Xp, agg1


def run_malleability(cfg: MalleabilityConfig, cache: Cache | None = None, data_dir=None, device: str = "cpu",
                     progress: Progress | None = None, cancel=None) -> Result:
    """Flip rates of NTK influence under attacks on the training data, per (arch, attack, ε).

    Frame ``rows``: arch, attack, eps, flip_rate, pair_flip_rate, spearman, test_acc (clean
    net), test_acc_after, n_top, and the options that produced them (perturb, retrain,
    adversarial_training, tau, ridge, steps, step_size). Frame ``interventions`` (when
    asked): arch, intervention, test_acc, influence_change, spearman, flip_rate.
    Arrays per arch for the first attack and ε: ``{arch}_top_idx``, ``{arch}_X_clean`` and
    ``{arch}_X_pert`` (k, d) float32, ``{arch}_infl_before`` and ``{arch}_infl_after`` (n,).
    """
    _validate(cfg)

    def compute() -> Result:
        p = prepare(cfg.data, data_dir, device, progress, cancel)
        dev, sample, X, y, Xt, yt, c, Y = p.device, p.sample, p.X, p.y, p.Xt, p.yt, p.c, p.Y
        box = sample.box
        loss = resolve_loss(cfg.train, c)
        rows, inter, arrays = [], [], {}
        for k, arch in enumerate(cfg.archs):
            lo, hi = k / len(cfg.archs), (k + 1) / len(cfg.archs)
            adv = _attack_spec(cfg, "pgd", cfg.eps[0]) if cfg.adversarial_training else None
            net = _fit(cfg, arch, X, y, c, dev, box, adv, _sub(progress, lo, lo + 0.5 * (hi - lo), f"training {arch}"),
                       cancel)
            I0 = net_influence(net, X, Y, Xt, cfg.ridge)
            agg0 = aggregate(I0)
            top = top_indices(agg0, cfg.tau)
            acc = accuracy(net, Xt, yt)
            combos = [(a, e) for a in cfg.attacks for e in cfg.eps]
            for j, (method, eps) in enumerate(combos):
                _tick(progress, cancel, lo + (0.5 + 0.3 * j / len(combos)) * (hi - lo), f"{arch}: {method} ε={eps}")
                spec = _attack_spec(cfg, method, eps)
                row, Xp, agg1 = _measure(cfg, arch, net, p, spec, I0, agg0, top, loss, cancel)
                rows.append({"arch": arch, "attack": method, "eps": eps, **row, "test_acc": acc,
                             "n_top": int(top.numel()), "perturb": cfg.perturb, "retrain": cfg.retrain,
                             "adversarial_training": cfg.adversarial_training, "tau": cfg.tau,
                             "ridge": cfg.ridge, "steps": 1 if method == "fgsm" else cfg.steps,
                             "step_size": eps if method == "fgsm" else spec.alpha})
                if j == 0:
                    arrays.update({f"{arch}_top_idx": top.cpu().numpy(),
                                   f"{arch}_X_clean": X[top].float().cpu().numpy(),
                                   f"{arch}_X_pert": Xp[top].float().cpu().numpy(),
                                   f"{arch}_infl_before": agg0.cpu().numpy(),
                                   f"{arch}_infl_after": agg1.cpu().numpy()})
                    first_Xp = Xp
            if cfg.interventions:
                _tick(progress, cancel, lo + 0.8 * (hi - lo), f"{arch}: interventions")
                inter += _interventions(cfg, arch, net, p, agg0, top, acc, first_Xp, loss, cancel)
        _tick(progress, cancel, 1.0, "done")
        meta = {"image_shape": list(sample.image_shape) if sample.image_shape else None,
                "class_names": list(sample.class_names), "shown_attack": cfg.attacks[0],
                "shown_eps": cfg.eps[0], "n": sample.n, "n_test": sample.X_test.shape[0],
                "source": sample.source}
        return Result("malleability", {}, {"rows": pd.DataFrame(rows), "interventions": pd.DataFrame(inter)},
                      arrays, meta)

    return cached_run("malleability", cfg, compute, cache)


def _interventions(cfg, arch, net, p: Prepared, agg0, top, acc, X_attacked, loss, cancel):
    """Curated / Transformed / Adversarial retraining, compared with the clean net.

    ``X_attacked``: the training set after the first attack (its top-τ rows replace the
    clean ones in Transformed)."""
    X, y, Y, Xt, yt, c = p.X, p.y, p.Y, p.Xt, p.yt, p.c
    out = [{"arch": arch, "intervention": "none", "test_acc": acc, "influence_change": 0.0,
            "spearman": 1.0, "flip_rate": 0.0}]
    keep = torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
    keep[top] = False
    X_adv_all = attack(net, X, y, c, _attack_spec(cfg, "pgd", cfg.eps[0]), loss, None, p.sample.box)
    X_transformed = X.clone()
    X_transformed[top] = X_attacked[top]
    cases = {"curated": (X[keep], y[keep], Y[keep]), "transformed": (X_transformed, y, Y),
             "adversarial": (X_adv_all, y, Y)}
    for name, (Xn, yn, Yn) in cases.items():
        new = _fit(cfg, arch, Xn, yn, c, p.device, cancel=cancel)
        agg_new = aggregate(net_influence(new, Xn, Yn, Xt, cfg.ridge))
        ref = agg0[keep] if name == "curated" else agg0
        row = {"arch": arch, "intervention": name, "test_acc": accuracy(new, Xt, yt),
               "influence_change": float(torch.linalg.norm(agg_new - ref) / torch.linalg.norm(ref)),
               "spearman": _spearman(ref, agg_new),
               "flip_rate": None if name == "curated" else _signs_differ(agg0[top], agg_new[top])}
        out.append(row)
    return out
