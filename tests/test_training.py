import threading

import numpy as np
import pytest
import torch

from engine.errors import BadInput, Cancelled
from engine.models import Net
from engine.training import TrainSpec, accuracy, targets, train


def _blobs(n=60, d=5, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % c
    centers = torch.rand(c, d, generator=g, dtype=torch.float64)
    X = (centers[y] + 0.05 * torch.rand(n, d, generator=g, dtype=torch.float64)).clamp(0, 1)
    return X, y


def test_one_full_batch_step_matches_numpy_adam_with_l2():
    """Adam with L2 weight decay on the MSE of a binary net, reproduced in numpy."""
    X, y = _blobs(20, 4, 2)
    net = Net("relu", X, 16, 1, seed=0, dtype=torch.float64)
    W0 = net.mlp.W.detach().numpy().copy()
    a = net.mlp.a.numpy()
    spec = TrainSpec(epochs=1, lr=0.01, batch_size=20, weight_decay=0.1)
    train(net, X, y, 2, spec)

    Z = X.numpy() / np.linalg.norm(X.numpy(), axis=1, keepdims=True)
    t = 2.0 * y.numpy()[:, None] - 1.0
    pre = Z @ W0.T
    f = np.maximum(pre, 0) @ a / 4.0
    dL_df = 2 * (f - t) / len(t)
    grad = ((dL_df @ a.T) * (pre > 0)).T @ Z / 4.0 + 0.1 * W0
    m, v = 0.1 * grad, 0.001 * grad**2
    m_hat, v_hat = m / 0.1, v / 0.001
    W1 = W0 - 0.01 * m_hat / (np.sqrt(v_hat) + 1e-8)
    np.testing.assert_allclose(net.mlp.W.detach().numpy(), W1, rtol=1e-10, atol=1e-12)


def test_training_is_deterministic_and_lowers_the_loss():
    X, y = _blobs()
    runs = []
    for _ in range(2):
        net = Net("attn", X, 64, 3, seed=1)
        res = train(net, X, y, 3, TrainSpec(epochs=30, lr=1e-2, batch_size=16), seed=5)
        runs.append((net.mlp.W.detach().clone(), res.losses))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    losses = runs[0][1]
    assert len(losses) == 31 and losses[-1] < losses[0]


def test_zero_epochs_leaves_weights_and_snapshots():
    X, y = _blobs(c=2)
    net = Net("relu", X, 32, 1)
    W0 = net.mlp.W.detach().clone()
    res = train(net, X, y, 2, TrainSpec(epochs=0, snapshot_epochs=(0,)))
    assert torch.equal(net.mlp.W.detach(), W0) and torch.equal(res.snapshots[0], W0)
    res = train(net, X, y, 2, TrainSpec(epochs=3, snapshot_epochs=(1, 3)))
    assert sorted(res.snapshots) == [1, 3] and torch.equal(res.snapshots[3], net.mlp.W.detach())


def test_binary_targets_are_pm_one_and_multiclass_one_hot():
    y = torch.tensor([0, 1, 1])
    assert targets(y, 2).squeeze(1).tolist() == [-1.0, 1.0, 1.0]
    assert targets(torch.tensor([2, 0]), 3).tolist() == [[0, 0, 1], [1, 0, 0]]


def test_training_reaches_high_accuracy_on_separable_blobs():
    X, y = _blobs(90, 6, 3, seed=2)
    net = Net("relu", X, 256, 3)
    train(net, X, y, 3, TrainSpec(epochs=60, lr=1e-2, batch_size=32))
    assert accuracy(net, X, y) > 0.95


def test_cancel_stops_training():
    X, y = _blobs()
    flag = threading.Event()
    flag.set()
    with pytest.raises(Cancelled):
        train(Net("relu", X, 8, 3), X, y, 3, TrainSpec(epochs=5), cancel=flag)


@pytest.mark.parametrize("kwargs", [{"epochs": -1}, {"lr": 0}, {"batch_size": 0}, {"loss": "hinge"},
                                    {"weight_decay": -1.0}, {"optimizer": "lbfgs"}])
def test_bad_train_spec(kwargs):
    with pytest.raises(BadInput):
        TrainSpec(**kwargs)


def test_cross_entropy_on_binary_is_refused():
    X, y = _blobs(c=2)
    with pytest.raises(BadInput, match="ce"):
        train(Net("relu", X, 8, 1), X, y, 2, TrainSpec(epochs=1, loss="ce"))


@pytest.mark.parametrize("arch,c,optimizer", [("relu", 3, "adam"), ("attn", 3, "adam"), ("relu", 2, "adam"),
                                              ("relu", 3, "adamw"), ("attn", 2, "sgd")])
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_batched_widths_follow_the_separate_trajectories(arch, c, optimizer, dtype, rtol):
    from engine.training import train_many

    if optimizer == "adamw" and dtype == torch.float32:
        # Without coupled decay, dead units get gradients of pure rounding noise, which
        # Adam's normalisation blows up to ±lr: float32 runs are chaotic there, batched or not.
        pytest.skip("float32 AdamW amplifies rounding noise; the float64 case checks the equality")
    X, y = _blobs(48, 6, c, seed=3)
    spec = TrainSpec(epochs=8, lr=5e-3, batch_size=16, weight_decay=1e-3, snapshot_epochs=(4,), optimizer=optimizer)
    widths = (8, 32, 128)
    alone = [Net(arch, X, w, 1 if c == 2 else c, seed=2, dtype=dtype) for w in widths]
    single = [train(net, X, y, c, spec, seed=9) for net in alone]
    batched = [Net(arch, X, w, 1 if c == 2 else c, seed=2, dtype=dtype) for w in widths]
    together = train_many(batched, X, y, c, spec, seed=9)
    for a, b, ra, rb in zip(alone, batched, single, together):
        torch.testing.assert_close(b.mlp.W, a.mlp.W, rtol=rtol, atol=rtol * 1e-2)
        np.testing.assert_allclose(rb.losses, ra.losses, rtol=rtol)
        torch.testing.assert_close(rb.snapshots[4], ra.snapshots[4], rtol=rtol, atol=rtol * 1e-2)


def test_sgd_step_is_plain_gradient_descent_with_l2():
    X, y = _blobs(20, 4, 2)
    net = Net("relu", X, 16, 1, seed=0, dtype=torch.float64)
    W0 = net.mlp.W.detach().clone()
    loss = torch.nn.functional.mse_loss(net(X), 2.0 * y.double()[:, None] - 1)
    (grad,) = torch.autograd.grad(loss, net.mlp.W)
    train(net, X, y, 2, TrainSpec(epochs=1, lr=0.1, batch_size=20, weight_decay=0.01, optimizer="sgd"))
    torch.testing.assert_close(net.mlp.W.detach(), W0 - 0.1 * (grad + 0.01 * W0), rtol=1e-12, atol=1e-14)
