"""The causal design along training (engine.experiments.along: flips_at, design_flips, design_frames,
design_effects, association), against tests/reference.py alone (numpy features, eNTK, arc-cosine K∞,
loss gradient, PGD, brute-force leave-one-out refits) and against scipy on hand-made rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from conftest import ATOL64, ATOL64_REFIT, RTOL32_ONE_PASS, RTOL64_KINF_ATTENTION, RTOL64_REFIT
from engine.data import DataSpec
from engine.experiments import along
from engine.experiments.configs.alignment import AlignmentConfig
from engine.experiments.influence import in_space
from engine.experiments.readings import fresh_net
from engine.experiments.recipes import Reading, net_recipe
from engine.experiments.runs import prepare
from engine.maths.specs import AttackSpec, TrainSpec
from engine.runtime.errors import BadInput
from reference import arccos_ntk, attack as ref_attack, features, loo_true, loss_grad, ntk_relu

SYN = DataSpec(dataset="synthetic", n=24, n_test=8, synthetic_d=6, synthetic_classes=3)
CFG = AlignmentConfig(data=SYN, train=TrainSpec(epochs=2, snapshot_epochs=(0, 2)), widths=(16,), seeds=(0, 1),
                      tau=0.25, eps=0.3, attack=AttackSpec(steps=3, norm="l2"), curve_ns=(8,), curve_trials=2,
                      design=True)


def _agg(X, Xt, Y, yt, W, arch, kernel):
    P, Pt = features(X, X, arch), features(Xt, X, arch)
    K, Kt = (arccos_ntk(P, P), arccos_ntk(Pt, P)) if kernel == "kinf" else (ntk_relu(P, P, W), ntk_relu(Pt, P, W))
    return loo_true(K, Kt, Y, yt, CFG.ridge).mean(axis=0)


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("kernel", ["entk", "kinf"])
def test_a_crossed_cell_reads_one_kernel_and_attacks_another_net(arch, kernel):
    """Influence on the kernel of W_kernel (or K∞), the attack on the loss of the net with W_attack."""
    p = prepare(SYN, None, "cpu", None, None)
    init = fresh_net(net_recipe(CFG, arch, 16, 0), p.X, p.c, "cpu").mlp
    W0 = init.W.detach()
    Wt = W0 + 0.3 * torch.randn(W0.shape, generator=torch.Generator().manual_seed(5))
    r = Reading("ridge", kernel, CFG.target, CFG.ridge, "float64", CFG.precision)
    got = along.flips_at(CFG, p, arch, 16, 0, 2, W0, Wt, r, "ce")

    X32, Xt32, _ = in_space(CFG, p)
    X, Xt, Y, y, yt = X32.double().numpy(), Xt32.double().numpy(), p.Y.numpy(), p.y.numpy(), p.yt.numpy()
    Wk, Wa, a = W0.double().numpy(), Wt.double().numpy(), init.a.double().numpy()
    agg0 = _agg(X, Xt, Y, yt, Wk, arch, kernel)
    rtol = RTOL64_KINF_ATTENTION if (arch, kernel) == ("attn", "kinf") else RTOL64_REFIT
    np.testing.assert_allclose(got["agg"], agg0, rtol=rtol, atol=ATOL64_REFIT)
    top = np.sort(np.argsort(-np.abs(agg0))[:round(CFG.tau * len(X))])
    assert got["top"] == top.tolist()
    move = np.zeros(len(X), dtype=bool)
    move[top] = True
    Xp, _, _ = ref_attack(lambda Z: loss_grad(Z, y, Wa, a, arch, "ce"), X, "pgd", "l2", CFG.eps,
                          steps=CFG.attack.steps, move=move)
    after = _agg(Xp, Xt, Y, yt, Wk, arch, kernel)
    assert got["attack"] == (np.sign(agg0[top]) != np.sign(after[top])).tolist()


def test_the_design_reuses_what_is_the_same_computation():
    p = prepare(SYN, None, "cpu", None, None)
    W0 = fresh_net(net_recipe(CFG, "relu", 16, 0), p.X, p.c, "cpu").mlp.W.detach()
    snaps = {0: W0, 2: W0 + 0.3 * torch.randn(W0.shape, generator=torch.Generator().manual_seed(1))}
    cells = along.design_flips(CFG, p, "relu", 16, 0, snaps, W0, {}, "ce")
    assert len(cells) == len(snaps) * len(along.KERNELS) * len(along.ATTACKERS)
    at = {(c["epoch"], c["kernel"], c["attacker"]): c for c in cells}
    for k in along.KERNELS:  # at t = 0, W(t) = W(0): every cell is its K_m(0) or K∞ cell
        for a in along.ATTACKERS:
            assert at[(0, k, a)]["agg"] == at[(0, "K∞" if k == "K∞" else "K_m(0)", "epoch 0")]["agg"]
    assert at[(2, "K_m(0)", "epoch 0")] == {**at[(0, "K_m(0)", "epoch 0")], "epoch": 2}
    own = along.snapshot_flips(CFG, p, "relu", 16, 0, 2, snaps[2], "ce")
    assert at[(2, "K_m(t)", "epoch t")]["attack"] == own["attack"]
    assert at[(2, "K∞", "epoch t")]["agg"] == at[(2, "K∞", "epoch 0")]["agg"]  # K∞: W does not enter
    assert at[(2, "K_m(0)", "epoch t")]["agg"] == at[(0, "K_m(0)", "epoch 0")]["agg"]


DRAW_NOISE = (0.01, -0.004, -0.006)  # each draw's own departure of both effects (mean zero over draws)
NET_NOISE = (0.003, -0.003)          # each net's within its draw (mean zero within a draw)


def _rows(effect_kernel, effect_attacker):
    rows = []
    for d, dn in enumerate(DRAW_NOISE):
        for s, sn in enumerate(NET_NOISE):
            for k in along.KERNELS:
                for a in along.ATTACKERS:
                    for e in (0, 10):
                        late = e > 0
                        v = 0.1 + 0.01 * d + late * ((effect_kernel + dn + sn) * (k == "K_m(t)")
                                                      + (effect_attacker - dn + sn) * (a == "epoch t"))
                        rows.append({"data_seed": d, "arch": "attn", "width": 16, "seed": s, "epoch": e,
                                     "kernel": k, "attacker": a, "flip_excess": v})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kernel, attacker, follows", [(0.2, 0.0, "kernel"), (0.0, 0.2, "attacker"),
                                                       (0.2, 0.2, "both"), (0.0, 0.0, "neither")])
def test_the_rule_names_what_the_excess_follows(kernel, attacker, follows):
    frame = _rows(kernel, attacker)
    e = along.design_effects(frame).iloc[0]
    assert e["follows"] == follows and (e["first"], e["last"], e["n_nets"], e["n_draws"]) == (0, 10, 6, 3)
    last = frame[frame["epoch"] == 10].set_index(["data_seed", "seed", "kernel", "attacker"])["flip_excess"]
    per_net = [((last[(d, s, "K_m(t)", "epoch 0")] - last[(d, s, "K_m(0)", "epoch 0")])
                + (last[(d, s, "K_m(t)", "epoch t")] - last[(d, s, "K_m(0)", "epoch t")])) / 2
               for d in (0, 1, 2) for s in (0, 1)]
    means = np.array(per_net).reshape(3, 2).mean(axis=1)  # draws the unit: the mean of each draw's nets
    lo, hi = stats.t.interval(0.95, 2, loc=means.mean(), scale=stats.sem(means))
    assert e["kernel_effect"] == pytest.approx(means.mean(), abs=ATOL64)
    assert (e["kernel_low"], e["kernel_high"]) == pytest.approx((lo, hi), abs=ATOL64)


def test_association_is_spearman_with_whole_nets_resampled_for_each_distance():
    from engine.reporting.alignment import association_sentence

    rows = [{"data_seed": d, "arch": a, "seed": s, "epoch": t, "kernel_dist": 0.1 * t + 0.01 * s,
             "kernel_dist_whitened": 5.0 - t + 0.1 * s, "prediction_gap": 0.2,  # constant: ρ undefined
             "flip_excess": (0.05 * t if a == "attn" else -0.02 * t) + 0.003 * d}
            for a in ("attn", "relu") for d in (0, 1) for s in (0, 1, 2) for t in (0, 1, 2, 3)]
    frame = pd.DataFrame(rows)
    got = along.association(frame, resamples=200).set_index(["distance", "arch"])
    for distance in ("kernel_dist", "kernel_dist_whitened"):
        for arch in ("attn", "relu"):
            g = frame[frame["arch"] == arch]
            row = got.loc[(distance, arch)]
            assert row["rho"] == pytest.approx(stats.spearmanr(g[distance], g["flip_excess"]).statistic)
            assert row["n_nets"] == 6 and row["n_points"] == 24
            assert row["low"] <= row["rho"] <= row["high"]
        assert (distance, "both") in got.index
    assert got.loc[("kernel_dist", "attn"), "low"] > 0 and got.loc[("kernel_dist", "relu"), "high"] < 0
    assert got.loc[("kernel_dist_whitened", "attn"), "high"] < 0  # the whitened distance falls here
    assert np.isnan(got.loc[("prediction_gap", "attn"), "rho"])  # a constant column has no ρ
    text = association_sentence(got.reset_index())
    assert "The distances disagree for MLP-Attn, 2L-ReLU" in text and "whitened distance: MLP-Attn ρ = " in text
    assert "prediction gap: MLP-Attn ρ undefined" in text
    unsettled = pd.DataFrame({"distance": ["kernel_dist", "prediction_gap"], "arch": ["attn", "attn"],
                              "rho": [0.3, -0.2], "low": [-0.001, -0.5], "high": [0.6, 0.1], "n_points": 24, "n_nets": 6})
    assert association_sentence(unsettled).count("No distance's association excludes zero.") == 1


def test_the_snapshot_distances_match_numpy():
    """The training frame's distances from K∞ at epoch 0 (the net at init) against the numpy eNTK,
    arc-cosine K∞, scipy's matrix square root and a ridge solve of tests/reference.py."""
    import scipy.linalg

    from engine.experiments.alignment import run_alignment
    from reference import ridge_predict

    cfg = replace(CFG, archs=("relu",), seeds=(0,), flips=False, design=False)
    res = run_alignment.compute(cfg, None, torch.device("cpu"), None, None)
    row = res.frames["training"].query("epoch == 0").iloc[0]
    p = prepare(SYN, None, "cpu", None, None)
    W = fresh_net(net_recipe(cfg, "relu", 16, 0), p.X, p.c, "cpu").mlp.W.detach().double().numpy()
    X, Xt, Y = p.X.double().numpy(), p.Xt.double().numpy(), p.Y.double().numpy()
    P, Pt = features(X, X, "relu"), features(Xt, X, "relu")
    K, Kt, Ki, Kit = ntk_relu(P, P, W), ntk_relu(Pt, P, W), arccos_ntk(P, P), arccos_ntk(Pt, P)
    lam = cfg.ridge * np.mean(np.diag(Ki))
    R = scipy.linalg.sqrtm(np.linalg.inv(Ki + lam * np.eye(len(Ki)))).real
    f_inf = ridge_predict(Ki, Kit, Y, lam)
    f_m = ridge_predict(K, Kt, Y, cfg.ridge * np.mean(np.diag(K)))
    assert row["kernel_dist"] == pytest.approx(np.linalg.norm(K - Ki) / np.linalg.norm(Ki), rel=RTOL32_ONE_PASS)
    assert row["kernel_dist_whitened"] == pytest.approx(np.linalg.norm(R @ (K - Ki) @ R, 2), rel=RTOL32_ONE_PASS)
    assert row["prediction_gap"] == pytest.approx(np.linalg.norm(f_m - f_inf) / np.linalg.norm(f_inf),
                                                  rel=RTOL32_ONE_PASS)


def test_design_needs_the_flips():
    with pytest.raises(BadInput, match="drop --no-flips"):
        AlignmentConfig(flips=False, design=True)
