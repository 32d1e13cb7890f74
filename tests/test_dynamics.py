"""engine.experiments.dynamics: the linearised head against torch.func, K∞ gradient flow against scipy's expm,
μP's scalings against theory, and the run, CLI and page around them."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch

from engine import cli
from engine.data import DataSpec, load_sample
from engine.experiments.calibration import estimate
from engine.experiments.configs.coord_check import CoordCheckConfig
from engine.experiments.configs.dynamics import PRESETS, DynamicsConfig
from engine.experiments.coord_check import run_coord_check
from engine.experiments.dynamics import run_dynamics, width_slopes
from engine.experiments.registry import EXPERIMENTS
from engine.maths.flow import KernelFlow, linearised_head, train_pair
from engine.maths.models import Net, TwoLayerReLU
from engine.maths.specs import TrainSpec
from engine.maths.training import train
from engine.runtime.errors import BadInput
from reference import arccos_ntk
from tests.conftest import (
    ATOL64,
    ATOL64_EXPM,
    ATOL64_STEP,
    ATOL_ONE_OF_40,
    RTOL32,
    RTOL64,
    RTOL64_EXPM,
    RTOL64_SAME,
    RTOL64_STEP,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = DataSpec("synthetic", n=48, n_test=32, synthetic_d=12, synthetic_classes=2)   # MSE, one output
MULTI = DataSpec("synthetic", n=48, n_test=32, synthetic_d=12, synthetic_classes=3)  # CE, three outputs
SLOPE_TOL = 0.3   # log-log slopes over a factor 8 of step sizes
COORD_TOL = 0.15  # coordinate-check slopes over widths 64 … 4096


def _sample64(spec):
    s = load_sample(spec)
    return s.X.double(), s.y, s.X_test.double(), s.y_test


# ---------------------------------------------------------------- the linearisation

@pytest.mark.parametrize("param", ["ntk", "mup"])
def test_linearised_head_equals_the_net_at_init_exactly(param):
    X, _, Xt, _ = _sample64(MULTI)
    net = Net("attn", X.float(), 256, 3, seed=1, param=param)
    phi = net.features(Xt.float())
    W0 = net.mlp.W.detach()
    f_lin = linearised_head(phi, W0, phi @ W0.T > 0, net.mlp.readout())
    assert torch.equal(f_lin, torch.relu(phi @ W0.T) @ net.mlp.readout())
    res = run_dynamics(DynamicsConfig(data=MULTI, train=TrainSpec(epochs=2, batch_size=16), widths=(16, 64),
                                      seeds=(0,), record_every=1))
    at0 = res.frames["rows"].query("epoch == 0")
    assert (at0.lin_gap == 0.0).all() and (at0.pattern_change == 0.0).all()
    assert (at0.train_loss == at0.train_loss_lin).all() and (at0.test_acc == at0.test_acc_lin).all()


def test_linearised_head_is_the_first_order_taylor_model_of_torch_func():
    """f_lin(W) = f(W0) + J(W0)(W − W0), J from torch.func.jvp of the real net, float64."""
    X, _, Xt, _ = _sample64(BIN)
    for param in ("ntk", "mup"):
        head = TwoLayerReLU(12, 64, 2, seed=3, dtype=torch.float64, param=param)
        phi = Xt / Xt.norm(dim=1, keepdim=True)
        W0 = head.W.detach().clone()
        W = W0 + 0.3 * torch.randn(W0.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        f = lambda w, head=head, phi=phi: torch.func.functional_call(head, {"W": w}, (phi,))  # noqa: E731
        f0, jvp = torch.func.jvp(f, (W0,), (W - W0,))
        torch.testing.assert_close(linearised_head(phi, W, phi @ W0.T > 0, head.readout()), f0 + jvp,
                                   rtol=RTOL64, atol=ATOL64)


# n = 48 points: d = 12 trains in weight space, d = 64 (n < 2d) plain SGD in the features' span
WIDE = replace(BIN, synthetic_d=64)


@pytest.mark.parametrize("param,optimizer,wd,data", [("ntk", "sgd", 0.01, BIN), ("mup", "sgd", 0.0, BIN),
                                                     ("ntk", "adam", 1e-3, BIN), ("ntk", "sgd", 0.01, WIDE),
                                                     ("mup", "sgd", 0.0, WIDE)])
def test_linearised_training_follows_the_jvp_model_and_the_net_follows_engine_training(param, optimizer, wd, data):
    """Two epochs of train_pair against (a) the jvp model trained by hand with torch's own
    optimiser on the same batches, (b) engine.maths.training.train of the same net (float64)."""
    X, y, _, _ = _sample64(data)
    spec = TrainSpec(epochs=2, batch_size=16, optimizer=optimizer, lr=0.3 if optimizer == "sgd" else 0.01,
                     weight_decay=wd, param=param)
    net = Net("relu", X, 32, 1, seed=2, dtype=torch.float64)
    phi = net.features(X)
    W, W_lin, W0 = train_pair([net], phi, y, 2, spec, seed=4)

    head = net.mlp
    f = lambda w, rows: torch.func.functional_call(head, {"W": w}, (rows,))  # noqa: E731
    Wr = torch.nn.Parameter(W0.clone())
    opt = (torch.optim.SGD([Wr], lr=spec.lr, weight_decay=wd) if optimizer == "sgd"
           else torch.optim.Adam([Wr], lr=spec.lr, weight_decay=wd))
    g = torch.Generator().manual_seed(4 + 7919)
    scale = head.width if param == "mup" else 1.0
    Y = (2.0 * y.double() - 1.0)[:, None]
    for _ in range(spec.epochs):
        order = torch.randperm(X.shape[0], generator=g)
        for start in range(0, X.shape[0], spec.batch_size):
            idx = order[start:start + spec.batch_size]
            f0, jvp = torch.func.jvp(lambda w, rows=phi[idx]: f(w, rows), (W0,), (Wr - W0,))
            opt.zero_grad()
            (scale * ((f0 + jvp - Y[idx]) ** 2).mean()).backward()
            opt.step()
    torch.testing.assert_close(W_lin, Wr.detach(), rtol=RTOL64, atol=ATOL64)
    assert not torch.allclose(W_lin, W)  # the real net left its linearisation

    twin = Net("relu", X, 32, 1, seed=2, dtype=torch.float64)
    train(twin, X, y, 2, spec, seed=4)
    torch.testing.assert_close(W, twin.mlp.W.detach(), rtol=RTOL64_STEP * 100, atol=ATOL64_STEP * 100)


def test_recorded_weights_in_the_span_are_those_of_shorter_runs():
    """In the features' span train_pair records each epoch from snapshots after both runs: the weights
    recorded at epoch e are those a run of e epochs ends with, for the net and its linearisation."""
    X, y, _, _ = _sample64(WIDE)
    spec = TrainSpec(epochs=3, batch_size=16, optimizer="sgd", lr=0.3, weight_decay=0.01)
    net = Net("relu", X, 32, 1, seed=2, dtype=torch.float64)
    phi = net.features(X)
    seen = {}
    W, W_lin, W0 = train_pair([net], phi, y, 2, spec, seed=4, record=(0, 1, 3),
                              on_record=lambda e, a, b: seen.setdefault(e, (a.clone(), b.clone())))
    assert sorted(seen) == [0, 1, 3]
    assert torch.equal(seen[0][0], W0) and torch.equal(seen[0][1], W0)
    torch.testing.assert_close(seen[3][0], W, rtol=0, atol=0)
    torch.testing.assert_close(seen[3][1], W_lin, rtol=0, atol=0)
    W1, W1_lin, _ = train_pair([net], phi, y, 2, replace(spec, epochs=1), seed=4)
    torch.testing.assert_close(seen[1][0], W1, rtol=RTOL64, atol=ATOL64)
    torch.testing.assert_close(seen[1][1], W1_lin, rtol=RTOL64, atol=ATOL64)


def test_gap_after_one_step_scales_with_the_step_size():
    """ReLU makes f piecewise linear in W: after a step of size η only the units whose sign
    flips (a share ∝ η) leave the linearisation, each by at most |Δh| ∝ η. The hidden layer's
    error Σ relu(h) − 1[h0 > 0] h ≥ 0 adds up coherently, so it grows like η²; in the output
    those terms carry the random signs a_r, so at finite width ‖f − f_lin‖ grows like η^(3/2)
    (its coherent part, ∝ η², is smaller at these widths)."""
    X, y, Xt, _ = _sample64(replace(BIN, n=64, n_test=128))
    lrs = (0.125, 0.25, 0.5, 1.0)
    hidden, output = [], []
    for lr in lrs:
        net = Net("relu", X, 2048, 1, seed=0, dtype=torch.float64)
        phi, phit = net.features(X), net.features(Xt)
        W, W_lin, W0 = train_pair([net], phi, y, 2, TrainSpec(epochs=1, batch_size=64, optimizer="sgd", lr=lr,
                                                                 weight_decay=0.0))
        assert torch.equal(W, W_lin)  # one full-batch step: both start with the same gradient
        H, mask0 = phit @ W.T, phit @ W0.T > 0
        hidden.append(float((torch.relu(H) - H.masked_fill(~mask0, 0.0)).mean()))
        output.append(float(torch.linalg.norm(torch.relu(H) @ net.mlp.readout()
                                              - linearised_head(phit, W, mask0, net.mlp.readout()))))
    slope = lambda v: np.polyfit(np.log(lrs), np.log(v), 1)[0]  # noqa: E731
    assert abs(slope(hidden) - 2.0) < SLOPE_TOL, hidden
    assert abs(slope(output) - 1.5) < SLOPE_TOL, output


# ---------------------------------------------------------------- K∞ gradient flow

def _expm_flow(K, K_t, Y, F0, F0_t, eta, beta, tau):
    """The linear ODE of the module docstring solved by one matrix exponential (scipy)."""
    n, nt = K.shape[0], K_t.shape[0]
    M = np.zeros((n + nt + 1, n + nt + 1))
    M[:n, :n] = -(eta * K + beta * np.eye(n))
    M[n:n + nt, :n] = -eta * K_t
    M[n:n + nt, n:n + nt] = -beta * np.eye(nt)
    M[:n, -1] = eta * (K @ Y)
    M[n:n + nt, -1] = eta * (K_t @ Y)
    z = scipy.linalg.expm(M * tau) @ np.concatenate([F0, F0_t, [1.0]])
    return z[n:n + nt]


@pytest.mark.parametrize("beta", [0.0, 0.02])
def test_kernel_flow_against_scipy_expm(beta):
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(9, 4))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    K, K_t = arccos_ntk(Z[:6], Z[:6]), arccos_ntk(Z[6:], Z[:6])
    Y, F0, F0_t = rng.choice([-1.0, 1.0], 6), rng.normal(size=6), rng.normal(size=3)
    flow = KernelFlow(torch.tensor(K), torch.tensor(K_t))
    for tau in (0.0, 3.0, 40.0):
        got = flow.predict(torch.tensor(Y)[:, None], torch.tensor(F0)[:, None], torch.tensor(F0_t)[:, None],
                           0.7, beta, tau)[:, 0].numpy()
        np.testing.assert_allclose(got, _expm_flow(K, K_t, Y, F0, F0_t, 0.7, beta, tau),
                                   rtol=RTOL64_EXPM, atol=ATOL64_EXPM)


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_k_inf_gap_of_a_run_against_a_direct_computation(wd):
    """η' = 2η/(n·c) for the engine's mean-squared loss, τ = epochs·⌈n/B⌉ steps, β = ηλ."""
    data = DataSpec("synthetic", n=10, n_test=5, synthetic_d=6, synthetic_classes=2)
    spec = TrainSpec(epochs=3, batch_size=4, optimizer="sgd", lr=0.4, weight_decay=wd)
    res = run_dynamics(DynamicsConfig(data=data, train=spec, widths=(64,), archs=("relu",), seeds=(0,),
                                      record_every=1))
    rows = res.frames["rows"]
    assert res.meta["flow"] == pytest.approx([2 * 0.4 / 10, 0.4 * wd, 3])
    s = load_sample(data)
    Z = (s.X / s.X.norm(dim=1, keepdim=True)).double().numpy()
    Zt = (s.X_test / s.X_test.norm(dim=1, keepdim=True)).double().numpy()
    K, K_t = arccos_ntk(Z, Z), arccos_ntk(Zt, Z)
    Y = 2.0 * s.y.double().numpy() - 1.0
    net = Net("relu", s.X.float(), 64, 1, seed=0)
    with torch.no_grad():
        F0, F0_t = net(s.X.float())[:, 0].double().numpy(), net(s.X_test.float())[:, 0].double().numpy()
    for epoch in (1, 3):
        twin = Net("relu", s.X.float(), 64, 1, seed=0)
        train(twin, s.X.float(), s.y, 2, replace(spec, epochs=epoch), seed=0)
        with torch.no_grad():
            f_t = twin(s.X_test.float())[:, 0].double().numpy()
        f_k = _expm_flow(K, K_t, Y, F0, F0_t, 2 * 0.4 / 10, 0.4 * wd, epoch * 3)
        want = np.linalg.norm(f_t - f_k) / np.linalg.norm(f_k)
        assert rows.query("epoch == @epoch").k_inf_gap.iloc[0] == pytest.approx(want, rel=RTOL32 * 10)


def test_k_inf_gap_is_missing_without_mse_and_sgd():
    for data, spec in [(MULTI, TrainSpec(epochs=1, optimizer="sgd")), (BIN, TrainSpec(epochs=1))]:
        rows = run_dynamics(DynamicsConfig(data=data, train=spec, widths=(16,), archs=("relu",), seeds=(0,)))
        assert rows.frames["rows"].k_inf_gap.isna().all()


# ---------------------------------------------------------------- the run

def test_run_rows_summary_and_cache(cache):
    cfg = DynamicsConfig(data=BIN, train=TrainSpec(epochs=6, batch_size=16, optimizer="sgd", lr=0.5,
                                                   weight_decay=0.0), widths=(32, 512), seeds=(0, 1), record_every=4)
    stages = []
    res = run_dynamics(cfg, cache, progress=lambda f, s: stages.append(f))
    rows, summary, final = res.frames["rows"], res.frames["summary"], res.frames["final"]
    assert sorted(set(rows.epoch)) == [0, 4, 6] and len(rows) == 2 * 2 * 2 * 3
    assert set(rows.step) == {0, 12, 18}  # ⌈48/16⌉ = 3 steps an epoch
    assert (rows.query("epoch > 0").lin_gap > 0).all() and rows.k_inf_gap.notna().all()
    assert len(final) == 4 and (final.epoch == 6).all() and (final.n_seeds == 2).all()
    v = rows.query("arch == 'relu' and width == 32 and epoch == 6").lin_gap.to_numpy()
    got = summary.query("arch == 'relu' and width == 32 and epoch == 6").iloc[0]
    assert got.lin_gap_mean == pytest.approx(v.mean(), rel=RTOL64_SAME)
    assert got.lin_gap_sd == pytest.approx(v.std(ddof=1))
    assert stages == sorted(stages) and stages[-1] == 1.0
    again = run_dynamics(cfg, cache)
    assert again.cached and again.frames["rows"].lin_gap.tolist() == rows.lin_gap.tolist()
    slopes = width_slopes(final)
    assert set(slopes.metric) == {"lin_gap", "pattern_change"} and slopes.slope.notna().all()


def test_qkv_attention_is_refused():
    with pytest.raises(BadInput, match="qkv"):
        DynamicsConfig(attention="qkv")


def test_estimates_grow_with_every_parameter():
    base = DynamicsConfig(data=BIN, widths=(64,))
    for bigger in (replace(base, widths=(64, 256)), replace(base, seeds=(0, 1, 2, 3)),
                   replace(base, train=replace(base.train, epochs=500)), replace(base, data=replace(BIN, n=4000)),
                   replace(base, record_every=1)):
        assert estimate(bigger).seconds > estimate(base).seconds
    cc = CoordCheckConfig(data=BIN, widths=(64,))
    assert estimate(replace(cc, widths=(64, 4096))).seconds > estimate(replace(cc, steps=1)).seconds


# ---------------------------------------------------------------- μP

def test_mup_head_is_the_ntk_head_over_sqrt_width():
    X, _, _, _ = _sample64(BIN)
    ntk, mup = TwoLayerReLU(12, 100, 2, seed=1, dtype=torch.float64), TwoLayerReLU(12, 100, 2, seed=1,
                                                                                  dtype=torch.float64, param="mup")
    torch.testing.assert_close(mup(X), ntk(X) / 10.0, rtol=RTOL64, atol=ATOL64)
    assert mup.output_scale == 1 / 100 and ntk.output_scale == 1 / 10
    with pytest.raises(BadInput, match="param"):
        TwoLayerReLU(12, 100, 2, param="sp")


def test_mup_sgd_is_learning_rate_times_width_with_decay_over_width():
    """TrainSpec(param="mup", lr=η, weight_decay=λ) on SGD = plain SGD of the m^-1 head with
    learning rate η·m and coupled L2 λ/m (Tensor Programs V, Table 3, input weights)."""
    X, y, _, _ = _sample64(BIN)
    m, eta, lam = 64, 0.05, 0.02
    net = Net("relu", X, m, 1, seed=0, dtype=torch.float64)
    train(net, X, y, 2, TrainSpec(epochs=2, batch_size=16, optimizer="sgd", lr=eta, weight_decay=lam, param="mup"))
    assert net.mlp.param == "mup"
    ref = Net("relu", X, m, 1, seed=0, dtype=torch.float64, param="mup")
    phi = ref.features(X)
    opt = torch.optim.SGD([ref.mlp.W], lr=eta * m, weight_decay=lam / m)
    g = torch.Generator().manual_seed(7919)
    Y = (2.0 * y.double() - 1.0)[:, None]
    for _ in range(2):
        order = torch.randperm(48, generator=g)
        for start in range(0, 48, 16):
            idx = order[start:start + 16]
            opt.zero_grad()
            ((ref.head(phi[idx]) - Y[idx]) ** 2).mean().backward()
            opt.step()
    torch.testing.assert_close(net.mlp.W.detach(), ref.mlp.W.detach(), rtol=RTOL64, atol=ATOL64)


def test_mup_refuses_trainable_attention():
    X, y, _, _ = _sample64(BIN)
    net = Net("attn", X.float(), 16, 1, attention="qkv")
    with pytest.raises(BadInput, match="mup"):
        train(net, X.float(), y, 2, TrainSpec(epochs=1, param="mup"))


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.1), ("adam", 1e-3)])
def test_coordinate_check_slopes_follow_theory(optimizer, lr):
    """Δh ∝ m^-1/2 under NTK + SGD, Δf ∝ m^+1/2 under NTK + Adam, everything flat under μP."""
    cfg = CoordCheckConfig(data=DataSpec("synthetic", n=128, n_test=64, synthetic_d=32, synthetic_classes=2),
                           train=TrainSpec(epochs=1, optimizer=optimizer, lr=lr, batch_size=64, weight_decay=0.0),
                           widths=(64, 256, 1024, 4096), steps=3, seeds=(0, 1))
    fit = run_coord_check(cfg).frames["fit"]
    assert len(fit) == 2 * 3 * 2 and fit.slope.notna().all()
    bad = fit[(fit.slope - fit.theory).abs() > COORD_TOL]
    assert bad.empty, bad


# ---------------------------------------------------------------- CLI and page

def test_cli_defaults_and_presets_are_the_engine_configs():
    cmd = EXPERIMENTS["dynamics"]
    assert cli.config_from_args(cmd, cli.build_parser().parse_args(["dynamics"])) == DynamicsConfig()
    for preset in ("quick", "paper"):
        ns = cli.build_parser(preset).parse_args(["dynamics", "--preset", preset])
        assert cli.config_from_args(cmd, ns) == PRESETS["dynamics"][preset]
    ns = cli.build_parser().parse_args(["ntk-sweep", "--param", "mup"])  # every training command has --param
    assert cli.config_from_args(EXPERIMENTS["ntk-sweep"], ns).train.param == "mup"


@pytest.mark.slow
def test_cli_dynamics_json(tmp_path):
    p = subprocess.run([sys.executable, "-m", "engine", "dynamics", "--dataset", "synthetic", "--n", "40",
                        "--n-test", "20", "--synthetic-classes", "2", "--widths", "16,64", "--archs", "relu,attn",
                        "--epochs", "4", "--optimizer", "sgd", "--seeds", "0", "--record-every", "2", "--json",
                        "--cache-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert [(r["arch"], r["width"], r["epoch"]) for r in obj["rows"][:3]] == [("relu", 16, 0), ("relu", 64, 0),
                                                                              ("relu", 16, 2)]
    assert len(obj["rows"]) == 2 * 2 * 3 and len(obj["summary"]) == 2 * 2 * 3
    assert all(r["k_inf_gap"] is not None for r in obj["rows"]) and obj["meta"]["loss"] == "mse"
    assert "epoch 4/4" in p.stderr


def test_page_renders_and_binds_its_settings_to_the_url(tmp_path, monkeypatch):
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.testing.v1 import AppTest

    from ui.common import Shared

    init = PagesManager.__init__

    def steady_init(self, *args, **kwargs):  # as tests/test_app.py: the server's steady state
        init(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", steady_init)
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    at = AppTest.from_file(str(ROOT / "pages" / "dynamics.py"), default_timeout=600)
    at.session_state["shared"] = Shared(base="synthetic", classes="0-1", n=40, n_test=20, widths=(16, 64))
    at.query_params.update({"regime.epochs": "4", "regime.seeds": "1", "regime.cc_steps": "2"})
    at.run()
    from ui.common import get_manager

    while at.get("progress"):  # wait on the jobs themselves, not on a clock
        for job in get_manager().jobs():
            job.wait()
        at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 6  # 4 dynamics charts, the K∞ flow (binary, SGD), the coordinate check
    assert at.number_input(key="regime.epochs").value == 4


def test_lin_gap_is_the_relative_frobenius_distance_to_the_linearisation():
    from engine.maths.flow import lin_gap

    g = torch.Generator().manual_seed(3)
    f, f_lin = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g)
    a, b = f.double().numpy(), f_lin.double().numpy()
    assert lin_gap(f, f_lin) == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=RTOL64)
    assert lin_gap(f_lin, f_lin) == 0.0 and np.isnan(lin_gap(f, torch.zeros(7, 3)))


@pytest.mark.parametrize("classes", [2, 3])
def test_train_accuracy_is_the_trained_nets_own(classes):
    """train_acc at epoch e is engine.maths.training's accuracy of the same net trained e epochs, on the
    training set (a point on the decision boundary may fall either way in float32)."""
    from engine.maths.training import accuracy

    data = DataSpec("synthetic", n=40, n_test=10, synthetic_d=6, synthetic_classes=classes)
    spec = TrainSpec(epochs=4, batch_size=16, optimizer="sgd", lr=0.5, weight_decay=0.0)
    rows = run_dynamics(DynamicsConfig(data=data, train=spec, widths=(64,), archs=("relu",), seeds=(0,),
                                       record_every=2)).frames["rows"]
    s = load_sample(data)
    n_out = 1 if classes == 2 else classes
    for epoch in (0, 2, 4):
        twin = Net("relu", s.X.float(), 64, n_out, seed=0)
        train(twin, s.X.float(), s.y, classes, replace(spec, epochs=epoch), seed=0)
        got = rows.query("epoch == @epoch").train_acc.iloc[0]
        assert got == pytest.approx(accuracy(twin, s.X.float(), s.y), abs=ATOL_ONE_OF_40), epoch
