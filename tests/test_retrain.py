"""engine.experiments.retrain: retraining without a point against the kernel's leave-one-out.

References: kernel ridge regression's exact leave-one-out (a converged linearised head is
that regression), a loop of separate retrainings with the net's own forward (bit for bit),
and retraining with the point deleted from its batches (masking is deleting).
"""

from dataclasses import replace

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch

from engine.data import DataSpec
from engine.experiments.configs.retrain import PRESETS, RetrainConfig
from engine.experiments.registry import EXPERIMENTS, estimate
from engine.experiments.retrain import agreement, picks, run_retrain_loo
from engine.maths.influence import influence_matrix
from engine.maths.loo import best_other, flow_loo, head_outputs, kernel_loo, score, train_masked
from engine.maths.models import Net, TwoLayerReLU
from engine.maths.ntk import empirical_ntk_features
from engine.maths.specs import TrainSpec
from engine.maths.training import BATCH_SEED_OFFSET, OPTIMIZER_FNS, targets, train
from engine.reporting import export, plots
from engine.runtime.budget import Estimate
from engine.runtime.errors import BadInput
from reference import loo_changes
from tests.conftest import ATOL64, ATOL64_EXPM, RTOL64, RTOL64_EXPM, RTOL64_SAME

SYN = DataSpec("synthetic", n=60, n_test=20, synthetic_d=32, synthetic_classes=3)


def _features(n=40, d=32, classes=3, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64).to(dtype)
    return X, torch.randint(0, classes, (n,), generator=g)


def _keep(n: int, left_out) -> torch.Tensor:
    """Row 0 keeps every point (the full run); row j + 1 leaves out left_out[j]."""
    keep = torch.ones(1 + len(left_out), n, dtype=torch.bool)
    for j, i in enumerate(left_out):
        keep[j + 1, i] = False
    return keep


def _alone(head: TwoLayerReLU, phi, y, n_classes, spec, seed, keep=None, delete=None):
    """One head retrained alone with its own forward: points where ``keep`` is 0 multiply their
    loss by 0, or the point ``delete`` is taken out of its batch (keeping the batch's normaliser)."""
    head.param = spec.param
    opt = OPTIMIZER_FNS[spec.optimizer]([head.W], lr=spec.lr, weight_decay=spec.weight_decay)
    g = torch.Generator().manual_seed(int(seed) + BATCH_SEED_OFFSET)
    n = phi.shape[0]
    t = targets(y, n_classes).to(phi.dtype)
    for _ in range(spec.epochs):
        order = torch.randperm(n, generator=g)
        for start in range(0, n, spec.batch_size):
            idx = order[start:start + spec.batch_size]
            rows = idx if delete is None else idx[idx != delete]
            opt.zero_grad(set_to_none=False)
            err = (head(phi[rows]) - t[rows]) ** 2
            if keep is not None:
                err = keep.to(phi.dtype)[rows][:, None] * err
            loss = err.sum() / (idx.numel() * t.shape[1])
            (loss * (head.width if spec.param == "mup" else 1)).backward()
            opt.step()
    return head.W.detach()


# ---------------------------------------------------------------- (a) the kernel regime's exact case

@pytest.mark.parametrize("init", ["gaussian", "antisymmetric"])
def test_converged_linearised_retraining_is_the_kernel_loo(init):
    """Linearised head, MSE, weight decay w, full batches to convergence: kernel ridge regression with
    the eNTK at W₀ and λ_abs = n·c·w/2, so each retrained change is exactly its leave-one-out."""
    n, d, m = 12, 16, 24
    X, y = _features(n + 6, d, classes=2, seed=1, dtype=torch.float64)
    net = Net("relu", X[:n], m, 1, seed=2, init=init, dtype=torch.float64)
    phi, phi_t = net.features(X[:n]).detach(), net.features(X[n:]).detach()
    y = y[:n]
    wd = 0.05  # λ_abs = n·w/2 = 0.3: the slowest mode contracts by 1 − ηw = 0.95 a step, 10⁻¹⁴ in 700
    spec = TrainSpec(epochs=700, lr=1.0, batch_size=n, weight_decay=wd, optimizer="sgd", loss="mse")
    left_out = [0, 5, 11]
    heads = [net.mlp] * (1 + len(left_out))
    W0 = torch.cat([h.W.detach() for h in heads])
    run = train_masked(phi, y, 2, heads, _keep(n, left_out), spec, frozen=phi @ W0.T > 0)
    out = head_outputs(phi_t @ run.W.T, heads, phi_t @ W0.T > 0)        # (1 + k, n_test, 1)
    actual = (out[0] - out[1:])[:, :, 0].T                               # (n_test, k)

    K, K_t = empirical_ntk_features(net.mlp, phi), empirical_ntk_features(net.mlp, phi_t, phi)
    ridge = (n * 1 * wd / 2) / float(K.diagonal().mean())
    changes, _ = loo_changes(K.numpy(), K_t.numpy(), targets(y, 2).numpy(), ridge)  # n refits, (n, n_test, 1)
    predicted = torch.from_numpy(changes[left_out, :, 0].T)
    assert float(actual.abs().max()) > 1e-3  # the changes are not trivially zero
    torch.testing.assert_close(actual, predicted, rtol=RTOL64, atol=ATOL64)


# ---------------------------------------------------------------- (b) batched = separate, bit for bit

@pytest.mark.parametrize("width,init,classes,optimizer,param", [
    (16, "gaussian", 2, "sgd", "ntk"),
    (64, "gaussian", 3, "adam", "ntk"),
    (32, "antisymmetric", 3, "sgd", "ntk"),
    (48, "antisymmetric", 2, "adam", "mup"),
])
def test_batched_retrainings_are_separate_retrainings_bit_for_bit(width, init, classes, optimizer, param):
    """Each head of the batched model ends, bit for bit on CPU, where it ends trained alone with its own
    forward. (MKL computes products with fewer than 12 output columns by another kernel, in another
    order, so a head narrower than 12 units, 24 antisymmetric, alone rounds differently; see engine.experiments.retrain.)"""
    n = 40
    X, y = _features(n, 32, classes, seed=3)
    n_out = 1 if classes == 2 else classes
    net = Net("relu", X, width, n_out, seed=4, init=init)
    phi = net.features(X).detach()
    spec = TrainSpec(epochs=4, lr=0.5 if optimizer == "sgd" else 1e-2, batch_size=16, weight_decay=1e-3,
                     optimizer=optimizer, loss="mse", param=param)
    left_out = [3, 17, 22, 39]
    keep = _keep(n, left_out)
    run = train_masked(phi, y, classes, [net.mlp] * len(keep), keep, spec, seed=5, in_span=False)
    for j in range(len(keep)):
        alone = _alone(Net("relu", X, width, n_out, seed=4, init=init).mlp, phi, y, classes, spec, 5, keep=keep[j])
        assert torch.equal(run.W[j * width:(j + 1) * width], alone), (j, float((run.W[j * width:(j + 1) * width]
                                                                               - alone).abs().max()))
    assert not torch.equal(run.W[:width], run.W[width:2 * width])  # leaving a point out changed something


def test_the_full_copy_follows_engine_training_bit_for_bit():
    """A head kept everywhere is engine.maths.training.train's run: the same batches, the same steps. At
    width 64 the output scale 1/8 is a power of two, so train's premultiplied readout a/√m and the
    head's (h·a)/√m round alike."""
    X, y = _features(40, 32, 3, seed=6)
    spec = TrainSpec(epochs=3, lr=1e-2, batch_size=16, loss="mse")
    net = Net("relu", X, 64, 3, seed=7)
    run = train_masked(net.features(X).detach(), y, 3, [net.mlp], torch.ones(1, 40, dtype=torch.bool), spec, seed=8)
    alone = Net("relu", X, 64, 3, seed=7)
    train(alone, X, y, 3, spec, seed=8)
    assert torch.equal(run.W, alone.mlp.W.detach())


@pytest.mark.parametrize("init,classes,loss,param,decay,linearised", [
    ("gaussian", 3, "mse", "ntk", 1e-3, False),
    ("antisymmetric", 3, "ce", "ntk", 0.0, False),
    ("gaussian", 2, "mse", "mup", 1e-2, False),
    ("antisymmetric", 3, "mse", "ntk", 1e-3, True),
])
def test_sgd_in_the_features_span_takes_the_weight_space_steps(init, classes, loss, param, decay, linearised):
    """W = s·W₀ + Cᵀφ with H_b = s·(φW₀ᵀ)_b + (φφᵀ)_b C is the same SGD, summed in another order: float64
    runs agree to rounding, every head (masked or not, several widths, μP weights, decay, a linearised
    head) and the loss curves too; other optimisers are refused."""
    n = 40
    X, y = _features(n, 96, classes, seed=13, dtype=torch.float64)
    n_out = 1 if classes == 2 else classes
    nets = [Net("relu", X, w, n_out, seed=14 + w, init=init, dtype=torch.float64) for w in (32, 64)]
    phi = nets[0].features(X).detach()
    heads = [nets[0].mlp, nets[1].mlp, nets[1].mlp, nets[1].mlp]
    keep = _keep(n, [5, 30, 31])
    frozen = (phi @ torch.cat([h.W.detach() for h in heads]).T > 0) if linearised else None
    spec = TrainSpec(epochs=6, lr=0.5, batch_size=16, weight_decay=decay, optimizer="sgd", loss=loss, param=param)
    span = train_masked(phi, y, classes, heads, keep, spec, seed=15, frozen=frozen, in_span=True)
    weights = train_masked(phi, y, classes, heads, keep, spec, seed=15, frozen=frozen, in_span=False)
    torch.testing.assert_close(span.W, weights.W, rtol=RTOL64, atol=ATOL64)
    torch.testing.assert_close(torch.tensor(span.losses), torch.tensor(weights.losses), rtol=RTOL64, atol=ATOL64)
    assert torch.equal(span.W0, weights.W0) and not torch.allclose(span.W, span.W0)
    with pytest.raises(BadInput, match="plain SGD's in float32; optimizer 'adam'"):
        train_masked(phi, y, classes, heads, keep, replace(spec, optimizer="adam"), in_span=True)


# ---------------------------------------------------------------- (c) masking = deleting

@pytest.mark.parametrize("batch_size", [7, 40])
def test_masking_a_point_equals_deleting_it_from_its_batches(batch_size):
    n = 40
    X, y = _features(n, 32, 3, seed=9, dtype=torch.float64)
    net = Net("relu", X, 32, 3, seed=10, dtype=torch.float64)
    phi = net.features(X).detach()
    spec = TrainSpec(epochs=5, lr=0.5, batch_size=batch_size, weight_decay=1e-3, optimizer="sgd", loss="mse")
    left_out = [0, 13, 39]
    run = train_masked(phi, y, 3, [net.mlp] * 4, _keep(n, left_out), spec, seed=11)
    for j, i in enumerate(left_out):
        deleted = _alone(Net("relu", X, 32, 3, seed=10, dtype=torch.float64).mlp, phi, y, 3, spec, 11, delete=i)
        torch.testing.assert_close(run.W[(j + 1) * 32:(j + 2) * 32], deleted, rtol=RTOL64,
                                   atol=ATOL64)


# ---------------------------------------------------------------- the pieces

@pytest.mark.parametrize("target", ["true", "margin", "sum"])
def test_kernel_loo_scores_are_influence_matrix(target):
    g = torch.Generator().manual_seed(12)
    F = torch.randn(30, 8, generator=g, dtype=torch.float64)
    Ft = torch.randn(9, 8, generator=g, dtype=torch.float64)
    Y = torch.nn.functional.one_hot(torch.randint(0, 4, (30,), generator=g), 4).double()
    yt = torch.randint(0, 4, (9,), generator=g)
    K, K_t = F @ F.T, Ft @ F.T
    loo = kernel_loo(K, K_t, Y, yt, 1e-2)
    torch.testing.assert_close(loo.scored(target, yt), influence_matrix(K, K_t, Y, 1e-2, target, yt),
                               rtol=RTOL64, atol=ATOL64)
    cols = torch.tensor([4, 0, 29])
    torch.testing.assert_close(loo.scored(target, yt, cols), influence_matrix(K, K_t, Y, 1e-2, target, yt)[:, cols],
                               rtol=RTOL64, atol=ATOL64)


def test_flow_loo_refits_the_gradient_flow_without_each_point():
    """Each refit is F'(τ) = F₀' + K'₋ᵢ K₋ᵢ⁻¹ (I − e^{−η'K₋ᵢτ}) (Y − F₀)₋ᵢ (no decay) with the full set's
    η' = 2η/(n·c), computed here with scipy's expm."""
    g = torch.Generator().manual_seed(13)
    n, nt, c = 15, 4, 3
    Fe, Ft = torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randn(nt, 6, generator=g, dtype=torch.float64)
    K, K_t = Fe @ Fe.T + 0.1 * torch.eye(n, dtype=torch.float64), Ft @ Fe.T
    Y = torch.nn.functional.one_hot(torch.randint(0, c, (n,), generator=g), c).double()
    yt = torch.randint(0, c, (nt,), generator=g)
    F0, F0_t = 0.1 * torch.randn(n, c, generator=g, dtype=torch.float64), 0.1 * torch.randn(nt, c, generator=g,
                                                                                            dtype=torch.float64)
    spec = TrainSpec(epochs=7, optimizer="sgd", lr=2.0, batch_size=4, weight_decay=0.0, loss="mse")
    eta, tau = 2 * 2.0 / (n * c), 7 * 4  # 4 batches an epoch

    def flow(Kk, Kt, Yy, F0k):
        Kk, Kt = Kk.numpy(), Kt.numpy()
        return F0_t.numpy() + Kt @ np.linalg.solve(Kk, (np.eye(len(Kk)) - scipy.linalg.expm(-eta * tau * Kk))
                                                   @ (Yy - F0k).numpy())

    full = flow(K, K_t, Y, F0)
    loo = flow_loo(K, K_t, Y, yt, torch.tensor([9, 2]), spec, F0, F0_t)
    assert loo.points.tolist() == [2, 9]
    for j, i in enumerate([2, 9]):
        keep = torch.arange(n) != i
        expected = full - flow(K[keep][:, keep], K_t[:, keep], Y[keep], F0[keep])
        torch.testing.assert_close(loo.D[:, j], torch.from_numpy(expected), rtol=RTOL64_EXPM, atol=ATOL64_EXPM)
    assert torch.equal(loo.jstar, best_other(torch.from_numpy(full), yt))
    with pytest.raises(BadInput, match="plain SGD on MSE"):
        flow_loo(K, K_t, Y, yt, torch.tensor([2]), replace(spec, optimizer="adam"), F0, F0_t)


def test_score_of_one_output_ignores_the_target():
    D = torch.randn(5, 3, 1, dtype=torch.float64)
    for target in ("true", "margin", "sum"):
        assert torch.equal(score(D, target, torch.ones(5, dtype=torch.long)), D[:, :, 0])  # binary labels 0/1
    assert best_other(torch.randn(5, 1), torch.ones(5, dtype=torch.long)).tolist() == [0] * 5
    with pytest.raises(BadInput, match="unknown influence target 'own'; allowed: true, margin, sum"):
        score(D, "own", None)


def test_agreement_against_hand_computed_values():
    a = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    same = agreement(a, a)
    assert same["retrain_spearman"] == pytest.approx(1.0) and same["retrain_pearson"] == pytest.approx(1.0)
    assert same["retrain_sign_agreement"] == 1.0 and same["retrain_rel_error"] == 0.0
    flipped = agreement(-a, a)
    assert flipped["retrain_spearman"] == pytest.approx(-1.0) and flipped["retrain_sign_agreement"] == 0.0
    assert flipped["retrain_rel_error"] == pytest.approx(2.0)
    p = torch.tensor([[0.1, 0.2], [-0.3, 0.4]])
    r = agreement(p, a)
    assert r["retrain_spearman"] == pytest.approx(scipy.stats.spearmanr([0.1, 0.2, -0.3, 0.4], [1, -2, 3, 0.5])[0])
    assert r["retrain_sign_agreement"] == 0.5
    assert r["actual_rms"] == pytest.approx(np.sqrt((1 + 4 + 9 + 0.25) / 4))


def test_picks_are_the_largest_magnitudes_and_a_seeded_draw():
    agg = torch.tensor([0.1, -5.0, 0.3, 2.0, -0.2, 4.0])
    pk = picks(agg, 3, seed=0)
    assert pk["top"].tolist() == [1, 5, 3]
    assert torch.equal(pk["random"], picks(torch.zeros(6), 3, seed=0)["random"])  # independent of the influence
    assert len(set(pk["random"].tolist())) == 3 and not torch.equal(pk["random"], picks(agg, 3, seed=1)["random"])


# ---------------------------------------------------------------- config, estimate, run

def test_bad_settings_are_one_line():
    for kwargs, text in [({"k": 61}, "k = 61 points cannot be left out of n = 60"),
                         ({"attention": "qkv"}, "qkv"),
                         ({"widths": (63,)}, "must be even, got 63"),
                         ({"kernels": ()}, r"kernels must not be empty \(one of entk, kinf\)"),
                         ({"loo": ()}, r"loo must not be empty \(one of ridge, flow\)"),
                         ({"train": TrainSpec(optimizer="adam")}, "loo 'flow' follows plain SGD on MSE, not adam"),
                         ({"kernels": ("rbf",)}, "rbf")]:
        with pytest.raises(BadInput, match=text) as info:
            RetrainConfig(data=SYN, **kwargs)
        assert "\n" not in str(info.value)


def test_estimates_grow_with_every_parameter():
    small = RetrainConfig(data=SYN, widths=(16, 64), seeds=(0,), k=2, train=TrainSpec(epochs=5, optimizer="sgd",
                                                                                        loss="mse"))
    larger = [replace(small, k=4), replace(small, widths=(16, 64, 256)), replace(small, seeds=(0, 1)),
              replace(small, train=replace(small.train, epochs=10)), replace(small, data=replace(SYN, n=62)),
              replace(small, data=replace(SYN, n_test=40))]
    smaller = [replace(small, archs=("relu",)), replace(small, loo=("ridge",)), replace(small, kernels=("entk",))]
    a = estimate(small)
    assert isinstance(a, Estimate) and a.seconds > 0 and a.bytes > 0
    for cfg in larger:
        assert estimate(cfg).seconds > a.seconds, cfg
    for cfg in smaller:
        assert estimate(cfg).seconds < a.seconds, cfg
    assert estimate(replace(small, k=4)).bytes > a.bytes


def test_run_rows_changes_and_summary():
    cfg = RetrainConfig(data=SYN, train=TrainSpec(epochs=4, batch_size=16, optimizer="sgd", lr=1.0,
                                                  weight_decay=0.0, loss="mse"),
                        widths=(16, 64), seeds=(0, 1), k=3)
    res = run_retrain_loo(cfg)
    rows, changes, summary = res.frames["rows"], res.frames["changes"], res.frames["summary"]
    # arch, width, seed, kernel, loo, pick
    assert len(rows) == 2 * 2 * 2 * 2 * 2 * 2 and set(rows["pick"]) == {"top", "random"}
    assert set(rows["kernel"]) == {"entk", "kinf"} and set(rows["loo"]) == {"ridge", "flow"} and (rows["k"] == 3).all()
    assert len(changes) == len(rows) * 3 * 20
    assert res.meta["full_rerun_gap"] == 0.0  # the full run's copy beside the retrainings is the full run
    # every row's numbers are its changes' agreement, recomputed here from the stored pairs
    for _, r in rows.sample(6, random_state=0).iterrows():
        c = changes[(changes.arch == r.arch) & (changes.width == r.width) & (changes.seed == r.seed)
                    & (changes.kernel == r.kernel) & (changes.loo == r.loo) & (changes.pick == r.pick)]
        rho = scipy.stats.spearmanr(c.predicted, c.actual).statistic
        assert r.retrain_spearman == pytest.approx(rho, rel=RTOL64_SAME)
        assert r.retrain_sign_agreement == pytest.approx(float(np.mean(np.sign(c.predicted) == np.sign(c.actual))))
    # the random points are one draw per seed, whatever the arch and width
    rand = changes[changes.pick == "random"].groupby(["seed", "arch", "width"])["point"].apply(
        lambda p: tuple(sorted(set(p))))
    for seed in (0, 1):
        assert len(set(rand.loc[seed])) == 1
    # on the target "true" every prediction is set beside the same retrained changes
    keyed = [changes[(changes.kernel == kern) & (changes.loo == loo)].reset_index(drop=True)
             for kern in ("entk", "kinf") for loo in ("ridge", "flow")]
    for other in keyed[1:]:
        assert np.array_equal(keyed[0].actual, other.actual) and np.array_equal(keyed[0].point, other.point)
    assert not np.array_equal(keyed[0].predicted, keyed[1].predicted)  # ridge and flow predict differently
    assert set(summary["n_seeds"]) == {2} and len(summary) == len(rows) // 2
    assert set(res.meta["stopping_ridge"]) == {"relu", "attn"}


def test_presets_and_probe():
    quick, paper = PRESETS["retrain-loo"]["quick"], PRESETS["retrain-loo"]["paper"]
    assert (quick.data.n, quick.k, quick.widths) == (200, 10, (64, 1024, 4096))
    assert (quick.train.optimizer, quick.train.loss, quick.train.weight_decay) == ("sgd", "mse", 0.0)
    assert quick.init == "antisymmetric" and paper.init == "antisymmetric" and quick.loo == ("ridge", "flow")
    assert estimate(paper).seconds > estimate(quick).seconds
    assert EXPERIMENTS["retrain-loo"].presets["quick"] is quick


def test_width_chart_data_and_reference():
    cfg = RetrainConfig(data=SYN, train=TrainSpec(epochs=2, batch_size=16, optimizer="sgd", loss="mse"),
                        widths=(16, 64), seeds=(0,), k=2, archs=("relu",))
    res = run_retrain_loo(cfg)
    data = plots.retrain_width_data(res.frames["summary"], "retrain_spearman", "top")
    assert len(data) == 2 * 2 * 2 and set(data["kernel"]) == {"entk", "kinf"} and set(data["loo"]) == {"ridge", "flow"}
    for _, g in data.groupby(["kernel", "loo"]):
        assert g["reference_inv_sqrt_m"].iloc[0] == pytest.approx(g["disagreement"].iloc[0])
        assert g["reference_inv_sqrt_m"].iloc[1] == pytest.approx(g["disagreement"].iloc[0] / 2)  # 4x the width
    np.testing.assert_allclose(data["disagreement"], 1 - data["mean"])
    fig = plots.retrain_width_fig(data)
    main = export.main_figure("retrain-loo", res)
    assert "1 − Spearman ρ against width" in main.layout.title.text and len(main.data) == len(fig.data)
    with pytest.raises(BadInput, match="unknown metric 'lin_gap' for retrain-loo; allowed: retrain_spearman"):
        export.main_figure("retrain-loo", res, "lin_gap")
    assert len(fig.data) == 2 * 2 * 2 and fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"


@pytest.mark.parametrize("page,n", [("pages/influence.py", 40), ("pages/dynamics.py", 44)])
def test_page_section_waits_for_its_button_then_shows_the_chart(page, n, tmp_path, monkeypatch):
    """The section never starts by itself; one click runs it and the chart appears. (Each page gets its own n:
    the job manager is the server's, so a second page asking for the same config would get the first's job.)"""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from tests.conftest import steady_app_state
    from ui.common import Shared, get_manager

    steady_app_state(monkeypatch, tmp_path / "cache", tmp_path / "no-data")
    root = Path(__file__).resolve().parents[1]
    at = AppTest.from_file(str(root / page), default_timeout=600)
    at.session_state["shared"] = Shared(base="synthetic", classes="0-1", n=n, n_test=20, widths=(16, 64),
                                        archs=("relu",))
    at.query_params.update({"regime.epochs": "2", "regime.seeds": "1", "regime.cc_steps": "1",
                            "influence.epochs": "2"})

    def settle():
        at.run()
        while at.get("progress"):
            for job in get_manager().jobs():
                job.wait()
            at.run()

    settle()
    assert not at.exception, at.exception
    before = len(at.get("plotly_chart"))
    (button,) = [b for b in at.button if b.label == "Retrain without each point"]  # waits: never starts unasked
    assert not [j for j in get_manager().jobs() if j.kind == "retrain-loo" and not j.done]
    button.click()
    settle()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == before + 1
    assert not [b for b in at.button if b.label == "Retrain without each point"]


def test_span_run_reads_new_rows_and_keeps_snapshots_without_forming_weights():
    """``span.SpanRun``: pre-activations of new rows, s·X W₀ᵀ + (X φᵀ) C, are those of the weights it
    forms (X Wᵀ), and the weights kept after epoch e are those a run of e epochs ends with."""
    from engine.maths.span import sgd_in_span

    n = 40
    X, y = _features(n, 96, 3, seed=21, dtype=torch.float64)
    Xt, _ = _features(12, 96, 3, seed=22, dtype=torch.float64)
    net = Net("relu", X, 32, 3, seed=23, init="antisymmetric", dtype=torch.float64)
    phi, phi_t = net.features(X).detach(), net.features(Xt).detach()
    keep = _keep(n, [3, 17]).to(phi.dtype)
    spec = TrainSpec(epochs=4, lr=0.5, batch_size=16, weight_decay=1e-2, optimizer="sgd", loss="mse")
    run = sgd_in_span(phi, y, 3, [net.mlp] * 3, keep, spec, 5, None, None, None, None, "mse", snapshots=(0, 2))
    torch.testing.assert_close(run.pre_activations(phi_t), phi_t @ run.W.T, rtol=RTOL64, atol=ATOL64)
    assert torch.equal(run.W_at(0), run.W0)
    short = sgd_in_span(phi, y, 3, [net.mlp] * 3, keep, replace(spec, epochs=2), 5, None, None, None, None, "mse")
    torch.testing.assert_close(run.W_at(2), short.W, rtol=0, atol=0)
    with pytest.raises(BadInput, match="no snapshot at epoch 3; kept: \\[0, 2\\]"):
        run.W_at(3)
