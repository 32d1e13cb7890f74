"""engine.reporting.paper: the reported tables and the plain-words verdicts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from engine.maths import gates
from engine.reporting import paper, report, rule as FR
from reference import gap_columns

NOTES = Path(__file__).resolve().parents[2] / "shared" / "paper" / "NOTES.md"


def _summary(kappa=1.5e3, kappa_att=None, v2=28.0, n=200):
    return {"n": n, "kappa": kappa, "numerical_rank": n, "kappa_attention": kappa_att or kappa ** 3,
            "kappa_attention_theory": kappa ** 3,
            "width_threshold_log10": {"attn_v1": 27.0, "attn_v2": v2, "relu_v1": 10.0, "relu_v2": 11.0}}


def _sweep(relu, attn, widths=(16, 1024, 4096)):
    return pd.DataFrame([{"arch": a, "width": w, "seed": 0, paper.CONVERGENCE_METRIC: v}
                         for a, vals in (("relu", relu), ("attn", attn)) for w, v in zip(widths, vals, strict=True)])


def _flips(relu, attn, eps=0.3, adversarial=False):
    return pd.DataFrame([{"arch": a, "attack": k, "eps": eps, "flip_rate": v, "adversarial_training": adversarial}
                         for a, vals in (("relu", relu), ("attn", attn))
                         for k, v in zip(("fgsm", "pgd", "mim"), vals, strict=True)])


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
                for ds, cell in zip(("mnist", "cifar10"), _row(table, label), strict=True)
                for w, v in zip(widths, cell, strict=True)]
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
                for ds, cell in zip(("mnist", "cifar10"), _row(ten, label), strict=True)}
    binary = _between(notes, "Binary (FGSM", "Adversarial training")
    assert binary.index("MNIST 3 vs 8") < binary.index("CIFAR-10 cars vs planes")
    pairs = re.findall(r"ReLU ([\d.]+) / ([\d.]+) / ([\d.]+) %, Attn ([\d.]+) / ([\d.]+) / ([\d.]+) %", binary)
    assert len(pairs) == 2
    for ds, values in zip(("mnist:3-8", "cifar10:automobile-airplane"), pairs, strict=True):
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


def _excess(relu, attn, attack="pgd", eps=0.3, trained=(1.0, 1.0), seeds=3, nulls=(0.0, 0.0), draws=1,
            role="primary", p_holm=math.nan):
    """A malleability summary row per arch: (excess, low, high) of relu and attn, the share of
    nets through the gate and the seed nulls (NaN: one seed), the cell's role and Holm-adjusted p."""
    return pd.DataFrame([{"arch": a, "attack": attack, "eps": eps, "flip_excess_mean": e, "flip_excess_low": lo,
                          "flip_excess_high": hi, "flip_rate_mean": e + 0.05, "flip_rate_sd": 0.01,
                          "null_seed_flip_rate_mean": ns, "null_random_flip_rate_mean": 0.05,
                          "trained_mean": tr, "test_acc_mean": 0.8, "test_acc_kernel_mean": 0.82, "n_seeds": seeds,
                          "n_draws": draws, "gap_draws": draws, "role": role, "gap_p_holm": p_holm,
                          **gap_columns(relu, attn)}
                         for a, (e, lo, hi), tr, ns in (("relu", relu, trained[0], nulls[0]),
                                                        ("attn", attn, trained[1], nulls[1]))])


@pytest.mark.parametrize("relu,attn,kw,want,why", [
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {}, "holds", "gap +21 [+4, +38] points, one draw"),
    ((-0.02, -0.05, 0.0), (0.10, 0.02, 0.18), {"draws": 8}, "holds", "gap +12 [+2, +23] points, 8 draws"),
    ((0.04, 0.02, 0.08), (0.25, 0.12, 0.38), {}, "holds", "6.2× [1.5, 19]"),            # a ratio over a non-zero excess
    ((0.04, 0.0, 0.08), (0.25, 0.0, 0.38), {}, "fails", "MLP-Attn's excess interval reaches 0 %"),
    ((0.04, 0.0, 0.08), (0.25, -0.1, 0.38), {}, "fails", "reaches -10 %"),
    ((0.15, 0.1, 0.2), (0.25, 0.12, 0.38), {}, "fails", "the gap's interval reaches zero"),  # above zero, gap not
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {"trained": (1.0, 2 / 3)}, "did not train", "MLP-Attn: 67 % of nets"),
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {"trained": (0.0, 1.0)}, "did not train", "2L-ReLU: 0 % of nets"),
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {"trained": (0.9, 0.85)}, "holds", "gap +21"),  # a few left out
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {"seeds": 1, "nulls": (math.nan, math.nan)}, "uninformative",
     "one network seed and one draw"),
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {"role": "secondary", "p_holm": 0.2}, "fails", "Holm"),
    ((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), {"role": "secondary", "p_holm": 0.01}, "holds", "gap +21"),
])
def test_flip_rule_on_hand_made_summaries(relu, attn, kw, want, why):
    v = FR.flip_rule(_excess(relu, attn, **kw))
    assert v["outcome"] == want and why in v["why"], v["why"]
    assert v["attn"].excess == attn[0] and v["relu"].low == relu[1] and v["attack"] == "pgd" and v["eps"] == 0.3
    assert "MLP-Attn" in v["numbers"] and "%" in v["numbers"]


def test_flip_rule_picks_its_attack_and_eps_and_needs_both_nets_and_the_nulls():
    s = pd.concat([_excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), attack="fgsm"),
                   _excess((0.2, 0.1, 0.3), (0.2, 0.1, 0.3)),
                   _excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), eps=0.05)], ignore_index=True)
    assert FR.flip_rule(s)["outcome"] == "fails"                      # pgd, first ε (0.3)
    assert FR.flip_rule(s, "fgsm")["outcome"] == "holds"
    assert FR.flip_rule(s, eps=0.05)["outcome"] == "holds"
    assert FR.flip_rule(s.iloc[:1])["outcome"] == "uninformative"     # one architecture
    assert FR.flip_rule(None)["outcome"] == "uninformative"
    no_nulls = _excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38)).drop(columns=["flip_excess_low"])
    assert "nulls" in FR.flip_rule(no_nulls)["why"]


def test_training_gate_is_per_net_and_relative_to_the_kernel_baseline():
    assert gates.passes_gate(0.80, 0.89) and gates.passes_gate(0.79, 0.89)
    assert not gates.passes_gate(0.78, 0.89)
    assert gates.passes_gate([0.5, 0.9], [0.55, 0.99]).tolist() == [True, True]
    assert gates.passes_gate([0.1, 0.9], [0.85, 0.85]).tolist() == [False, True]


def test_flip_gap():
    good = pd.concat([_excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), attack=a) for a in ("fgsm", "pgd", "mim")])
    v = paper.verdict_flip_gap(good, "mnist", 0.3)
    assert v.status == "agrees" and "every attack" in v.words and "34.6" in v.paper and "PGD:" in v.measured
    partly = pd.concat([good.iloc[:4], _excess((0.2, 0.1, 0.3), (0.2, 0.1, 0.3), attack="mim")])
    assert paper.verdict_flip_gap(partly, "mnist").status == "partly"
    bad = pd.concat([_excess((0.3, 0.2, 0.4), (0.1, -0.05, 0.2), attack=a) for a in ("fgsm", "pgd")])
    assert paper.verdict_flip_gap(bad, "mnist").status == "disagrees"
    untrained = pd.concat([_excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), attack=a, trained=(1, 0))
                           for a in ("fgsm", "pgd")])
    v = paper.verdict_flip_gap(untrained, "mnist")
    assert v.status == "did not train" and "did not train" in v.words
    one_seed = _excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), seeds=1, nulls=(math.nan, math.nan))
    assert paper.verdict_flip_gap(one_seed, "mnist").status == "not measured"
    assert paper.verdict_flip_gap(None, "mnist").status == "not measured"
    assert paper.verdict_flip_gap(good, "mnist", 0.05).status == "not measured"   # no rows at that ε


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
    assert len(table) == 8 and set(table["status"]) == {"not measured"}
    assert set(table["status"]) <= set(paper.STATUSES)


def test_readme_tables_read_every_cell_with_the_flip_rule():
    good = _excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38))
    untrained = _excess((0.04, 0.0, 0.08), (0.25, 0.12, 0.38), trained=(1.0, 0.0))
    text = report.readme_tables([("ℓ2 0.3", good), ("Adam", untrained), ("later", None)])
    lines = text.splitlines()
    assert lines[0].startswith("| setting | attack |") and lines[1].startswith("|---|")
    assert "| ℓ2 0.3 | PGD ε = 0.3 |" in lines[2] and "**holds**" in lines[2] and "25 [12, 38]" in lines[2]
    assert "9 (0 / 5)" in lines[2]                 # 2L-ReLU's flip rate with its seed and random nulls
    assert "**did not train**" in lines[3] and "3 of 3 / 0 of 3" in lines[3] and "(primary)" in lines[3]
    assert "not computed yet" in lines[4]
    assert FR.RULE_WORDS.replace("**", "") in text


def test_the_readme_grid_and_its_report_command(capsys):
    from engine import cli
    from engine.grid.driver import load_spec
    from engine.reporting import report

    spec = load_spec(Path(__file__).resolve().parents[1] / "grids" / "readme.toml")
    cells = [c for c in spec.cells if c.kind == "malleability"]
    network = [c for c in cells if c.config.readings != ("ridge",)]
    flips = [c for c in cells if c not in network]
    assert len(flips) >= 10 and all(c.config.data.dataset == "mnist" and c.config.data.n == 500 and
                                    c.config.widths == (1024,) and c.config.nulls and len(c.config.seeds) == 3
                                    for c in flips)
    assert [c.config.readings for c in network] == [("ridge", "flow", "retrain")]  # the network's own influence
    assert len(network[0].config.widths) >= 3 and len(network[0].config.data_seeds) >= 2
    cells = [c for c in cells if c in flips]
    assert {c.config.influence_kernel for c in cells} == {"entk", "kinf"}
    assert {c.config.attention for c in cells} == {"linear", "centered"}
    assert {c.config.precision for c in cells} == {"float64", "float32"}
    text = report.markdown(spec, None)
    aligned = [c for c in spec.cells if c.kind == "alignment"]  # the power half's paragraph lists its cells too
    assert text.count("not computed yet") == len(cells) + len(network) and "readme.toml" in text
    missing = text[text.index("Not computed yet"):].split("\n")[0]   # the power half lists its cells in one line
    assert aligned and missing.count("task alignment") == len(aligned)
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", "--help"])
    assert exc.value.code == 0 and "usage:" in capsys.readouterr().out


def test_protocol_lines_read_each_blocks_first_cell_with_the_rule(cache):
    """One sentence per block: the first cell's verdict where the cache holds it (the very flip_rule
    outcome and reason), else that it is not in this cache; the Overview shows them."""
    import tomllib

    from engine.experiments.registry import EXPERIMENTS
    from engine.grid.spec import parse_spec

    doc = tomllib.loads("""
[[grid]]
label = "tiny"
kind = "malleability"
preset = "quick"
base."data.dataset" = "synthetic"
base."data.n" = 30
base."data.n_test" = 10
base.widths = [16]
base.seeds = [0, 1]
base."train.epochs" = 5
base.attacks = ["pgd"]
base."attack.steps" = 2
axes.eps = [0.3, 0.1]
[[grid]]
label = "other"
kind = "malleability"
preset = "quick"
base."data.dataset" = "synthetic"
base."data.n" = 31
""")
    spec = parse_spec(doc)
    first = spec.cells[0]
    res = EXPERIMENTS["malleability"].run(first.config, cache)
    lines = report.protocol_lines(report.results(spec, cache))
    v = FR.flip_rule(res.frames["summary"])
    assert lines == [f"tiny ({first.settings}), PGD ε = {v['eps']:g}: {v['outcome']} ({v['role']}) — {v['why']}",
                     f"other ({spec.cells[2].settings}): not in this cache"]
    assert v["outcome"] in FR.FLIP_OUTCOMES
