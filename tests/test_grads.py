"""engine.maths.grads: the head's closed-form gradient against autograd's, and bfloat16 training
against float32 (its accuracy, its kernel, and the rows that say which ran)."""

from dataclasses import replace

import pytest
import torch

from conftest import (
    ATOL32,
    ATOL32_ONE_PASS,
    ATOL32_SAME_STEPS,
    ATOL64_SAME,
    ATOL_BF16_ACCURACY,
    BF16_KERNEL_SHARE_OF_TRAINING,
    RTOL32,
    RTOL32_ONE_PASS,
    RTOL32_SAME_STEPS,
    RTOL64_SAME,
    RTOL_BF16_GRAD,
    RTOL_BF16_KERNEL,
    RTOL_DEVICES_TRAINED,
    requires_cuda,
)
from engine.maths.grads import StackedHead
from engine.maths.models import Net
from engine.maths.specs import TrainSpec
from engine.maths.training import (
    accuracy,
    autograd_head,
    loss_weights,
    n_outputs,
    resolve_loss,
    targets,
    train,
    train_many,
)
from engine.runtime.errors import BadInput

WIDTHS = (8, 32, 128)  # several widths batched into one stacked head


def _blobs(n=48, d=6, c=3, seed=3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % c
    centers = torch.rand(c, d, generator=g, dtype=torch.float64)
    X = (centers[y] + 0.3 * torch.rand(n, d, generator=g, dtype=torch.float64)).clamp(0, 1)
    return X.to(dtype), y


def _stacked(c, spec, dtype, X):
    """The stacked head train_many builds: features, W (Σm, d), block-diagonal readout, loss weights."""
    nets = [Net("relu", X, w, n_outputs(c), seed=1, dtype=dtype) for w in WIDTHS]
    for net in nets:
        net.mlp.param = spec.param
    with torch.no_grad():
        phi = nets[0].features(X)
    W0 = torch.cat([net.mlp.W.detach() for net in nets])
    return phi, W0, torch.block_diag(*[net.mlp.readout() for net in nets]), loss_weights(nets, spec)


def _grads(c, spec, dtype, batch=16):
    """(closed-form W.grad, its k losses, autograd's W.grad, its k losses) on one mini-batch."""
    X, y = _blobs(c=c, dtype=dtype)
    phi, W0, A, weights = _stacked(c, spec, dtype, X)
    loss = resolve_loss(spec, c)
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    W = torch.nn.Parameter(W0.clone())
    head = StackedHead(phi, y, targets(y, c), W, A, len(WIDTHS), loss, c, weights, spec.train_precision)
    head.epoch(idx)
    per = head.step(0, batch)
    W_ref = torch.nn.Parameter(W0.clone())
    per_ref = autograd_head(phi, y, W_ref, A, len(WIDTHS), loss, c)(idx[:batch], None)
    (per_ref.sum() if weights is None else (per_ref * weights.to(per_ref.dtype)).sum()).backward()
    return W.grad, per, W_ref.grad, per_ref.detach()


# ---------------------------------------------------------------- the closed form against autograd

@pytest.mark.parametrize("c,loss", [(2, "mse"), (3, "mse"), (3, "ce")])  # ±1 targets, one-hot, softmax
@pytest.mark.parametrize("param", ["ntk", "mup"])
@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, RTOL64_SAME, ATOL64_SAME),
                                             (torch.float32, RTOL32_ONE_PASS, ATOL32_ONE_PASS)])
def test_closed_form_gradient_equals_autograds(c, loss, param, dtype, rtol, atol):
    spec = TrainSpec(loss=loss, param=param)
    grad, per, ref, per_ref = _grads(c, spec, dtype)
    torch.testing.assert_close(grad, ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(per, per_ref, rtol=rtol, atol=atol)
    assert grad.abs().max() > 1e3 * atol  # the gradient is not vacuous
    if dtype == torch.float32:  # and float32 is float64's gradient to float32 rounding
        ref64 = _grads(c, spec, torch.float64)[0]
        torch.testing.assert_close(grad.double(), ref64, rtol=RTOL32, atol=ATOL32 * float(ref64.abs().max()))


@pytest.mark.parametrize("c,loss,optimizer,param,lr", [(2, "auto", "adam", "ntk", 1e-2), (3, "ce", "adam", "mup", 1e-2),
                                                       (3, "mse", "sgd", "ntk", 0.5), (3, "ce", "sgd", "mup", 0.05)])
def test_a_float32_run_ends_where_autograds_does(c, loss, optimizer, param, lr):
    """30 epochs of mini-batches with coupled weight decay, closed form against autograd: the same
    weights, snapshots and loss curves to RTOL32_SAME_STEPS (bit for bit where the BLAS agrees)."""
    X, y = _blobs(c=c, dtype=torch.float32)
    spec = TrainSpec(epochs=30, lr=lr, batch_size=16, weight_decay=1e-2, loss=loss, optimizer=optimizer, param=param,
                     snapshot_epochs=(10,))
    runs = {}
    for gradient in ("closed", "autograd"):
        nets = [Net("relu", X, w, n_outputs(c), seed=2) for w in WIDTHS]
        runs[gradient] = nets, train_many(nets, X, y, c, spec, seed=4, gradient=gradient)
    (nets_a, res_a), (nets_b, res_b) = runs["closed"], runs["autograd"]
    for a, b, ra, rb in zip(nets_a, nets_b, res_a, res_b, strict=True):
        torch.testing.assert_close(a.mlp.W, b.mlp.W, rtol=RTOL32_SAME_STEPS, atol=ATOL32_SAME_STEPS)
        torch.testing.assert_close(ra.snapshots[10], rb.snapshots[10], rtol=RTOL32_SAME_STEPS, atol=ATOL32_SAME_STEPS)
        torch.testing.assert_close(torch.tensor(ra.losses), torch.tensor(rb.losses), rtol=RTOL32_SAME_STEPS,
                                   atol=ATOL32_SAME_STEPS)
        assert not torch.equal(a.mlp.W, ra.W0) and ra.losses[-1] < ra.losses[0]  # it trained


def test_adversarial_epochs_take_new_features_in_the_closed_form_too():
    X, y = _blobs(n=20, c=3, dtype=torch.float32)
    moved = (X + 0.1).clamp(0, 1)
    spec = TrainSpec(epochs=3, lr=1e-2, batch_size=8)
    runs = []
    for gradient in ("closed", "autograd"):
        net = Net("attn", X, 16, 3, seed=0)
        train_many([net], X, y, 3, spec, seed=1, epoch_inputs=lambda e: moved, gradient=gradient)
        runs.append(net.mlp.W.detach())
    torch.testing.assert_close(runs[0], runs[1], rtol=RTOL32_SAME_STEPS, atol=ATOL32_SAME_STEPS)


def test_unknown_gradient_and_precision_are_refused():
    X, y = _blobs(n=12, c=3, dtype=torch.float32)
    with pytest.raises(BadInput, match="gradient"):
        train_many([Net("relu", X, 8, 3)], X, y, 3, TrainSpec(epochs=1), gradient="numeric")
    with pytest.raises(BadInput, match="train_precision"):
        TrainSpec(train_precision="float16")
    X64, y64 = _blobs(n=12, c=3)
    with pytest.raises(BadInput, match="float32 nets"):  # float64 nets are references: never rounded
        train(Net("relu", X64, 8, 3, dtype=torch.float64), X64, y64, 3, TrainSpec(epochs=1, train_precision="bfloat16"))


# ---------------------------------------------------------------- bfloat16

@pytest.mark.parametrize("c,loss", [(2, "mse"), (3, "ce")])
def test_bfloat16_gradient_is_float32s_to_bfloat16_rounding(c, loss):
    """Close to float32's, and far from equal to it: the head's GEMMs did run in bfloat16."""
    g32 = _grads(c, TrainSpec(loss=loss), torch.float32)[0]
    g16 = _grads(c, TrainSpec(loss=loss, train_precision="bfloat16"), torch.float32)[0]
    assert g16.dtype == torch.float32  # the master weights' gradient stays float32
    rel = float((g16 - g32).norm() / g32.norm())
    assert 10 * RTOL32_ONE_PASS < rel < RTOL_BF16_GRAD  # float32 rounding stays below RTOL32_ONE_PASS


@pytest.mark.slow  # 400 steps of two heads twice: 7 s on one idle core, much more beside other work
def test_bfloat16_training_moves_accuracy_and_the_trained_kernel_little(mnist_dir):
    """The malleability quick preset's training (Adam 2e-2, 200 epochs) on 200 real digits, float32
    against bfloat16 from the same init and batches: test accuracy and the trained eNTK."""
    from engine.data import DataSpec, load_sample
    from engine.experiments.configs.malleability import QUICK_MALLEABLE
    from engine.maths.ntk import empirical_ntk

    s = load_sample(DataSpec("mnist", n=200, n_test=500, seed=0), mnist_dir)
    X, y, Xt, yt = s.X.float(), s.y, s.X_test.float(), s.y_test
    out = {}
    for precision in ("float32", "bfloat16"):
        nets = [Net("relu", X, w, 10, seed=0) for w in (256, 1024)]
        K0 = [empirical_ntk(net, Xt[:200]) for net in nets]
        train_many(nets, X, y, 10, replace(QUICK_MALLEABLE, train_precision=precision), seed=0)
        out[precision] = [(accuracy(net, Xt, yt), empirical_ntk(net, Xt[:200]), k0) for net, k0 in zip(nets, K0, strict=True)]
    for (acc32, K32, K0), (acc16, K16, _) in zip(out["float32"], out["bfloat16"], strict=True):
        assert acc32 > 0.7  # it learnt: the comparison is between trained nets
        assert abs(acc16 - acc32) <= ATOL_BF16_ACCURACY
        moved = float((K16 - K32).norm() / K32.norm())
        assert moved <= RTOL_BF16_KERNEL
        assert moved <= BF16_KERNEL_SHARE_OF_TRAINING * float((K32 - K0).norm() / K0.norm())


def test_bfloat16_autocasts_the_trainers_that_keep_autograd():
    """Trainable attention (qkv) and the masked leave-one-out trainer run their forward under bf16
    autocast: they still train, near float32, and not identically to it."""
    from engine.maths.loo import train_masked

    X, y = _blobs(n=24, c=3, dtype=torch.float32)
    spec = TrainSpec(epochs=10, lr=1e-2, batch_size=8)
    W = {}
    for precision in ("float32", "bfloat16"):
        net = Net("attn", X, 16, 3, seed=0, attention="qkv")
        res = train(net, X, y, 3, replace(spec, train_precision=precision), seed=1)
        assert res.losses[-1] < res.losses[0] and net.mlp.W.dtype == torch.float32
        W[precision] = net.mlp.W.detach()
    assert 0 < float((W["bfloat16"] - W["float32"]).norm() / W["float32"].norm()) < RTOL_BF16_KERNEL
    head = Net("relu", X, 32, 3, seed=0)
    keep = torch.ones(2, 24, dtype=torch.bool)
    keep[1, 0] = False
    with torch.no_grad():
        phi = head.features(X)
    runs = {p: train_masked(phi, y, 3, [head.mlp, head.mlp], keep, replace(spec, train_precision=p), seed=1)
            for p in ("float32", "bfloat16")}
    assert runs["bfloat16"].W.dtype == torch.float32
    torch.testing.assert_close(runs["bfloat16"].W, runs["float32"].W, rtol=RTOL_BF16_KERNEL,
                               atol=RTOL_BF16_KERNEL * float(runs["float32"].W.abs().max()))


def test_rows_say_which_precision_trained():
    from engine.data import DataSpec
    from engine.experiments.configs.malleability import MalleabilityConfig
    from engine.experiments.malleability import run_malleability

    tiny = DataSpec("synthetic", n=12, n_test=4, synthetic_d=6, synthetic_kappa=10.0, synthetic_classes=3)
    fast = TrainSpec(epochs=3, lr=1e-2, batch_size=6)
    for precision in ("float32", "bfloat16"):
        cfg = MalleabilityConfig(data=tiny, train=replace(fast, train_precision=precision), widths=(32,), seeds=(0,),
                                 attacks=("fgsm",), eps=(0.1,))
        rows = run_malleability(cfg).frames["rows"]
        assert len(rows) and (rows.train_precision == precision).all()


def test_the_command_line_has_the_setting_and_float32_is_the_default():
    from engine import cli
    from engine.experiments.registry import EXPERIMENTS

    parser = cli.build_parser()
    for command in ("malleability", "ntk-sweep", "influence"):
        ns = parser.parse_args([command])
        assert cli.config_from_args(EXPERIMENTS[command], ns).train.train_precision == "float32"
        ns = parser.parse_args([command, "--train-precision", "bfloat16"])
        assert cli.config_from_args(EXPERIMENTS[command], ns).train.train_precision == "bfloat16"
    with pytest.raises(BadInput, match="train_precision"):
        cli.config_from_args(EXPERIMENTS["ntk-sweep"], parser.parse_args(["ntk-sweep", "--train-precision", "fp8"]))


@requires_cuda
@pytest.mark.cuda
def test_closed_form_and_bfloat16_on_cuda():
    X, y = _blobs(c=3, dtype=torch.float32)
    spec = TrainSpec(epochs=20, lr=1e-2, batch_size=16)
    W = {}
    for gradient, precision in (("closed", "float32"), ("autograd", "float32"), ("closed", "bfloat16")):
        net = Net("relu", X, 64, 3, seed=0).to("cuda")
        train_many([net], X.cuda(), y.cuda(), 3, replace(spec, train_precision=precision), seed=1, gradient=gradient)
        assert accuracy(net, X.cuda(), y) > 0.9
        W[gradient, precision] = net.mlp.W.detach().cpu()
    torch.testing.assert_close(W["closed", "float32"], W["autograd", "float32"], rtol=RTOL_DEVICES_TRAINED,
                               atol=RTOL_DEVICES_TRAINED)
