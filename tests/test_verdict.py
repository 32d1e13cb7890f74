"""engine.experiments.verdict and the verdict frame (engine.experiments.flips.verdict): the frame's
``holds`` is ``flip_rule``'s on every cell of a generated grid of runs, and agrees with the rule restated
here from its words; the declared primary; nets below the training gate left out with a sensitivity
line; repeated values of a tuple setting refused in one line wherever tuples are parsed."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from conftest import ATOL64
from engine.experiments import flips as F
from engine.experiments.verdict import flip_rule
from engine.maths.gates import GATE_SHARE
from engine.maths.metrics import LEVEL, excess_interval, gap_interval

K = 20


def _run(rng, draws, seeds, widths=(64, 1024), readings=("ridge", "retrain"), p_fail=0.1, lift=0.0):
    """Rows and per-point flips of a made-up run: every (draw, arch, width, seed, reading) one net."""
    rows, flips = [], []
    for d, arch, w, s, r in itertools.product(draws, ("attn", "relu"), widths, seeds, readings):
        p_attack = rng.uniform(0.0, 0.6) + (lift if arch == "attn" else 0.0)
        units = (rng.random(K) < min(p_attack, 1.0), rng.random(K) < 0.05, rng.random(K) < 0.05)
        e = float(units[0].mean() - max(units[1].mean(), units[2].mean()))
        rows.append({"data_seed": d, "arch": arch, "width": w, "seed": s, "attack": "pgd", "eps": 0.3, "reading": r,
                     "flip_rate": float(units[0].mean()), "null_seed_flip_rate": float(units[1].mean()),
                     "null_random_flip_rate": float(units[2].mean()), "flip_excess": e,
                     "trained": bool(rng.random() > p_fail), "objective_match": r == "retrain",
                     "test_acc": 0.8, "test_acc_kernel": 0.82})
        flips.append(units)
    return pd.DataFrame(rows), flips


CASES = [(n_draws, n_seeds, p_fail, lift, seed) for n_draws in (1, 2, 3, 5) for n_seeds in (1, 2, 3)
         for p_fail, lift in ((0.0, 0.0), (0.0, 0.4), (0.15, 0.3), (0.5, 0.3)) for seed in (0, 1)]


@pytest.mark.parametrize("n_draws,n_seeds,p_fail,lift,seed", CASES)
def test_holds_is_the_rule_on_every_generated_cell(n_draws, n_seeds, p_fail, lift, seed):
    rng = np.random.default_rng([n_draws, n_seeds, seed, int(100 * p_fail)])
    rows, flips = _run(rng, range(n_draws), range(n_seeds), p_fail=p_fail, lift=lift)
    verdict, per_draw = F.verdict(rows, flips, nulls=True)
    summary = F.with_gaps(F.summary(rows, flips, True), verdict)
    assert len(verdict) == 4 and (verdict["role"] == "primary").sum() == 1
    for _, v in verdict.iterrows():
        cell = summary[(summary["width"] == v["width"]) & (summary["reading"] == v["reading"])]
        rule = flip_rule(cell, v["attack"], v["eps"])
        assert (v["outcome"], bool(v["holds"])) == (rule["outcome"], rule["outcome"] == "holds")
        # the rule restated from its words, on the frame's own numbers
        trained = min(v["trained_attn"], v["trained_relu"]) >= GATE_SHARE
        secondary_ok = v["role"] == "primary" or not math.isfinite(v["gap_p_holm"]) or v["gap_p_holm"] < 1 - LEVEL
        informative = n_seeds > 1 or n_draws > 1
        expect = trained and informative and v["excess_attn_low"] > 0 and v["gap_low"] > 0 and secondary_ok
        assert bool(v["holds"]) == expect, v.to_dict()
        if not trained:
            assert v["outcome"] == "did not train"
    if n_draws > 1:
        assert set(per_draw["data_seed"]) <= set(range(n_draws)) and len(per_draw) >= len(verdict)


def test_the_primary_is_the_networks_own_reading_at_the_largest_width():
    rows, flips = _run(np.random.default_rng(0), range(2), range(2), widths=(64, 4096),
                       readings=("ridge", "flow", "retrain"))
    v = F.verdict(rows, flips, nulls=True)[0]
    primary = v[v["role"] == "primary"]
    assert primary[["width", "reading"]].values.tolist() == [[4096, "retrain"]]
    assert set(v[v["role"] != "primary"]["role"]) == {"secondary"}
    no_retrain = rows["reading"] != "retrain"
    v2 = F.verdict(rows[no_retrain].reset_index(drop=True), [f for f, k in zip(flips, no_retrain, strict=True) if k], True)[0]
    assert set(v2["role"]) == {"exploratory"}          # ridge and flow rows here are not exact for the training


def test_a_net_below_the_gate_is_left_out_named_and_stated_beside():
    rng = np.random.default_rng(4)
    rows, flips = _run(rng, range(3), range(3), widths=(64,), readings=("retrain",), p_fail=0.0, lift=0.3)
    bad = rows.index[(rows["arch"] == "attn") & (rows["data_seed"] == 2) & (rows["seed"] == 1)][0]
    rows.loc[bad, "trained"] = False
    v = F.verdict(rows, flips, nulls=True)[0].iloc[0]
    kept = [i for i in rows.index if i != bad]
    attn_kept = [i for i in kept if rows.at[i, "arch"] == "attn"]
    relu = [i for i in rows.index if rows.at[i, "arch"] == "relu"]
    ref = gap_interval([flips[i] for i in attn_kept], [flips[i] for i in relu],
                       rows.loc[attn_kept, "data_seed"], rows.loc[relu, "data_seed"])
    every = gap_interval([flips[i] for i in rows.index if rows.at[i, "arch"] == "attn"], [flips[i] for i in relu],
                         rows[rows["arch"] == "attn"]["data_seed"],
                         rows.loc[relu, "data_seed"])
    assert (v["gap"], v["gap_low"], v["gap_high"]) == pytest.approx(tuple(ref[:3]), abs=ATOL64)
    assert (v["gap_all"], v["gap_all_low"], v["gap_all_high"]) == pytest.approx(tuple(every[:3]), abs=ATOL64)
    assert v["left_out"] == "MLP-Attn draw 2 seed 1" and "with them, gap" in v["sensitivity"]
    assert v["trained_attn"] == pytest.approx(8 / 9) and v["outcome"] != "did not train"
    s = F.summary(rows, flips, True).set_index("arch")
    assert s.at["attn", "n_left_out"] == 1 and s.at["attn", "n_nets"] == 9
    assert s.at["attn", "flip_excess_mean"] == pytest.approx(
        excess_interval([flips[i] for i in attn_kept], draws=rows.loc[attn_kept, "data_seed"]).value, abs=ATOL64)


@pytest.mark.parametrize("argv", [
    ["malleability", "--seeds", "0,0"], ["malleability", "--data-seeds", "0,1,0"],
    ["malleability", "--reading", "flow,flow"], ["scaling", "--kappas", "4,4"], ["alignment", "--seeds", "1,1"],
    ["alignment", "--data-seeds", "0,0"], ["malleability", "--widths", "64,64"],
])
def test_repeated_values_are_one_line_errors(argv, capsys):
    from engine.cli import main

    assert main([*argv, "--estimate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than once" in err[0] and "Traceback" not in err[0]


def test_repeated_values_are_refused_from_a_grid_spec(tmp_path):
    from engine.grid import spec as G
    from engine.runtime.errors import BadInput

    path = tmp_path / "g.toml"
    path.write_text('name = "g"\n[[grid]]\nkind = "malleability"\nbase.seeds = [0, 0]\n')
    with pytest.raises(BadInput, match="more than once"):
        G.load_spec(path)


def test_the_per_draw_strip_shows_each_draws_gap_beside_the_pooled_interval():
    from engine.reporting import plots

    rows, flips = _run(np.random.default_rng(9), range(4), range(2), widths=(64,), readings=("retrain",), lift=0.3)
    verdict, per_draw = F.verdict(rows, flips, nulls=True)
    data = plots.draw_gaps_data(verdict, per_draw, "pgd", 0.3)
    assert len(data) == 4 and list(data["data_seed"]) == [0, 1, 2, 3]
    assert data["gap_draw"].mean() == pytest.approx(data["gap"].iloc[0], abs=ATOL64)   # equal nets per draw
    assert data["gap"].iloc[0] == pytest.approx(100 * verdict["gap"].iloc[0])
    fig = plots.draw_gaps_fig(data)
    assert [len(t.y) for t in fig.data] == [4, 1]


def test_the_readme_opens_on_the_primary_verdict_and_its_kernel_readings():
    from types import SimpleNamespace

    from engine.reporting.report import findings

    rows, flips = _run(np.random.default_rng(3), range(3), range(2), widths=(64, 4096),
                       readings=("ridge", "flow", "retrain"), lift=0.3)
    verdict, _ = F.verdict(rows, flips, nulls=True)
    lines = findings([("none yet", None), ("network", SimpleNamespace(frames={"verdict": verdict}))], [])
    p = verdict[verdict["role"] == "primary"].iloc[0]
    assert len(lines) == 2 and "declared primary): " + p["outcome"] in lines[0] and "3 data draws" in lines[0]
    assert f"{100 * p['gap']:+.0f} [{100 * p['gap_low']:+.0f}, {100 * p['gap_high']:+.0f}] points" in lines[0]
    assert "ridge leave-one-out" in lines[1] and "gradient flow" in lines[1] and "m = 4096" in lines[0]


def test_a_verdicts_sides_read_the_summary_columns_their_fields_name():
    """``flip_rule``'s ``relu`` and ``attn`` are ``Side`` records: every field is the summary column its
    metadata names, read for that architecture (a page's number is a field, found by grep)."""
    import dataclasses

    from engine.data import DataSpec
    from engine.experiments.configs.malleability import MalleabilityConfig
    from engine.experiments.flips import COLUMNS
    from engine.experiments.malleability import run_malleability
    from engine.experiments.verdict import Side
    from engine.maths.specs import TrainSpec

    cfg = MalleabilityConfig(data=DataSpec(dataset="synthetic", n=24, n_test=8, synthetic_d=6, synthetic_classes=3),
                             train=TrainSpec(epochs=2, batch_size=8), widths=(32,), seeds=(0, 1), attacks=("fgsm",),
                             eps=(0.1,), tau=0.5)
    summ = run_malleability(cfg).frames["summary"]
    v = flip_rule(summ)
    for f in dataclasses.fields(Side):
        column = f.metadata["column"]
        assert column in summ.columns and (column.rsplit("_", 1)[0] in COLUMNS or column.endswith(("_low", "_high")))
        for arch in ("relu", "attn"):
            want = float(summ.set_index("arch").at[arch, column])
            got = getattr(v[arch], f.name)
            assert got == want or (math.isnan(got) and math.isnan(want)), (arch, f.name)
