"""engine.paper: the reported tables and the plain-words verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from engine import paper

NOTES = Path(__file__).resolve().parents[2] / "shared" / "paper" / "NOTES.md"


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


def _notes() -> str:
    """NOTES.md with whitespace collapsed (the paper's numbers as summarised for this project)."""
    if not NOTES.exists():
        pytest.skip("../shared/paper/NOTES.md is absent")
    return re.sub(r"\s+", " ", NOTES.read_text(encoding="utf-8"))


def _numbers(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"\d+(?:\.\d+)?", text)]


def _row(text: str, label: str) -> list[list[float]]:
    """The cells after ``| label |`` of a markdown table row, as lists of numbers."""
    m = re.search(r"\| " + re.escape(label) + r" \|(.*?)\| (?=\||$)", text)
    assert m, label
    return [_numbers(cell) for cell in m.group(1).split("|")]


def _between(text: str, start: str, stop: str) -> str:
    return text[text.index(start):text.index(stop)]


def test_ntk_distance_table_is_the_notes_table():
    table = _between(_notes(), "NTK distance", "Flip rate, 10 classes")
    widths = (16, 1024, 4096)
    expected = [{"dataset": ds, "arch": arch, "width": w, "value": v}
                for arch, label in (("relu", "2L-ReLU"), ("attn", "MLP-Attn"))
                for ds, cell in zip(("mnist", "cifar10"), _row(table, label)) for w, v in zip(widths, cell)]
    assert len(expected) == 12
    order = ["dataset", "arch", "width"]
    got = paper.ntk_distance_table().sort_values(order).reset_index(drop=True)
    want = pd.DataFrame(expected).sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    mnist = paper.ntk_distance_table("mnist").sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(mnist, want[want.dataset == "mnist"].reset_index(drop=True), check_dtype=False)


def test_flip_rate_tables_are_the_notes_numbers():
    notes = _notes()
    ten = _between(notes, "Flip rate, 10 classes", "Binary (FGSM")
    expected = {(ds, arch): cell for arch, label in (("relu", "2L-ReLU"), ("attn", "MLP-Attn"))
                for ds, cell in zip(("mnist", "cifar10"), _row(ten, label))}
    binary = _between(notes, "Binary (FGSM", "Adversarial training")
    assert binary.index("MNIST 3 vs 8") < binary.index("CIFAR-10 cars vs planes")
    pairs = re.findall(r"ReLU ([\d.]+) / ([\d.]+) / ([\d.]+) %, Attn ([\d.]+) / ([\d.]+) / ([\d.]+) %", binary)
    assert len(pairs) == 2
    for ds, values in zip(("mnist:3-8", "cifar10:automobile-airplane"), pairs):
        values = [float(v) for v in values]
        expected[(ds, "relu")], expected[(ds, "attn")] = values[:3], values[3:]
    table = paper.flip_rate_table()
    got = {}
    for r in table.itertuples():  # rows come in FGSM / PGD / MIM order, as in the notes
        got.setdefault((r.dataset, r.arch), []).append(r.flip_rate_pct)
    assert got == expected
    assert list(table.attack[:3]) == ["fgsm", "pgd", "mim"]
    assert (table.eps == float(re.search(r"budget ε = ([\d.]+)", notes).group(1))).all()


def test_adversarial_table_and_constants_are_the_notes_numbers():
    notes = _notes()
    found = re.findall(r"(MNIST|CIFAR-10) ReLU ([\d.]+) → ([\d.]+) %, Attn ([\d.]+) → ([\d.]+) %", notes)
    expected = {}
    for name, *values in found:
        ds = {"MNIST": "mnist", "CIFAR-10": "cifar10"}[name]
        values = [float(v) for v in values]
        expected[(ds, "relu")], expected[(ds, "attn")] = values[:2], values[2:]
    assert len(expected) == 4
    got = {(r.dataset, r.arch): [r.standard_pct, r.adversarial_pct] for r in paper.adversarial_table().itertuples()}
    assert got == expected
    kappa = re.search(r"κ\(G\) ≈ ([\d.e]+) \(MNIST\), ([\d.e]+) \(CIFAR-10\)", notes)
    assert paper.KAPPA_G == {"mnist": float(kappa.group(1)), "cifar10": float(kappa.group(2))}
    widths = re.search(r"m ≫ 1e(\d+) \(MNIST\), m ≫ 1e(\d+) \(CIFAR-10\)", notes)
    assert paper.WIDTH_LOG10_V2 == {"mnist": float(widths.group(1)), "cifar10": float(widths.group(2))}
    gap = re.search(r"malleability gap (\d+)–(\d+)×", notes)
    assert paper.MALLEABILITY_GAP == (float(gap.group(1)), float(gap.group(2)))
    assert float(re.search(r"\(τ = ([\d.]+)\)", notes).group(1)) == paper.TAU
    assert float(re.search(r"budget ε = ([\d.]+)", notes).group(1)) == paper.FLIP_EPS


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
