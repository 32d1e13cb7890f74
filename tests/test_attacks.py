"""engine.maths.attacks against a plain numpy reimplementation (loss, gradient and update rules) in float64."""

import math

import numpy as np
import pytest
import torch

from conftest import ATOL64, RTOL64
from engine.maths.attacks import _project, _random_start, attack, training_loss
from engine.maths.models import Net
from engine.maths.specs import AttackNorm, AttackSpec, TrainSpec
from engine.maths.training import train
from engine.runtime.errors import BadInput
from reference import attack as np_attack, loss_grad, project, step_direction

NORMS = ("linf", "l2")


def _tiny(arch, loss="ce", n=8, d=5, width=16, seed=0):
    """A float64 Net at init on random [0, 1] inputs, and its numpy loss/gradient."""
    g = torch.Generator().manual_seed(seed)
    X = 0.1 + 0.8 * torch.rand(n, d, generator=g, dtype=torch.float64)
    c = 3 if loss == "ce" else 2
    y = torch.arange(n) % c
    net = Net(arch, X, width, c if loss == "ce" else 1, seed=seed + 1, dtype=torch.float64)
    W, a = net.mlp.W.detach().numpy(), net.mlp.a.numpy()
    return net, X, y, c, lambda Xn: loss_grad(Xn, y.numpy(), W, a, arch, loss)


def _close(got, expected):
    np.testing.assert_allclose(got.numpy() if torch.is_tensor(got) else got, expected, rtol=RTOL64, atol=ATOL64)


# ---------------------------------------------------------------- the reference itself

@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("loss", ["ce", "mse"])
def test_numpy_reference_loss_and_gradient_agree_with_autograd(arch, loss):
    net, X, y, c, f = _tiny(arch, loss)
    Xg = X.clone().requires_grad_(True)
    value = training_loss(net, Xg, y, loss, c)
    (g,) = torch.autograd.grad(value, Xg)
    ref_value, ref_g = f(X.numpy())
    assert value.item() == pytest.approx(ref_value, rel=RTOL64, abs=ATOL64)
    _close(g, ref_g)


# ---------------------------------------------------------------- one step of each method

@pytest.mark.parametrize("arch,loss", [("relu", "ce"), ("attn", "ce"), ("attn", "mse")])
@pytest.mark.parametrize("norm", NORMS)
def test_fgsm_step_matches_numpy(arch, loss, norm):
    net, X, y, c, f = _tiny(arch, loss)
    got = attack(net, X, y, c, AttackSpec("fgsm", 0.05, norm=norm), loss, box=None)
    expected, _, _ = np_attack(f, X.numpy(), "fgsm", norm, 0.05)
    _close(got, expected)
    moved = np.abs(expected - X.numpy())
    if norm == "linf":
        _close(moved, np.full_like(moved, 0.05))  # every coordinate moves by exactly ε
    else:
        _close(np.linalg.norm(moved, axis=1), np.full(len(moved), 0.05))


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("norm", NORMS)
def test_pgd_steps_match_numpy_with_the_projection_active(arch, norm):
    """Two steps of 0.7·ε: the second one leaves the ball, so the projection matters."""
    net, X, y, c, f = _tiny(arch)
    spec = AttackSpec("pgd", 0.05, steps=2, step_size=0.035, norm=norm)
    got = attack(net, X, y, c, spec, "ce", box=None)
    expected, iterates, losses = np_attack(f, X.numpy(), "pgd", norm, 0.05, steps=2, alpha=0.035)
    _close(got, expected)
    assert int(np.argmax(losses)) == 2  # the comparison covers both steps, not the clean start
    unprojected = iterates[1] + 0.035 * step_direction(f(iterates[1])[1], norm) - X.numpy()
    size = np.abs(unprojected).max() if norm == "linf" else np.linalg.norm(unprojected, axis=1).max()
    assert size > 0.05 * (1 + 1e-3)


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_mim_two_steps_match_numpy(arch, norm, mu):
    """Step two uses μ·v₁ + g₂/‖g₂‖₁: a momentum bug changes it (μ = 0: PGD on ℓ1-normalised g)."""
    net, X, y, c, f = _tiny(arch)
    spec = AttackSpec("mim", 0.05, steps=2, step_size=0.02, momentum=mu, norm=norm)
    got = attack(net, X, y, c, spec, "ce", box=None)
    expected, _, losses = np_attack(f, X.numpy(), "mim", norm, 0.05, steps=2, alpha=0.02, mu=mu)
    _close(got, expected)
    assert int(np.argmax(losses)) == 2


def test_mim_momentum_changes_the_second_step():
    """Guards the MIM test above: with these inputs μ = 0 and μ = 0.9 give different points."""
    net, X, y, c, _ = _tiny("attn")
    a, b = (attack(net, X, y, c, AttackSpec("mim", 0.05, steps=2, step_size=0.02, momentum=mu, norm="l2"), "ce",
                   box=None) for mu in (0.0, 0.9))
    assert (a - b).abs().max() > 1e-4


@pytest.mark.parametrize("norm", NORMS)
def test_pgd_with_one_step_equals_fgsm(norm):
    for arch in ("relu", "attn"):
        net, X, y, c, _ = _tiny(arch)
        fgsm = attack(net, X, y, c, AttackSpec("fgsm", 0.1, norm=norm), "ce")
        pgd = attack(net, X, y, c, AttackSpec("pgd", 0.1, steps=1, step_size=0.1, norm=norm), "ce")
        assert torch.equal(fgsm, pgd)


# ---------------------------------------------------------------- projection, box, mask

def test_l2_projection_matches_numpy_and_keeps_inner_points():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(50, 7, generator=g, dtype=torch.float64)
    Xp = X + torch.randn(50, 7, generator=g, dtype=torch.float64) * torch.linspace(0.01, 1.0, 50)[:, None]
    eps = 0.4
    got = _project(Xp, X, eps, None, AttackNorm.L2)
    _close(got, project(Xp.numpy(), X.numpy(), eps, "l2", None))
    norms = (got - X).norm(dim=1)
    inside = (Xp - X).norm(dim=1) <= eps
    assert 0 < int(inside.sum()) < 50
    assert torch.equal(got[inside], Xp[inside])
    _close(norms[~inside], np.full(int((~inside).sum()), eps))  # outer points land on the sphere


@pytest.mark.parametrize("norm", NORMS)
def test_box_clipping_matches_numpy_and_stays_in_the_ball(norm):
    """Inputs close to 0 and 1 with a large ε: the box clips, after the ball."""
    net, X, y, c, f = _tiny("attn")
    X = torch.where(torch.arange(5) % 2 == 0, X * 0.05, 1 - X * 0.05)  # coordinates near the faces
    net = Net("attn", X, 16, 3, seed=1, dtype=torch.float64)
    W, a = net.mlp.W.detach().numpy(), net.mlp.a.numpy()
    f = lambda Xn: loss_grad(Xn, y.numpy(), W, a, "attn", "ce")  # noqa: E731
    eps = 0.3 if norm == "linf" else 0.6
    got = attack(net, X, y, c, AttackSpec("pgd", eps, steps=3, norm=norm), "ce", box=(0.0, 1.0))
    expected, _, _ = np_attack(f, X.numpy(), "pgd", norm, eps, steps=3, box=(0.0, 1.0))
    _close(got, expected)
    assert got.min() >= 0 and got.max() <= 1
    assert ((got == 0) | (got == 1)).sum() > 0  # the box was active
    free, _, _ = np_attack(f, X.numpy(), "pgd", norm, eps, steps=3)
    assert (free.min() < 0) or (free.max() > 1)  # without the box the same attack leaves it
    delta = (got - X).abs().amax(1) if norm == "linf" else (got - X).norm(dim=1)
    assert (delta <= eps * (1 + RTOL64)).all()


@pytest.mark.parametrize("method", ["fgsm", "pgd", "mim"])
@pytest.mark.parametrize("norm", NORMS)
def test_mask_keeps_other_rows_bit_for_bit(method, norm):
    """Fixed rows stay exact, even one outside the box that clipping would otherwise move."""
    net, X, y, c, f = _tiny("attn")
    X = X.clone()
    X[6, 0] = 1.2
    mask = torch.zeros(8, dtype=torch.bool)
    mask[:3] = True
    spec = AttackSpec(method, 0.1, steps=3, random_start=True, norm=norm)
    got = attack(net, X, y, c, spec, "ce", mask=mask)
    assert torch.equal(got[3:], X[3:])
    assert bool(((got[:3] - X[:3]).abs().amax(1) > 1e-3).all())
    if method != "pgd":  # PGD's random start is not reproduced in numpy
        box = (-math.inf, math.inf)  # numpy: no clipping, so row 6 stays where it is
        expected, _, _ = np_attack(f, X.numpy(), method, norm, 0.1, steps=3, move=mask.numpy(), box=box)
        _close(got[:3], expected[:3])


# ---------------------------------------------------------------- iterates and strength

@pytest.mark.parametrize("method,norm,mult,mu", [("pgd", "linf", 1.5, 1.0), ("pgd", "l2", 1.5, 1.0),
                                                 ("mim", "linf", 1.5, 0.5), ("mim", "l2", 4.0, 0.5)])
def test_returns_the_best_iterate_of_the_numpy_run(method, norm, mult, mu):
    """Steps larger than ε overshoot, so the loss goes up and down: the result is an inner iterate."""
    net, X, y, c, f = _tiny("attn", seed=5)
    eps = 0.2 if norm == "linf" else 0.4
    spec = AttackSpec(method, eps, steps=6, step_size=mult * eps, momentum=mu, norm=norm)
    got = attack(net, X, y, c, spec, "ce", box=None)
    expected, iterates, losses = np_attack(f, X.numpy(), method, norm, eps, steps=6, alpha=mult * eps, mu=mu)
    best = int(np.argmax(losses))
    assert 0 < best < len(losses) - 1, losses  # neither the start nor the last iterate
    _close(got, expected)
    assert not np.allclose(iterates[-1], expected)  # returning the last iterate would fail


@pytest.fixture(scope="module")
def trained():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(40) % 3
    centers = torch.rand(3, 16, generator=g, dtype=torch.float64)
    X = (centers[y] + 0.2 * torch.rand(40, 16, generator=g, dtype=torch.float64)).clamp(0, 1)
    nets = {}
    for arch in ("relu", "attn"):
        net = Net(arch, X, 128, 3, seed=1, dtype=torch.float64)
        train(net, X, y, 3, TrainSpec(epochs=20, lr=1e-2, batch_size=20))
        nets[arch] = net
    return X, y, nets


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("method", ["fgsm", "pgd", "mim"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("eps", [0.02, 0.3])
def test_stays_in_ball_and_box(trained, arch, method, norm, eps):
    X, y, nets = trained
    Xp = attack(nets[arch], X, y, 3, AttackSpec(method, eps, steps=5, random_start=True, norm=norm), "ce")
    delta = (Xp - X).abs().amax(1) if norm == "linf" else (Xp - X).norm(dim=1)
    assert (delta <= eps * (1 + RTOL64)).all() and delta.max() > eps / 4
    assert Xp.min() >= 0 and Xp.max() <= 1


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("norm", NORMS)
def test_pgd_beats_random_noise_of_the_same_size(trained, arch, norm):
    """The loss gain of PGD is several times that of random points on the same sphere."""
    X, y, nets = trained
    net, eps = nets[arch], 0.05 if norm == "linf" else 0.2
    Xp = attack(net, X, y, 3, AttackSpec("pgd", eps, norm=norm), "ce", box=None)
    with torch.no_grad():
        clean = float(training_loss(net, X, y, "ce", 3))
        pgd = float(training_loss(net, Xp, y, "ce", 3))
        g = torch.Generator().manual_seed(1)
        gains = []
        for _ in range(5):
            noise = torch.randn(X.shape, generator=g, dtype=X.dtype)
            noise = eps * (noise.sign() if norm == "linf" else noise / noise.norm(dim=1, keepdim=True))
            gains.append(float(training_loss(net, X + noise, y, "ce", 3)) - clean)
    assert pgd - clean > 5 * max(max(gains), 0) and pgd - clean > 1e-3


@pytest.mark.parametrize("norm", NORMS)
def test_random_start_is_uniform_in_the_ball(norm):
    """Monte Carlo against the analytic moments: E|δ_j| = ε/2 (ℓ∞); E‖δ‖₂ = ε·d/(d+1) (ℓ2)."""
    n, d, eps = 20_000, 5, 0.3
    delta = _random_start(torch.zeros(n, d, dtype=torch.float64), eps, AttackNorm(norm), seed=2)
    if norm == "linf":
        assert delta.abs().max() <= eps
        stat, mean, sd = delta.abs().mean(), eps / 2, eps / math.sqrt(12) / math.sqrt(n * d)
    else:
        r = delta.norm(dim=1)
        assert r.max() <= eps * (1 + RTOL64)
        # r/ε ~ U^(1/d): mean d/(d+1), variance d/(d+2) − (d/(d+1))²
        stat, mean = r.mean(), eps * d / (d + 1)
        sd = eps * math.sqrt(d / (d + 2) - (d / (d + 1)) ** 2) / math.sqrt(n)
        assert float((delta / r[:, None]).mean(0).abs().max()) < 4 / math.sqrt(n)  # isotropic directions
    assert abs(float(stat) - mean) < 4 * sd


def test_attention_attack_propagates_through_the_whole_set(trained):
    """Moving one point changes every MLP-Attn feature (C changes); ReLU features of other rows stay exact."""
    X, y, nets = trained
    mask = torch.zeros(40, dtype=torch.bool)
    mask[0] = True
    for arch in ("relu", "attn"):
        net = nets[arch]
        Xp = attack(net, X, y, 3, AttackSpec("fgsm", 0.1), "ce", mask=mask)
        with torch.no_grad():
            change = (net.features(Xp, X_ref=Xp) - net.features(X, X_ref=X)).abs().amax(1)
        assert change[0] > 1e-3
        if arch == "relu":
            assert bool((change[1:] == 0).all())
        else:
            assert bool((change[1:] > 1e3 * ATOL64).all())


@pytest.mark.parametrize("norm", NORMS)
def test_unbounded_box_for_synthetic(norm):
    """Without a box FGSM moves every coordinate by exactly ε (ℓ∞) / every row by ε (ℓ2), leaving [0, 1]."""
    net, X, y, c, _ = _tiny("relu")
    X = X * 0.02  # near 0: a step of 0.5 leaves the unit box
    Xp = attack(net, X, y, c, AttackSpec("fgsm", 0.5, norm=norm), "ce", box=None)
    delta = (Xp - X).abs() if norm == "linf" else (Xp - X).norm(dim=1)
    _close(delta, np.full(tuple(delta.shape), 0.5))
    assert Xp.min() < 0


@pytest.mark.parametrize("kwargs", [{"method": "cw"}, {"eps": -0.1}, {"eps": 1e4}, {"eps": math.nan},
                                    {"steps": 0}, {"steps": 1001}, {"steps": 2.0}, {"step_size": 0.0},
                                    {"momentum": -1.0}, {"momentum": 11.0}, {"seed": -1}, {"norm": "l1"},
                                    {"random_start": 1}])
def test_bad_attack_specs(kwargs):
    with pytest.raises(BadInput) as e:
        AttackSpec(**kwargs)
    assert "\n" not in str(e.value) and next(iter(kwargs)) in str(e.value)


def test_spec_declares_its_settings_once():
    from engine.runtime.settings import default, meta

    assert AttackSpec().norm == "linf" == default(AttackSpec, "norm")
    assert meta(AttackSpec, "norm").choices == ("linf", "l2")
    assert not meta(AttackSpec, "method").cli and not meta(AttackSpec, "eps").cli and meta(AttackSpec, "steps").cli
    # positional callers (the malleability experiment) keep working; norm comes last
    assert AttackSpec("mim", 0.1, 5, None, False, 0.5, 3) == AttackSpec("mim", 0.1, 5, momentum=0.5, seed=3)
    assert AttackSpec(eps=0.3, steps=6).alpha == pytest.approx(0.125, rel=RTOL64)


def test_a_set_cancel_flag_stops_the_attack_before_its_next_step():
    import threading

    from engine.runtime.errors import Cancelled

    torch.manual_seed(0)
    X = torch.rand(6, 5, dtype=torch.float64)
    net = Net("relu", X, 8, 3, seed=0, dtype=torch.float64)
    flag = threading.Event()
    flag.set()
    with pytest.raises(Cancelled, match="step 1/"):
        attack(net, X, torch.tensor([0, 1, 2, 0, 1, 2]), 3, AttackSpec("pgd", 0.1, steps=5), "ce", cancel=flag)
