"""engine.experiments.malleability: flip rates end to end against a plain numpy reference, and the run's frames.

The reference takes only the trained weights from the engine. Everything else — features
(normalised rows; linearised attention C z with C = Zᵀ Z of the perturbed set), the loss
gradient that FGSM steps along, the empirical NTK (ΦΦᵀ)∘(SSᵀ)/m and leave-one-out influences
by brute-force kernel-ridge refits — is recomputed here in float64.
"""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from conftest import (
    ATOL32,
    ATOL64,
    ATOL64_MEAN,
    RTOL32,
    RTOL64,
    RTOL64_CHAIN,
    RTOL64_GRAD,
    RTOL_POWER_ITERATION,
    RTOL_SAME_RANKS,
    RTOL_SAME_RANKS_REDRAWN,
)
from engine.data import DataSpec
from engine.experiments.configs.influence import InfluenceConfig
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.influence import fit_net, in_space, run_influence
from engine.experiments.malleability import ROW_METRICS, example_key, run_malleability
from engine.experiments.recipes import net_recipe
from engine.experiments.runs import prepare
from engine.maths.attacks import training_loss
from engine.maths.influence import net_influence
from engine.maths.models import Net
from engine.maths.specs import AttackSpec, TrainSpec
from engine.maths.training import accuracy, n_outputs, targets, train
from engine.runtime.errors import BadInput
from reference import features, loo_true, loss_grad, ntk_relu, unit

TINY = DataSpec("synthetic", n=12, n_test=4, synthetic_d=6, synthetic_kappa=10.0, synthetic_classes=3)
SYN = DataSpec("synthetic", n=24, n_test=8, synthetic_d=8, synthetic_kappa=20.0, synthetic_classes=3)
FAST = TrainSpec(epochs=3, lr=1e-2, batch_size=6)


# ---------------------------------------------------------------- numpy reference (float64)

_unit, _features, _loss_grad, _ntk, _loo_true = unit, features, loss_grad, ntk_relu, loo_true  # tests/reference.py


def _influences(X, Xt, W, Y, y_test, arch, ridge):
    P, Pt = _features(X, X, arch), _features(Xt, X, arch)  # attention over the (perturbed) training set
    return _loo_true(_ntk(P, P, W), _ntk(Pt, P, W), Y, y_test, ridge)


@pytest.mark.parametrize("arch", ["relu", "attn"])
def test_reference_gradient_equals_autograd_of_the_engine_loss(arch):
    g = torch.Generator().manual_seed(1)
    X = torch.rand(10, 5, generator=g, dtype=torch.float64) + 0.1
    y = torch.randint(0, 3, (10,), generator=g)
    net = Net(arch, X, 16, 3, seed=2, dtype=torch.float64)
    Xp = X.clone().requires_grad_(True)
    value = training_loss(net, Xp, y, "ce", 3)
    (grad,) = torch.autograd.grad(value, Xp)
    ref_value, ref_grad = _loss_grad(X.numpy(), y.numpy(), net.mlp.W.detach().numpy(), net.mlp.a.numpy(), arch)
    assert float(value.detach()) == pytest.approx(ref_value, rel=RTOL64)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=RTOL64_GRAD, atol=ATOL64)


@pytest.mark.parametrize("space", ["raw", "normalized"])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_flip_rates_equal_the_numpy_reference_end_to_end(norm, space):
    eps = (0.1, 0.5)
    cfg = MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0,), attack=AttackSpec(norm=norm),
                             attacks=("fgsm",), eps=eps, space=space, tau=0.5, target="true")
    res = run_malleability(cfg)
    rows = res.frames["rows"]
    assert len(rows) == 2 * len(eps)

    p = prepare(cfg.data, None, "cpu", None, None)
    X = p.X.double().numpy()
    X = _unit(X) if space == "normalized" else X      # the attack's space, in float64
    Xt = p.Xt.double().numpy()
    Xt = _unit(Xt) if space == "normalized" else Xt
    y, yt = p.y.numpy(), p.yt.numpy()
    Y = np.eye(p.c)[y]
    k = round(cfg.tau * len(X))
    X32, _, box = in_space(cfg, p)
    for arch in cfg.archs:
        # the only engine inputs: the trained weights (the run's own training, deterministic on CPU)
        net = fit_net(net_recipe(cfg, arch, cfg.widths[0], 0), X32, p.y, p.c, p.device, box)
        W, a = net.mlp.W.detach().double().numpy(), net.mlp.a.double().numpy()
        I0 = _influences(X, Xt, W, Y, yt, arch, cfg.ridge)
        agg0 = I0.mean(axis=0)
        top = np.argsort(-np.abs(agg0))[:k]
        _, grad = _loss_grad(X, y, W, a, arch)
        step = np.sign(grad) if norm == "linf" else grad / np.linalg.norm(grad, axis=1, keepdims=True)
        for e in eps:
            row = rows[(rows.arch == arch) & (rows.eps == e)].iloc[0]
            key = lambda what, arch=arch, e=e: example_key(arch, "fgsm", e, what)  # noqa: E731
            assert sorted(res.arrays[key("top_idx")]) == sorted(top)
            Xp = X.copy()
            Xp[top] += e * step[top]                    # FGSM; synthetic data have no box to clip to
            np.testing.assert_allclose(res.arrays[key("X_pert")], Xp[res.arrays[key("top_idx")]],
                                       rtol=RTOL32, atol=ATOL32)
            I1 = _influences(Xp, Xt, W, Y, yt, arch, cfg.ridge)
            agg1 = I1.mean(axis=0)
            for got, want in ((key("infl_before"), agg0), (key("infl_after"), agg1)):
                np.testing.assert_allclose(res.arrays[got], want, rtol=0, atol=RTOL32 * np.abs(want).max())
            assert row.flip_rate == np.mean(np.sign(agg0[top]) != np.sign(agg1[top]))
            assert row.pair_flip_rate == np.mean(np.sign(I0[:, top]) != np.sign(I1[:, top]))
            assert row.spearman == pytest.approx(scipy.stats.spearmanr(agg0, agg1).statistic, rel=RTOL64)
            assert row.n_top == k and row.points_moved == k
    assert (rows.flip_rate > 0).any()  # the comparison is not vacuous


# ---------------------------------------------------------------- influence targets

def test_shuffling_training_labels_changes_true_influences_but_not_sum():
    g = torch.Generator().manual_seed(0)
    X, Xt = torch.rand(14, 5, generator=g, dtype=torch.float64), torch.rand(6, 5, generator=g, dtype=torch.float64)
    y, yt = torch.arange(14) % 3, torch.arange(6) % 3
    net = Net("attn", X, 64, 3, seed=0, dtype=torch.float64)
    shuffled = y[torch.randperm(14, generator=g)]
    assert not torch.equal(shuffled, y)

    def infl(labels, target, test_labels=yt):
        return net_influence(net, X, targets(labels, 3), Xt, target=target, y_test=test_labels).numpy()

    np.testing.assert_allclose(infl(shuffled, "sum"), infl(y, "sum"), rtol=RTOL64, atol=ATOL64)
    assert np.abs(infl(shuffled, "true") - infl(y, "true")).max() > 1e-3 * np.abs(infl(y, "true")).max()
    # renaming the classes consistently (train and test) changes nothing
    rename = torch.tensor([2, 0, 1])
    np.testing.assert_allclose(infl(rename[y], "true", rename[yt]), infl(y, "true"), rtol=RTOL64, atol=ATOL64)


# ---------------------------------------------------------------- the run's frames

def test_rows_follow_the_definitions_from_the_stored_arrays(cache):
    cfg = MalleabilityConfig(data=SYN, widths=(32,), train=FAST, attack=AttackSpec(steps=3), attacks=("fgsm", "pgd"),
                             eps=(0.2, 0.5), seeds=(0,))
    res = run_malleability(cfg, cache)
    rows = res.frames["rows"]
    assert len(rows) == 2 * 2 * 2
    assert set(rows.columns) >= {"arch", "seed", "attack", "eps", "norm", "space", "target", "flip_rate",
                                 "pair_flip_rate", "spearman", "test_acc", "train_acc", "test_acc_ntk",
                                 "test_acc_after", "rel_perturbation", "n_top", "perturb", "retrain", "tau",
                                 "ridge", "adversarial_training", "storage"}
    assert (rows.norm == "linf").all() and (rows.space == "raw").all() and (rows.target == "true").all()
    assert (rows.storage == "float64").all() and res.meta["storage"] == "float64"
    for _, row in rows.iterrows():
        key = lambda what, row=row: example_key(row.arch, row.attack, row.eps, what)  # noqa: E731
        top = res.arrays[key("top_idx")]
        before, after = res.arrays[key("infl_before")], res.arrays[key("infl_after")]
        assert len(top) == row.n_top == round(0.1 * 24) and set(np.argsort(-np.abs(before))[:len(top)]) == set(top)
        assert row.flip_rate == np.mean(np.sign(before[top]) != np.sign(after[top]))
        assert row.spearman == pytest.approx(scipy.stats.spearmanr(before, after).statistic)
        moved = np.abs(res.arrays[key("X_pert")] - res.arrays[key("X_clean")]).max()
        assert 0 < moved <= row.eps + 1e-6
    assert run_malleability(cfg, cache).cached


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_rel_perturbation_is_the_mean_relative_size_of_the_moved_points(norm):
    cfg = MalleabilityConfig(data=SYN, archs=("attn",), widths=(32,), train=FAST, attack=AttackSpec(norm=norm, steps=3),
                             attacks=("fgsm", "pgd"), eps=(0.3,), seeds=(0,))
    res = run_malleability(cfg)
    for _, row in res.frames["rows"].iterrows():
        key = lambda what, row=row: example_key("attn", row.attack, 0.3, what)  # noqa: E731
        clean, pert = res.arrays[key("X_clean")].astype(np.float64), res.arrays[key("X_pert")].astype(np.float64)
        delta = np.linalg.norm(pert - clean, axis=1)
        moved = delta > 0
        assert moved.sum() == row.points_moved
        rel = np.mean(delta[moved] / np.linalg.norm(clean[moved], axis=1))
        assert row.rel_perturbation == pytest.approx(rel, rel=RTOL32)
        if row.attack == "fgsm":  # one full step: ‖δ‖₂ = ε (ℓ2) or ε√d (ℓ∞); no box on synthetic data
            size = 0.3 if norm == "l2" else 0.3 * math.sqrt(clean.shape[1])
            np.testing.assert_allclose(delta, size, rtol=RTOL32)


def test_zero_budget_flips_nothing():
    cfg = MalleabilityConfig(data=SYN, widths=(32,), train=FAST, attack=AttackSpec(steps=2), eps=(0.0,), seeds=(0,))
    rows = run_malleability(cfg).frames["rows"]
    assert (rows.flip_rate == 0).all() and (rows.pair_flip_rate == 0).all() and (rows.rel_perturbation == 0).all()
    np.testing.assert_allclose(rows.spearman, 1.0)


def test_seeds_give_rows_and_a_summary_of_mean_and_sample_sd():
    cfg = MalleabilityConfig(data=SYN, widths=(32,), train=FAST, attack=AttackSpec(steps=2), attacks=("fgsm", "mim"),
                             eps=(0.3,), seeds=(0, 1, 2))
    res = run_malleability(cfg)
    rows, summary = res.frames["rows"], res.frames["summary"]
    assert len(rows) == 2 * 3 * 2 and len(summary) == 2 * 2
    for _, s in summary.iterrows():
        group = rows[(rows.arch == s.arch) & (rows.attack == s.attack) & (rows.eps == s.eps)]
        assert sorted(group.seed) == [0, 1, 2] and s.n_seeds == 3
        for metric in ROW_METRICS:
            v = group[metric].to_numpy(dtype=float)
            assert s[f"{metric}_mean"] == pytest.approx(np.mean(v), rel=RTOL64, abs=ATOL64)
            assert s[f"{metric}_sd"] == pytest.approx(np.std(v, ddof=1), rel=RTOL64, abs=ATOL64)


def test_interventions_match_direct_retraining():
    cfg = MalleabilityConfig(data=SYN, widths=(32,), train=FAST, attack=AttackSpec(steps=2), attacks=("fgsm",),
                             eps=(0.3,), seeds=(0,), interventions=True)
    res = run_malleability(cfg)
    inter, rows = res.frames["interventions"], res.frames["rows"]
    p = prepare(cfg.data, None, "cpu", None, None)
    c = p.c
    for arch in cfg.archs:
        mine = inter[inter.arch == arch].set_index("intervention")
        assert list(mine.index) == ["none", "curated", "transformed", "adversarial"]
        assert mine.loc["none", "test_acc"] == rows[rows.arch == arch].test_acc.iloc[0]
        top = res.arrays[example_key(arch, "fgsm", 0.3, "top_idx")]
        keep = np.ones(p.X.shape[0], dtype=bool)
        keep[top] = False
        X_transformed = p.X.clone()
        X_transformed[top] = torch.from_numpy(res.arrays[example_key(arch, "fgsm", 0.3, "X_pert")])
        for name, (X, y) in {"curated": (p.X[keep], p.y[keep]), "transformed": (X_transformed, p.y)}.items():
            net = Net(arch, X, cfg.widths[0], n_outputs(c), 0, cfg.init_std, cfg.attention, cfg.data.normalize)
            train(net, X, y, c, cfg.train, 0)
            assert mine.loc[name, "test_acc"] == accuracy(net, p.Xt, p.yt), name
        assert mine.loc["curated", "flip_rate"] is None or np.isnan(mine.loc["curated", "flip_rate"])
        assert (mine.influence_change.iloc[1:] > 0).all()
    assert set(res.frames["interventions_summary"].intervention) == {"none", "curated", "transformed", "adversarial"}


def test_options_show_up_in_rows():
    cfg = MalleabilityConfig(data=SYN, archs=("relu",), widths=(32,), train=FAST, attack=AttackSpec(steps=2),
                             eps=(0.1,), seeds=(0,), perturb="all", retrain=True, adversarial_training=True,
                             target="margin", storage="float32")
    res = run_malleability(cfg)
    row = res.frames["rows"].iloc[0]
    assert row.perturb == "all" and row.retrain and row.adversarial_training and row.target == "margin"
    assert row.storage == "float32" and res.meta["storage"] == "float32"
    assert row.points_moved > round(0.1 * 24) and row.steps == 2
    assert res.meta["adversarial_training"] is True
    plain = run_malleability(MalleabilityConfig(data=SYN, archs=("relu",), widths=(32,), train=FAST,
                                                attack=AttackSpec(steps=2), eps=(0.1,), seeds=(0,), perturb="all",
                                                retrain=True, target="margin"))
    assert not plain.frames["rows"].adversarial_training.iloc[0]
    key = example_key("relu", "pgd", 0.1, "infl_before")
    assert not np.array_equal(res.arrays[key], plain.arrays[key])  # trained on attacked inputs: another net


def test_normalized_space_needs_normalized_rows():
    with pytest.raises(BadInput, match="normalized"):
        MalleabilityConfig(data=DataSpec("synthetic", n=24, n_test=8, synthetic_d=8, normalize=False),
                           space="normalized")
    MalleabilityConfig(data=DataSpec("synthetic", n=24, n_test=8, synthetic_d=8, normalize=False), space="raw")


@pytest.mark.parametrize("kwargs,match", [({"perturb": "some"}, "perturb"), ({"tau": 1.5}, "tau"),
                                          ({"attacks": ("cw",)}, "attack"), ({"eps": (-0.1,)}, "eps"),
                                          ({"eps": (math.nan,)}, "eps"), ({"widths": (0,)}, "widths"),
                                          ({"ridge": 0.0}, "ridge"), ({"space": "pixel"}, "space"),
                                          ({"target": "all"}, "target"), ({"seeds": ()}, "seeds")])
def test_bad_configs(kwargs, match):
    with pytest.raises(BadInput, match=match):
        MalleabilityConfig(data=SYN, **kwargs)


def test_influence_run_shapes_and_aggregate():
    res = run_influence(InfluenceConfig(data=SYN, width=32, train=FAST, seeds=(0, 1)))
    for arch in ("relu", "attn"):
        I = res.arrays[f"{arch}_I"]
        assert I.shape == (8, 24)
        agg = res.frames["aggregate"].query("arch == @arch and seed == 0").influence.to_numpy()
        np.testing.assert_allclose(agg, I.mean(0), rtol=RTOL64)
    assert len(res.frames["summary"]) == 4 and res.meta["target"] == "true"
    assert res.arrays["X"].shape == (24, 8) and res.meta["image_shape"] is None


# ---------------------------------------------------------------- null baselines

def _reference_clean(cfg, arch, seed, p):
    """Aggregate influence (n,) and top-τ indices of a net trained here, independently of the run
    (its own Net and train call; numpy float64 features, eNTK and leave-one-out refits)."""
    net = Net(arch, p.X, cfg.widths[0], n_outputs(p.c), seed, cfg.init_std, cfg.attention, cfg.data.normalize)
    train(net, p.X, p.y, p.c, cfg.train, seed)
    X, Xt = p.X.double().numpy(), p.Xt.double().numpy()
    W = net.mlp.W.detach().double().numpy()
    agg = _influences(X, Xt, W, np.eye(p.c)[p.y.numpy()], p.yt.numpy(), arch, cfg.ridge).mean(axis=0)
    return agg, np.argsort(-np.abs(agg))[:round(cfg.tau * len(X))], W


def test_seed_null_is_the_sign_disagreement_of_two_independently_trained_nets():
    cfg = MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0, 1, 2), attacks=("fgsm",), eps=(0.1,),
                             tau=0.5)
    res = run_malleability(cfg)
    rows = res.frames["rows"]
    p = prepare(cfg.data, None, "cpu", None, None)
    assert res.meta["null_seed_pairs"] == {0: 1, 1: 2, 2: 0}
    seen = []
    for arch in cfg.archs:
        clean = {s: _reference_clean(cfg, arch, s, p)[:2] for s in cfg.seeds}
        for s, partner in ((0, 1), (1, 2), (2, 0)):
            (agg, top), (other, _) = clean[s], clean[partner]
            row = rows[(rows.arch == arch) & (rows.seed == s)].iloc[0]
            assert row.null_seed_partner == partner
            want = np.mean(np.sign(agg[top]) != np.sign(other[top]))   # on this seed's own top-τ points
            assert row.null_seed_flip_rate == want
            assert row.null_seed_spearman == pytest.approx(scipy.stats.spearmanr(agg, other).statistic,
                                                           rel=RTOL_SAME_RANKS)
            seen.append(want)
    assert max(seen) > 0   # the seeds disagree somewhere: the comparison is not vacuous


def test_one_seed_has_no_seed_null_and_nulls_can_be_switched_off():
    one = run_malleability(MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0,), attacks=("fgsm",),
                                              eps=(0.1,), tau=0.5))
    rows = one.frames["rows"]
    assert rows.null_seed_flip_rate.isna().all() and rows.null_seed_partner.isna().all()
    assert rows.null_random_flip_rate.notna().all()
    np.testing.assert_array_equal(rows.flip_excess, rows.flip_rate - rows.null_random_flip_rate)
    off = run_malleability(MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0, 1), attacks=("fgsm",),
                                              eps=(0.1,), tau=0.5, nulls=False))
    cols = ["null_seed_flip_rate", "null_random_flip_rate", "flip_excess", "flip_excess_low"]
    assert off.frames["rows"][cols].isna().all().all() and off.frames["summary"].flip_excess_low.isna().all()
    from engine.reporting.paper import flip_rule
    assert "nulls off" in flip_rule(off.frames["summary"])["why"]


def test_random_perturbation_keeps_each_rows_norm_and_only_its_direction_is_random():
    from engine.experiments.flips import random_perturbation

    g = torch.Generator().manual_seed(3)
    X = torch.rand(20, 7, generator=g, dtype=torch.float64)
    Xp = X.clone()
    Xp[:5] += 0.3 * torch.randn(5, 7, generator=g, dtype=torch.float64)  # rows 5.. do not move
    Xr = random_perturbation(X, Xp, seed=11)
    np.testing.assert_allclose((Xr - X).norm(dim=1).numpy(), (Xp - X).norm(dim=1).numpy(), rtol=RTOL64, atol=0)
    assert torch.equal(Xr[5:], X[5:])
    cos = torch.nn.functional.cosine_similarity(Xr[:5] - X[:5], Xp[:5] - X[:5], dim=1)
    assert cos.abs().max() < 0.99                       # not the attack's direction
    assert torch.equal(random_perturbation(X, Xp, seed=11), Xr)
    assert not torch.equal(random_perturbation(X, Xp, seed=12), Xr)
    X32 = X.float()
    assert random_perturbation(X32, Xp.float(), 1).dtype == torch.float32


def test_random_null_equals_the_numpy_reference_at_the_attacks_norms():
    from engine.experiments.flips import null_seed, random_perturbation

    cfg = MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0,), attacks=("fgsm",), eps=(0.1, 0.5),
                             tau=0.5, attack=AttackSpec(norm="l2"))
    res = run_malleability(cfg)
    rows = res.frames["rows"]
    p = prepare(cfg.data, None, "cpu", None, None)
    X, Xt = p.X.double().numpy(), p.Xt.double().numpy()
    Y = np.eye(p.c)[p.y.numpy()]
    flips = []
    for arch in cfg.archs:
        agg0, top, W = _reference_clean(cfg, arch, 0, p)
        for j, e in enumerate(cfg.eps):
            key = lambda what, arch=arch, e=e: example_key(arch, "fgsm", e, what)  # noqa: E731
            Xp = X.copy()
            Xp[res.arrays[key("top_idx")]] = res.arrays[key("X_pert")]
            Xr = random_perturbation(torch.from_numpy(X), torch.from_numpy(Xp), null_seed(0, j)).numpy()
            np.testing.assert_allclose(np.linalg.norm(Xr - X, axis=1)[top], e, rtol=RTOL32)  # FGSM ℓ2: ‖δ‖ = ε
            agg_r = _influences(Xr, Xt, W, Y, p.yt.numpy(), arch, cfg.ridge).mean(axis=0)
            row = rows[(rows.arch == arch) & (rows.eps == e)].iloc[0]
            assert row.null_random_flip_rate == np.mean(np.sign(agg0[top]) != np.sign(agg_r[top]))
            assert row.null_random_spearman == pytest.approx(scipy.stats.spearmanr(agg0, agg_r).statistic,
                                                             rel=RTOL_SAME_RANKS_REDRAWN)
            flips.append(row.null_random_flip_rate)
    zero = run_malleability(replace_cfg(cfg, eps=(0.0,))).frames["rows"]
    assert (zero.null_random_flip_rate == 0).all() and np.allclose(zero.null_random_spearman, 1.0)


def replace_cfg(cfg, **kw):
    from dataclasses import replace

    return replace(cfg, **kw)


def test_flip_excess_is_the_flip_rate_over_the_larger_null_with_an_interval_around_it():
    cfg = MalleabilityConfig(data=SYN, widths=(32,), train=FAST, attack=AttackSpec(steps=2), attacks=("fgsm", "pgd"),
                             eps=(0.3,), seeds=(0, 1, 2))
    res = run_malleability(cfg)
    rows, summary = res.frames["rows"], res.frames["summary"]
    nulls = np.maximum(rows.null_seed_flip_rate, rows.null_random_flip_rate)
    np.testing.assert_allclose(rows.flip_excess, rows.flip_rate - nulls, rtol=0, atol=ATOL64_MEAN)
    assert (rows.flip_excess_low <= rows.flip_excess + 1e-12).all()
    assert (rows.flip_excess + 1e-12 >= rows.flip_excess_low).all() and (rows.flip_excess_high >= rows.flip_excess - 1e-12).all()
    assert (rows.flip_excess_high - rows.flip_excess_low).max() > 0   # points do vary
    for _, s in summary.iterrows():
        group = rows[(rows.arch == s.arch) & (rows.attack == s.attack)]
        assert s.flip_excess_mean == pytest.approx(group.flip_excess.mean(), abs=ATOL64)
        assert s.flip_excess_low <= s.flip_excess_mean + 1e-12 <= s.flip_excess_high + 2e-12
        assert s.trained_mean == pytest.approx(group.trained.mean())


def test_data_seeds_repeat_the_run_on_fresh_draws():
    from dataclasses import replace

    base = MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0, 1), attacks=("fgsm",), eps=(0.1,), tau=0.5)
    both = run_malleability(replace(base, data_seeds=(0, 5))).frames
    assert sorted(both["rows"].data_seed.unique()) == [0, 5] and int(both["summary"].n_seeds.iloc[0]) == 4
    alone = run_malleability(replace(base, data=replace(TINY, seed=5))).frames["rows"]
    got = both["rows"][both["rows"].data_seed == 5].reset_index(drop=True)
    cols = ["arch", "seed", "flip_rate", "null_seed_flip_rate", "null_random_flip_rate", "test_acc", "flip_excess"]
    assert got[cols].equals(alone[cols])   # the draw-5 rows are that draw's own run; nulls pair within a draw


# ---------------------------------------------------------------- kernels, baselines, precision

def test_test_acc_kernel_is_kernel_ridge_with_the_trained_nets_own_kernel():
    from engine.maths.gates import passes_gate
    from reference import ridge_predict

    cfg = InfluenceConfig(data=SYN, width=32, train=FAST, seeds=(0, 1))
    summary = run_influence(cfg).frames["summary"]
    p = prepare(cfg.data, None, "cpu", None, None)
    X, Xt = p.X.double().numpy(), p.Xt.double().numpy()
    Y = np.eye(p.c)[p.y.numpy()]
    for arch in cfg.archs:
        for seed in cfg.seeds:
            net = Net(arch, p.X, cfg.width, n_outputs(p.c), seed)
            train(net, p.X, p.y, p.c, cfg.train, seed)
            W = net.mlp.W.detach().double().numpy()
            P, Pt = _features(X, X, arch), _features(Xt, X, arch)
            K = _ntk(P, P, W)
            pred = ridge_predict(K, _ntk(Pt, P, W), Y, cfg.ridge * np.mean(np.diag(K))).argmax(axis=1)
            row = summary[(summary.arch == arch) & (summary.seed == seed)].iloc[0]
            assert row.test_acc_kernel == np.mean(pred == p.yt.numpy())
            assert row.trained == passes_gate(row.test_acc, row.test_acc_kernel)
            assert row.sgd_lr_limit == pytest.approx(2 * 24 * 3 / np.linalg.eigvalsh(K)[-1], rel=RTOL_POWER_ITERATION)


def test_influence_kernel_kinf_is_loo_with_the_infinite_width_kernel_of_the_same_features():
    from reference import arccos_ntk

    cfg = InfluenceConfig(data=SYN, width=32, train=FAST, seeds=(0,), influence_kernel="kinf")
    res = run_influence(cfg)
    entk = run_influence(InfluenceConfig(data=SYN, width=32, train=FAST, seeds=(0,)))
    p = prepare(cfg.data, None, "cpu", None, None)
    X, Xt = p.X.double().numpy(), p.Xt.double().numpy()
    Y = np.eye(p.c)[p.y.numpy()]
    for arch in cfg.archs:
        P, Pt = _features(X, X, arch), _features(Xt, X, arch)
        K = arccos_ntk(P, P)
        np.fill_diagonal(K, (P * P).sum(axis=1) / 2)  # θ = 0 exactly: arccos(1 − ulp) would cost 1e-8
        want = _loo_true(K, arccos_ntk(Pt, P), Y, p.yt.numpy(), cfg.ridge)
        np.testing.assert_allclose(res.arrays[f"{arch}_I"], want, rtol=0, atol=RTOL64_CHAIN * np.abs(want).max())
        assert not np.allclose(res.arrays[f"{arch}_I"], entk.arrays[f"{arch}_I"])   # another kernel
    s = res.frames["summary"]
    assert (s.influence_kernel == "kinf").all() and s.test_acc_kernel.equals(entk.frames["summary"].test_acc_kernel)


@pytest.mark.parametrize("precision,storage,attack,kernel", [("float64", "float64", "float64", "float64"),
                                                             ("float64", "float32", "float64", "float32"),
                                                             ("float32", "float64", "float32", "float32")])
def test_rows_record_the_precision_of_the_attack_and_of_the_kernel(precision, storage, attack, kernel):
    cfg = MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0,), attacks=("fgsm",), eps=(0.1,),
                             precision=precision, storage=storage, influence_kernel="kinf", ridge=1e-2)
    rows = run_malleability(cfg).frames["rows"]
    assert (rows.attack_precision == attack).all() and (rows.kernel_precision == kernel).all()
    assert (rows.influence_kernel == "kinf").all() and (rows.ridge == 1e-2).all()


@pytest.mark.parametrize("kwargs,match", [({"influence_kernel": "ntk"}, "influence_kernel"),
                                          ({"precision": "float16"}, "precision"),
                                          ({"init": "antisymmetric", "widths": (31,)}, "even"),
                                          ({"data_seeds": (-1,)}, "data_seeds")])
def test_bad_new_settings(kwargs, match):
    with pytest.raises(BadInput, match=match):
        MalleabilityConfig(data=SYN, **kwargs)


def test_each_net_lands_as_soon_as_it_and_its_seed_null_are_trained():
    """engine.runtime.stream: one unit per (net, attack, ε) in the order finished, each holding exactly
    the rows of the final frame for that unit; a run read back from its checkpoints lands whole."""
    from engine.experiments import flips as F
    from engine.runtime.stream import landing, records

    cfg = MalleabilityConfig(data=TINY, train=FAST, widths=(32,), seeds=(0, 1, 2), attacks=("fgsm", "pgd"),
                             eps=(0.1,), tau=0.5)
    seen = []
    with landing(lambda unit, rows: seen.append((unit, rows))):
        res = run_malleability(cfg)
    rows = res.frames["rows"]
    assert [(u["arch"], u["seed"], u["attack"]) for u, _ in seen] == [
        (a, s, m) for a in cfg.archs for s in cfg.seeds for m in cfg.attacks]
    for landed_unit, got in seen:
        want = rows[(rows.arch == landed_unit["arch"]) & (rows.seed == landed_unit["seed"]) & (rows.attack == landed_unit["attack"])]
        assert len(got) == len(want) == len(cfg.readings)
        assert records(F.frame(got)) == records(want)  # as the run builds its frame; missing values as None
    quiet = []
    run_malleability(cfg)  # nobody listening: nothing lands anywhere
    assert quiet == [] and len(seen) == 12


def test_stream_prints_a_json_line_per_unit_then_the_result(tmp_path):
    import json
    import subprocess
    import sys

    argv = [sys.executable, "-m", "engine", "malleability", "--dataset", "synthetic", "--n", "12", "--n-test", "4",
            "--synthetic-d", "6", "--synthetic-classes", "3", "--epochs", "3", "--lr", "0.01", "--batch-size", "6",
            "--widths", "32", "--seeds", "0,1", "--attack", "fgsm", "--eps", "0.1", "--tau", "0.5", "--stream",
            "--quiet", "--cache-dir", str(tmp_path / "c")]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-1000:]
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    units, final = lines[:-1], lines[-1]
    assert len(units) == 4 and all(set(u) == {"unit", "rows"} for u in units)
    assert [r for u in units for r in u["rows"]] == final["rows"] and "verdict" in final and "summary" in final
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)  # from the cache: no unit lands
    assert [json.loads(line) for line in again.stdout.splitlines()][-1]["cached"] is True


def test_the_first_rows_wait_for_neither_pandas_nor_scipy_stats(tmp_path):
    """Their imports (about half a second on a 2-core CPU) come after a run's first unit has landed:
    the run path names pandas lazily (``engine._lazy.LazyModule``) and ranks with numpy
    (``rank_correlation``); pandas loads for the frames at the end."""
    import subprocess
    import sys
    from pathlib import Path

    script = ("import sys\nfrom engine.cli import main\nfrom engine.runtime import stream\nseen = []\n"
              "def landed(unit, rows, first=stream.landed):  # bound by the run module when it is imported\n"
              "    seen.append(sorted(m for m in ('pandas', 'scipy.stats') if m in sys.modules))\n"
              "    first(unit, rows)\n"
              "stream.landed = landed\n"
              "main(sys.argv[1:])\n"
              "print('FIRST', seen[0], 'END', sorted(m for m in ('pandas', 'scipy.stats') if m in sys.modules), "
              "file=sys.stderr)\n")
    argv = ["malleability", "--dataset", "synthetic", "--n", "12", "--n-test", "4", "--synthetic-d", "6",
            "--synthetic-classes", "3", "--epochs", "3", "--batch-size", "6", "--widths", "32", "--seeds", "0,1",
            "--attack", "fgsm", "--eps", "0.1", "--tau", "0.5", "--quiet", "--json", "--cache-dir", str(tmp_path)]
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", script, *argv], cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == "FIRST [] END ['pandas']", p.stderr[-2000:]  # one draw: no t quantile
