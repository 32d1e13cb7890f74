"""The ``influence`` experiment: NTK leave-one-out influence of trained nets on one draw.

Train the net on clean data (per network seed) and compute the influence matrix I
(n_test, n) with its trained empirical kernel (or K∞ of the same features:
``influence_kernel``) on the chosen ``target`` (``true``: each test point's own-class output,
the default; ``margin``: own class minus the best other class; ``sum``: the label-free sum
over outputs), and each training point's aggregate influence (mean over test points).
Beside it stand the net's accuracies and the kernel-ridge accuracy its own K_m reaches: an
influence of a net that did not train describes an untrained predictor. The helpers that
train and score a net here are the malleability experiment's too; the net a recipe starts from, its
kernels and its ridge influence are ``readings``' (the readings read through them).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._lazy import LazyModule
from ..maths.attacks import attack
from ..maths.gates import passes_gate
from ..maths.influence import aggregate
from ..maths.kinf import infinite_ntk
from ..maths.metrics import rank_correlation
from ..maths.models import Net, normalize_rows
from ..maths.ridge import kernel_regression
from ..maths.specs import AttackSpec
from ..maths.training import accuracy, predict_labels, resolve_loss, sgd_lr_limit, train
from ..runtime.cache import Result
from .configs.influence import InfluenceConfig
from .readings import ReadOut, Trained, fresh_net, influence_of, kernels_of, read
from .recipes import NetRecipe, Reading, net_recipe, reading_of
from .runs import Prepared, Progress, experiment_run, prepare, resumable, shape, sub_progress, tick

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported at its first use, after a run's first rows

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .configs.alignment import AlignmentConfig
    from .configs.malleability import MalleabilityConfig
    from .runs import DataDir


def fit_net(recipe: NetRecipe, X: torch.Tensor, y: torch.Tensor, c: int, dev: torch.device,
            box: tuple[float, float] | None = None, *, adversarial: AttackSpec | None = None,
            progress: Progress | None = None, cancel: CancelFlag | None = None) -> Net:
    """The recipe's net trained on (X, y); with ``adversarial``, on that attack's examples each epoch."""
    net = fresh_net(recipe, X, c, dev)
    loss = resolve_loss(recipe.train, c)

    def attacked(epoch: int) -> torch.Tensor:  # a fresh attack on the current net every epoch
        assert adversarial is not None  # passed to train only with one
        return attack(net, X, y, c, replace(adversarial, seed=adversarial.seed + epoch), loss, None, box, cancel)

    train(net, X, y, c, recipe.train, recipe.seed, progress, cancel, None if adversarial is None else attacked)
    return net


def in_space(cfg: MalleabilityConfig | AlignmentConfig, p: Prepared
             ) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float] | None]:
    """Training and test inputs in the attack's space, and the box perturbed inputs must stay in."""
    if cfg.space == "normalized":
        return normalize_rows(p.X), normalize_rows(p.Xt), None  # the nets normalise again: same features
    return p.X, p.Xt, p.sample.box


def attack_dtype(r: Reading) -> torch.dtype:
    return torch.float64 if r.precision == "float64" else torch.float32


def at_precision(r: Reading, net: Net) -> Net:
    """The trained (float32) net in the reading's precision, for attacks, kernels and influence."""
    return copy.deepcopy(net).to(attack_dtype(r)) if attack_dtype(r) != net.X_ref.dtype else net


def kernel_precision(r: Reading) -> str:
    """The precision the influence's kernel entries carry: the features' and the storage's lower one."""
    return "float32" if "float32" in (r.precision, r.storage) else "float64"


def _ridge_accuracy(K: torch.Tensor, Kt: torch.Tensor, Y: torch.Tensor, yt: torch.Tensor, ridge: float) -> float:
    return float((predict_labels(kernel_regression(K, Kt, Y, ridge)) == yt).double().mean())


def ntk_accuracy(recipe: NetRecipe, r: Reading, X: torch.Tensor, Xt: torch.Tensor, Y: torch.Tensor, yt: torch.Tensor,
                 c: int, dev: torch.device) -> float:
    """Test accuracy of kernel ridge regression with K∞ on the same features (the baseline)."""
    probe = at_precision(r, fresh_net(recipe, X, c, dev))
    with torch.no_grad():
        phi, phi_t = probe.features(X), probe.features(Xt)
        return _ridge_accuracy(infinite_ntk(phi, storage=r.storage), infinite_ntk(phi_t, phi, storage=r.storage),
                               Y, yt, r.ridge)


def clean_run(r: Reading, net32: Net, net: Net, X32: torch.Tensor, Xt32: torch.Tensor, X: torch.Tensor,
              Xt: torch.Tensor, p: Prepared, ntk_acc: float
              ) -> tuple[torch.Tensor, dict, tuple[torch.Tensor, torch.Tensor]]:
    """The clean net's ridge influence (n_test, n), its row (accuracies, K_m baseline, training
    gate) and the kernels (K, K_test) of ``r.kernel`` it was read on."""
    entk = kernels_of(r, net, X, Xt, kind="entk")
    kernels = entk if r.kernel == "entk" else kernels_of(r, net, X, Xt)
    I0 = influence_of(r, net, X, p.Y, Xt, p.yt, kernels=kernels)
    test_acc = accuracy(net32, Xt32, p.yt)
    acc_kernel = _ridge_accuracy(*entk, p.Y, p.yt, r.ridge)
    row = {"test_acc": test_acc, "train_acc": accuracy(net32, X32, p.y), "test_acc_ntk": ntk_acc,
           "test_acc_kernel": acc_kernel, "trained": bool(passes_gate(test_acc, acc_kernel)),
           "sgd_lr_limit": sgd_lr_limit(entk[0], p.n_out)}
    return I0, row, kernels


# ---------------------------------------------------------------- influence

@experiment_run("influence")
def run_influence(cfg: InfluenceConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                  cancel: CancelFlag | None) -> Result:
    """Influence matrices of trained nets on one draw.

    Arrays (first seed): ``{arch}_I`` (n_test, n) float64 on ``cfg.target`` under
    ``cfg.influence_kernel`` (see ``engine.maths.influence`` for the sign), ``X`` (n, d) and
    ``X_test`` float32 raw inputs, ``y``, ``y_test``. Frame ``aggregate``: arch, seed,
    reading, train_index, label, influence (mean over test points; ``ridge`` at every training point,
    each other reading of ``cfg.readings`` at the top ``cfg.read_points`` by |ridge aggregate|, whose
    first-seed columns are ``{arch}_I_{reading}`` (n_test, p) at ``{arch}_points_{reading}``). Frame
    ``readings`` (when there is one besides ridge): arch, seed, reading, points, rho_vs_ridge (Spearman
    of the aggregates), sign_agreement_vs_ridge (share of entries of the same sign), reading_test_acc
    (the retrained full head's), exact_for, objective_match. Frame ``summary``: arch, seed,
    test_acc, train_acc, test_acc_ntk (K∞ ridge on the same features), test_acc_kernel (ridge
    with the trained net's own K_m: what this width supports), trained (the training gate,
    ``engine.maths.gates.passes_gate``), sgd_lr_limit, influence_scale (mean |aggregate influence|),
    influence_kernel, kernel_precision. Meta: image_shape, class_names, target.
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    sample = p.sample
    reading = reading_of(cfg)
    X, Xt = p.X.to(attack_dtype(reading)), p.Xt.to(attack_dtype(reading))
    arrays = {"X": sample.X.float().numpy(), "y": sample.y.numpy(),
              "X_test": sample.X_test.float().numpy(), "y_test": sample.y_test.numpy()}
    ntk_acc: dict[str, float] = {}
    agg_rows, summary, agree = [], [], []
    runs = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for k, (arch, seed) in enumerate(runs):
        lo, hi = k / len(runs), (k + 1) / len(runs)
        unit = resumable({"arch": arch, "seed": seed},
                         partial(_influence_unit, cfg, p, arch, seed, X, Xt, ntk_acc, (lo, hi), progress, cancel),
                         shape(I=(np.ndarray, type(None)), aggregate=np.ndarray, row=dict, readings=dict),
                         nan_ok=("reading_test_acc", "rho_vs_ridge"))
        if unit["I"] is not None:  # the first seed's only
            arrays[f"{arch}_I"] = unit["I"]
        agg_rows.append(pd.DataFrame({"arch": arch, "seed": seed, "reading": "ridge", "train_index": np.arange(sample.n),
                                      "label": sample.y.numpy(), "influence": unit["aggregate"]}))
        for name, got in unit["readings"].items():
            if got["I"] is not None:
                arrays[f"{arch}_I_{name}"], arrays[f"{arch}_points_{name}"] = got["I"], got["points"]
            agg_rows.append(pd.DataFrame({"arch": arch, "seed": seed, "reading": name, "train_index": got["points"],
                                          "label": sample.y.numpy()[got["points"]], "influence": got["aggregate"]}))
            agree.append({"arch": arch, "seed": seed, "reading": name, **got["row"]})
        summary.append({"arch": arch, "seed": seed, **unit["row"],
                        "influence_scale": float(np.abs(unit["aggregate"]).mean()),
                        "influence_kernel": cfg.influence_kernel, "kernel_precision": kernel_precision(reading),
                        "init": cfg.init})
    tick(progress, cancel, 1.0, "done")
    meta = {"image_shape": list(sample.image_shape) if sample.image_shape else None,
            "class_names": list(sample.class_names), "source": sample.source, "target": cfg.target,
            "storage": cfg.storage, "shown_seed": cfg.seeds[0], "influence_kernel": cfg.influence_kernel,
            "precision": cfg.precision,
            "readings": list(cfg.readings), "read_points": cfg.read_points}
    frames = {"aggregate": pd.concat(agg_rows, ignore_index=True), "summary": pd.DataFrame(summary)}
    if agree:
        frames["readings"] = pd.DataFrame(agree)
    return Result("influence", {}, frames, arrays, meta)


def _influence_unit(cfg: InfluenceConfig, p: Prepared, arch: str, seed: int, X: torch.Tensor, Xt: torch.Tensor,
                    ntk_acc: dict[str, float], span: tuple[float, float], progress: Progress | None,
                    cancel: CancelFlag | None) -> dict:
    """One (arch, seed) of ``run_influence``: the trained net's ridge influence (first seed only),
    its aggregate and its summary row, and each other reading of ``cfg.readings`` at the top
    ``cfg.read_points`` by |ridge aggregate| (``readings``: {name: points, I (first seed), aggregate,
    row}). ``ntk_acc`` keeps the K∞ baseline per arch (it depends on neither seed nor training)."""
    lo, hi = span
    r = reading_of(cfg)
    recipe = net_recipe(cfg, arch, cfg.width, seed)
    net32 = fit_net(recipe, p.X, p.y, p.c, p.device,
                    progress=sub_progress(progress, lo, lo + 0.8 * (hi - lo), f"training {arch} seed {seed}"),
                    cancel=cancel)
    tick(progress, cancel, lo + 0.8 * (hi - lo), f"influence of {arch} seed {seed}")
    if arch not in ntk_acc:
        ntk_acc[arch] = ntk_accuracy(net_recipe(cfg, arch, cfg.width, 0), r, X, Xt, p.Y, p.yt, p.c, p.device)
    net = at_precision(r, net32)
    I, row, kernels = clean_run(r, net32, net, p.X, p.Xt, X, Xt, p, ntk_acc[arch])
    agg = aggregate(I)
    first = seed == cfg.seeds[0]
    others = [name for name in cfg.readings if name != "ridge"]
    readings: dict[str, dict[str, Any]] = {}
    if others:
        tick(progress, cancel, lo + 0.85 * (hi - lo), f"reading {arch} seed {seed} by {', '.join(others)}")
        points = torch.sort(torch.argsort(agg.abs(), descending=True)[:cfg.read_points]).values
        trained = Trained(recipe, net32, net, fresh_net(recipe, p.X, p.c, p.device).mlp.W.detach())
        for name in others:
            out = read(reading_of(cfg, name), trained, p, X, Xt, points, kernels=kernels, cancel=cancel)
            readings[name] = {"points": points.cpu().numpy(), "aggregate": out.agg.cpu().numpy(),
                              "I": out.I.cpu().numpy() if first else None,
                              "row": agreement(I[:, points], agg[points], out, reading_of(cfg, name), recipe, p.c)}
    return {"I": I.cpu().numpy() if first else None, "aggregate": agg.cpu().numpy(), "row": row,
            "readings": readings}


def agreement(I_ridge: torch.Tensor, agg_ridge: torch.Tensor, out: ReadOut, r: Reading, recipe: NetRecipe,
              c: int) -> dict:
    """How a reading's influence at its points agrees with ridge's: Spearman ρ of the aggregates, the
    share of (test point, training point) entries of the same sign, and what the reading is exact for."""
    same = (torch.sign(out.I) == torch.sign(I_ridge.to(out.I.dtype))).double().mean()
    return {"points": int(out.points.numel()), "rho_vs_ridge": rank_correlation(agg_ridge.cpu(), out.agg.cpu()),
            "sign_agreement_vs_ridge": float(same), "reading_test_acc": out.test_acc,
            "exact_for": r.exact_for(), "objective_match": r.matches(recipe.train, resolve_loss(recipe.train, c))}
