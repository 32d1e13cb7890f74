"""The linearised head, its training beside the net's, and the closed-form K∞ gradient flow.

Linearisation. The head f(x) = s_m Σ_r a_r relu(w_r·φ(x)) (s_m = m^-1/2, or m^-1 under μP)
is positively homogeneous in each w_r, so its first-order Taylor model around the
initialisation W0 freezes every unit's activation pattern at init:

    f_lin(x; W) = f(x; W0) + J(W0)(W − W0) = s_m Σ_r a_r 1[w_r⁰·φ(x) > 0] (w_r·φ(x)).

``train_pair`` trains a net and this linear model side by side from the same W0 with the
same optimiser, learning rate, mini-batches (engine.maths.training's batch order for the seed)
and steps. The net stays in the kernel (lazy) regime when f_t − f_lin,t is small; theory
(NTK parametrisation, SGD) says it falls like m^-1/2, with the share of flipped activation
signs.

K∞ gradient flow. The engine's MSE is L = (1/(n c)) Σ_i Σ_k (f_ik − y_ik)² over n points and
c outputs, and each mini-batch step's gradient is in expectation the full-batch one (an
epoch of ⌈n/B⌉ steps weights every point equally). For small steps, τ = epoch·⌈n/B⌉ optimiser
steps of plain SGD with learning rate η and coupled L2 λ follow the linear ODE

    dF/dτ = −η' K (F − Y) − β F,   η' = 2η / (n c),   β = η λ,

for the training outputs F (n, c) and likewise dF'/dτ = −η' K' (F − Y) − β F' for test
outputs (K' = K(X_test, X)); the decay term is exact for the linear model because
f_lin(W) = J(W0) W. With K = U diag(μ) Uᵀ, a = η'μ + β, G = UᵀF, G_y = UᵀY:

    F'(τ) = e^{−βτ} F'_0 + η' K' U [ (1 − e^{−βτ})/a ⊙ G_y − τ e^{−βτ} φ₁(η'μτ) ⊙ (G_0 − (η'μ/a) ⊙ G_y) ],

φ₁(x) = (1 − e^{−x})/x. With λ = 0 this is the classic
F'(τ) = F'_0 + K' K⁻¹ (I − e^{−η' K τ}) (Y − F_0) (Jacot et al. 2018; Lee et al. 2019).
Putting K∞ for K gives f_K∞,t. Under μP the loss is weighted by m and the tangent kernel is
K_m/m, so the same η' holds. ``k_inf_gap`` = ‖f_t − f_K∞,t‖_F / ‖f_K∞,t‖_F on the test points,
for MSE and SGD only (other losses and optimisers follow no such closed form).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import torch

from ..runtime import budget as B
from ..runtime.errors import BadInput, Cancelled
from .grads import autocast, check_precision
from .span import sgd_in_span
from .specs import TrainSpec
from .tiles import eig_threads
from .training import BATCH_SEED_OFFSET, OPTIMIZER_FNS, CancelFlag, loss_weights, per_model_loss, resolve_loss

if TYPE_CHECKING:
    from .models import Net

# ---------------------------------------------------------------- the linearised head and the loop

def lin_gap(f: torch.Tensor, f_lin: torch.Tensor) -> float:
    """‖f − f_lin‖_F / ‖f_lin‖_F: how far the net's outputs (n_test, c) are from those of its
    linearisation at initialisation trained beside it (0 in the kernel regime); NaN when f_lin = 0."""
    f, f_lin = f.double(), f_lin.double()
    scale = float(torch.linalg.norm(f_lin))
    return float(torch.linalg.norm(f - f_lin)) / scale if scale else math.nan


def linearised_head(phi: torch.Tensor, W: torch.Tensor, mask0: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """f_lin = ((φ Wᵀ) ∘ 1[φ W0ᵀ > 0]) (s_m a): the head linearised around W0.

    phi (n, d) features; W (m, d) current weights; mask0 (n, m) bool, ``φ W0ᵀ > 0``;
    readout (m, n_out) = s_m · a (``TwoLayerReLU.readout``; block-diagonal for stacked widths).
    Returns (n, n_out) in phi's dtype. With W = W0 and mask0 from the same product this is
    bit for bit ``relu(φ W0ᵀ) readout`` (masked entries are +0, as relu's).
    """
    return (phi @ W.T).masked_fill(~mask0, 0.0) @ readout


def batch_steps(params: list[torch.Tensor], loss_of: Callable[[torch.Tensor], torch.Tensor], n: int, spec: TrainSpec,
                seed: int, device: torch.device | str, cancel: CancelFlag | None) -> Iterator[tuple[int, int, bool]]:
    """Mini-batch steps in engine.maths.training's order for ``seed``; yields (epoch, step, end of epoch)
    after each step. ``loss_of(idx)`` returns the scalar to minimise on the rows idx, computed under
    ``grads.autocast`` for ``spec.train_precision`` (bfloat16 GEMMs; weights and their gradients float32)."""
    for p in params:
        check_precision(spec.train_precision, p.dtype)
    opt = OPTIMIZER_FNS[spec.optimizer](params, lr=spec.lr, weight_decay=spec.weight_decay)
    g = torch.Generator().manual_seed(int(seed) + BATCH_SEED_OFFSET)
    cast = autocast(spec.train_precision, device)  # bfloat16 GEMMs in the forward, float32 weights
    step, epoch = 0, 0
    while True:
        epoch += 1
        if cancel is not None and cancel.is_set():
            raise Cancelled("training cancelled")
        order = torch.randperm(n, generator=g).to(device)
        for start in range(0, n, spec.batch_size):
            idx = order[start:start + spec.batch_size]
            opt.zero_grad(set_to_none=False)
            with cast:
                loss = loss_of(idx)
            loss.backward()
            opt.step()
            step += 1
            yield epoch, step, start + spec.batch_size >= n


def stack_heads(nets: list[Net], spec: TrainSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Stacked weights (Σm, d), block-diagonal readout (Σm, k·n_out) and the loss weights."""
    for net in nets:  # as engine.maths.training does: the spec decides the head's parametrisation
        net.mlp.param = spec.param
    W0 = torch.cat([net.mlp.W.detach() for net in nets]).clone()
    A = torch.block_diag(*[net.mlp.readout() for net in nets])
    return W0, A, loss_weights(nets, spec)


def train_pair(nets: list[Net], phi: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int = 0,
               record: Iterable[int] = (), on_record: Callable | None = None,
               progress: Callable[[float, str], None] | None = None, cancel: CancelFlag | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train nets and their linearisations side by side (same init, optimiser, batches, steps).

    nets: heads of one arch and seed with fixed features (widths may differ), trained as
    one stacked model like ``engine.maths.training.train_many``; phi (n, d) their features of the
    training set, y (n,) labels. ``on_record(epoch, W, W_lin)`` is called before training
    (epoch 0) and after each epoch listed in ``record``, with the stacked (Σm, d) weights.
    Returns (W, W_lin, W0), stacked. The nets' own weights are left at W0.
    """
    if not all(net.fixed_features for net in nets):
        raise BadInput("the linearised comparison needs fixed features (not qkv attention)")
    loss_name = resolve_loss(spec, n_classes)
    W0, A, weights = stack_heads(nets, spec)
    k, n_out = len(nets), nets[0].mlp.a.shape[1]
    mask0 = phi @ W0.T > 0
    W, W_lin = torch.nn.Parameter(W0.clone()), torch.nn.Parameter(W0.clone())

    def loss_of(idx):
        rows, yy = phi[idx], y[idx]
        real = per_model_loss((torch.relu(rows @ W.T) @ A).reshape(-1, k, n_out), yy, loss_name, n_classes)
        lin = per_model_loss(linearised_head(rows, W_lin, mask0[idx], A).reshape(-1, k, n_out), yy,
                              loss_name, n_classes)
        both = real + lin  # independent parameters: each gets its own gradient
        return both.sum() if weights is None else (both * weights.to(both.dtype)).sum()

    record = set(record)
    if spec.epochs > 0 and B.in_span(phi.shape[0], phi.shape[1], spec):
        return _pair_in_span(nets, phi, y, n_classes, spec, seed, record, on_record, progress, cancel, W0, mask0,
                             weights, loss_name)
    if on_record is not None and 0 in record:
        on_record(0, W.detach(), W_lin.detach())
    if spec.epochs == 0:
        return W.detach(), W_lin.detach(), W0
    for epoch, _, end in batch_steps([W, W_lin], loss_of, phi.shape[0], spec, seed, phi.device, cancel):
        if not end:
            continue
        if not (bool(torch.isfinite(W).all()) and bool(torch.isfinite(W_lin).all())):
            raise BadInput(f"training diverged at epoch {epoch}: the weights are not finite; lower the "
                           f"learning rate (now {spec.lr:g})")
        if on_record is not None and epoch in record:
            on_record(epoch, W.detach(), W_lin.detach())
        if progress is not None:
            progress(epoch / spec.epochs, f"epoch {epoch}/{spec.epochs}")
        if epoch >= spec.epochs:
            break
    return W.detach(), W_lin.detach(), W0


def _pair_in_span(nets: list[Net], phi: torch.Tensor, y: torch.Tensor, n_classes: int, spec: TrainSpec, seed: int,
                  record: set[int], on_record: Callable | None, progress: Callable[[float, str], None] | None,
                  cancel: CancelFlag | None, W0: torch.Tensor, mask0: torch.Tensor, weights: torch.Tensor | None,
                  loss_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``train_pair`` for plain SGD with n < 2d: the net, then its linearisation (the pattern at W₀
    fixed), each trained in the features' span (``engine.maths.span``: the same steps in another
    order, 2d/n times fewer FLOPs), then ``on_record`` at each recorded epoch from their snapshots."""
    heads, keep = [net.mlp for net in nets], torch.ones(len(nets), phi.shape[0], dtype=phi.dtype, device=phi.device)
    wanted = {e for e in record if 0 <= e <= spec.epochs}
    runs = []
    for half, frozen in enumerate((None, mask0)):
        part = None if progress is None else \
            (lambda f, s, h=half: progress((h + f) / 2, f"{'linearised, ' if h else ''}{s}"))
        runs.append(sgd_in_span(phi, y, n_classes, heads, keep, spec, seed, part, cancel, frozen, weights, loss_name,
                                wanted))
    real, lin = runs
    if on_record is not None:
        for epoch in sorted(wanted):
            on_record(epoch, real.W_at(epoch), lin.W_at(epoch))
    return real.W, lin.W, W0


# ---------------------------------------------------------------- K∞ gradient flow

def flow_rates(spec: TrainSpec, n: int, n_out: int) -> tuple[float, float, int] | None:
    """(η', β, steps per epoch) of the MSE gradient flow the engine's SGD follows; None
    when the loss is not MSE or the optimiser not SGD. η' = 2η/(n·n_out), β = η·λ."""
    if spec.optimizer != "sgd":
        return None
    if resolve_loss(spec, 2 if n_out == 1 else n_out) != "mse":
        return None
    return 2.0 * spec.lr / (n * n_out), spec.lr * spec.weight_decay, math.ceil(n / spec.batch_size)


def _phi1(x: torch.Tensor) -> torch.Tensor:
    """(1 − e^{−x}) / x, 1 at x = 0, accurate for tiny x."""
    safe = torch.where(x > 0, x, torch.ones_like(x))
    return torch.where(x > 0, -torch.expm1(-safe) / safe, torch.ones_like(x))


class KernelFlow:
    """Gradient-flow predictions of kernel regression in closed form (module docstring).

    K (n, n) train kernel, K_t (n_t, n) test–train kernel, float64. The eigendecomposition
    is done once; ``predict`` is then O(n_t·n·c) per call.
    """

    def __init__(self, K: torch.Tensor, K_t: torch.Tensor):
        K = K.double()
        if not B.all_finite(K):  # eigh of a NaN kernel raises deep inside LAPACK
            raise BadInput(f"the K∞ gradient flow's {K.shape[0]} x {K.shape[0]} kernel holds NaN or infinite "
                           "values; check the data for non-finite or all-zero rows")
        with eig_threads(K.shape[0], K.device.type):
            mu, U = torch.linalg.eigh((K + K.T) / 2)
        self.mu, self.U = mu.clamp(min=0.0), U    # rounding can make tiny eigenvalues negative
        self.KtU = K_t.double() @ U

    def predict(self, Y: torch.Tensor, F0: torch.Tensor, F0_t: torch.Tensor, eta: float, beta: float, tau: float) -> torch.Tensor:
        """F'(τ) (n_t, c) float64 from targets Y (n, c), initial outputs F0 (n, c), F0_t (n_t, c)."""
        Gy, G0 = self.U.T @ Y.double(), self.U.T @ F0.double()
        em = eta * self.mu
        a = em + beta
        decay = math.exp(-beta * tau)
        ratio = torch.where(a > 0, em / torch.where(a > 0, a, torch.ones_like(a)), torch.ones_like(a))
        if beta > 0:
            c1 = -math.expm1(-beta * tau) / a  # a ≥ β > 0
        else:
            c1 = torch.zeros_like(a)
        inner = c1[:, None] * Gy - (tau * decay) * _phi1(em * tau)[:, None] * (G0 - ratio[:, None] * Gy)
        return decay * F0_t.double() + eta * (self.KtU @ inner)
