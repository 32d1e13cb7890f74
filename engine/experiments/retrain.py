"""Leave-one-out by retraining, against the kernel's prediction: is the NTK influence the network's?

Every influence the engine reports is a kernel's (``engine.maths.influence``: exact leave-one-out of
kernel ridge regression with the trained net's eNTK, or K∞). Here the network itself is
retrained without each of k training points and the change of its test outputs is set beside
the kernel's prediction. For each architecture, width and network seed:

1. train the head on the full set (all widths as one batched model, ``train_masked``);
2. pick k points by |aggregate eNTK influence| (``top``, the points malleability tracks) and k
   at random (``random``, drawn once per seed, the same for every arch and width);
3. retrain from the same initialisation with the same mini-batches without each picked point,
   all of them (and one more copy of the full run) as one batched model;
4. compare the actual change f(x_t) − f₋ᵢ(x_t) on the influence target with each kernel's
   (``KERNELS``: the trained net's eNTK, K∞) leave-one-out prediction (``LOOS``: ``ridge``, the
   exact leave-one-out of kernel ridge regression, i.e. the engine's influence; ``flow``, that
   of kernel gradient descent run for the net's own SGD steps, ``engine.maths.flow.KernelFlow``,
   the kernel regime's prediction of this very training), over the k points × the test points.

Masking, not deleting. Every retraining draws the full run's batch order (``engine.maths.training``'s
generator for the seed); the left-out point stays in its batch with its loss terms multiplied
by 0, and each batch keeps its normaliser 1/(|batch| · c). The retrained objective is then the
full one minus that point's term: every other point keeps its weight, so weight decay, hence
the ridge relative to the data term, is what it was, as the kernel's leave-one-out assumes
(f₋ᵢ refits with the same λ). With the head linearised around W₀ (``frozen``), MSE, weight
decay w and full batches run to convergence, the retrained change is exactly kernel ridge
regression's leave-one-out with the eNTK at W₀ and λ_abs = n·c·w/2 (``tests/test_retrain.py``).

Batched. The k heads' weights are stacked into one (Σm, d) parameter: one GEMM forward, one
for the weight gradient. The readout runs head by head with ``TwoLayerReLU.forward``'s own
operations (k small (B, m) x (m, c) products), not through a block-diagonal matrix, whose
longer sums round differently: on CPU every head then follows, bit for bit, the run it would
follow alone (tested against a loop of separate retrainings). One exception, MKL's: a product
with fewer than 12 output columns runs another kernel with another order of summation, so a
head narrower than 12 units (24 antisymmetric, whose halves are multiplied apart) rounds
differently alone than as a slice of the stacked product (a few ulps a step).

Sign convention as ``engine.maths.influence``: change = f(x_t) − f₋ᵢ(x_t), positive when removing i
lowers the scored output. Targets (``INFLUENCE_TARGETS``) score the same output combination on
both sides: for ``margin`` the best other class j* is that of the kernel's own ridge
prediction (as ``influence_matrix`` defines it) and is applied to the network's change too.

Initialisation. The kernel's leave-one-out describes f = k(x, X)(K + λI)⁻¹Y, with no f₀; a
lazily trained gaussian net fits the residual Y − f₀, so its f₀ (of the targets' size at init)
enters its retrained change but not the kernel's. ``init="antisymmetric"`` (f₀ ≡ 0) removes
that difference, which is why the presets use it.

Early stopping. Kernel ridge regression at the default ridge 1e-3 is the (nearly) converged
interpolant; a net trained for τ SGD steps with rate η on MSE is regularised by its stopping
time, roughly like a ridge λ ≈ n·c / (2ητ) (``stopping_ridge``, in meta). Spearman ρ, Pearson r
and the sign agreement do not depend on the changes' scale; the relative error does. The
``flow`` leave-one-out has no such mismatch: it stops where the net stopped.
"""

from __future__ import annotations

import copy
import math
import time
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
import torch

from ..maths.kinf import infinite_ntk
from ..maths.loo import KernelLOO, flow_loo, head_outputs, kernel_loo, stopping_ridge, train_masked
from ..maths.metrics import rank_correlation, summarize
from ..maths.models import Net
from ..maths.ntk import empirical_ntk_features
from ..maths.training import predict_labels, resolve_loss
from ..runtime.cache import Result
from ..runtime.errors import BadInput
from .configs.retrain import RetrainConfig
from .runs import Prepared, Progress, check_finite, experiment_run, prepare, resumable, shape, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

PICKS = ("top", "random")
RANDOM_SEED_OFFSET = 15485863  # the random pick's generator: seed + this, apart from init and batch order
METRICS = ("retrain_spearman", "retrain_pearson", "retrain_sign_agreement", "retrain_rel_error",
           "actual_rms", "predicted_rms", "train_acc", "test_acc", "weight_movement", "final_loss")


# ---------------------------------------------------------------- agreement, and the points left out

def agreement(pred: torch.Tensor, actual: torch.Tensor) -> dict:
    """How well predicted changes (n_test, k) match the actual ones, over all n_test · k pairs.

    retrain_spearman / retrain_pearson: rank and linear correlation; retrain_sign_agreement:
    share of pairs with the same sign (zero is its own sign, as ``engine.maths.metrics.sign_flipped``);
    retrain_rel_error ‖pred − actual‖_F / ‖actual‖_F; actual_rms and predicted_rms, the scales.
    """
    p, a = pred.double().flatten().cpu().numpy(), actual.double().flatten().cpu().numpy()
    varied = p.size > 1 and np.ptp(p) > 0 and np.ptp(a) > 0
    norm = float(np.linalg.norm(a))
    return {
        "retrain_spearman": rank_correlation(p, a) if varied else math.nan,
        "retrain_pearson": float(np.corrcoef(p, a)[0, 1]) if varied else math.nan,
        "retrain_sign_agreement": float(np.mean(np.sign(p) == np.sign(a))),
        "retrain_rel_error": float(np.linalg.norm(p - a)) / norm if norm > 0 else math.nan,
        "actual_rms": float(np.sqrt(np.mean(a ** 2))),
        "predicted_rms": float(np.sqrt(np.mean(p ** 2))),
    }


def picks(agg: torch.Tensor, k: int, seed: int) -> dict[str, torch.Tensor]:
    """``top``: the k points of largest |agg| (n,); ``random``: k points drawn for ``seed`` (any arch, width)."""
    g = torch.Generator().manual_seed(int(seed) + RANDOM_SEED_OFFSET)
    return {"top": torch.topk(agg.abs().cpu(), k).indices, "random": torch.randperm(agg.numel(), generator=g)[:k]}


# ---------------------------------------------------------------- run

@experiment_run("retrain-loo")
def run_retrain_loo(cfg: RetrainConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                    cancel: CancelFlag | None) -> Result:
    """Leave-one-out by retraining against the kernels' leave-one-out, per (arch, width, seed).

    Frame ``rows``: one row per (arch, width, seed, kernel, loo, pick) with the ``agreement``
    metrics over the k left-out points × the test points (retrain_spearman, retrain_pearson,
    retrain_sign_agreement, retrain_rel_error, actual_rms, predicted_rms) and, of the net
    trained on the full set, train_acc, test_acc, weight_movement ‖W − W₀‖_F / ‖W₀‖_F and
    final_loss. Frame ``summary``: mean and sd over seeds per (arch, attention, width, kernel,
    loo, pick). Frame ``changes``: every (arch, width, seed, kernel, loo, pick, point, test
    index) with ``predicted`` and ``actual``. Meta: n, n_test, n_classes, loss, target,
    stopping_ridge (per arch: the ridge, relative to mean diag K∞, that early stopping roughly
    amounts to), full_rerun_gap (largest |difference| of test outputs between the full run and
    its copy trained beside the retrainings: 0 on CPU), source, device.
    """
    p = prepare(cfg.data, data_dir, dev, progress, cancel)
    n, c, Xt = p.X.shape[0], p.c, p.Xt
    loss_name = resolve_loss(cfg.train, c)
    if "flow" in cfg.loo and loss_name != "mse":
        raise BadInput(f"loo 'flow' follows MSE training; this task trains with {loss_name}: add --loss mse "
                       "or use --loo ridge")
    kinf: dict[str, _Reference] = {}
    rows, changes, stop, gap = [], [], {}, 0.0
    groups = [(a, s) for a in cfg.archs for s in cfg.seeds]
    for j, (arch, seed) in enumerate(groups):
        span = j / len(groups), (j + 1) / len(groups)
        compute = partial(_retrain_unit, cfg, p, arch, seed, kinf, span, progress, cancel)
        unit = resumable({"arch": arch, "seed": seed}, compute,
                         shape(rows=list, changes=list, gap=float, stopping_ridge=(float, type(None))),
                         nan_ok=("retrain_spearman", "retrain_pearson", "retrain_rel_error"))  # NaN: nothing varied
        rows += unit["rows"]
        changes += [pd.DataFrame(part) for part in unit["changes"]]
        gap, stop[arch] = max(gap, unit["gap"]), unit["stopping_ridge"]
    tick(progress, cancel, 1.0, "done")
    frame = pd.DataFrame(rows)
    meta = {"n": n, "n_test": int(Xt.shape[0]), "d": p.sample.d, "n_classes": c, "loss": loss_name,
            "target": cfg.target, "stopping_ridge": stop, "full_rerun_gap": gap, "source": p.sample.source,
            "device": str(dev)}
    frames = {"rows": frame,
              "summary": summarize(frame, ["arch", "attention", "width", "kernel", "loo", "pick"], METRICS),
              "changes": pd.concat(changes, ignore_index=True)}
    return Result("retrain-loo", {}, frames, {}, meta)


class _Reference(NamedTuple):
    """An arch's K∞ (n, n), K∞(test, train), its ridge leave-one-out (None without "ridge") and
    the ridge early stopping amounts to: they depend on neither seed nor width."""

    K: torch.Tensor
    K_t: torch.Tensor
    ridge: KernelLOO | None
    stopping_ridge: float | None


def _retrain_unit(cfg: RetrainConfig, p: Prepared, arch: str, seed: int, kinf: dict[str, _Reference],
                  span: tuple[float, float], progress: Progress | None, cancel: CancelFlag | None) -> dict:
    """One (arch, seed) of ``run_retrain_loo``, every width at once: its rows, its per-point
    changes (one column dict per (width, kernel, loo, pick)), the full runs' rerun gap and the
    arch's stopping ridge. ``kinf`` keeps each arch's ``_Reference`` once computed."""
    stage, (lo, hi) = f"{arch} seed {seed}", span
    X, y, Xt, yt, c, Y, dev = p.X, p.y, p.Xt, p.yt, p.c, p.Y, p.device
    n, n_out, sizes = X.shape[0], p.n_out, list(cfg.widths)
    rows, changes, gap = [], [], 0.0
    tick(progress, cancel, lo, stage)
    t0 = time.perf_counter()
    nets = [Net(arch, X, w, n_out, seed, cfg.init_std, cfg.attention, cfg.data.normalize, init=cfg.init).to(dev)
            for w in sizes]
    heads = [net.mlp for net in nets]
    with torch.no_grad():
        phi, phi_t = nets[0].features(X), nets[0].features(Xt)
    if arch not in kinf:  # features, hence K∞ and its ridge leave-one-out, depend on neither seed nor width
        K, K_t = infinite_ntk(phi), infinite_ntk(phi_t, phi)
        check_finite(K, f"the infinite-width kernel of {arch}")
        ridge = kernel_loo(K, K_t, Y, yt, cfg.ridge) if "ridge" in cfg.loo else None
        kinf[arch] = _Reference(K, K_t, ridge, stopping_ridge(cfg.train, n, n_out, float(K.diagonal().mean())))

    # 1. the full runs, every width in one batched model
    sub = None if progress is None else (
        lambda f, s, a=lo, b=hi: progress(a + 0.2 * f * (b - a), f"{stage}: full runs, {s}"))
    full = train_masked(phi, y, c, heads, torch.ones(len(heads), n, dtype=torch.bool, device=dev), cfg.train,
                        seed, None if progress is None else sub, cancel)
    tick(progress, cancel, lo + 0.2 * (hi - lo), f"{stage}: kernels of the trained nets")

    # 2. the picks from each trained net's eNTK influence, and every kernel's prediction at them
    offsets = np.cumsum([0, *sizes])
    chosen, points, preds = [], [], []
    for i, head in enumerate(heads):
        seg = slice(int(offsets[i]), int(offsets[i + 1]))
        twin = copy.deepcopy(head)  # the trained head, for its kernel
        with torch.no_grad():
            twin.W.copy_(full.W[seg])
            F0, F0_t = (head_outputs(f @ full.W0[seg].T, [head])[0].double() for f in (phi, phi_t))
        K, K_t = empirical_ntk_features(twin, phi), empirical_ntk_features(twin, phi_t, phi)
        check_finite(K, f"the empirical kernel of {arch} at width {head.width}")
        influence = kernel_loo(K, K_t, Y, yt, cfg.ridge)  # the engine's influence: it picks the top points
        pk = picks(influence.scored(cfg.target, yt).mean(dim=0), cfg.k, seed)
        pts = torch.unique(torch.cat([pk["top"], pk["random"]])).to(dev)  # each point retrained once
        mine = {}
        for kernel in cfg.kernels:
            ref = kinf[arch]
            KK, KK_t, ridge = (K, K_t, influence) if kernel == "entk" else (ref.K, ref.K_t, ref.ridge)
            if "ridge" in cfg.loo:
                assert ridge is not None  # K∞'s ridge leave-one-out is computed whenever "ridge" is in loo
                mine[kernel, "ridge"] = KernelLOO(ridge.D[:, pts], pts, ridge.jstar)
            if "flow" in cfg.loo:
                mine[kernel, "flow"] = flow_loo(KK, KK_t, Y, yt, pts, cfg.train, F0, F0_t)
        del K, K_t, influence
        chosen.append(pk)
        points.append(pts)
        preds.append(mine)

    # 3. every retraining (and a copy of each full run) as one batched model
    batch_heads, keep_rows = [], []
    for head, pts in zip(heads, points, strict=True):
        keep = torch.ones(1 + len(pts), n, dtype=torch.bool, device=dev)
        keep[torch.arange(1, 1 + len(pts), device=dev), pts] = False
        batch_heads += [head] * (1 + len(pts))
        keep_rows.append(keep)
    sub = None if progress is None else (
        lambda f, s, a=lo, b=hi: progress(a + (0.25 + 0.7 * f) * (b - a), f"{stage}: retrainings, {s}"))
    run = train_masked(phi, y, c, batch_heads, torch.cat(keep_rows), cfg.train, seed,
                       None if progress is None else sub, cancel)
    tick(progress, cancel, lo + 0.95 * (hi - lo), f"{stage}: comparing")
    seconds = (time.perf_counter() - t0) / len(sizes)
    units = np.cumsum([0, *[h.width for h in batch_heads]])
    H_t = run.pre_activations(phi_t)  # (n_test, Σ heads' units), every retrained head's
    H_x, H_full_t = full.pre_activations(phi), full.pre_activations(phi_t)  # the full runs', as the retrained
    first = 0
    for i, (head, pts, pk, mine) in enumerate(zip(heads, points, chosen, preds, strict=True)):
        seg = slice(int(offsets[i]), int(offsets[i + 1]))
        group = slice(int(units[first]), int(units[first + 1 + len(pts)]))
        with torch.no_grad():
            out_t = head_outputs(H_t[:, group], batch_heads[first:first + 1 + len(pts)]).double()
            out_x, ref_t = (head_outputs(H[:, seg], [head])[0].double() for H in (H_x, H_full_t))
        first += 1 + len(pts)
        gap = max(gap, float((out_t[0] - ref_t).abs().max()))
        D_act = (out_t[0][None] - out_t[1:]).permute(1, 0, 2)  # (n_test, points, c): f − f₋ᵢ
        net_metrics = {
            "train_acc": float((predict_labels(out_x) == y).double().mean()),
            "test_acc": float((predict_labels(ref_t) == yt).double().mean()),
            "weight_movement": float(torch.linalg.norm(full.W[seg] - full.W0[seg])
                                     / torch.linalg.norm(full.W0[seg])),
            "final_loss": full.losses[-1][i],
        }
        for (kernel, loo), pred_loo in mine.items():
            actual_loo = KernelLOO(D_act, pts, pred_loo.jstar)  # the net's changes, on the kernel's j*
            for pick in PICKS:
                idx = pk[pick].to(dev)
                pred, actual = pred_loo.scored(cfg.target, yt, idx), actual_loo.scored(cfg.target, yt, idx)
                rows.append({"arch": arch, "attention": cfg.attention if arch == "attn" else None,
                             "init": cfg.init, "width": head.width, "seed": seed, "kernel": kernel, "loo": loo,
                             "pick": pick, "k": int(idx.numel()), "n_test": int(Xt.shape[0]),
                             **agreement(pred, actual), **net_metrics, "seconds": seconds})
                nt = pred.shape[0]
                changes.append({
                    "arch": arch, "width": head.width, "seed": seed, "kernel": kernel, "loo": loo, "pick": pick,
                    "point": np.repeat(idx.cpu().numpy(), nt), "test_index": np.tile(np.arange(nt), idx.numel()),
                    "predicted": pred.T.flatten().cpu().numpy(), "actual": actual.T.flatten().cpu().numpy()})
    del run, full
    return {"rows": rows, "changes": changes, "gap": gap, "stopping_ridge": kinf[arch].stopping_ridge}
