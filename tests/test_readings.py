"""engine.experiments.readings and the readings of the malleability run: the network's own
leave-one-out against an independent retraining loop, the gradient-flow leave-one-out against
the closed form in scipy, the nulls of every reading, and the verdict rule on hand-made rows."""

import math
from dataclasses import replace

import numpy as np
import pytest
import scipy.linalg
import torch

from conftest import (
    ATOL32_RETRAIN,
    ATOL64,
    ATOL64_FLOW_CLOSED,
    ATOL_FLOW_STEP,
    RTOL32,
    RTOL64,
    RTOL64_FLOW_CLOSED,
    RTOL_FLOW_STEP,
)
from engine.data import DataSpec
from engine.experiments import flips as F
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.retrain import LAZY_SGD
from engine.experiments.influence import in_space, kernels_of
from engine.experiments.malleability import random_perturbation, run_malleability, train_net
from engine.experiments.readings import read
from engine.experiments.recipes import net_recipe, reading_of
from engine.experiments.runs import prepare
from engine.maths.metrics import flip_rate
from engine.maths.specs import AttackSpec
from engine.maths.training import BATCH_SEED_OFFSET, targets
from engine.runtime.errors import BadInput

SYN = DataSpec("synthetic", n=24, n_test=8, synthetic_d=8, synthetic_kappa=20.0, synthetic_classes=3)
LAZY = replace(LAZY_SGD, epochs=4, batch_size=10, lr=2.0)
NET = MalleabilityConfig(data=SYN, widths=(32,), train=LAZY, init="antisymmetric", attention="centered",
                         attack=AttackSpec(steps=3, norm="l2"), space="normalized", eps=(0.3,), seeds=(0, 1),
                         tau=0.25, readings=("ridge", "flow", "retrain"))


def _trained(cfg, arch, seed=0):
    p = prepare(cfg.data, None, "cpu", None, None)
    X32, Xt32, box = in_space(cfg, p)
    t = train_net(cfg, p, net_recipe(cfg, arch, cfg.widths[0], seed), X32, box)
    return p, t, X32.double(), Xt32.double()


def _retrain_by_hand(t, phi, phi_t, y, c, keep, spec, seed):
    """Plain SGD on the masked MSE objective (each batch normalised by its full size), W only,
    with the engine's batch order for ``seed``: written here without the engine's trainer."""
    W = t.W0.clone().double()
    a = t.net32.mlp.a.double()
    half = W.shape[0] // 2
    Y = targets(y, c).double()
    g = torch.Generator().manual_seed(seed + BATCH_SEED_OFFSET)
    n, m = phi.shape[0], W.shape[0]

    def f(P, W):
        return (torch.relu(P @ W[:half].T) - torch.relu(P @ W[half:].T)) @ a[:half] / math.sqrt(m)

    for _ in range(spec.epochs):
        order = torch.randperm(n, generator=g)
        for start in range(0, n, spec.batch_size):
            idx = order[start:start + spec.batch_size]
            Wv = W.clone().requires_grad_(True)
            out = f(phi[idx].double(), Wv)
            loss = (keep[idx, None].double() * (out - Y[idx]) ** 2).sum() / (idx.numel() * Y.shape[1])
            (grad,) = torch.autograd.grad(loss, Wv)
            W = W - spec.lr * grad
    return f(phi_t.double(), W)


@pytest.mark.parametrize("arch", ["relu", "attn"])
def test_retrain_reading_equals_retraining_without_each_point_one_at_a_time(arch):
    p, t, X, Xt = _trained(NET, arch)
    points = torch.tensor([3, 11, 17])
    out = read(reading_of(NET, "retrain"), t, p, X, Xt, points)
    with torch.no_grad():
        phi, phi_t = t.net32.features(X.float()), t.net32.features(Xt.float())
    full = _retrain_by_hand(t, phi, phi_t, p.y, p.c, torch.ones(p.y.numel(), dtype=torch.bool), NET.train, 0)
    for j, i in enumerate(points.tolist()):
        keep = torch.ones(p.y.numel(), dtype=torch.bool)
        keep[i] = False
        D = full - _retrain_by_hand(t, phi, phi_t, p.y, p.c, keep, NET.train, 0)  # (n_test, c)
        own = D[torch.arange(D.shape[0]), p.yt]  # target "true": each test point's own class
        np.testing.assert_allclose(out.I[:, j].numpy(), own.numpy(), rtol=RTOL32, atol=ATOL32_RETRAIN)
    np.testing.assert_allclose(out.agg.numpy(), out.I.mean(dim=0).numpy(), rtol=RTOL64)


def test_flow_reading_equals_the_closed_form_of_kernel_gradient_descent():
    p, t, X, Xt = _trained(NET, "relu")
    r = reading_of(NET, "flow")
    points = torch.tensor([0, 5, 9])
    out = read(r, t, p, X, Xt, points)
    K, Kt = (k.double().numpy() for k in kernels_of(r, t.net, X, Xt))
    n, c = p.Y.shape
    tau = NET.train.epochs * math.ceil(n / NET.train.batch_size)
    eta = 2 * NET.train.lr / (n * c)  # antisymmetric init: f₀ ≡ 0, no weight decay

    def f_test(keep):
        Kk, Ktk, Yk = K[np.ix_(keep, keep)], Kt[:, keep], p.Y.numpy()[keep]
        grown = Yk - scipy.linalg.expm(-eta * tau * Kk) @ Yk  # (I − e^{−η'τK}) Y
        return Ktk @ np.linalg.solve(Kk, grown)

    full = f_test(np.ones(n, bool))
    for j, i in enumerate(points.tolist()):
        keep = np.ones(n, bool)
        keep[i] = False
        D = full - f_test(keep)
        np.testing.assert_allclose(out.I[:, j].numpy(), D[np.arange(D.shape[0]), p.yt.numpy()], rtol=RTOL64_FLOW_CLOSED,
                                   atol=ATOL64_FLOW_CLOSED)


def test_every_reading_measures_the_same_attack_with_its_own_nulls():
    res = run_malleability(NET)
    rows = res.frames["rows"]
    assert set(rows.reading) == {"ridge", "flow", "retrain"} and set(rows.width) == {32}
    for _, g in rows.groupby(["arch", "seed"]):  # one attack, three readings: the same perturbation
        assert g.rel_perturbation.nunique() == 1 and g.points_moved.nunique() == 1
    assert (rows.null_seed_kind == "partner seed").all()
    # the retrain reading's seed null, recomputed here: seed 1's retrained net at seed 0's points
    p, t0, X, Xt = _trained(NET, "attn", 0)
    _, t1, _, _ = _trained(NET, "attn", 1)
    ridge, retrain = reading_of(NET, "ridge"), reading_of(NET, "retrain")
    top = torch.topk(read(ridge, t0, p, X, Xt, None).agg.abs(), NET.n_tracked).indices
    own, other = read(retrain, t0, p, X, Xt, top).at(top), read(retrain, t1, p, X, Xt, top).at(top)
    row = rows[(rows.arch == "attn") & (rows.seed == 0) & (rows.reading == "retrain")].iloc[0]
    assert row.null_seed_flip_rate == pytest.approx(flip_rate(own, other), abs=0)
    assert row.flip_excess == pytest.approx(row.flip_rate - max(row.null_seed_flip_rate,
                                                                row.null_random_flip_rate), abs=ATOL64)
    assert row.exact_for.startswith("the net's own training") and bool(row.objective_match)
    verdict = res.frames["verdict"]
    assert set(verdict.reading) == {"ridge", "flow", "retrain"}


def test_kinf_of_fixed_features_has_no_seed_null_and_its_excess_is_over_the_random_null():
    cfg = replace(NET, influence_kernel="kinf", readings=("ridge",), train=replace(LAZY, epochs=2))
    rows = run_malleability(cfg).frames["rows"]
    assert (rows.null_seed_kind == "seed-free").all() and rows.null_seed_flip_rate.isna().all()
    np.testing.assert_allclose(rows.flip_excess, rows.flip_rate - rows.null_random_flip_rate, atol=ATOL64)


def test_random_null_of_the_retrain_reading_retrains_on_the_randomly_moved_rows():
    p, t, X, Xt = _trained(NET, "relu")
    Xp = X.clone()
    Xp[:4] += 0.05
    Xr = random_perturbation(X, Xp, 3)
    top = torch.arange(4)
    r = reading_of(NET, "retrain")
    a = read(r, t, p, Xr, Xt, top, X_ref=Xr)
    b = read(r, t, p, Xr.clone(), Xt, top, X_ref=Xr.clone())
    assert torch.equal(a.I, b.I)  # deterministic: the null is reproducible from its seed
    assert not torch.equal(a.I, read(r, t, p, X, Xt, top).I)


@pytest.mark.parametrize("kwargs, match", [
    ({"readings": ("flow",), "train": replace(LAZY, optimizer="adam")}, "flow"),
    ({"readings": ("retrain",), "attention": "qkv"}, "qkv"),
    ({"readings": ("retrain",), "adversarial_training": True}, "adversarial"),
    ({"readings": ("bogus",)}, "readings"),
])
def test_readings_refuse_what_they_cannot_read(kwargs, match):
    with pytest.raises(BadInput, match=match):
        replace(NET, **kwargs)


def _rows(arch, reading, flip, n=3, draw=0):
    return [{"data_seed": draw, "arch": arch, "width": 64, "seed": s, "attack": "pgd", "eps": 0.3, "reading": reading,
             "flip_excess": flip, "null_seed_flip_rate": 0.0, "null_random_flip_rate": 0.0, "trained": True,
             "objective_match": reading != "ridge"} for s in range(n)]


def test_verdict_states_the_gap_with_its_interval_and_a_ratio_only_over_a_nonzero_excess():
    import pandas as pd

    k = 40
    hi, lo, none = np.ones(k, bool), np.r_[np.ones(k // 4, bool), np.zeros(3 * k // 4, bool)], np.zeros(k, bool)
    rows = pd.DataFrame(_rows("attn", "retrain", 1.0) + _rows("relu", "retrain", 0.25)
                        + _rows("attn", "ridge", 1.0) + _rows("relu", "ridge", 0.0))
    flips = [(hi, none, none)] * 3 + [(lo, none, none)] * 3 + [(hi, none, none)] * 3 + [(none, none, none)] * 3
    v = F.verdict(rows, flips, nulls=True)[0].set_index("reading")
    assert v.loc["retrain", "gap"] == pytest.approx(0.75) and v.loc["retrain", "gap_low"] > 0.5
    assert v.loc["retrain", "ratio"] == pytest.approx(4.0) and v.loc["retrain", "ratio_low"] > 2
    assert v.loc["retrain", "role"] == "primary" and v.loc["ridge", "role"] == "secondary"
    assert bool(v.loc["retrain", "holds"]) and bool(v.loc["ridge", "holds"])
    assert math.isnan(v.loc["ridge", "ratio"])  # 2L-ReLU's excess interval is [0, 0]: no ratio
    assert not bool(v.loc["ridge", "objective_match"])
    rows.loc[rows.arch == "relu", "trained"] = False
    gated = F.verdict(rows, flips, nulls=True)[0]
    assert not gated["holds"].any() and set(gated["outcome"]) == {"did not train"}  # no net trained: no verdict


def test_flow_reading_is_what_retraining_a_linear_model_gives():
    """The head linearised at W₀ (activation pattern frozen), full batches and a small rate: gradient
    descent on it is the kernel's gradient flow with the eNTK at W₀, so retraining it without each
    point (``train_masked``, frozen) and the flow leave-one-out must agree up to the step size. One
    output: with several, a finite-width head's outputs are coupled through its shared W (cross-class
    terms of order m^-½), which the flow reading's per-output kernel leaves out."""
    from engine.maths.loo import flow_loo, head_outputs, train_masked
    from engine.maths.ntk import empirical_ntk_features

    binary = replace(SYN, synthetic_classes=2)  # one output: the scalar eNTK is the whole tangent kernel
    cfg = replace(NET, data=binary, train=replace(LAZY, epochs=300, batch_size=binary.n, lr=0.5))
    p, t, X, Xt = _trained(cfg, "relu")
    head = fresh = t.net32.mlp.__class__(X.shape[1], 32, 1, 0, init="antisymmetric").double()
    with torch.no_grad():
        phi, phi_t = (t.net32.features(z.float()).double() for z in (X, Xt))
        head.W.copy_(t.W0.double())
    frozen, frozen_t = phi @ head.W.T > 0, phi_t @ head.W.T > 0
    points = torch.tensor([2, 7, 13])
    keep = torch.ones(1 + len(points), SYN.n, dtype=torch.bool)
    keep[torch.arange(1, 1 + len(points)), points] = False
    run = train_masked(phi, p.y, p.c, [fresh] * keep.shape[0], keep, cfg.train, 0, frozen=frozen.repeat(1, keep.shape[0]))
    with torch.no_grad():
        out = head_outputs(phi_t @ run.W.T, [fresh] * keep.shape[0], frozen_t.repeat(1, keep.shape[0]))
    retrained = (out[0][None] - out[1:]).permute(1, 0, 2)[:, :, 0]
    K, K_t = empirical_ntk_features(head, phi), empirical_ntk_features(head, phi_t, phi)
    zero = torch.zeros(SYN.n, 1, dtype=torch.float64)
    flow = flow_loo(K, K_t, p.Y, p.yt, points, cfg.train, zero, zero[: phi_t.shape[0]]).scored("true", p.yt)
    np.testing.assert_allclose(retrained.numpy(), flow.numpy(), rtol=RTOL_FLOW_STEP, atol=ATOL_FLOW_STEP)
    assert float(flow.abs().max()) > 1e-2  # the changes are not all nil: the comparison says something


def test_influence_reads_its_top_points_by_flow_and_by_retraining():
    """The Influence run's other readings: at the top ``read_points`` by |ridge aggregate|, the
    retrain reading is the by-hand retraining without each point, and the agreement row is
    scipy's Spearman ρ and numpy's sign agreement of the stored columns."""
    import scipy.stats

    from engine.experiments.configs.influence import InfluenceConfig
    from engine.experiments.influence import run_influence

    cfg = InfluenceConfig(data=SYN, width=32, train=LAZY, init="antisymmetric", attention="centered", seeds=(0,),
                          archs=("relu",), readings=("ridge", "flow", "retrain"), read_points=4)
    res = run_influence(cfg)
    agg, rows = res.frames["aggregate"], res.frames["readings"]
    ridge = agg[agg.reading == "ridge"].sort_values("train_index").influence.to_numpy()
    top = np.sort(np.argsort(-np.abs(ridge), kind="stable")[:4])
    assert set(rows.reading) == {"flow", "retrain"}
    for name in ("flow", "retrain"):
        mine = agg[agg.reading == name]
        np.testing.assert_array_equal(np.sort(mine.train_index.to_numpy()), top)
        np.testing.assert_array_equal(res.arrays[f"relu_points_{name}"], top)
        row = rows[rows.reading == name].iloc[0]
        I_r, I_0 = res.arrays[f"relu_I_{name}"], res.arrays["relu_I"][:, top]
        assert row.rho_vs_ridge == pytest.approx(scipy.stats.spearmanr(ridge[top], I_r.mean(axis=0)).statistic)
        assert row.sign_agreement_vs_ridge == pytest.approx(float((np.sign(I_r) == np.sign(I_0)).mean()))
        assert row.objective_match  # lazy SGD on MSE: every reading's own training
    p, t, X, Xt = _trained(MalleabilityConfig(data=SYN, widths=(32,), train=LAZY, init="antisymmetric",
                                              attention="centered", seeds=(0,), space="raw"), "relu")
    with torch.no_grad():
        phi, phi_t = t.net32.features(p.X), t.net32.features(p.Xt)
    full = _retrain_by_hand(t, phi, phi_t, p.y, p.c, torch.ones(p.y.numel(), dtype=torch.bool), LAZY, 0)
    keep = torch.ones(p.y.numel(), dtype=torch.bool)
    keep[int(top[0])] = False
    D = full - _retrain_by_hand(t, phi, phi_t, p.y, p.c, keep, LAZY, 0)
    own = D[torch.arange(D.shape[0]), p.yt].numpy()
    np.testing.assert_allclose(res.arrays["relu_I_retrain"][:, 0], own, rtol=RTOL32, atol=ATOL32_RETRAIN)


def test_influence_refuses_flow_under_adam_and_more_points_than_it_has():
    from engine.experiments.configs.influence import InfluenceConfig

    with pytest.raises(BadInput, match="reading 'flow' follows plain SGD on MSE, not adam"):
        InfluenceConfig(readings=("ridge", "flow"))
    with pytest.raises(BadInput, match="--read-points 400 exceeds the 300 training points"):
        InfluenceConfig(readings=("ridge", "retrain"), read_points=400)
