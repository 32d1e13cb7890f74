"""Influence of one trained net read three ways, on the clean or on perturbed training inputs.

A ``Trained`` net (its recipe, the float32 net, its copy at the reading precision and its
initial weights) is read on a training set ``Xs`` (n, d) in the attack's space (the clean set,
or the set after an attack or a random perturbation; MLP-Attn's attention is over ``Xs``) by
``read``, which returns a ``ReadOut``: the influence (n_test, p) of ``p`` training points on the
reading's target, sign as ``engine.maths.influence`` (f(x_t) − f₋ᵢ(x_t)), and its aggregate (p,)
(mean over test points). The readings (``engine.experiments.recipes.READINGS``):

- ``ridge``: exact kernel-ridge leave-one-out on ``r.kernel`` of the net (every point at once);
- ``flow``: kernel gradient descent's leave-one-out on the same kernel for the net's own steps,
  from its initial outputs (``engine.maths.loo.flow_loo``), at the given points;
- ``retrain``: the head retrained from its initialisation with the same batch order without each
  given point, in float32 as the net was trained, all as one batched masked model
  (``engine.maths.loo.train_masked``); f is the full run trained beside them.

``fresh_net`` is the net a recipe starts from, ``kernels_of`` its kernels and ``influence_of`` the
ridge reading (the influence and malleability experiments read through them too).

Kernels (``ridge``, ``flow``) are those of the net trained on the clean set, evaluated at ``Xs``
(``engine.experiments.malleability``'s ``retrain=False``), or of ``net`` when the caller passes a
net retrained on ``Xs``. The retraining reading always retrains: it is the network's own answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..maths.influence import aggregate, influence_matrix
from ..maths.kinf import infinite_ntk
from ..maths.loo import KernelLOO, best_other, flow_loo, head_outputs, train_masked
from ..maths.models import Net
from ..maths.ntk import empirical_ntk
from ..maths.training import n_outputs, predict_labels
from ..runtime.errors import BadInput
from .recipes import NetRecipe, Reading
from .runs import Prepared, check_finite

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag


def fresh_net(recipe: NetRecipe, X_ref: torch.Tensor, c: int, dev: torch.device) -> Net:
    """The recipe's net at initialisation (float32), attending over ``X_ref`` (n, d)."""
    return Net(recipe.arch, X_ref, recipe.width, n_outputs(c), recipe.seed, recipe.init_std, recipe.attention,
               recipe.normalize, init=recipe.init).to(dev)


def kernels_of(r: Reading, net: Net, X: torch.Tensor, Xt: torch.Tensor, X_ref: torch.Tensor | None = None,
               kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K (n, n) and K_test (n_test, n) of ``kind`` (default ``r.kernel``): the net's eNTK K_m, or
    K∞ of the net's features (with MLP-Attn's attention over ``X_ref``)."""
    if (kind or r.kernel) == "entk":
        return (empirical_ntk(net, X, X_ref=X_ref, storage=r.storage),
                empirical_ntk(net, Xt, X, X_ref=X_ref, storage=r.storage))
    with torch.no_grad():
        phi, phi_t = net.features(X, X_ref), net.features(Xt, X_ref)
    return infinite_ntk(phi, storage=r.storage), infinite_ntk(phi_t, phi, storage=r.storage)


def influence_of(r: Reading, net: Net, X: torch.Tensor, Y: torch.Tensor, Xt: torch.Tensor, yt: torch.Tensor,
                 X_ref: torch.Tensor | None = None,
                 kernels: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The ridge reading's influence (n_test, n) on ``r.target`` under ``r.kernel``."""
    K, Kt = kernels if kernels is not None else kernels_of(r, net, X, Xt, X_ref)
    return influence_matrix(K, Kt, Y, r.ridge, target=r.target, y_test=yt)


@dataclass
class Trained:
    """One trained net: its recipe, the float32 net, its copy at the reading's precision, W₀."""

    recipe: NetRecipe
    net32: Net
    net: Net
    W0: torch.Tensor  # (m, d) float32 initial weights

    def weight_movement(self) -> float:
        """‖W − W₀‖_F / ‖W₀‖_F: how far training moved the head (small in the kernel regime)."""
        W = self.net32.mlp.W.detach()
        return float(torch.linalg.norm(W - self.W0) / torch.linalg.norm(self.W0))


@dataclass
class ReadOut:
    """A reading's influence of ``points`` (p,) on the test set: ``I`` (n_test, p) float64 and its
    aggregate ``agg`` (p,); ``test_acc``: accuracy of the predictor the reading describes, when it
    has one of its own (the retrained net), else None."""

    points: torch.Tensor
    I: torch.Tensor
    agg: torch.Tensor
    test_acc: float | None = None

    def at(self, points: torch.Tensor) -> torch.Tensor:
        """The aggregate (len(points),) at training indices that are among ``self.points``."""
        where = torch.searchsorted(self.points, points.to(self.points.device))
        if not torch.equal(self.points[where.clamp(max=len(self.points) - 1)], points.to(self.points.device)):
            raise BadInput(f"points {points.tolist()} are not all among this reading's {len(self.points)} points")
        return self.agg[where]

    def columns(self, points: torch.Tensor) -> torch.Tensor:
        """The influence columns (n_test, len(points)) at training indices among ``self.points``."""
        where = torch.searchsorted(self.points, points.to(self.points.device))
        return self.I[:, where]


def read(r: Reading, t: Trained, p: Prepared, Xs: torch.Tensor, Xt: torch.Tensor, points: torch.Tensor | None,
         *, X_ref: torch.Tensor | None = None, kernels: tuple[torch.Tensor, torch.Tensor] | None = None,
         cancel: CancelFlag | None = None) -> ReadOut:
    """Reading ``r`` of ``t`` on training inputs Xs (n, d) (labels ``p.y``, targets ``p.Y``) and test
    inputs Xt, at ``points`` (training indices; ``ridge`` reads every point and ignores them).
    ``X_ref``: the set attention runs over (None: the net's own training set). ``kernels``: (K,
    K_test) of ``r.kernel`` of ``t.net`` on (Xs, Xt) when already computed (``ridge``, ``flow``)."""
    if r.name == "ridge":
        I = influence_of(r, t.net, Xs, p.Y, Xt, p.yt, X_ref=X_ref, kernels=kernels)
        return ReadOut(torch.arange(Xs.shape[0], device=I.device), I, aggregate(I))
    if points is None:
        raise BadInput(f"reading {r.name!r} reads given training points; none were given")
    points = torch.sort(points.to(Xs.device)).values
    if r.name == "flow":
        K, K_t = kernels if kernels is not None else kernels_of(r, t.net, Xs, Xt, X_ref)
        check_finite(K, f"the {r.kernel} kernel of the flow reading")
        init = fresh_net(t.recipe, t.net32.X_ref, p.c, p.device).to(t.net.X_ref.dtype)
        with torch.no_grad():
            F0, F0_t = init(Xs, X_ref=X_ref).double(), init(Xt, X_ref=X_ref).double()
        loo = flow_loo(K.double(), K_t.double(), p.Y, p.yt, points, t.recipe.train, F0, F0_t)
        I = loo.scored(r.target, p.yt)
        return ReadOut(loo.points, I, I.mean(dim=0))
    if r.name == "retrain":
        return _retrained(r, t, p, Xs, Xt, points, X_ref, cancel)
    raise BadInput(f"unknown influence reading {r.name!r}; allowed: ridge, flow, retrain")


def _retrained(r: Reading, t: Trained, p: Prepared, Xs: torch.Tensor, Xt: torch.Tensor, points: torch.Tensor,
               X_ref: torch.Tensor | None, cancel: CancelFlag | None) -> ReadOut:
    """The ``retrain`` reading: 1 + p heads from the same W₀, head 0 on every point, head j + 1
    without ``points[j]``, trained as one batched model on float32 features of Xs."""
    ref = None if X_ref is None else X_ref.float()
    with torch.no_grad():
        phi, phi_t = t.net32.features(Xs.float(), ref), t.net32.features(Xt.float(), ref)
    head = fresh_net(t.recipe, t.net32.X_ref, p.c, p.device).mlp
    n, k = phi.shape[0], 1 + points.numel()
    keep = torch.ones(k, n, dtype=torch.bool, device=phi.device)
    keep[torch.arange(1, k, device=phi.device), points] = False
    run = train_masked(phi, p.y, p.c, [head] * k, keep, t.recipe.train, t.recipe.seed, cancel=cancel)
    with torch.no_grad():
        out = head_outputs(run.pre_activations(phi_t), [head] * k).double()  # (k, n_test, c)
    check_finite(out, "the retrained heads' test outputs", "lower the learning rate")
    D = (out[0][None] - out[1:]).permute(1, 0, 2)  # (n_test, p, c): f − f₋ᵢ
    loo = KernelLOO(D, points, best_other(out[0], p.yt))
    I = loo.scored(r.target, p.yt)
    acc = float((predict_labels(out[0]) == p.yt).double().mean())
    return ReadOut(points, I, I.mean(dim=0), acc)
