import numpy as np
import pytest
import scipy.stats

from engine.data import DataSpec
from engine.errors import BadInput
from engine.malleability import InfluenceConfig, MalleabilityConfig, run_influence, run_malleability
from engine.training import TrainSpec

SYN = DataSpec("synthetic", n=60, n_test=15, synthetic_d=10, synthetic_kappa=20.0, synthetic_classes=3)
FAST = TrainSpec(epochs=5, lr=1e-2, batch_size=30)


def test_rows_follow_the_definitions_from_the_stored_influences(cache):
    cfg = MalleabilityConfig(data=SYN, width=64, train=FAST, attacks=("fgsm", "pgd"), eps=(0.2, 0.5), steps=3)
    res = run_malleability(cfg, cache)
    rows = res.frames["rows"]
    assert len(rows) == 2 * 2 * 2
    assert set(rows.columns) >= {"arch", "attack", "eps", "flip_rate", "pair_flip_rate", "spearman", "test_acc",
                                 "perturb", "retrain", "tau", "ridge"}
    for arch in ("relu", "attn"):
        top = res.arrays[f"{arch}_top_idx"]
        before, after = res.arrays[f"{arch}_infl_before"], res.arrays[f"{arch}_infl_after"]
        assert len(top) == 6 and set(np.argsort(-np.abs(before))[:6]) == set(top)
        first = rows[(rows.arch == arch)].iloc[0]
        assert first.flip_rate == pytest.approx(np.mean(np.sign(before[top]) != np.sign(after[top])))
        assert first.spearman == pytest.approx(scipy.stats.spearmanr(before, after).statistic)
        moved = np.abs(res.arrays[f"{arch}_X_pert"] - res.arrays[f"{arch}_X_clean"]).max()
        assert 0 < moved <= 0.2 + 1e-6
    assert run_malleability(cfg, cache).cached


def test_zero_budget_flips_nothing():
    cfg = MalleabilityConfig(data=SYN, width=32, train=FAST, attacks=("pgd",), eps=(0.0,), steps=2)
    rows = run_malleability(cfg).frames["rows"]
    assert (rows.flip_rate == 0).all() and (rows.pair_flip_rate == 0).all()
    np.testing.assert_allclose(rows.spearman, 1.0)


def test_options_interventions_adversarial_training_retrain():
    cfg = MalleabilityConfig(data=SYN, archs=("attn",), width=32, train=FAST, eps=(0.1,), steps=2,
                             perturb="all", retrain=True, adversarial_training=True, interventions=True)
    res = run_malleability(cfg)
    row = res.frames["rows"].iloc[0]
    assert row.perturb == "all" and row.retrain and row.adversarial_training and row.points_moved > 6
    inter = res.frames["interventions"]
    assert list(inter.intervention) == ["none", "curated", "transformed", "adversarial"]
    assert inter.test_acc.between(0, 1).all()
    assert (inter.influence_change.iloc[1:] > 0).all()


@pytest.mark.parametrize("kwargs,match", [({"perturb": "some"}, "perturb"), ({"tau": 1.5}, "tau"),
                                          ({"attacks": ("cw",)}, "attack"), ({"eps": (-0.1,)}, "eps"),
                                          ({"width": 0}, "width"), ({"ridge": 0.0}, "ridge")])
def test_bad_configs(kwargs, match):
    with pytest.raises(BadInput, match=match):
        run_malleability(MalleabilityConfig(data=SYN, **kwargs))


def test_influence_run_shapes_and_aggregate():
    res = run_influence(InfluenceConfig(data=SYN, width=32, train=FAST))
    for arch in ("relu", "attn"):
        I = res.arrays[f"{arch}_I"]
        assert I.shape == (15, 60)
        agg = res.frames["aggregate"].query("arch == @arch").influence.to_numpy()
        np.testing.assert_allclose(agg, I.mean(0), rtol=1e-12)
    assert res.arrays["X"].shape == (60, 10) and res.meta["image_shape"] is None
