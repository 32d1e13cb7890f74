"""The two networks of the paper and the attention feature maps in front of them.

Both architectures are the same two-layer ReLU head

    f(x) = m^(-1/2) · relu(φ(x) Wᵀ) a,        W: (m, d) trained,  a: (m, c) fixed ±1,

applied to different features φ (``param="mup"`` replaces m^(-1/2) by μP's m^(-1); see
``TwoLayerReLU`` and ``engine.maths.training``):

- ``relu`` (2L-ReLU):   φ(x) = normalize(x)
- ``attn`` (MLP-Attn):  φ(x) = normalize(A(normalize(x); Z)), where A is an attention map
  computed over the (normalised) training set Z. It is transductive: test points use the
  training set's map, and perturbing a training point changes every feature.

Attention variants are an enum plus a dispatch table (``ATTENTION_FNS``; what else each implies is
its record, ``specs.VARIANTS``, and a trainable one's module is in ``ATTENTION_MODULES``); the default,
``linear``, is the paper's parameter-free linearised attention ``A(z) = C z`` with
``C = Zᵀ Z``, so that the attention features of the training set are ``Z Zᵀ Z`` and their
Gram is ``G³``. ``centered`` subtracts the training set's mean attention feature first
(``A(z) = C (z − z̄)``): a different model, reported as one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..runtime.errors import BadInput
from .specs import ARCHS, PARAMS, Attention, check_init, check_width, parse_attention, variant


def normalize_rows(X: torch.Tensor) -> torch.Tensor:
    """ℓ2-normalise the rows of ``X`` (n, d); all-zero rows stay zero."""
    return X / X.norm(dim=1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny ** 0.5)


def _linear(Z, Zref, p):
    """Row i = C z_i with C = Zrefᵀ Zref, in whichever order costs less: forming C (d × d) when
    the rows outnumber the features, else the (n1 × n2) products (never both)."""
    (n1, d), n2 = Z.shape, Zref.shape[0]
    if n1 * n2 > d * (n2 + n1):  # ~FLOPs of (Z Zrefᵀ) Zref against Z (Zrefᵀ Zref)
        return Z @ (Zref.T @ Zref)
    return (Z @ Zref.T) @ Zref


def _centered(Z, Zref, p):
    """Row i = C (z_i − z̄), z̄ the mean training row: linear attention minus the mean attention
    feature of the training set (C z̄), so the training features have mean zero before the
    output normalisation.

    A different model from the paper's, not a numerical variant of it: ``linear`` puts 99 % of
    every MNIST feature on one shared direction; this removes it. On the training set the
    features are P Z Zᵀ Z (P = I − 11ᵀ/n) with Gram P G³ P, of rank ≤ n − 1, so there is no
    closed-form κ (the spectrum reports none)."""
    return _linear(Z - Zref.mean(dim=0, keepdim=True), Zref, None)


def _stacked(Z, Zref, p):
    for _ in range(int(p)):
        Z = _linear(Z, Zref, None)
    return Z


def _truncated(Z, Zref, p):
    r = int(p)
    if r > min(Zref.shape):
        raise BadInput(f"truncated:{r} keeps more directions than the training set has "
                       f"(at most min(n, d) = {min(Zref.shape)})")
    # C_r = V_r diag(s_r²) V_rᵀ from the SVD of the training set.
    _, s, Vh = torch.linalg.svd(Zref, full_matrices=False)
    Vr, sr = Vh[:r], s[:r]
    return ((Z @ Vr.T) * sr**2) @ Vr


def _softmax(Z, Zref, p):
    weights = torch.softmax((Z @ Zref.T) / p, dim=1)  # rows sum to one
    return weights @ Zref


class QKVAttention(nn.Module):
    """Trainable single-head attention over the training set (transductive, like the others).

    ``A(z) = softmax((z W_Q)(Zref W_K)ᵀ / √d_k) (Zref W_V)`` with W_Q, W_K (d, d_k) and
    W_V (d, d) at the standard init N(0, 1/d); d_k = min(d, 64). All three are
    ``nn.Parameter``s, trained with the head; the net's NTK then needs autograd.
    """

    def __init__(self, d: int, seed: int = 0, dtype: torch.dtype = torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(int(seed) + 104729)
        dk = min(d, 64)

        def init(*shape):
            return nn.Parameter((torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(d)).to(dtype))

        self.W_Q, self.W_K, self.W_V = init(d, dk), init(d, dk), init(d, d)
        self.scale = 1.0 / math.sqrt(dk)

    def forward(self, Z: torch.Tensor, Zref: torch.Tensor) -> torch.Tensor:
        scores = (Z @ self.W_Q) @ (Zref @ self.W_K).T * self.scale
        return torch.softmax(scores, dim=1) @ (Zref @ self.W_V)


def _qkv_at_init(Z, Zref, p):
    # Parameter-free callers (spectra) see the trainable variant at its seed-0 init.
    return QKVAttention(Z.shape[1], 0, Z.dtype).to(Z.device).requires_grad_(False)(Z, Zref)


ATTENTION_FNS = {
    Attention.LINEAR: _linear,
    Attention.CENTERED: _centered,
    Attention.STACKED: _stacked,
    Attention.TRUNCATED: _truncated,
    Attention.SOFTMAX: _softmax,
    Attention.QKV: _qkv_at_init,
}
# A trainable variant's (``VARIANTS[kind].trainable``) parameters: a module (d, seed, dtype), trained with the head.
ATTENTION_MODULES: dict[Attention, type[nn.Module]] = {Attention.QKV: QKVAttention}


def attention_features(X: torch.Tensor, X_ref: torch.Tensor, attention: str = "linear",
                       normalize: bool = True, module: nn.Module | None = None) -> torch.Tensor:
    """Attention output before the output normalisation.

    X: (n, d) raw inputs; X_ref: (n_ref, d) raw training inputs that define the map.
    Differentiable in both (attacks on MLP-Attn use ``X_ref = X_perturbed``).
    For ``linear`` on the training set this is ``Z Zᵀ Z``, whose Gram is ``G³``.
    """
    spec = parse_attention(attention) if isinstance(attention, str) else attention
    Z = normalize_rows(X) if normalize else X
    Zref = normalize_rows(X_ref) if normalize else X_ref
    if module is not None:  # trainable attention (qkv) with the net's own parameters
        return module(Z, Zref)
    return ATTENTION_FNS[spec.kind](Z, Zref, spec.param)


def features(X: torch.Tensor, X_ref: torch.Tensor | None, arch: str, attention: str = "linear",
             normalize: bool = True, module: nn.Module | None = None) -> torch.Tensor:
    """φ(X): the inputs of the ReLU head, (n, d), same dtype as X.

    ``relu``: normalize(X). ``attn``: normalize(attention_features(X, X_ref)).
    With ``normalize=False`` no row normalisation happens anywhere.
    """
    if arch == "relu":
        return normalize_rows(X) if normalize else X
    if arch == "attn":
        if X_ref is None:
            raise BadInput("arch 'attn' needs the training set X_ref that defines its attention")
        A = attention_features(X, X_ref, attention, normalize, module)
        return normalize_rows(A) if normalize else A
    raise BadInput(f"unknown arch {arch!r}; allowed: {', '.join(ARCHS)}")


def check_param(param: str) -> str:
    if param not in PARAMS:
        raise BadInput(f"unknown param {param!r}; allowed: {', '.join(PARAMS)}")
    return param


class TwoLayerReLU(nn.Module):
    """``f(x) = s_m · relu(x Wᵀ) a`` with ``s_m = width^(-1/2)`` (``param="ntk"``, the paper's)
    or ``s_m = width^(-1)`` (``param="mup"``, the mean-field / μP output multiplier).

    W (width, d) ~ N(0, init_std²) is the only ``nn.Parameter``; a (width, n_out) is a
    buffer of random ±1 signs. Same seed → same W and a, whatever ``param``. Output (n, n_out).
    Training sets ``param`` from ``TrainSpec.param`` (see ``engine.maths.training``), which also
    scales the learning rate as μP asks.

    ``init="antisymmetric"`` (width even, k = width/2): W = [W₁; W₁] and a = [a₁; −a₁], with
    (W₁, a₁) exactly the W and a of a ``gaussian`` net of width k and the same seed. Every
    hidden unit has a twin of opposite readout, so f₀ ≡ 0 (exactly: ``forward`` sums the two
    halves as (h₁ − h₂) a₁). The eNTK wrt W only sees a² = 1, so at width m it *is* the
    gaussian eNTK of width m/2 (mean K∞, the variance of m/2 units); training moves the twins
    apart (their gradients have opposite signs).
    """

    a: torch.Tensor  # the readout signs, a buffer (register_buffer leaves it untyped)

    def __init__(self, d: int, width: int, n_out: int, seed: int = 0, init_std: float = 1.0,
                 dtype: torch.dtype = torch.float32, param: str = "ntk", init: str = "gaussian"):
        super().__init__()
        check_width(width)
        check_init(init, width)
        if not init_std > 0:
            raise BadInput(f"init_std must be > 0, got {init_std!r}")
        g = torch.Generator().manual_seed(int(seed))
        k = width // 2 if init == "antisymmetric" else width
        W = torch.randn(k, d, generator=g, dtype=torch.float64).to(dtype) * init_std
        signs = torch.randint(0, 2, (k, n_out), generator=g).to(dtype) * 2 - 1
        if init == "antisymmetric":
            W, signs = torch.cat([W, W]), torch.cat([signs, -signs])
        self.W = nn.Parameter(W)
        self.register_buffer("a", signs)
        self.width = width
        self.init = init
        self.param = check_param(param)

    @property
    def output_scale(self) -> float:
        """s_m: m^-1/2 (ntk) or m^-1 (mup)."""
        return 1.0 / math.sqrt(self.width) if self.param == "ntk" else 1.0 / self.width

    def readout(self) -> torch.Tensor:
        """``s_m · a`` (width, n_out): the fixed second layer with its output multiplier."""
        if self.param == "ntk":
            return self.a / math.sqrt(self.width)
        return self.a / self.width

    def forward(self, phi: torch.Tensor) -> torch.Tensor:
        if self.init == "antisymmetric":  # twins summed pairwise: exactly 0 while W's halves agree
            k = self.width // 2
            out = (torch.relu(phi @ self.W[:k].T) - torch.relu(phi @ self.W[k:].T)) @ self.a[:k]
        else:
            out = torch.relu(phi @ self.W.T) @ self.a
        return out / (math.sqrt(self.width) if self.param == "ntk" else self.width)


class Net(nn.Module):
    """A ReLU head over the features of ``arch``; the unit the experiments train.

    ``forward(X)`` takes raw inputs (n, d) and uses the stored training set ``X_ref``
    for attention. ``head(phi)`` applies only the ReLU head to given features.
    ``fixed_features`` is False for trainable attention (``qkv``: its record's ``trainable``): then
    the features move during training and the NTK covers the attention parameters too. ``init``:
    one of ``INITS`` (see ``TwoLayerReLU``).
    """

    X_ref: torch.Tensor  # the stored training inputs, a buffer (register_buffer leaves it untyped)

    def __init__(self, arch: str, X_ref: torch.Tensor, width: int, n_out: int, seed: int = 0,
                 init_std: float = 1.0, attention: str = "linear", normalize: bool = True,
                 dtype: torch.dtype = torch.float32, param: str = "ntk", init: str = "gaussian"):
        super().__init__()
        if arch not in ARCHS:
            raise BadInput(f"unknown arch {arch!r}; allowed: {', '.join(ARCHS)}")
        self.arch, self.attention, self.normalize = arch, str(parse_attention(attention)), normalize
        self.register_buffer("X_ref", X_ref.to(dtype))
        self.mlp = TwoLayerReLU(X_ref.shape[1], width, n_out, seed, init_std, dtype, param, init)
        kind = parse_attention(attention).kind
        trainable = arch == "attn" and variant(kind).trainable
        self.attn = ATTENTION_MODULES[kind](X_ref.shape[1], seed, dtype) if trainable else None
        self.fixed_features = not trainable

    def features(self, X: torch.Tensor, X_ref: torch.Tensor | None = None) -> torch.Tensor:
        dtype = self.X_ref.dtype
        ref = self.X_ref if X_ref is None else X_ref.to(dtype)
        return features(X.to(dtype), ref, self.arch, self.attention, self.normalize, self.attn)

    def head(self, phi: torch.Tensor) -> torch.Tensor:
        return self.mlp(phi)

    def forward(self, X: torch.Tensor, X_ref: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features(X, X_ref))
