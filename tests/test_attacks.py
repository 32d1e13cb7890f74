import pytest
import torch

from engine.attacks import AttackSpec, attack, training_loss
from engine.errors import BadInput
from engine.models import Net
from engine.training import TrainSpec, train


@pytest.fixture(scope="module")
def trained():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(40) % 3
    centers = torch.rand(3, 16, generator=g)
    X = (centers[y] + 0.2 * torch.rand(40, 16, generator=g)).clamp(0, 1)
    nets = {}
    for arch in ("relu", "attn"):
        net = Net(arch, X, 128, 3, seed=1)
        train(net, X, y, 3, TrainSpec(epochs=20, lr=1e-2, batch_size=20))
        nets[arch] = net
    return X, y, nets


@pytest.mark.parametrize("arch", ["relu", "attn"])
@pytest.mark.parametrize("method", ["fgsm", "pgd", "mim"])
@pytest.mark.parametrize("eps", [0.02, 0.3])
def test_stays_in_ball_and_box_and_raises_the_loss(trained, arch, method, eps):
    X, y, nets = trained
    net = nets[arch]
    Xp = attack(net, X, y, 3, AttackSpec(method, eps, steps=5, random_start=True), "ce")
    assert (Xp - X).abs().max() <= eps + 1e-6
    assert Xp.min() >= 0 and Xp.max() <= 1
    with torch.no_grad():
        assert training_loss(net, Xp, y, "ce", 3) >= training_loss(net, X, y, "ce", 3)


def test_pgd_with_one_step_equals_fgsm(trained):
    X, y, nets = trained
    for net in nets.values():
        fgsm = attack(net, X, y, 3, AttackSpec("fgsm", 0.1), "ce")
        pgd = attack(net, X, y, 3, AttackSpec("pgd", 0.1, steps=1, step_size=0.1), "ce")
        assert torch.equal(fgsm, pgd)


def test_mask_keeps_other_rows_fixed(trained):
    X, y, nets = trained
    mask = torch.zeros(40, dtype=torch.bool)
    mask[:5] = True
    Xp = attack(nets["attn"], X, y, 3, AttackSpec("pgd", 0.1, steps=3), "ce", mask=mask)
    assert torch.equal(Xp[5:], X[5:]) and not torch.equal(Xp[:5], X[:5])


def test_attention_attack_propagates_through_the_whole_set(trained):
    """Moving a few points changes every MLP-Attn feature (C changes), not so for ReLU."""
    X, y, nets = trained
    mask = torch.zeros(40, dtype=torch.bool)
    mask[0] = True
    for arch, expect_global in (("relu", False), ("attn", True)):
        net = nets[arch]
        Xp = attack(net, X, y, 3, AttackSpec("fgsm", 0.1), "ce", mask=mask)
        with torch.no_grad():
            changed = (net.features(Xp, X_ref=Xp) - net.features(X, X_ref=X)).abs().amax(1) > 1e-7
        assert bool(changed[1:].any()) == expect_global


def test_unbounded_box_for_synthetic(trained):
    X, y, nets = trained
    Xp = attack(nets["relu"], X, y, 3, AttackSpec("fgsm", 0.5), "ce", box=None)
    assert (Xp - X).abs().max() == pytest.approx(0.5)


@pytest.mark.parametrize("kwargs", [{"method": "cw"}, {"eps": -0.1}, {"steps": 0}, {"step_size": 0.0},
                                    {"momentum": -1.0}])
def test_bad_attack_specs(kwargs):
    with pytest.raises(BadInput):
        AttackSpec(**kwargs)
