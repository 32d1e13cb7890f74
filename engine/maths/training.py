"""Training the ReLU head with the paper's protocol (every knob an option).

Only W is trained. The features φ(X) do not depend on W, so they are computed once and the
head is trained on them (MLP-Attn's transductive attention is fixed by the clean training
set). Binary tasks use one output and targets ±1 with MSE; multi-class tasks use c outputs
with cross-entropy (``loss="auto"``). The head's weight gradient is written in closed form
(``engine.maths.grads``; autograd is its tested reference, and trains trainable attention), its
GEMMs in float32 or, by ``TrainSpec.train_precision``, in bfloat16.

Parametrisation (``TrainSpec.param``). ``ntk`` (default, the paper's): output multiplier
m^(-1/2), learning rate independent of the width. ``mup``: the Maximal Update
Parametrisation of Yang & Hu 2021 ("Tensor Programs IV", ICML) in the form of Yang et al.
2022 ("Tensor Programs V", Table 3). There the output weights have init variance 1 and
multiplier 1/fan_in = 1/m, and the input weights (our W: fan_in d, fan_out m, init variance
independent of m) take SGD learning rate η·fan_out = η·m and Adam learning rate η. For
this head, where only W trains and a = ±1 is fixed:

    f = m^-1 Σ_r a_r relu(w_r·φ),   ∂f/∂w_r = m^-1 a_r 1[w_r·φ > 0] φ = O(1/m),

so an SGD step Δw_r = −η_m ∂L/∂w_r changes each pre-activation h_r = w_r·φ by Θ(η_m/m):
η_m = η·m keeps Δh_r = Θ(1) (features move at every width), and since Δw_r ∝ a_r the
m terms of Δf = m^-1 Σ_r a_r 1[h_r > 0] Δh_r add up coherently to Θ(1). Adam normalises
the gradient, so Δw_r = Θ(η) already and η stays width-independent. Both are realised
here by weighting net j's loss by its width m_j (base width 1): SGD then steps
−η(m ∇L + λ W) = −(η m)(∇L + (λ/m) W), i.e. learning rate η·m with coupled L2 λ/m; Adam
and AdamW are invariant to the gradient's scale (up to ε, which becomes ε/m as μP's 1/m
gradients ask), so they keep η, with coupled L2 λ/m (adam) or decoupled λ (adamw).
Training sets each net's ``mlp.param`` to ``spec.param``. The NTK functions of
``engine.maths.ntk`` keep their 1/m normalisation: for a μP net they give m times its tangent
kernel (which itself vanishes like 1/m, the point of μP).

What every trainer of heads shares (targets, loss weights, the batch seed, ``TrainResult``) is
``engine.maths.heads``; plain SGD in the features' span is handed to ``engine.maths.span``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F

from ..runtime import budget as B
from ..runtime.errors import BadInput, Cancelled
from .grads import StackedHead, autocast, check_precision
from .heads import BATCH_SEED_OFFSET, CancelFlag, Progress, TrainResult, loss_weights, targets, write_back
from .optim import OPTIMIZERS
from .span import train_in_span
from .specs import TrainSpec

if TYPE_CHECKING:
    from .models import Net

PerModel = Callable[["torch.Tensor | None", "torch.Tensor | None"], "torch.Tensor"]  # (rows, new inputs) -> k losses


# How a head on fixed features gets its weight gradient: in closed form (the default, two GEMMs and
# a mask per step) or by autograd through the same loss (the reference the closed form is tested against).
GRADIENTS = ("closed", "autograd")
DEFAULT_GRADIENT = "closed"


def n_outputs(n_classes: int) -> int:
    """One output (±1 targets) for binary tasks, one per class otherwise."""
    return 1 if n_classes == 2 else n_classes


def resolve_loss(spec: TrainSpec, n_classes: int) -> str:
    if spec.loss == "auto":
        return "mse" if n_classes == 2 else "ce"
    if spec.loss == "ce" and n_classes == 2:
        raise BadInput("loss 'ce' needs 3 or more classes here; binary tasks have one ±1 output")
    return spec.loss


def loss_fn(out: torch.Tensor, y: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """Mean training loss of outputs (n, n_out) against integer labels (n,)."""
    if loss == "ce":
        return F.cross_entropy(out, y)
    return F.mse_loss(out, targets(y, n_classes).to(out.dtype))


def predict_labels(out: torch.Tensor) -> torch.Tensor:
    """Class predictions from outputs (n, n_out): sign for one output, argmax otherwise."""
    return (out[:, 0] > 0).long() if out.shape[1] == 1 else out.argmax(dim=1)


def per_model_loss(out: torch.Tensor, y: torch.Tensor, loss: str, n_classes: int) -> torch.Tensor:
    """Mean loss of each of k models, (k,), from outputs (B, k, n_out) and labels (B,)."""
    if loss == "ce":
        return F.cross_entropy(out.permute(0, 2, 1), y[:, None].expand(-1, out.shape[1]),
                               reduction="none").mean(dim=0)
    t = targets(y, n_classes).to(out.dtype)[:, None, :]
    return ((out - t) ** 2).mean(dim=(0, 2))


def train(net: Net, X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int = 0,
          progress: Progress | None = None, cancel: CancelFlag | None = None,
          epoch_inputs: Callable[[int], torch.Tensor] | None = None) -> TrainResult:
    """Train ``net`` in place on raw inputs X (n, d) and labels y (n,).

    Only W moves, except for trainable attention (``qkv``) whose parameters train too.
    Deterministic on CPU for a given seed (it seeds the batch order). ``cancel`` is any
    object with ``is_set()``; it is checked every epoch and raises ``Cancelled``.
    ``epoch_inputs(epoch)``, when given, returns the inputs (n, d) to train on in that epoch
    (adversarial training attacks the current net); MLP-Attn's attention is then computed
    over those inputs. Otherwise fixed features of X are computed once.
    """
    return train_many([net], X, y, n_classes, spec, seed, progress, cancel, epoch_inputs)[0]


def train_many(nets: list[Net], X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int = 0,
               progress: Progress | None = None, cancel: CancelFlag | None = None,
               epoch_inputs: Callable[[int], torch.Tensor] | None = None,
               gradient: str = DEFAULT_GRADIENT) -> list[TrainResult]:
    """Train several nets on the same features as one batched model; same result as ``train`` each.

    The nets must share arch, attention and training set (so their features agree); widths
    may differ. Their weight matrices are stacked into one (Σm, d) parameter and each net's
    ``a / √m`` into a block-diagonal (Σm, k·n_out) readout, so a step is two GEMMs for all
    widths. The loss is the sum of the nets' mean losses: each block's gradient is its own
    net's, and Adam and weight decay act elementwise, so every net follows the trajectory
    it would follow alone (up to float rounding). Weights are written back in place.
    Nets with trainable attention are trained one by one (their features move).

    ``gradient`` (``GRADIENTS``): how a head on fixed features gets ∂L/∂W; ``closed`` (the
    default) writes it in closed form (``engine.maths.grads.StackedHead``), ``autograd`` is the
    reference it is tested against. Trainable attention always uses autograd.
    """
    if epoch_inputs is not None and len(nets) != 1:
        raise BadInput("epoch_inputs trains a single net")
    if gradient not in GRADIENTS:
        raise BadInput(f"unknown gradient {gradient!r}; allowed: {', '.join(GRADIENTS)}")
    if not nets[0].fixed_features and spec.param != "ntk":
        raise BadInput("param 'mup' is defined for the ReLU head alone; trainable attention (qkv) "
                       "trains more layers, use param 'ntk'")
    for net in nets:  # the spec decides the parametrisation (output multiplier) of the head
        net.mlp.param = spec.param
    if not nets[0].fixed_features:
        return [_train_one_trainable(net, X, y, n_classes, spec, seed, progress, cancel, epoch_inputs)
                for net in nets]
    loss_name = resolve_loss(spec, n_classes)
    with torch.no_grad():
        phi = nets[0].features(X)
    if gradient == "closed" and epoch_inputs is None and B.in_span(phi.shape[0], phi.shape[1], spec):
        return train_in_span(nets, phi, y.to(phi.device), n_classes, spec, seed, progress, cancel, loss_name)
    k = len(nets)
    W = torch.nn.Parameter(torch.cat([net.mlp.W.detach() for net in nets]))
    A = torch.block_diag(*[net.mlp.readout() for net in nets])
    yd = y.to(phi.device)

    def feats(inputs):  # the features of an epoch's new inputs (adversarial training)
        return nets[0].features(inputs, X_ref=inputs)

    if gradient == "closed":  # engine.maths.grads: autograd's steps, without its graph
        head = StackedHead(phi, yd, targets(yd, n_classes), W, A, k, loss_name, n_classes, loss_weights(nets, spec),
                           spec.train_precision, feats)
        curves, snapshots, W0 = optimise([W], None, yd, k, spec, seed, progress, cancel, epoch_inputs, head=head)
    else:
        curves, snapshots, W0 = optimise([W], autograd_head(phi, yd, W, A, k, loss_name, n_classes, feats), yd, k,
                                         spec, seed, progress, cancel, epoch_inputs, loss_weights(nets, spec))
    return write_back(nets, W, W0[0], curves, {e: w[0] for e, w in snapshots.items()})


def full_batch(n: int, spec: TrainSpec) -> bool:
    """Whether every epoch of ``spec`` on n points is one batch of all of them."""
    return n <= spec.batch_size


def train_seeds(nets: list[Net], seeds: Sequence[int], X: torch.Tensor, y: torch.Tensor, n_classes: int,
                spec: TrainSpec, progress: Progress | None = None,
                cancel: CancelFlag | None = None) -> list[TrainResult]:
    """Train nets of several seeds (and widths), ``nets[j]`` with batch order ``seeds[j]``, as few
    batched models as their batch orders allow; same result as ``train(nets[j], …, seeds[j])`` each.

    Where every epoch is one full batch (``full_batch``) the seed's order only permutes the rows of
    each step's mean, so all nets train as one model (``train_many``): each follows its lone run up to
    the order of that sum (float rounding). Otherwise the nets of each seed train as one model.
    Nets must share arch, attention and training set, as for ``train_many``."""
    if len(nets) != len(seeds):
        raise BadInput(f"{len(nets)} nets for {len(seeds)} seeds")
    groups: dict[int, list[int]] = {}
    merge = full_batch(X.shape[0], spec)
    for j, s in enumerate(seeds):
        groups.setdefault(0 if merge else int(s), []).append(j)
    out: list[TrainResult | None] = [None] * len(nets)
    for g, (s, members) in enumerate(groups.items()):
        part = None if progress is None else \
            (lambda f, msg, g=g: progress((g + f) / len(groups), msg))
        for j, r in zip(members, train_many([nets[j] for j in members], X, y, n_classes, spec, s, part, cancel),
                        strict=True):
            out[j] = r
    return [r for r in out if r is not None]


def autograd_head(phi: torch.Tensor, y: torch.Tensor, W: torch.Tensor, A: torch.Tensor, k: int, loss: str,
                  n_classes: int, features: Callable[[torch.Tensor], torch.Tensor] | None = None) -> PerModel:
    """``per_model(idx, new_inputs)`` for ``optimise``: the k mean losses of the stacked head
    relu(φ Wᵀ) A (W (Σm, d), A (Σm, k·n_out)) on the feature rows idx of phi (n, d), by autograd;
    new inputs (adversarial training) get new features once. The reference of ``grads.StackedHead``."""

    def per_model(idx: torch.Tensor | None, inputs: torch.Tensor | None) -> torch.Tensor:
        nonlocal phi
        if inputs is not None:  # new inputs this epoch: features over them, computed once
            assert features is not None
            with torch.no_grad():
                phi = features(inputs)
        rows = phi if idx is None else phi[idx]
        return per_model_loss((torch.relu(rows @ W.T) @ A).reshape(-1, k, A.shape[1] // k),
                              y if idx is None else y[idx], loss, n_classes)

    return per_model


def _train_one_trainable(net: Net, X: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int,
                         progress: Progress | None, cancel: CancelFlag | None,
                         epoch_inputs: Callable[[int], torch.Tensor] | None) -> TrainResult:
    """Full forward passes per batch: the attention's parameters train with W."""
    loss_name = resolve_loss(spec, n_classes)
    ref = X

    def per_model(idx, inputs):
        nonlocal ref
        if inputs is not None:
            ref = inputs
        rows = ref if idx is None else ref[idx]
        return per_model_loss(net(rows, X_ref=ref)[:, None, :], y if idx is None else y[idx], loss_name, n_classes)

    assert net.attn is not None  # features that train are the qkv attention's
    params = [net.mlp.W, *net.attn.parameters()]
    curves, snapshots, W0 = optimise(params, per_model, y, 1, spec, seed, progress, cancel, epoch_inputs)
    return TrainResult([row[0] for row in curves], W0[0], {e: w[0] for e, w in snapshots.items()})


OPTIMIZER_FNS = OPTIMIZERS  # engine.maths.optim: torch.optim's rules without its import of torch._dynamo


class AutogradBatches:
    """Mini-batches whose gradient autograd computes: ``per_model(idx, new_inputs)`` gives the k
    mean losses on the rows idx (None: all rows; ``new_inputs`` an epoch's new inputs, passed with
    its first batch), and each ``step`` back-propagates their sum, weighted by ``weights`` (k,)
    when given, into the parameters' gradients, its forward under ``cast`` (``grads.autocast``).
    The same interface as ``grads.StackedHead``, for ``optimise``."""

    def __init__(self, per_model: PerModel, zero_grad: Callable[[], None], weights: torch.Tensor | None,
                 cast: contextlib.AbstractContextManager, dtype: torch.dtype):
        self.per_model, self.zero_grad, self.weights, self.cast, self.dtype = per_model, zero_grad, weights, cast, dtype
        self.order: torch.Tensor = torch.empty(0, dtype=torch.long)
        self.inputs: torch.Tensor | None = None

    def losses(self) -> torch.Tensor:
        with torch.no_grad(), self.cast:
            return self.per_model(None, None).to(self.dtype)

    def epoch(self, order: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
        self.order, self.inputs = order, inputs

    def step(self, start: int, stop: int) -> torch.Tensor:
        self.zero_grad()
        with self.cast:
            batch = self.per_model(self.order[start:stop], self.inputs if start == 0 else None).to(self.dtype)
        (batch.sum() if self.weights is None else (batch * self.weights.to(batch.dtype)).sum()).backward()
        return batch.detach()


def optimise(params: Sequence[torch.Tensor], per_model: PerModel | None, y: torch.Tensor, k: int, spec: TrainSpec,
             seed: int, progress: Progress | None, cancel: CancelFlag | None,
             epoch_inputs: Callable[[int], torch.Tensor] | None, weights: torch.Tensor | None = None,
             head: StackedHead | None = None) -> tuple[list, dict[int, list[torch.Tensor]], list[torch.Tensor]]:
    """The one mini-batch loop of every trainer here and of ``engine.maths.loo.train_masked``.

    The optimiser (``spec.optimizer``) minimises the sum of k mean losses, weighted by ``weights``
    (k,) when given, over batches in this module's order for ``seed``: by autograd through
    ``per_model`` (``AutogradBatches``), or, with ``head`` (a ``grads.StackedHead`` over
    ``params[0]``, which carries its own weights), by the gradient the head writes itself. Stops
    with ``Cancelled`` between epochs and with a one-line ``BadInput`` when the loss is not finite.
    Returns (loss curves (epochs + 1, k), snapshots of the parameters by epoch, initial parameters)."""
    for p in params:
        check_precision(spec.train_precision, p.dtype)
    init = [p.detach().clone() for p in params]
    opt = OPTIMIZER_FNS[spec.optimizer](params, lr=spec.lr, weight_decay=spec.weight_decay)
    if head is None:
        if per_model is None:
            raise BadInput("optimise needs per_model or a head")
        # reuse the gradient buffers (set_to_none=False): no page faults per step
        batches: StackedHead | AutogradBatches = AutogradBatches(
            per_model, lambda: opt.zero_grad(set_to_none=False), weights, autocast(spec.train_precision, y.device),
            params[0].dtype)
    else:
        batches = head
    g = torch.Generator().manual_seed(int(seed) + BATCH_SEED_OFFSET)
    n, size = y.shape[0], spec.batch_size
    losses = [batches.losses()]
    sizes = torch.tensor([min(size, n - s) for s in range(0, n, size)], dtype=losses[0].dtype, device=y.device)
    snapshots = {0: [p.clone() for p in init]} if 0 in spec.snapshot_epochs else {}
    for epoch in range(1, spec.epochs + 1):
        if cancel is not None and cancel.is_set():
            raise Cancelled("training cancelled")
        inputs = None if epoch_inputs is None else epoch_inputs(epoch).detach()
        batches.epoch(torch.randperm(n, generator=g).to(y.device), inputs)
        per_batch = []
        for start in range(0, n, size):
            per_batch.append(batches.step(start, min(start + size, n)))
            opt.step()
        losses.append(sizes @ torch.stack(per_batch) / n)  # the epoch's mean: batches weighted by their rows
        if not bool(torch.isfinite(losses[-1]).all()):
            raise BadInput(f"training diverged at epoch {epoch}: the loss is not finite; lower the learning "
                           f"rate (now {spec.lr:g}) or the weight decay")
        if epoch in spec.snapshot_epochs:
            snapshots[epoch] = [p.detach().clone() for p in params]
        if progress is not None:
            progress(epoch / spec.epochs, f"epoch {epoch}/{spec.epochs}")
    return torch.stack(losses).cpu().tolist(), snapshots, init  # one transfer at the end


def top_eigenvalue(K: torch.Tensor, iters: int = 200, rtol: float = 1e-6) -> float:
    """λ₁ of a symmetric positive semi-definite K (n, n) by power iteration in float64 (n² per
    step; kernels have a well separated top eigenvalue, so a few dozen steps suffice)."""
    v = torch.ones(K.shape[0], dtype=torch.float64, device=K.device)
    v /= v.norm()
    lam = 0.0
    for _ in range(iters):
        w = K.double() @ v
        new = float(v @ w)
        v = w / w.norm().clamp_min(1e-300)
        if abs(new - lam) <= rtol * abs(new):
            return new
        lam = new
    return lam


def sgd_lr_limit(K: torch.Tensor, n_out: int) -> float:
    """Plain SGD's stability limit 2·n·c/λ₁ for a net whose eNTK on the n training points is K
    (n, n), with c = ``n_out`` outputs and the mean loss over n·c entries (``loss_fn``).

    Linearised MSE training multiplies the residual along K's top eigenvector by 1 − 2ηλ₁/(n c)
    per full-batch step: lazy below η = n c/λ₁; up to about twice that the kernel first shrinks
    (the catapult phase) and training still converges; beyond 2·n·c/λ₁ it diverges."""
    n = K.shape[0]
    return 2.0 * n * n_out / top_eigenvalue(K)


def accuracy(net: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    """Share of X (n, d) whose predicted class equals y (n,)."""
    with torch.no_grad():
        return float((predict_labels(net(X)) == y.to(X.device)).double().mean())
