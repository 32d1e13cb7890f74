"""engine.experiments.along: flip rates along training, beside the alignment at the same snapshots.

The per-snapshot flips are checked against tests/reference.py alone: the numpy features and
loss gradient, the first layer's eNTK, the brute-force leave-one-out refits and the numpy PGD.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import ATOL64_REFIT, ATOL64_SAME, RTOL64_REFIT, RTOL64_SAME
from engine.data import DataSpec
from engine.experiments import along
from engine.experiments.configs.alignment import AlignmentConfig
from engine.experiments.flips import random_perturbation
from engine.experiments.influence import in_space
from engine.experiments.readings import fresh_net
from engine.experiments.recipes import net_recipe
from engine.experiments.runs import prepare
from engine.maths.specs import AttackSpec, TrainSpec
from engine.reporting.alignment import along_sentence
from engine.reporting.plots import alignment as AP
from reference import attack as ref_attack, features, loo_true, loss_grad, ntk_relu

SYN = DataSpec(dataset="synthetic", n=24, n_test=8, synthetic_d=6, synthetic_classes=3)


def _reference_agg(X, Xt, Y, yt, W, arch, ridge):
    """Aggregate true-class ridge leave-one-out influence (n,) on the first layer's eNTK, by refits."""
    P, Pt = features(X, X, arch), features(Xt, X, arch)
    return loo_true(ntk_relu(P, P, W), ntk_relu(Pt, P, W), Y, yt, ridge).mean(axis=0)


@pytest.mark.parametrize("arch", ["relu", "attn"])
def test_a_snapshot_equals_numpy_refits_on_a_numpy_attack(arch):
    cfg = AlignmentConfig(data=SYN, train=TrainSpec(epochs=2, snapshot_epochs=(0, 2)), widths=(16,), seeds=(0,),
                          tau=0.25, eps=0.3, attack=AttackSpec(steps=3, norm="l2"), curve_ns=(8,), curve_trials=2)
    p = prepare(SYN, None, "cpu", None, None)
    seed, epoch = 0, 2
    init = fresh_net(net_recipe(cfg, arch, 16, seed), p.X, p.c, "cpu").mlp
    W = init.W.detach()
    W = W + 0.3 * torch.randn(W.shape, generator=torch.Generator().manual_seed(5))  # a moved snapshot
    got = along.snapshot_flips(cfg, p, arch, 16, seed, epoch, W, "ce")

    X32, Xt32, box = in_space(cfg, p)  # space "normalized": the attack moves the float32 unit rows, no box
    assert box is None
    X, Xt, Y, y, yt = X32.double().numpy(), Xt32.double().numpy(), p.Y.numpy(), p.y.numpy(), p.yt.numpy()
    Wn = W.double().numpy()
    a = init.a.double().numpy()
    agg0 = _reference_agg(X, Xt, Y, yt, Wn, arch, cfg.ridge)
    np.testing.assert_allclose(got["agg"], agg0, rtol=RTOL64_REFIT, atol=ATOL64_REFIT)
    k = round(cfg.tau * len(X))
    top = np.sort(np.argsort(-np.abs(agg0))[:k])
    assert got["top"] == top.tolist()

    move = np.zeros(len(X), dtype=bool)
    move[top] = True
    Xp, _, _ = ref_attack(lambda Z: loss_grad(Z, y, Wn, a, arch, "ce"), X, "pgd", "l2", cfg.eps,
                          steps=cfg.attack.steps, move=move)
    after = _reference_agg(Xp, Xt, Y, yt, Wn, arch, cfg.ridge)
    assert got["attack"] == (np.sign(agg0[top]) != np.sign(after[top])).tolist()
    assert got["flip_rate"] == pytest.approx(np.mean(np.sign(agg0[top]) != np.sign(after[top])))
    # the random null: the attack's per-row norms in the seeded random directions, read the same way
    Xr = random_perturbation(torch.from_numpy(X), torch.from_numpy(Xp), 7919 * seed + epoch + 1).numpy()
    np.testing.assert_allclose(np.linalg.norm(Xr - X, axis=1), np.linalg.norm(Xp - X, axis=1), rtol=RTOL64_SAME, atol=ATOL64_SAME)
    rand = _reference_agg(Xr, Xt, Y, yt, Wn, arch, cfg.ridge)
    assert got["random"] == (np.sign(agg0[top]) != np.sign(rand[top])).tolist()
    rel = np.linalg.norm((Xp - X)[top], axis=1) / np.linalg.norm(X[top], axis=1)
    assert 0 < got["rel_perturbation"] == pytest.approx(rel.mean(), rel=RTOL64_REFIT)


def _snap(seed, agg, top, attack, random, epoch=0, draw=0):
    return {"data_seed": draw, "arch": "relu", "width": 16, "seed": seed, "epoch": epoch, "agg": agg, "top": top,
            "attack": attack, "random": random, "flip_rate": float(np.mean(attack)),
            "null_random_flip_rate": float(np.mean(random)), "test_acc": 0.5, "test_acc_after": 0.5,
            "rel_perturbation": 0.1}


def test_seed_nulls_pair_each_seed_with_the_next_cyclically():
    s0 = _snap(0, [1.0, -2.0, 3.0, -4.0], [1, 3], [True, False], [False, False])
    s1 = _snap(1, [-1.0, -2.0, 3.0, 4.0], [2, 3], [False, False], [False, True])
    out = {s["seed"]: s for s in along.seed_nulls([s0, s1], (0, 1))}
    assert out[0]["null_seed_partner"] == 1 and out[0]["seed_null"] == [False, True]  # at seed 0's points 1, 3
    assert out[1]["null_seed_partner"] == 0 and out[1]["seed_null"] == [False, True]  # at seed 1's points 2, 3
    assert out[0]["null_seed_flip_rate"] == 0.5
    alone = along.seed_nulls([s0], (0,))[0]
    assert alone["seed_null"] is None and math.isnan(alone["null_seed_flip_rate"])


def test_rows_subtract_the_larger_null_and_carry_the_alignment():
    snaps = along.seed_nulls([_snap(0, [1.0, -2.0, 3.0, -4.0], [1, 3], [True, True], [False, False]),
                              _snap(1, [-1.0, -2.0, 3.0, 4.0], [2, 3], [True, False], [False, True])], (0, 1))
    training = pd.DataFrame([{"data_seed": 0, "arch": "relu", "width": 16, "seed": s, "epoch": 0, "alignment": al,
                              "kernel_dist": 0.1} for s, al in ((0, 0.4), (1, 0.6))])
    rows, summary = along.frames(snaps, training)
    r0, r1 = rows.set_index("seed").loc[0], rows.set_index("seed").loc[1]
    assert r0["flip_excess"] == pytest.approx(1.0 - max(0.5, 0.0)) and r0["alignment"] == 0.4
    assert r1["flip_excess"] == pytest.approx(0.5 - max(0.5, 0.5))
    assert r0["flip_excess_low"] <= r0["flip_excess"] <= r0["flip_excess_high"]
    (s,) = summary.itertuples()
    assert s.flip_excess == pytest.approx((0.5 + 0.0) / 2) and s.alignment_mean == pytest.approx(0.5)
    assert s.flip_excess_low <= s.flip_excess <= s.flip_excess_high and s.n_nets == 2
    fig = AP.both_halves_fig(AP.both_halves_data(summary))
    assert len(fig.data) == 3 and len(fig.layout.shapes) == 1  # alignment, excess, null; the zero line


def _nets(align_step, excess_step, dist_step, draws=(0, 1, 2), seeds=(0, 1), epochs=(0, 20, 40), noise=0.002):
    """Per-net snapshots (the ``flips_training`` frame): each net's alignment, flip excess and kernel
    distance move by the given step per snapshot, plus a small net-specific wobble."""
    rng = np.random.default_rng(0)
    rows = []
    for d in draws:
        for s in seeds:
            off = noise * rng.standard_normal(3)
            for i, e in enumerate(epochs):
                rows.append({"data_seed": d, "arch": "attn", "width": 64, "seed": s, "epoch": e,
                             "alignment": 0.4 + i * align_step + off[0] * i, "kernel_dist": 0.1 + i * dist_step + off[2] * i,
                             "flip_excess": 0.05 + i * excess_step + off[1] * i})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("steps,words", [
    ((0.05, 0.1, 0.1), ["alignment 0.400 → 0.49", "(rose); flip excess", "the excess moved with the kernel"]),
    ((0.05, 0.0, 0.1), ["(rose); flip excess", "(no change beyond its interval); kernel distance"]),
    ((0.0, 0.1, 0.0), ["the excess did not move with the kernel's distance"]),
    ((-0.05, -0.1, 0.0), ["(fell); flip excess", "(fell); kernel distance"]),
])
def test_the_sentence_follows_its_paired_rule(steps, words):
    text = along_sentence(_nets(*steps))
    for w in words:
        assert w in text, text
    assert "3 draws" in text and "6 nets" in text


def test_paired_changes_pool_draw_means_with_a_t_interval():
    import scipy.stats

    from engine.reporting.alignment import along_changes

    nets = _nets(0.05, 0.1, 0.1, noise=0.02)
    ch = along_changes(nets).iloc[0]
    per = nets.sort_values("epoch").groupby(["data_seed", "seed"])["alignment"].agg(lambda v: v.iloc[-1] - v.iloc[0])
    means = per.groupby(level=0).mean().to_numpy()
    lo, hi = scipy.stats.t.interval(0.95, means.size - 1, loc=means.mean(), scale=scipy.stats.sem(means))
    assert (ch["alignment_change"], ch["alignment_low"], ch["alignment_high"]) == pytest.approx((means.mean(), lo, hi))
    assert "not measured" in along_sentence(pd.DataFrame())
