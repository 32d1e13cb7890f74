"""The alignment metrics against independent references (numpy's eig, scipy's root finder, explicit
centring matrices, Monte-Carlo kernel ridge), the verdict rule, and the experiment end to end on
synthetic data."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from scipy.integrate import trapezoid
from scipy.linalg import hadamard
from scipy.optimize import brentq

from engine.data import DataSpec
from engine.experiments.configs.alignment import PRESETS, AlignmentConfig, estimate_alignment
from engine.maths import alignment as AL
from engine.maths.specs import TrainSpec
from engine.runtime.errors import BadInput
from tests.conftest import ATOL64, ATOL64_EIG, MC_SIGMAS, RTOL64, RTOL64_EIG, RTOL64_ROOT, RTOL64_SOLVE


def _psd(n: int, seed: int) -> np.ndarray:
    A = np.random.default_rng(seed).standard_normal((n, n + 3))
    return A @ A.T


def _labels(n: int, c: int, seed: int) -> np.ndarray:
    y = np.random.default_rng(seed).integers(0, c, n)
    return np.eye(c)[y] if c > 2 else np.where(y == 0, 1.0, -1.0)


def _reference_alignment(K, Y):
    n = K.shape[0]
    H = np.eye(n) - np.ones((n, n)) / n
    Y = Y.reshape(n, -1)
    Kc, Tc = H @ K @ H, H @ (Y @ Y.T) @ H
    return np.sum(Kc * Tc) / (np.linalg.norm(Kc) * np.linalg.norm(Tc))


@pytest.mark.parametrize("n,c,seed", [(30, 2, 0), (40, 10, 1), (25, 3, 2)])
def test_alignment_matches_explicit_centring(n, c, seed):
    K, Y = _psd(n, seed), _labels(n, c, seed)
    assert AL.centered_alignment(K, Y) == pytest.approx(_reference_alignment(K, Y), rel=RTOL64, abs=ATOL64)


def test_the_labels_own_kernel_is_perfectly_aligned_and_constants_do_not_count():
    Y = _labels(40, 5, 3)
    assert AL.centered_alignment(Y @ Y.T, Y) == pytest.approx(1.0, rel=RTOL64)
    K = _psd(40, 3)
    assert AL.centered_alignment(3.0 * K + 7.0, Y) == pytest.approx(AL.centered_alignment(K, Y), rel=RTOL64)


def _reference_power(K, Y):
    """C(k) from numpy's general eig (not eigh), sorted by decreasing eigenvalue."""
    s, V = np.linalg.eig(K)
    order = np.argsort(-s.real)
    V = V[:, order].real
    V /= np.linalg.norm(V, axis=0)
    Y = Y.reshape(len(K), -1)
    return np.cumsum(np.sum((V.T @ Y) ** 2, axis=1)) / np.sum(Y ** 2)


@pytest.mark.parametrize("n,c,seed", [(30, 2, 0), (50, 10, 4)])
def test_cumulative_power_matches_numpy_eig(n, c, seed):
    K, Y = _psd(n, seed), _labels(n, c, seed)
    C = AL.cumulative_power(*AL.eigh_desc(K), Y)
    np.testing.assert_allclose(C, _reference_power(K, Y), rtol=RTOL64_EIG, atol=ATOL64_EIG)
    assert C[-1] == pytest.approx(1.0, rel=RTOL64)


def test_known_eigenvectors_and_ties_give_the_basis_free_power():
    n = 32
    U = hadamard(n) / np.sqrt(n)  # known orthonormal eigenvectors
    s = np.repeat([8.0, 4.0, 2.0, 1.0], 8)  # four tied blocks of eight
    K = U @ np.diag(s) @ U.T
    Y = _labels(n, 4, 5)
    per = np.sum((U.T @ Y) ** 2, axis=1) / np.sum(Y ** 2)
    block = per.reshape(4, 8).sum(axis=1)  # the power of each eigenspace is basis free
    expected = np.cumsum(np.repeat(block / 8, 8))  # spread evenly within each tie
    C = AL.cumulative_power(*AL.eigh_desc(K), Y)
    np.testing.assert_allclose(C, expected, rtol=RTOL64_EIG, atol=ATOL64_EIG)
    np.testing.assert_allclose(C[7::8], np.cumsum(block), rtol=RTOL64_EIG, atol=ATOL64_EIG)


def test_power_summary_against_brute_force():
    C = np.array([0.2, 0.5, 0.85, 0.9, 0.95, 1.0])
    out = AL.power_summary(C, 0.9)
    assert out["k_at"] == min(k for k in range(1, 7) if C[k - 1] >= 0.9)
    assert out["auc_log"] == pytest.approx(trapezoid(C, np.log(np.arange(1, 7))) / np.log(6), rel=RTOL64)
    with pytest.raises(BadInput, match="level"):
        AL.power_summary(C, 1.5)


@pytest.mark.parametrize("p,ridge", [(10, 1e-3), (100, 1e-2), (200, 0.0)])
def test_kappa_solves_the_self_consistent_equation(p, ridge):
    lam = np.arange(1, 401) ** -1.5
    k = AL.solve_kappa(lam, p, ridge)
    ref = brentq(lambda x: ridge + np.sum(lam * x / (p * lam + x)) - x, 1e-14, ridge + lam.sum() + 1, xtol=1e-300, rtol=RTOL64_ROOT)
    assert k == pytest.approx(ref, rel=RTOL64_SOLVE)


def test_theory_matches_monte_carlo_kernel_ridge_on_a_gaussian_process():
    """Targets drawn from a GP with a known power-law spectrum; p well below the pool size."""
    rng = np.random.default_rng(0)
    N = 800
    U, _ = np.linalg.qr(rng.standard_normal((N, N)))
    eta = np.arange(1, N + 1) ** -1.5
    K = U @ np.diag(N * eta) @ U.T
    y = np.sqrt(N) * U @ (rng.standard_normal(N) * np.sqrt(eta))
    lam, w = AL.population(*AL.eigh_desc(K), y)
    np.testing.assert_allclose(lam, eta, rtol=RTOL64_EIG, atol=ATOL64_EIG)  # the known spectrum comes back
    ns, ridge, trials = (10, 20, 40, 80, 200, 400), 1e-2 * eta.sum(), 40   # up to p = N/2
    theory = AL.theory_curve(lam, w, ns, ridge, held_out_of=N)
    mean, sd = AL.measured_curve(K, y, ns, ridge, trials, seed=1)
    assert np.all(np.diff(theory) < 0)
    near = np.array(ns) <= N // 4   # the theory is asymptotic: up to N/4 within Monte-Carlo error,
    assert np.all((np.abs(mean - theory) <= MC_SIGMAS * sd / np.sqrt(trials))[near]), (mean, theory, sd)
    curves = pd.DataFrame({"measured": mean, "measured_se": sd / np.sqrt(trials), "theory": theory})
    assert AL.parted(curves).empty   # and up to N/2 no parting flag (within 20 % or two standard errors)
    population = AL.theory_curve(lam, w, ns, ridge)     # the whole pool's error: below the held-out points'
    assert np.all(population < theory) and population[0] == pytest.approx(theory[0], rel=2 * ns[0] / N)


def test_all_three_are_invariant_to_the_order_of_the_training_set():
    K, Y = _psd(60, 7), _labels(60, 10, 7)
    perm = np.random.default_rng(7).permutation(60)
    Kp, Yp = K[np.ix_(perm, perm)], Y[perm]
    assert AL.centered_alignment(Kp, Yp) == pytest.approx(AL.centered_alignment(K, Y), rel=RTOL64)
    np.testing.assert_allclose(AL.cumulative_power(*AL.eigh_desc(Kp), Yp),
                               AL.cumulative_power(*AL.eigh_desc(K), Y), rtol=RTOL64_EIG, atol=ATOL64_EIG)
    ridge = 1e-3 * np.trace(K) / 60
    np.testing.assert_allclose(AL.theory_curve(*AL.population(*AL.eigh_desc(Kp), Yp), (5, 20, 60), ridge),
                               AL.theory_curve(*AL.population(*AL.eigh_desc(K), Y), (5, 20, 60), ridge),
                               rtol=RTOL64_EIG)


def test_bad_input_is_one_line():
    with pytest.raises(BadInput, match="square"):
        AL.centered_alignment(np.ones((3, 4)), np.ones(3))
    with pytest.raises(BadInput, match="NaN"):
        AL.centered_alignment(np.full((3, 3), np.nan), np.ones(3))
    with pytest.raises(BadInput, match="p > 0"):
        AL.solve_kappa(np.ones(3), 0, 1e-3)
    with pytest.raises(BadInput, match="no held-out point"):
        AlignmentConfig(data=DataSpec(n=100), curve_ns=(50, 100))
    with pytest.raises(BadInput, match="no held-out point"):
        AL.measured_curve(np.eye(5), np.ones(5), (5,), 1e-3, 2)
    with pytest.raises(BadInput, match="qkv"):
        AlignmentConfig(attention="qkv")


def _rows(gaps, acc_gaps, draws):
    """Per-net rows: each (draw, seed) pair's MLP-Attn alignment exceeds 2L-ReLU's 0.3 by ``gaps[i]``,
    its K_m ridge accuracy 0.8's by ``acc_gaps[i]``; ``draws[i]`` the pair's data draw."""
    rows = []
    for i, (g, ag, d) in enumerate(zip(gaps, acc_gaps, draws, strict=True)):
        for arch, al, acc in (("relu", 0.3, 0.8), ("attn", 0.3 + g, 0.8 + ag)):
            rows.append({"data_seed": d, "arch": arch, "width": 256, "seed": i, "align_trained": al,
                         "test_acc_kernel_trained": acc})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("gaps,acc_gaps,draws,outcome", [
    ((0.10, 0.12, 0.09, 0.11), (0.0, 0.0, 0.01, -0.01), (0, 0, 1, 1), "holds"),
    ((0.10, -0.05, 0.12, -0.04), (0.0,) * 4, (0, 1, 2, 3), "fails"),          # the interval reaches zero
    ((0.10, 0.12, 0.09, 0.11), (-0.10, -0.11, -0.09, -0.10), (0, 0, 1, 1), "fails"),  # 10 points less accurate
    ((0.10, 0.12, 0.09, 0.11), (-0.01, 0.01, -0.02, 0.0), (0, 1, 2, 3), "holds"),     # accuracy within its interval
    ((0.10,), (0.0,), (0,), "uninformative"),
    ((-0.10, -0.12, -0.09, -0.11), (0.0,) * 4, (0, 1, 2, 3), "fails"),       # 2L-ReLU's the better aligned
])
def test_the_verdict_rule(gaps, acc_gaps, draws, outcome):
    """The paired rule against scipy's t interval over data-draw means of the per-pair differences."""
    v = AL.verdict(_rows(gaps, acc_gaps, draws)).iloc[0]
    assert v["outcome"] == outcome
    by = pd.Series(gaps).groupby(list(draws)).mean()
    assert v["gap"] == pytest.approx(by.mean())
    if len(by) > 1:
        lo, hi = scipy.stats.t.interval(0.95, len(by) - 1, loc=by.mean(), scale=scipy.stats.sem(by))
        assert (v["gap_low"], v["gap_high"]) == pytest.approx((lo, hi))
        assert ("2L-ReLU's is the better aligned" in v["why"]) == (hi < 0)


def test_parted_flags_only_gaps_beyond_both_tolerances():
    curves = pd.DataFrame({"measured": [1.0, 1.5, 1.5], "measured_se": [0.1, 0.1, 0.4], "theory": [1.05, 1.0, 1.0]})
    assert list(AL.parted(curves).index) == [1]


def test_training_sets_are_drawn_without_replacement_and_tested_on_the_rest():
    """The measured curve against a brute-force re-implementation: the same permutations, ridge on the
    first p, mean squared error on the N − p left out; no index is drawn twice."""
    K, Y = _psd(40, 3), _labels(40, 4, 3)
    ridge, ns, trials = 1e-2 * np.trace(K) / 40, (5, 20, 39), 3
    mean, sd = AL.measured_curve(K, Y, ns, ridge, trials, seed=11)
    rng = np.random.default_rng(11)
    for p, m, v in zip(ns, mean, sd, strict=True):
        errs = []
        for _ in range(trials):
            order = rng.permutation(40)
            S, T = order[:p], order[p:]
            assert len(set(S)) == p and not set(S) & set(T)
            f = K[np.ix_(T, S)] @ np.linalg.solve(K[np.ix_(S, S)] + ridge * np.eye(p), Y[S])
            errs.append(np.mean(np.sum((f - Y[T]) ** 2, axis=1)))
        assert m == pytest.approx(np.mean(errs), rel=RTOL64_SOLVE) and v == pytest.approx(np.std(errs, ddof=1),
                                                                                          rel=RTOL64_SOLVE)


def test_the_quick_preset_follows_n():
    from engine.experiments.registry import preset

    for n in (30, 200, 1000):
        cfg = replace(preset("alignment", "quick"), data=DataSpec(n=n, n_test=50))
        assert cfg.curve_sizes and max(cfg.curve_sizes) <= n // 2 and len(set(cfg.curve_sizes)) == len(cfg.curve_sizes)


def test_presets_validate_and_estimate():
    for cfg in PRESETS["alignment"].values():
        assert estimate_alignment(cfg).seconds > 0
    q, p = PRESETS["alignment"]["quick"], PRESETS["alignment"]["paper"]
    assert estimate_alignment(q).seconds < estimate_alignment(p).seconds


SYN = DataSpec(dataset="synthetic", n=80, n_test=40, synthetic_d=32, synthetic_kappa=10.0)


def test_the_run_end_to_end_on_synthetic_data():
    import torch

    from engine.experiments.alignment import run_alignment
    from engine.experiments.runs import prepare
    from engine.maths.kinf import infinite_ntk
    from engine.maths.models import Net
    from engine.reporting.alignment import readme_paragraph, verdict_alignment
    from engine.reporting.plots import alignment as AP

    cfg = AlignmentConfig(data=SYN, train=TrainSpec(epochs=4, snapshot_epochs=(0, 2, 4)), widths=(64, 128),
                          seeds=(0, 1), data_seeds=(0, 1), curve_ns=(10, 40), curve_trials=2)
    res = run_alignment.compute(cfg, None, torch.device("cpu"), None, None)
    rows, kinf = res.frames["rows"], res.frames["kinf"]
    assert len(rows) == 2 * 2 * 2 * 2 and len(kinf) == 2 * 2
    # K∞'s alignment on draw 1 against the explicit centring of an independently built K∞
    p = prepare(replace(SYN, seed=1), None, "cpu", None, None)
    for arch in ("relu", "attn"):
        net = Net(arch, p.X, 64, p.n_out, 0, 1.0, "linear", SYN.normalize)
        with torch.no_grad():
            K = infinite_ntk(net.features(p.X)).numpy()
        got = kinf[(kinf["data_seed"] == 1) & (kinf["arch"] == arch)]["align"].item()
        assert got == pytest.approx(_reference_alignment(K, p.Y.numpy()), rel=RTOL64_EIG)
    # the snapshot at epoch 0 is the kernel at init; the last is the trained one
    tr = res.frames["training"].merge(rows, on=["data_seed", "arch", "width", "seed"])
    np.testing.assert_allclose(tr[tr["epoch"] == 0]["alignment"], tr[tr["epoch"] == 0]["align_init"], rtol=RTOL64_EIG)
    np.testing.assert_allclose(tr[tr["epoch"] == 4]["alignment"], tr[tr["epoch"] == 4]["align_trained"],
                               rtol=RTOL64_EIG)
    # flip rates along training: the largest width's snapshots, each beside its alignment and both nulls
    fl = res.frames["flips_training"]
    assert len(fl) == 2 * 2 * 2 * 3 and set(fl["width"]) == {128} and set(fl["epoch"]) == {0, 2, 4}
    assert fl["alignment"].notna().all() and fl["null_seed_flip_rate"].notna().all()
    np.testing.assert_allclose(fl["flip_excess"], fl["flip_rate"] - fl[["null_seed_flip_rate",
                                                                         "null_random_flip_rate"]].max(axis=1),
                               rtol=RTOL64, atol=ATOL64)
    assert len(res.frames["flips_training_summary"]) == 2 * 3
    assert set(res.frames["curves"]["kernel"]) == {"K∞", "K_m trained"}
    assert set(res.frames["power"]["kernel"]) == {"K∞", "K_m init", "K_m trained"}
    assert list(res.frames["verdict"]["width"]) == [64, 128]
    assert verdict_alignment(res.frames["verdict"]).status in ("agrees", "partly", "disagrees")
    text = readme_paragraph([("synthetic", res), ("later", None)])
    rows = [line for line in text.splitlines() if line.startswith("| synthetic |")]
    assert len(rows) == 2 and all(len(r.split("|")) == 11 for r in rows)   # one row per net, nine cells
    assert "Not computed yet" in text and "later" in text and "Rule:" in text
    for fig in (AP.alignment_width_fig(AP.alignment_width_data(res.frames["summary"], kinf)),
                AP.power_fig(AP.power_data(res.frames["power"])), AP.curve_fig(AP.curve_data(res.frames["curves"])),
                AP.training_fig(AP.training_data(res.frames["training"])),
                AP.both_halves_fig(AP.both_halves_data(res.frames["flips_training_summary"]))):
        assert len(fig.data) >= 4


@pytest.mark.slow
def test_the_page_runs_on_synthetic_data(tmp_path, monkeypatch):
    """The Task alignment page on its own (app.py's navigation aside): a small synthetic draw, the
    run started by its button when it waits for one, every chart with its CSV, no error."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from tests.conftest import steady_app_state
    from tests.test_app import settle
    from ui.common import Shared

    steady_app_state(monkeypatch, tmp_path / "cache", tmp_path / "no-data")
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "pages" / "alignment.py"), default_timeout=600)
    at.session_state["shared"] = Shared(base="synthetic", n=60, n_test=20, widths=(16, 64))
    at.session_state["alignment.epochs"] = 5
    settle(at)
    waiting = [b for b in at.button if str(b.key or "").startswith("run.")]
    if waiting and not at.get("plotly_chart"):
        waiting[0].click()
        settle(at)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    design = [b for b in at.button if str(b.key or "").startswith("run.")]  # the causal design, where it waits
    if design:
        design[0].click()
        settle(at)
    assert not at.exception, [e.value for e in at.exception]
    charts = at.get("plotly_chart")  # five, and the causal design's (read in place of the plain run once it exists)
    assert len(charts) == 6 and len(at.get("download_button")) >= len(charts) - 1
    assert any("Power:" in i.value for i in at.info)
    assert any("Along training:" in c.value for c in at.caption)
    assert any("the flip excess follows" in m.value for m in at.markdown)
    assert any("against the flip excess" in c.value for c in at.caption), [c.value[:60] for c in at.caption]


def test_reach_interpolates_in_log_p():
    assert AL.reach([10, 100], [0.8, 0.4], 0.6) == pytest.approx(np.sqrt(10 * 100))   # halfway in log p
    assert AL.reach([10, 100], [0.5, 0.4], 0.6) == 10 and math.isnan(AL.reach([10, 100], [0.9, 0.7], 0.6))


def test_power_metrics_pair_the_nets_within_draws_and_say_where_they_disagree():
    import scipy.stats

    rng = np.random.default_rng(5)
    rows, curves = [], []
    for d in range(3):
        for s in range(2):
            for arch, align, k90 in (("attn", 0.5, 120), ("relu", 0.4, 100)):
                rows.append({"data_seed": d, "arch": arch, "seed": s, "width": 64,
                             "align_trained": align + 0.01 * rng.standard_normal(), "k90_trained": k90 + d,
                             "auc_trained": 0.5})
                for p, e in ((10, 0.9), (100, 0.5 if arch == "attn" else 0.55)):
                    curves.append({"data_seed": d, "arch": arch, "seed": s, "kernel": "K_m trained", "p": p,
                                   "measured": e})
    rows, curves = pd.DataFrame(rows), pd.DataFrame(curves)
    t = AL.power_metrics(rows, curves).set_index("metric")
    pair = rows[rows.arch == "attn"].set_index(["data_seed", "seed"])["align_trained"] \
        - rows[rows.arch == "relu"].set_index(["data_seed", "seed"])["align_trained"]
    means = pair.groupby(level=0).mean().to_numpy()
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=means.mean(), scale=scipy.stats.sem(means))
    assert (t.at["alignment", "diff"], t.at["alignment", "low"], t.at["alignment", "high"]) == pytest.approx(
        (means.mean(), lo, hi))
    assert t.at["alignment", "favours"] == "attn" and t.at["k90", "favours"] == "relu"
    assert t.at["auc", "favours"] == "neither" and t.at["p_reach", "favours"] == "attn"   # 56 against 72 points
    line = AL.disagreement(t.reset_index())
    assert line.startswith("The metrics disagree") and "k90 favour 2L-ReLU" in line
