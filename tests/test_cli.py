"""The CLI as a user runs it: a subprocess, JSON on stdout, exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, env_extra=None, cache_dir=None):
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir or ROOT / ".pytest_cache" / "xdg")}
    env.pop("ENGINE_DATA_DIR", None)  # the Makefile exports it; each test names its data dir
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow
def test_spectrum_json(mnist_dir, tmp_path):
    rc, out, err = run("spectrum", "--dataset", "mnist", "--n", "100", "--seed", "0", "--json",
                       "--data-dir", str(mnist_dir), "--cache-dir", str(tmp_path))
    assert rc == 0, err
    obj = json.loads(out)
    for key in ("n", "d", "numerical_rank", "rank_tol", "kappa", "kappa_d", "kappa_attention",
                "kappa_attention_theory", "width_threshold_log10"):
        assert key in obj
    assert obj["n"] == 100 and obj["d"] == 784 and not obj["cached"]
    assert "loading data" in err  # progress goes to stderr
    rc, out, _ = run("spectrum", "--dataset", "mnist", "--n", "100", "--seed", "0", "--json",
                     "--data-dir", str(mnist_dir), "--cache-dir", str(tmp_path))
    assert json.loads(out)["cached"]


@pytest.mark.slow
def test_ntk_sweep_json(mnist_dir, tmp_path):
    rc, out, err = run("ntk-sweep", "--dataset", "mnist", "--n", "400", "--n-test", "200", "--widths",
                       "16,256,4096", "--archs", "relu,attn", "--epochs", "0", "--seed", "0", "--seeds", "0",
                       "--json", "--data-dir", str(mnist_dir), "--no-cache")
    assert rc == 0, err
    obj = json.loads(out)
    rows = obj["rows"]
    assert [(s["arch"], s["width"], s["n_seeds"]) for s in obj["summary"]] == [
        (a, w, 1) for a in ("relu", "attn") for w in (16, 256, 4096)]
    assert obj["config"]["seeds"] == [0] and obj["provenance"]["data"]
    assert [(r["arch"], r["width"]) for r in rows] == [("relu", 16), ("relu", 256), ("relu", 4096),
                                                       ("attn", 16), ("attn", 256), ("attn", 4096)]
    for r in rows:
        for key in ("seed", "kernel_dist_init", "kernel_dist_trained", "function_dist", "test_acc",
                    "weight_movement", "kernel_dist_whitened_init", "kernel_dist_whitened_trained",
                    "prediction_gap_init", "prediction_gap_trained", "f_norm", "f_ntk_norm",
                    "function_dist_rel", "n_test", "train_acc", "test_acc_ntk"):
            assert r[key] is not None
    relu = [r["kernel_dist_init"] for r in rows if r["arch"] == "relu"]
    assert relu[0] > relu[1] > relu[2]


def test_datasets_lists_what_is_here(mnist_dir):
    rc, out, err = run("datasets", "--json", "--data-dir", str(mnist_dir))
    assert rc == 0, err
    found = {d["name"]: d["available"] for d in json.loads(out)["datasets"]}
    assert found["mnist"] and found["synthetic"]


@pytest.mark.parametrize("args,needle", [
    (["spectrum", "--dataset", "imagenet", "--no-cache"], "imagenet"),
    (["ntk-sweep", "--dataset", "synthetic", "--widths", "16,0", "--no-cache"], "widths"),
    (["spectrum", "--dataset", "synthetic", "--n", "-4", "--no-cache"], "-4"),
    (["ntk-sweep", "--dataset", "synthetic", "--archs", "cnn", "--no-cache"], "cnn"),
    (["ntk-sweep", "--widths", "a,b"], "a,b"),
    (["ntk-sweep", "--dataset", "synthetic", "--lr", "inf", "--no-cache"], "lr"),
    (["spectrum", "--dataset", "synthetic", "--attention", "stacked:100000000", "--no-cache"], "stacked"),
    (["ntk-sweep", "--dataset", "synthetic", "--widths", "1000000000", "--no-cache"], "widths"),
])
def test_bad_arguments_exit_2_with_one_line(args, needle):
    rc, out, err = run(*args)
    assert rc == 2 and needle in err and out == ""


@pytest.mark.slow
def test_over_budget_runs_are_refused_before_they_start(tmp_path):
    huge = ("--dataset", "synthetic", "--n", "2000", "--widths", "65536", "--epochs", "20000")  # about 14 h
    rc, out, err = run("ntk-sweep", *huge, "--cache-dir", str(tmp_path))
    assert rc == 2 and "budget" in err and "--max-seconds" in err and out == ""
    rc, out, err = run("ntk-sweep", *huge, "--estimate", "--json")
    assert rc == 0 and json.loads(out)["estimate_seconds"] > 6 * 3600


def test_n_larger_than_the_split_exits_2(mnist_dir):
    rc, _, err = run("spectrum", "--dataset", "mnist:3-8", "--n", "100000", "--data-dir", str(mnist_dir),
                     "--no-cache")
    assert rc == 2 and "100000" in err


@pytest.mark.slow
def test_missing_data_exits_3_and_names_the_files(tmp_path):
    rc, out, err = run("spectrum", "--dataset", "mnist", "--data-dir", str(tmp_path / "empty"), "--no-cache",
                       cache_dir=tmp_path)
    assert rc == 3 and "train-images-idx3-ubyte" in err and len(err.strip().splitlines()[-1]) > 20


@pytest.mark.slow
def test_malleability_json_on_real_digits(mnist_dir):
    rc, out, err = run("malleability", "--dataset", "mnist", "--n", "200", "--n-test", "50", "--widths", "256",
                       "--archs", "relu,attn", "--epochs", "10", "--attack", "pgd,fgsm", "--eps", "0.05,0.3",
                       "--tau", "0.1", "--seed", "0", "--seeds", "0", "--norm", "l2", "--space", "normalized",
                       "--influence", "true", "--json", "--data-dir", str(mnist_dir), "--no-cache")
    assert rc == 0, err
    rows = json.loads(out)["rows"]
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        assert 0 <= r["flip_rate"] <= 1 and 0 <= r["pair_flip_rate"] <= 1 and -1 <= r["spearman"] <= 1
        assert r["test_acc"] is not None and r["n_top"] == 20
        assert r["train_acc"] is not None and r["test_acc_ntk"] is not None and r["rel_perturbation"] > 0
        assert (r["norm"], r["space"], r["target"]) == ("l2", "normalized", "true")
        assert r["rel_perturbation"] <= r["eps"] * (1 + 1e-5)  # unit rows: ‖δ‖₂ ≤ ε
    assert {(r["attack"], r["eps"]) for r in rows} == {("pgd", 0.05), ("pgd", 0.3), ("fgsm", 0.05), ("fgsm", 0.3)}


def test_malleability_bad_tau_exits_2():
    rc, _, err = run("malleability", "--dataset", "synthetic", "--tau", "2", "--no-cache")
    assert rc == 2 and "tau" in err


@pytest.mark.slow
def test_scaling_json():
    rc, out, err = run("scaling", "--n", "16", "--d", "8", "--kappas", "2,8", "--measure", "init", "--target",
                       "0.3", "--max-width", "1024", "--attentions", "linear,stacked:2", "--json", "--no-cache")
    assert rc == 0, err
    obj = json.loads(out)
    assert len(obj["rows"]) == 6 and [f["theory_exponent"] for f in obj["fit"]] == [2.0, 6.0, 10.0]
    assert all("monotone" in r for r in obj["rows"]) and all("exponent_low" in f for f in obj["fit"])


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["truncated:10", "stacked:2", "softmax:0.5"])
def test_spectrum_attention_variants(mnist_dir, attention):
    rc, out, err = run("spectrum", "--dataset", "mnist", "--n", "60", "--attention", attention, "--json",
                       "--data-dir", str(mnist_dir), "--no-cache")
    assert rc == 0, err
    obj = json.loads(out)
    assert obj["attention"] == attention and obj["kappa_attention"] > 1
    assert (obj["kappa_attention_theory"] is None) == attention.startswith("softmax")


@pytest.mark.parametrize("args,frames", [
    (["alignment", "--widths", "32", "--seeds", "0,1", "--data-seeds", "0", "--epochs", "4", "--snapshot-epochs",
      "0,4", "--curve-trials", "2"], {"rows", "summary", "verdict", "kinf", "curves", "power", "training", "flips_training",
                                      "flips_training_summary"}),
    (["malleability", "--widths", "32", "--seeds", "0,1", "--data-seeds", "0,1", "--epochs", "4"],
     {"rows", "summary", "verdict", "draws", "interventions", "interventions_summary"}),
])
def test_json_holds_every_frame_of_the_result(args, frames, tmp_path):
    """--json prints every frame the pages draw, each under its own name."""
    rc, out, err = run(*args, "--dataset", "synthetic", "--n", "40", "--n-test", "20", "--json", "--no-cache",
                       cache_dir=tmp_path)
    assert rc == 0, err
    obj = json.loads(out)
    assert frames <= set(obj), frames - set(obj)
    if args[0] == "malleability":
        assert {v["role"] for v in obj["verdict"]} == {"exploratory"} and len(obj["draws"]) == 2
