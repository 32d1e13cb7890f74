"""engine.paper: the reported tables and the plain-words verdicts."""

from __future__ import annotations

import pandas as pd
import pytest

from engine import paper


def _summary(kappa=1.5e3, kappa_att=None, v2=28.0, n=200):
    return {"n": n, "kappa": kappa, "numerical_rank": n, "kappa_attention": kappa_att or kappa ** 3,
            "kappa_attention_theory": kappa ** 3,
            "width_threshold_log10": {"attn_v1": 27.0, "attn_v2": v2, "relu_v1": 10.0, "relu_v2": 11.0}}


def _sweep(relu, attn, widths=(16, 1024, 4096)):
    return pd.DataFrame([{"arch": a, "width": w, "seed": 0, "function_dist": v}
                         for a, vals in (("relu", relu), ("attn", attn)) for w, v in zip(widths, vals)])


def _flips(relu, attn, eps=0.3, adversarial=False):
    return pd.DataFrame([{"arch": a, "attack": k, "eps": eps, "flip_rate": v, "adversarial_training": adversarial}
                         for a, vals in (("relu", relu), ("attn", attn))
                         for k, v in zip(("fgsm", "pgd", "mim"), vals)])


def test_tables_hold_the_reported_numbers():
    t = paper.ntk_distance_table("mnist")
    assert t[(t.arch == "relu") & (t.width == 4096)]["value"].item() == 39.2
    f = paper.flip_rate_table("mnist:3-8")
    assert f[(f.arch == "attn") & (f.attack == "pgd")]["flip_rate_pct"].item() == 41.0
    a = paper.adversarial_table("cifar10")
    assert a[a.arch == "attn"][["standard_pct", "adversarial_pct"]].values.tolist() == [[19.1, 38.6]]
    assert len(paper.CLAIM) == 3


@pytest.mark.parametrize("text,key", [("mnist", "mnist"), ("MNIST", "mnist"), ("mnist:8-3", "mnist:3-8"),
                                      ("cifar10:1-0", "cifar10:automobile-airplane"), ("fashion-mnist", None),
                                      ("synthetic", None)])
def test_paper_key(text, key):
    assert paper.paper_key(text) == key


def test_kappa_cubed():
    assert paper.verdict_kappa_cubed(_summary()).status == "agrees"
    off = paper.verdict_kappa_cubed(_summary(kappa=10.0, kappa_att=2e3))
    assert off.status == "disagrees" and "factor 2.00" in off.words
    capped = paper.verdict_kappa_cubed(_summary(kappa=1e6, kappa_att=1e15))
    assert capped.status == "partly" and "float64" in capped.words
    assert paper.verdict_kappa_cubed(None).status == "not measured"


def test_kappa_size_and_width():
    assert paper.verdict_kappa_size(_summary(kappa=3e3), "mnist").status == "agrees"
    far = paper.verdict_kappa_size(_summary(kappa=2e5), "mnist")
    assert far.status == "disagrees" and "unknown" in far.words
    assert paper.verdict_kappa_size(_summary(), "synthetic").status == "not measured"
    assert paper.verdict_width(_summary(v2=28.0), "mnist").status == "agrees"
    assert paper.verdict_width(_summary(v2=None), "mnist").status == "agrees"   # falls back to v1 = 27
    assert paper.verdict_width(_summary(v2=8.0), "mnist").status == "disagrees"


def test_ntk_trends():
    good = _sweep(relu=(45.0, 40.0, 39.0), attn=(10.0, 33.0, 43.0))
    assert paper.verdict_relu_converges(good, "mnist").status == "agrees"
    assert paper.verdict_attn_diverges(good, "mnist").status == "agrees"
    bumpy = _sweep(relu=(45.0, 47.0, 39.0), attn=(10.0, 9.9, 9.8))
    assert paper.verdict_relu_converges(bumpy, "mnist").status == "partly"
    assert paper.verdict_attn_diverges(bumpy, "mnist").status == "partly"   # falls, but slower than ReLU
    bad = _sweep(relu=(10.0, 12.0, 15.0), attn=(10.0, 5.0, 1.0))
    assert paper.verdict_relu_converges(bad, "mnist").status == "disagrees"
    assert paper.verdict_attn_diverges(bad, "mnist").status == "disagrees"
    one = _sweep(relu=(1.0,), attn=(1.0,), widths=(16,))
    assert paper.verdict_relu_converges(one, "mnist").status == "not measured"


def test_flip_gap():
    v = paper.verdict_flip_gap(_flips((0.04, 0.03, 0.03), (0.35, 0.29, 0.22)), "mnist", 0.3)
    assert v.status == "agrees" and "every attack" in v.words and "34.6" in v.paper
    assert paper.verdict_flip_gap(_flips((0.1, 0.3, 0.1), (0.2, 0.2, 0.2)), "mnist").status == "partly"
    assert paper.verdict_flip_gap(_flips((0.3, 0.3, 0.3), (0.1, 0.1, 0.1)), "mnist").status == "disagrees"
    assert paper.verdict_flip_gap(None, "mnist").status == "not measured"
    other_eps = paper.verdict_flip_gap(_flips((0.04,) * 3, (0.3,) * 3, eps=0.05), "mnist", 0.3)
    assert other_eps.status == "not measured"


def test_adversarial_training():
    std = _flips((0.03, 0.03, 0.03), (0.29, 0.29, 0.29))
    adv = _flips((0.43, 0.43, 0.43), (0.42, 0.42, 0.42), adversarial=True)
    assert paper.verdict_adversarial(std, adv, "mnist").status == "agrees"
    assert paper.verdict_adversarial(std, _flips((0.4,) * 3, (0.1,) * 3, adversarial=True), "mnist").status == "partly"
    assert paper.verdict_adversarial(adv, std, "mnist").status == "disagrees"
    assert paper.verdict_adversarial(std, None, "mnist").status == "not measured"


def test_verdict_table_has_one_row_per_claim():
    table = paper.verdict_table(paper.verdicts("mnist"))
    assert list(table.columns) == ["claim", "paper", "measured", "status", "words"]
    assert len(table) == 7 and set(table["status"]) == {"not measured"}
    assert set(table["status"]) <= set(paper.STATUSES)
