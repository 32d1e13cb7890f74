"""Influence and its malleability under adversarial perturbation of the training data.

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
5. Flip rate: share of the top-τ points whose aggregate influence changed sign. Also the
   per-(test, train)-pair flip rate over the top-τ columns, and Spearman ρ between the
   aggregate influences before and after over all training points (lower = more malleable).

Interventions (Curated: remove the top-τ points; Transformed: replace them by their
adversarial versions; Adversarial: the attack on every point) retrain on the changed set and
report test accuracy and how much the influences moved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import scipy.stats
import torch

from . import budget as B
from . import options
from .attacks import AttackMethod, AttackSpec, attack
from .budget import Estimate
from .cache import Result
from .data import DataSpec
from .errors import BadInput
from .influence import INFLUENCE_TARGETS, aggregate, factor_bytes, net_influence, top_indices
from .models import Net, normalize_rows
from .ntk import infinite_ntk, kernel_regression
from .runs import Prepared, Progress, experiment_run, prepare, sub_progress, tick
from .settings import normalised, setting, validate
from .tables import summarize
from .training import TrainSpec, accuracy, n_outputs, predict_labels, resolve_loss, train

PERTURB = ("top", "all")
SPACES = ("raw", "normalized")
METHODS = tuple(m.value for m in AttackMethod)
ROW_METRICS = ("flip_rate", "pair_flip_rate", "spearman", "test_acc", "train_acc", "test_acc_ntk",
               "test_acc_after", "rel_perturbation")


@dataclass(frozen=True)
class InfluenceConfig:
    data: DataSpec = DataSpec(n=300, n_test=100)
    train: TrainSpec = TrainSpec(epochs=100)
    archs: tuple[str, ...] = options.archs()
    width: int = options.width(1024)  # the paper's influence runs
    attention: str = options.attention()
    seeds: tuple[int, ...] = options.seeds()
    init_std: float = options.init_std()
    init: str = options.init()
    ridge: float = options.ridge()  # of the influence's kernel regression and of the K∞ baseline
    target: str = setting("true", "influence on: true = each test point's own-class output; margin = own "
                          "class minus the best other class; sum = the label-free sum over outputs "
                          "(binary tasks have one output: all agree)", flag="--influence",
                          choices=INFLUENCE_TARGETS)
    storage: str = options.storage()

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.width)


@dataclass(frozen=True)
class MalleabilityConfig(InfluenceConfig):
    data: DataSpec = DataSpec(n=500, n_test=100)
    attack: AttackSpec = AttackSpec()     # norm, steps, step size, random start, momentum
    attacks: tuple[str, ...] = setting(("pgd",), "attacks on the training data: fgsm, pgd, mim",
                                       flag="--attack", choices=METHODS)
    eps: tuple[float, ...] = setting((0.05,), "attack radii ε in the attack space's units (raw: pixels "
                                     "in [0, 1]; normalized: fractions of a unit row); several make an ε sweep",
                                     lo=0, hi=100.0, max_len=20)
    space: str = setting("raw", "where the perturbation lives: raw pixels, or the ℓ2-normalised rows the "
                         "networks see", choices=SPACES)
    tau: float = setting(0.1, "share of training points tracked (top by |aggregate influence|)",
                         lo=0, lo_open=True, hi=1.0)
    perturb: str = setting("top", "which training points move: top (the top-τ) or all", choices=PERTURB)
    retrain: bool = setting(False, "retrain on the perturbed data before re-measuring (default: re-evaluate "
                            "the trained net's kernel on the perturbed inputs)")
    adversarial_training: bool = setting(False, "train on the attack's examples (every epoch, first ε, PGD) "
                                         "instead of clean data")
    interventions: bool = setting(False, "also run Curated / Transformed / Adversarial retraining")

    def __post_init__(self):
        super().__post_init__()
        if self.space == "normalized" and not self.data.normalize:
            raise BadInput("space 'normalized' needs normalised rows; drop --no-normalize or use space raw")


PRESETS = {
    "influence": {"quick": InfluenceConfig(data=DataSpec(n=200, n_test=100), train=TrainSpec(epochs=20),
                                           seeds=(0,)),
                  "paper": InfluenceConfig(data=DataSpec(n=1000, n_test=100), train=TrainSpec(epochs=500))},
    "malleability": {
        "quick": MalleabilityConfig(data=DataSpec(n=200, n_test=100), train=TrainSpec(epochs=20),
                                    attack=AttackSpec(steps=10), attacks=("fgsm", "pgd", "mim"),
                                    eps=(0.05, 0.3), seeds=(0, 1, 2)),
        "paper": MalleabilityConfig(data=DataSpec(n=1000, n_test=100), train=TrainSpec(epochs=500),
                                    attacks=("fgsm", "pgd", "mim"), eps=(0.3,)),
    },
}


def attack_spec(cfg: MalleabilityConfig, method: str, eps: float, seed: int) -> AttackSpec:
    """The config's attack with one method, radius and seed filled in."""
    return replace(cfg.attack, method=method, eps=float(eps), seed=int(seed))


def _fresh_net(cfg, arch, X_ref, c, dev, seed) -> Net:
    return Net(arch, X_ref, cfg.width, n_outputs(c), seed, cfg.init_std, cfg.attention,
               cfg.data.normalize, init=cfg.init).to(dev)


def _fit(cfg, arch, X, y, c, dev, seed, box=None, adversarial: AttackSpec | None = None,
         progress: Progress | None = None, cancel=None) -> Net:
    """A net trained on (X, y); with ``adversarial``, on that attack's examples each epoch."""
    net = _fresh_net(cfg, arch, X, c, dev, seed)
    loss = resolve_loss(cfg.train, c)

    def attacked(epoch):  # a fresh attack on the current net every epoch
        return attack(net, X, y, c, replace(adversarial, seed=adversarial.seed + epoch), loss, None, box, cancel)

    train(net, X, y, c, cfg.train, seed, progress, cancel, None if adversarial is None else attacked)
    return net


def _signs_differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((torch.sign(a) != torch.sign(b)).double().mean())


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(scipy.stats.spearmanr(a.cpu().numpy(), b.cpu().numpy()).statistic)


def _in_space(cfg, p: Prepared) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float] | None]:
    """Training and test inputs in the attack's space, and the box perturbed inputs must stay in."""
    if cfg.space == "normalized":
        return normalize_rows(p.X), normalize_rows(p.Xt), None  # the nets normalise again: same features
    return p.X, p.Xt, p.sample.box


def _influence(cfg, net, X, Y, Xt, yt, X_ref=None) -> torch.Tensor:
    return net_influence(net, X, Y, Xt, cfg.ridge, X_ref=X_ref, target=cfg.target, y_test=yt, storage=cfg.storage)


def _ntk_accuracy(cfg, arch, X, Xt, Y, yt, c, dev) -> float:
    """Test accuracy of kernel ridge regression with K∞ on the same features (the baseline)."""
    probe = _fresh_net(cfg, arch, X, c, dev, 0)
    with torch.no_grad():
        phi, phi_t = probe.features(X), probe.features(Xt)
        f = kernel_regression(infinite_ntk(phi, storage=cfg.storage), infinite_ntk(phi_t, phi, storage=cfg.storage),
                              Y, cfg.ridge)
    return float((predict_labels(f) == yt).double().mean())


# ---------------------------------------------------------------- influence

def _influence_bytes(cfg: InfluenceConfig) -> int:
    """K and K_test in their storage, the float64 factor and solves beside them."""
    n, nt = cfg.data.n, cfg.data.n_test
    size = 4 if cfg.storage == "float32" else 8
    c_out = B.n_outputs(cfg.data)
    return size * (n * n + nt * n) + factor_bytes(n, nt, c_out) + B.head_bytes(cfg.width, n + nt, c_out)


def estimate_influence(cfg: InfluenceConfig) -> Estimate:
    n, nt, d, m = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data), cfg.width
    per = (B.train_s(n, d, m, cfg.train.epochs, cfg.train.batch_size) + B.ntk_s(n, n, d, m)
           + B.ntk_s(nt, n, d, m) + B.chol_s(n) + B.attention_s(cfg.attention, n + nt, d))
    slow = B.QKV_SLOWDOWN if cfg.attention == "qkv" and "attn" in cfg.archs else 1
    return Estimate(B.FIXED_S + slow * len(cfg.archs) * len(cfg.seeds) * per,
                    int(_influence_bytes(cfg) + 16 * m * d))


@experiment_run("influence")
def run_influence(cfg: InfluenceConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
    """Influence matrices of trained nets on one draw.

    Arrays (first seed): ``{arch}_I`` (n_test, n) float64 on ``cfg.target`` (see
    ``engine.influence`` for the sign), ``X`` (n, d) and ``X_test`` float32 raw inputs, ``y``,
    ``y_test``. Frame ``aggregate``: arch, seed, train_index, label, influence (mean over test
    points). Frame ``summary``: arch, seed, test_acc, train_acc, test_acc_ntk, influence_scale
    (mean |aggregate influence|). Meta: image_shape, class_names, target.
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample, X, y, Xt, yt, c, Y = p.sample, p.X, p.y, p.Xt, p.yt, p.c, p.Y
    arrays = {"X": sample.X.float().numpy(), "y": sample.y.numpy(),
              "X_test": sample.X_test.float().numpy(), "y_test": sample.y_test.numpy()}
    agg_rows, summary = [], []
    runs = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for k, (arch, seed) in enumerate(runs):
        lo, hi = k / len(runs), (k + 1) / len(runs)
        net = _fit(cfg, arch, X, y, c, dev, seed,
                   progress=sub_progress(progress, lo, lo + 0.9 * (hi - lo), f"training {arch} seed {seed}"),
                   cancel=cancel)
        tick(progress, cancel, lo + 0.9 * (hi - lo), f"influence of {arch} seed {seed}")
        I = _influence(cfg, net, X, Y, Xt, yt)
        if seed == cfg.seeds[0]:
            arrays[f"{arch}_I"] = I.cpu().numpy()
        agg = aggregate(I).cpu().numpy()
        agg_rows.append(pd.DataFrame({"arch": arch, "seed": seed, "train_index": np.arange(sample.n),
                                      "label": sample.y.numpy(), "influence": agg}))
        summary.append({"arch": arch, "seed": seed, "test_acc": accuracy(net, Xt, yt),
                        "train_acc": accuracy(net, X, y),
                        "test_acc_ntk": _ntk_accuracy(cfg, arch, X, Xt, Y, yt, c, dev),
                        "influence_scale": float(np.abs(agg).mean())})
    tick(progress, cancel, 1.0, "done")
    meta = {"image_shape": list(sample.image_shape) if sample.image_shape else None,
            "class_names": list(sample.class_names), "source": sample.source, "target": cfg.target,
            "storage": cfg.storage, "shown_seed": cfg.seeds[0]}
    return Result("influence", {}, {"aggregate": pd.concat(agg_rows, ignore_index=True),
                                           "summary": pd.DataFrame(summary)}, arrays, meta)


# ---------------------------------------------------------------- malleability

def example_key(arch: str, method: str, eps: float, what: str) -> str:
    """Array name of the before/after example of one (arch, attack, ε) (first seed)."""
    return f"{arch}|{method}|{float(eps):g}|{what}"


def _measure(cfg, arch, net, p: Prepared, X, Xt, box, spec, I0, agg0, top, loss, seed, cancel):
    """Attack, recompute influences, and compare with the clean ones (I0, agg0)."""
    y, Y, yt, c = p.y, p.Y, p.yt, p.c
    mask = None
    if cfg.perturb == "top":
        mask = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        mask[top] = True
    Xp = attack(net, X, y, c, spec, loss, mask, box, cancel)
    if cfg.retrain:
        net_after = _fit(cfg, arch, Xp, y, c, p.device, seed, cancel=cancel)
        I1 = _influence(cfg, net_after, Xp, Y, Xt, yt)
        acc_after = accuracy(net_after, Xt, yt)
    else:
        I1 = _influence(cfg, net, Xp, Y, Xt, yt, X_ref=Xp)
        with torch.no_grad():  # MLP-Attn's test features now use the perturbed set's C
            pred = predict_labels(net.head(net.features(Xt, X_ref=Xp)))
        acc_after = float((pred == yt).double().mean())
    agg1 = aggregate(I1)
    delta = Xp - X
    moved = delta.abs().amax(dim=1) > 0
    rel = (delta.norm(dim=1) / X.norm(dim=1).clamp_min(1e-12))[moved]
    row = {
        "flip_rate": _signs_differ(agg0[top], agg1[top]),
        "pair_flip_rate": _signs_differ(I0[:, top], I1[:, top]),
        "spearman": _spearman(agg0, agg1),
        "test_acc_after": acc_after,
        "rel_perturbation": float(rel.mean()) if rel.numel() else 0.0,
        "max_abs_perturbation": float(delta.abs().max()),
        "max_l2_perturbation": float(delta.norm(dim=1).max()),
        "points_moved": int(moved.sum()),
    }
    return row, Xp, agg1


def estimate_malleability(cfg: MalleabilityConfig) -> Estimate:
    n, nt, d, m = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data), cfg.width
    tr = cfg.train
    kernel = B.ntk_s(n, n, d, m) + B.ntk_s(nt, n, d, m) + B.chol_s(n)
    grad_step = 3 * B.gemm_s(n, m, d) + B.attention_s(cfg.attention, n, d) + B.STEP_OVERHEAD_S
    steps = sum(1 if a == "fgsm" else cfg.attack.steps for a in cfg.attacks) * len(cfg.eps)
    fit = B.train_s(n, d, m, tr.epochs, tr.batch_size)
    if cfg.adversarial_training:
        fit += tr.epochs * cfg.attack.steps * grad_step
    per = fit + kernel * (1 + len(cfg.attacks) * len(cfg.eps)) + steps * grad_step
    if cfg.retrain:
        per += len(cfg.attacks) * len(cfg.eps) * B.train_s(n, d, m, tr.epochs, tr.batch_size)
    if cfg.interventions:
        per += 3 * (B.train_s(n, d, m, tr.epochs, tr.batch_size) + kernel) + cfg.attack.steps * grad_step
    slow = B.QKV_SLOWDOWN if cfg.attention == "qkv" and "attn" in cfg.archs else 1
    return Estimate(B.FIXED_S + slow * len(cfg.archs) * len(cfg.seeds) * per,
                    int(_influence_bytes(cfg) + 8 * n * n + 16 * m * d + 8 * n * m))


@experiment_run("malleability")
def run_malleability(cfg: MalleabilityConfig, data_dir, dev: torch.device, progress: Progress | None, cancel) -> Result:
    """Flip rates of NTK influence under attacks on the training data, per (arch, seed, attack, ε).

    Frame ``rows``: arch, seed, attack, eps, norm, space, target, flip_rate, pair_flip_rate,
    spearman, test_acc and train_acc (clean net), test_acc_ntk (K∞ ridge baseline on the same
    features), test_acc_after, rel_perturbation (mean ‖δ‖₂/‖x‖₂ applied, in the attack's space),
    n_top (how many points the flip rate is over), and the options that produced them.
    Frame ``summary``: mean and sd over seeds per (arch, attack, eps). Frame
    ``interventions`` (when asked): arch, seed, intervention, test_acc, influence_change,
    spearman, flip_rate. Arrays (first seed), per (arch, attack, ε) under ``example_key``:
    ``top_idx``, ``X_clean`` and ``X_pert`` (k, d) float32 in the attack's space,
    ``infl_before`` and ``infl_after`` (n,).
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample, y, Y, yt, c = p.sample, p.y, p.Y, p.yt, p.c
    X, Xt, box = _in_space(cfg, p)
    loss = resolve_loss(cfg.train, c)
    rows, inter, arrays = [], [], {}
    combos = [(a, e) for a in cfg.attacks for e in cfg.eps]
    runs = [(a, s) for a in cfg.archs for s in cfg.seeds]
    ntk_acc = {}
    for k, (arch, seed) in enumerate(runs):
        lo, hi = k / len(runs), (k + 1) / len(runs)
        adv = attack_spec(cfg, "pgd", cfg.eps[0], seed) if cfg.adversarial_training else None
        net = _fit(cfg, arch, X, y, c, dev, seed, box, adv,
                   sub_progress(progress, lo, lo + 0.5 * (hi - lo), f"training {arch} seed {seed}"), cancel)
        if arch not in ntk_acc:
            ntk_acc[arch] = _ntk_accuracy(cfg, arch, X, Xt, Y, yt, c, dev)
        I0 = _influence(cfg, net, X, Y, Xt, yt)
        agg0 = aggregate(I0)
        top = top_indices(agg0, cfg.tau)
        clean = {"test_acc": accuracy(net, Xt, yt), "train_acc": accuracy(net, X, y),
                 "test_acc_ntk": ntk_acc[arch]}
        first_Xp = None
        for j, (method, eps) in enumerate(combos):
            tick(progress, cancel, lo + (0.5 + 0.3 * j / len(combos)) * (hi - lo),
                 f"{arch} seed {seed}: {method} ε={eps:g}")
            spec = attack_spec(cfg, method, eps, seed)
            row, Xp, agg1 = _measure(cfg, arch, net, p, X, Xt, box, spec, I0, agg0, top, loss, seed, cancel)
            rows.append({"arch": arch, "seed": seed, "attack": method, "eps": float(eps), **row, **clean,
                         "n_top": int(top.numel()), "norm": cfg.attack.norm, "space": cfg.space,
                         "target": cfg.target, "perturb": cfg.perturb, "retrain": cfg.retrain,
                         "adversarial_training": cfg.adversarial_training, "tau": cfg.tau,
                         "ridge": cfg.ridge, "storage": cfg.storage,
                         "steps": 1 if method == "fgsm" else spec.steps,
                         "step_size": eps if method == "fgsm" else spec.alpha})
            first_Xp = Xp if first_Xp is None else first_Xp
            if seed == cfg.seeds[0]:
                arrays.update({example_key(arch, method, eps, "top_idx"): top.cpu().numpy(),
                               example_key(arch, method, eps, "X_clean"): X[top].float().cpu().numpy(),
                               example_key(arch, method, eps, "X_pert"): Xp[top].float().cpu().numpy(),
                               example_key(arch, method, eps, "infl_before"): agg0.cpu().numpy(),
                               example_key(arch, method, eps, "infl_after"): agg1.cpu().numpy()})
        if cfg.interventions:
            tick(progress, cancel, lo + 0.8 * (hi - lo), f"{arch} seed {seed}: interventions")
            inter += _interventions(cfg, arch, seed, net, p, X, Xt, box, agg0, top, clean["test_acc"],
                                    first_Xp, loss, cancel)
    tick(progress, cancel, 1.0, "done")
    meta = {"image_shape": list(sample.image_shape) if sample.image_shape else None,
            "class_names": list(sample.class_names), "n": sample.n, "n_test": int(sample.X_test.shape[0]),
            "source": sample.source, "shown_seed": cfg.seeds[0], "space": cfg.space,
            "norm": cfg.attack.norm, "target": cfg.target, "adversarial_training": cfg.adversarial_training,
            "storage": cfg.storage}
    frame = pd.DataFrame(rows)
    inter_frame = pd.DataFrame(inter)
    frames = {"rows": frame, "summary": summarize(frame, ["arch", "attack", "eps"], ROW_METRICS),
              "interventions": inter_frame,
              "interventions_summary": summarize(inter_frame, ["arch", "intervention"],
                                                 ("test_acc", "influence_change", "spearman", "flip_rate"))}
    return Result("malleability", {}, frames, arrays, meta)


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
        new = _fit(cfg, arch, Xn, yn, c, p.device, seed, cancel=cancel)
        agg_new = aggregate(_influence(cfg, new, Xn, Yn, Xt, yt))
        ref = agg0[keep] if name == "curated" else agg0
        out.append({"arch": arch, "seed": seed, "intervention": name, "test_acc": accuracy(new, Xt, yt),
                    "influence_change": float(torch.linalg.norm(agg_new - ref) / torch.linalg.norm(ref)),
                    "spearman": _spearman(ref, agg_new),
                    "flip_rate": None if name == "curated" else _signs_differ(agg0[top], agg_new[top])})
    return out
