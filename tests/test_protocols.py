"""engine.reporting.protocols: the verdict rules, the protocol grids, and their links to the pages."""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from engine.data import DataSpec
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.malleability import run_malleability
from engine.maths.specs import OPTIMIZERS, TrainSpec
from engine.reporting import protocols as P
from reference import gap_columns
from tests.test_app import app, env, settle  # noqa: F401  (env is a fixture)
from ui import links as L

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]


def _flips(relu, attn, trained=(1.0, 1.0), attack="pgd", eps=0.3, seeds=3) -> pd.DataFrame:
    """A malleability summary: (excess, low, high) of relu and attn and their share of seeds trained."""
    return pd.DataFrame([{"arch": a, "attack": attack, "eps": eps, "flip_excess_mean": e, "flip_excess_low": lo,
                          "flip_excess_high": hi, "flip_rate_mean": e, "flip_rate_sd": 0.01,
                          "null_seed_flip_rate_mean": 0.0, "null_random_flip_rate_mean": 0.0, "trained_mean": tr,
                          "n_seeds": seeds, **gap_columns(relu, attn)} for a, (e, lo, hi), tr in (("relu", relu, trained[0]),
                                                                        ("attn", attn, trained[1]))])


def _sweep(relu, attn, widths=(16, 1024, 4096), sd=0.01, col="kernel_dist_trained", trained=1.0) -> pd.DataFrame:
    return pd.DataFrame([{"arch": a, "attention": "linear" if a == "attn" else "", "width": w, f"{col}_mean": v,
                          f"{col}_sd": sd, "train_acc_mean": 0.9, "trained_mean": trained, "n_seeds": 3}
                         for a, vals in (("relu", relu), ("attn", attn)) for w, v in zip(widths, vals, strict=True)])


# ---------------------------------------------------------------- verdict rules

def test_flip_verdict_is_the_papers_rule():
    from engine.reporting import rule as FR

    cases = [((0.04, 0.0, 0.08), (0.30, 0.1, 0.5), (1, 1)), ((0.2, 0.1, 0.3), (0.3, 0.1, 0.5), (1, 1)),
             ((0.04, 0.0, 0.08), (0.30, 0.1, 0.5), (1, 0.5)), ((0.04, 0.0, 0.08), (0.30, -0.1, 0.5), (1, 1))]
    for relu, attn, trained in cases:
        s = _flips(relu, attn, trained)
        v, rule = P.flip_verdict(s), FR.flip_rule(s)
        assert v["verdict"] == rule["outcome"] and v["why"] == rule["why"] and v["numbers"] == rule["numbers"]
    assert [P.flip_verdict(_flips(*c))["verdict"] for c in cases] == ["holds", "fails", "did not train", "fails"]
    assert P.RULES["flip"] == FR.RULE_WORDS and P.VERDICTS == FR.FLIP_OUTCOMES


@pytest.mark.parametrize("metric", list(P.KERNEL_METRICS))
@pytest.mark.parametrize("relu,attn,want,why", [
    ((0.30, 0.05, 0.02), (0.10, 0.30, 0.40), "holds", "20×"),
    ((0.30, 0.05, 0.02), (0.30, 0.05, 0.03), "fails", "only 1.5×"),
    ((0.02, 0.05, 0.10), (0.30, 0.50, 0.60), "fails", "does not fall"),
    ((0.02, 0.05, 0.10), (0.10, 0.10, 0.10), "fails", "only 1× as far; 2L-ReLU"),
    ((0.30, 0.05, math.nan), (0.10, 0.30, 0.40), "uninformative", "non-finite"),
])
def test_kernel_verdict(metric, relu, attn, want, why):
    v = P.kernel_verdict(_sweep(relu, attn, col=P.KERNEL_METRICS[metric][0]), metric)
    assert v["verdict"] == want and why in v["why"]
    assert v["widths"] == (16, 4096) and v["relu"].small == relu[0] and v["attn"].large == attn[2]


def test_kernel_verdict_needs_two_widths_both_archs_and_reads_its_metric():
    assert P.kernel_verdict(_sweep((0.3,), (0.4,), widths=(16,)), "frobenius")["verdict"] == "uninformative"
    relu_only = _sweep((0.3, 0.1, 0.05), (1, 1, 1)).query("arch == 'relu'")
    assert P.kernel_verdict(relu_only, "frobenius")["verdict"] == "uninformative"
    both = _sweep((0.3, 0.1, 0.05), (0.3, 0.1, 0.05)).merge(
        _sweep((0.3, 0.1, 0.05), (0.3, 0.5, 0.6), col="prediction_gap_trained"))
    assert P.kernel_verdict(both, "frobenius")["verdict"] == "fails"
    assert P.kernel_verdict(both, "prediction")["verdict"] == "holds"


def test_kernel_verdict_labels_cells_whose_nets_did_not_train():
    v = P.kernel_verdict(_sweep((0.30, 0.05, 0.02), (0.10, 0.30, 0.40), trained=2 / 3), "frobenius")
    assert v["verdict"] == "did not train" and "m = 4096" in v["why"]
    untrained_sweep = _sweep((0.30, 0.05, 0.02), (0.10, 0.30, 0.40), trained=math.nan)   # epochs 0: no gate
    assert P.kernel_verdict(untrained_sweep, "frobenius")["verdict"] == "holds"


def test_every_verdict_is_reachable_and_named():
    seen = {P.flip_verdict(_flips(r, a, t))["verdict"] for r, a, t in
            [((0.0, 0, 0), (0.3, 0.1, 0.5), (1, 1)), ((0.3, 0.1, 0.5), (0.3, 0.1, 0.5), (1, 1)),
             ((0, 0, 0), (0.3, 0.1, 0.5), (0, 0))]}
    seen.add(P.flip_verdict(_flips((0, 0, 0), (0.3, 0.1, 0.5)).iloc[:1])["verdict"])
    assert seen == set(P.VERDICTS)
    assert set(P.RULES) == set(P.CLAIMS) == {"flip", "kernel"}


# ---------------------------------------------------------------- the grids

def _page_bases():
    """The bases the Reproduction page builds (quick presets, sidebar defaults on synthetic data)."""
    from ui import configs
    from ui.common import Shared

    s = Shared(base="synthetic")
    return (s, configs.malleability_config(s, attacks=("pgd",), eps=(0.3,), n_seeds=3),
            configs.sweep_config(s, n_seeds=3, widths=configs.PAPER_WIDTHS))


def test_flip_grid():
    _, base, _ = _page_bases()
    cells = P.flip_variants(base)
    extra = [r for r in P.RIDGES if r != base.ridge] + ["kinf"]
    assert len(cells) == 12 + len(extra) and len({c.config for c in cells}) == len(cells)
    assert [(c.config.attack.norm, c.config.space, c.config.target, c.config.train.optimizer) for c in cells[:12]] \
        == [(n, s, t, o) for (n, s), t, o in itertools.product(P.GEOMETRIES, P.TARGETS, OPTIMIZERS)]
    for c in cells:
        assert isinstance(c.config, MalleabilityConfig) and c.page == "malleability" and c.claim == "flip"
        assert replace(c.config) == c.config   # validates again
        assert c.config.attacks == base.attacks and c.config.eps == base.eps and c.config.data == base.data
        assert L.of(c).unlinked == {} and L.of(c).params["mall.optimizer"] == c.config.train.optimizer
        assert set(c.choices) == {"attack", "target", "optimizer", "ridge", "kernel"}
        opt = c.config.train.optimizer           # every optimiser trains with its own lr and decay, never Adam's
        want = P.OPTIMIZER_PRESETS[opt] or {"lr": base.train.lr, "weight_decay": base.train.weight_decay}
        assert (c.config.train.lr, c.config.train.weight_decay) == (want["lr"], want["weight_decay"])
    own = (base.attack.norm, base.space, base.target, base.train.optimizer)
    assert [c.config for c in cells[:12]                             # one geometry cell is the base itself
            if (c.config.attack.norm, c.config.space, c.config.target, c.config.train.optimizer) == own] == [base]
    assert [c.config.ridge for c in cells[12:-1]] == extra[:-1] and cells[-1].config.influence_kernel == "kinf"
    assert all(replace(c.config, ridge=base.ridge, influence_kernel=base.influence_kernel) == base
               for c in cells[12:])                                  # one choice changed each


def test_kernel_grid():
    _, _, base = _page_bases()
    cells = P.kernel_variants(base)
    assert len(cells) == 9 and len({c.config for c in cells}) == 3
    assert len({(c.config, c.metric) for c in cells}) == 9
    assert {c.config.train.optimizer for c in cells} == set(OPTIMIZERS)
    assert {c.metric for c in cells} == set(P.KERNEL_METRICS)
    assert all(c.page == "ntk-sweep" and replace(c.config) == c.config for c in cells)
    assert cells[0].config == base and not L.of(cells[0]).unlinked
    sgd = next(c for c in cells if c.config.train.optimizer == "sgd")
    assert (sgd.config.train.lr, sgd.config.train.weight_decay) == (10.0, 0.0) and not L.of(sgd).unlinked
    assert L.of(sgd).params["ntk.lr"] == "10.0"  # the page's learning rate, not the optimiser's suggestion


def test_unreproducible_settings_are_named():
    base = MalleabilityConfig(data=DataSpec(dataset="synthetic", n=40, n_test=10, synthetic_d=8), seeds=(5, 9))
    assert set(L.of(P.flip_variants(base)[0]).unlinked) == {"data", "seeds"}


def _widget_keys() -> set[str]:
    """Every literal widget key of the app: ``key="..."``, and ui.configs.number's fifth argument."""
    keys = set()
    for f in SOURCES:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            keys |= {k.value.value for k in node.keywords if k.arg == "key" and isinstance(k.value, ast.Constant)}
            if getattr(node.func, "attr", None) == "number" and len(node.args) > 4:
                keys.add(ast.literal_eval(node.args[4]))
    return keys


def _literal(path: Path, name: str):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == name)
    return ast.literal_eval(node.value)


def test_query_parameters_name_real_widgets_with_their_shown_values():
    from ui.common import ARCH_LABELS, WIDTH_CHOICES

    keys = _widget_keys()
    _, mbase, sbase = _page_bases()
    cells = P.flip_variants(mbase) + P.kernel_variants(sbase)
    for c in cells:
        assert set(L.of(c).params) <= keys, set(L.of(c).params) - keys
        assert set(L.of(c).params["archs"]) <= set(ARCH_LABELS.values())
        assert f"{c.page}?" in L.of(c).url and c.page in ("malleability", "ntk-sweep")
    eps_choices = {str(e) for e in _literal(ROOT / "pages" / "malleability.py", "EPS_CHOICES")}
    widths = {str(w) for w in _literal(ROOT / "pages" / "malleability.py", "WIDTHS")}
    ridges = {str(r) for r in _literal(ROOT / "pages" / "malleability.py", "RIDGES")}
    for c in (c for c in cells if c.claim == "flip"):
        assert set(L.of(c).params["mall.eps"]) <= eps_choices and set(L.of(c).params["mall.widths"]) <= widths
        assert L.of(c).params["mall.attacks"] == ["PGD"] and L.of(c).params["mall.ridge"] in ridges
    imported = {(n.module, a.name) for n in ast.walk(ast.parse((ROOT / "pages" / "ntk-sweep.py").read_text()))
                if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("ui.links", "NTK_METRIC_LABELS") in imported  # the page shows the labels the links use
    for c in (c for c in cells if c.claim == "kernel"):
        assert L.of(c).params["ntk.metric"] == L.NTK_METRIC_LABELS[P.KERNEL_METRICS[c.metric][1]]
        assert {int(w) for w in L.of(c).params["widths"]} <= set(WIDTH_CHOICES)


def test_query_parameters_rebuild_the_configs_as_the_pages_do():
    """What pages/malleability.py and pages/ntk-sweep.py make of the parameters is the cell's config."""
    from ui import configs
    from ui.common import ARCH_LABELS, Shared

    s0, mbase, sbase = _page_bases()
    label = {v: k for k, v in ARCH_LABELS.items()}

    def sidebar(p, widths=s0.widths):
        return Shared(base=p["data"], classes=p["classes"], n=int(p["n"]), n_test=int(p["n_test"]),
                      seed=int(p["seed"]), widths=widths, archs=tuple(label[a] for a in p["archs"]),
                      attention=p["attention"])

    for c in P.flip_variants(mbase):
        p = L.of(c).params
        cfg = configs.malleability_config(
            sidebar(p), attacks=tuple(a.lower() for a in p["mall.attacks"]),
            eps=tuple(float(e) for e in p["mall.eps"]), steps=int(p["mall.steps"]), epochs=int(p["mall.epochs"]),
            widths=tuple(int(w) for w in p["mall.widths"]), readings=tuple(p["mall.readings"]),
            tau=float(p["mall.tau"]), perturb=p["mall.perturb"],
            retrain=p["mall.retrain"] == "true", adversarial_training=p["mall.adv"] == "true",
            interventions=p["mall.interventions"] == "true", norm=p["mall.norm"], space=p["mall.space"],
            target=p["mall.target"], n_seeds=int(p["mall.seeds"]), optimizer=p["mall.optimizer"],
            ridge=float(p["mall.ridge"]), influence_kernel=p["mall.kernel"], init=p["mall.init"])
        cfg = replace(cfg, train=replace(cfg.train, lr=float(p["mall.lr"]), weight_decay=float(p["mall.decay"]),
                                         loss=p["mall.loss"]))
        assert cfg == c.config and not L.of(c).unlinked
    for c in P.kernel_variants(sbase):
        p = L.of(c).params
        cfg = configs.sweep_config(sidebar(p, tuple(int(w) for w in p["widths"])), int(p["ntk.epochs"]),
                                   int(p["ntk.seeds"]), float(p["ntk.ridge"]), optimizer=p["ntk.optimizer"],
                                   lr=float(p["ntk.lr"]))
        assert cfg == replace(c.config, train=replace(c.config.train, weight_decay=cfg.train.weight_decay))
        assert bool(L.of(c).unlinked) == (cfg != c.config)   # what the page cannot take is named


def test_a_link_opens_the_malleability_page_with_its_settings(env):  # noqa: F811
    _, base, _ = _page_bases()
    base = replace(base, data=replace(base.data, n=40, n_test=10), train=replace(base.train, epochs=3),
                   attack=replace(base.attack, steps=2))
    cell = next(c for c in P.flip_variants(base) if not L.of(c).unlinked and c.config.space == "normalized"
                and c.config.target == "sum")
    at = settle(app(L.of(cell).params).switch_page("pages/malleability.py").run())
    assert not at.exception and not at.error
    assert at.radio(key="mall.norm").value == "l2" and at.radio(key="mall.space").value == "normalized"
    assert at.radio(key="mall.target").value == "sum" and at.multiselect(key="mall.attacks").value == ["pgd"]
    assert at.multiselect(key="mall.eps").value == [0.3] and at.number_input(key="n").value == 40
    assert at.number_input(key="mall.epochs").value == 3 and at.number_input(key="mall.steps").value == 2
    assert at.number_input(key="mall.lr").value == cell.config.train.lr
    assert at.select_slider(key="mall.ridge").value == cell.config.ridge
    assert at.radio(key="mall.kernel").value == cell.config.influence_kernel


# ---------------------------------------------------------------- one real cell

def test_one_real_flip_cell_gets_a_verdict():
    base = MalleabilityConfig(data=DataSpec(dataset="synthetic", n=40, n_test=10, synthetic_d=8),
                              train=TrainSpec(epochs=3), widths=(64,), seeds=(0, 1))
    cell = P.flip_variants(base)[7]   # ℓ2 normalized, true target, adamw
    assert (cell.config.attack.norm, cell.config.space, cell.config.train.optimizer) == ("l2", "normalized", "adamw")
    res = run_malleability(cell.config)
    v = P.flip_verdict(res.frames["summary"])
    assert v["verdict"] in P.VERDICTS and v["n_seeds"] == 2 and 0.0 <= v["attn"].flip <= 1.0
    assert math.isfinite(v["attn"].null_seed) and math.isfinite(v["attn"].low)
    row = P.cell(cell, res.frames["summary"])
    assert row["verdict"] == v["verdict"] and row["optimizer"] == "adamw"
    assert P.cell(cell, None)["verdict"] == "not run"


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["linear", "centered"])
def test_the_malleability_defaults_train_every_net_on_every_seed(mnist_dir, attention):
    """The page's verdict at its defaults is about the attack: no net of either architecture fails the
    training gate on real MNIST (the quick preset, the sidebar's linear attention and the centred one)."""
    from engine.experiments.registry import preset

    cfg = replace(preset("malleability", "quick"), attention=attention, attacks=("pgd",))
    cfg = replace(cfg, data=replace(cfg.data, dataset="mnist"))
    rows = run_malleability(cfg, data_dir=mnist_dir).frames["rows"]
    nets = rows.drop_duplicates(["arch", "seed"])
    assert len(nets) == 6 and nets["trained"].all(), nets[["arch", "seed", "test_acc", "test_acc_kernel"]]
    assert (nets["train_acc"] > 0.7).all()
