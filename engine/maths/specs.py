"""The maths layer's settings and names, without torch: what the configs, the estimates and the
command line's ``--help`` need (each re-exported where it belongs: ``models``, ``training``,
``attacks``, ``influence``, ``ntk``).

``python -m engine --help`` builds every flag from the config dataclasses, and refusing a bad value
must not wait seconds for torch; so the training and attack specs, the architecture and init names,
the attention variants' records (``VARIANTS``), the influence targets, the kernel storages and the
byte count the estimates read live here, on the standard library and ``engine.runtime`` only (``tests/test_lean.py``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping

from ..runtime.errors import BadInput
from ..runtime.settings import normalised, setting, validate

if TYPE_CHECKING:  # annotations only: the references import numpy when called
    import numpy as np

# ---------------------------------------------------------------- nets and attention (engine.maths.models)

ARCHS = ("relu", "attn")
INITS = ("gaussian", "antisymmetric")  # W ~ N(0, σ²) and a = ±1; or the same, mirrored so that f₀ ≡ 0
PARAMS = ("ntk", "mup")    # parametrisations of the head: output scale m^-1/2 (the paper's) or m^-1 (μP)
MAX_WIDTH = 65536          # hidden units; larger heads do not fit a kernel computation here


class Attention(str, enum.Enum):
    """Attention variants for MLP-Attn. Strings may carry a parameter: ``stacked:2``. What each
    implies (its parameter, whether it trains, its estimate's cost and slow-down, its κ theory, its
    label, its numpy reference) is its ``AttentionVariant`` in ``VARIANTS``; its feature map is
    ``models.ATTENTION_FNS``."""

    LINEAR = "linear"        # C z, C = Zᵀ Z (the paper's)
    CENTERED = "centered"    # C (z − z̄): linear, minus the training set's mean attention feature
    STACKED = "stacked"      # C^k z: k linear layers, Gram G^(2k+1)
    TRUNCATED = "truncated"  # C_r z: top-r singular directions of Z only
    SOFTMAX = "softmax"      # Nadaraya–Watson over the training set, temperature T
    QKV = "qkv"              # trainable W_Q, W_K, W_V (standard init), trained with the head


Weights = Mapping[str, "np.ndarray"]  # a trainable variant's parameters by name (its module's), as arrays
Reference = Callable[["np.ndarray", "np.ndarray", "float | None", "Weights | None"], "np.ndarray"]


@dataclass(frozen=True)
class AttentionVariant:
    """Everything an attention variant implies outside its feature map, declared once: models,
    options, the estimates, the spectrum's and the scaling law's κ theory and the sidebar read it,
    and ``tests/test_attention_variants.py`` checks every record against what the code does.

    κ theory: the attention features' Gram has κ = base^p, base κ(G) (or λ₁/λ_r over the top r
    eigenvalues of G, ``kappa_top``) and p = ``kappa_exponent(param)``; ``None``: no closed form.

    ``flops(param, n, d)``: the float64 operations of the feature map over n rows of dimension d
    attending over n rows, which ``engine.runtime.budget.attention_s`` turns into the estimates'
    seconds: a map whose scores are n × n costs n²d, not d²n. ``reference(Z, Z_ref, param,
    weights)``: the same map in plain numpy, float64, on normalised rows Z (n, d) and Z_ref
    (n_ref, d); ``weights``: a trainable variant's parameters by name (None for the others). Both
    are keywords without a default: a new variant states them. ``example`` must come back from
    ``str(parse_attention(example))`` unchanged (the sidebar and links compare the two).
    """

    kind: Attention
    usage: str                            # how it is written in the help: "stacked:K"
    label: str                            # what it is, in the help's words
    example: str                          # the sidebar's choice of it; str(parse_attention(example)) == example
    param: str | None = None              # what its parameter is ("layers"); None: it takes none
    default_param: float | None = None    # the parameter of the bare name ("stacked" = "stacked:1")
    bounds: tuple[float, float] = (0, 0)  # the parameter's allowed range, both ends included
    integer: bool = False                 # the parameter is a count
    trainable: bool = False               # own parameters trained with the head: the features move
    slowdown: float = 1                   # factor on the estimate of an MLP-Attn net's kernels and training
    kappa_exponent: Callable[[float | None], int] | None = None  # p of κ = base^p from the parameter
    kappa_top: bool = False               # the κ theory's base is λ₁/λ_r (r the parameter), not κ(G)
    flops: Callable[[float | None, float, float], float] = field(kw_only=True)  # float64 operations (param, n, d)
    reference: Reference = field(kw_only=True)  # the feature map in numpy: the tests' independent reference


MAX_STACKED = 16           # stacked:k beyond this cubes κ past anything float64 can resolve
MAX_TRUNCATED = 100_000
SOFTMAX_T = (1e-3, 1e3)    # temperatures outside this under- or overflow the softmax
# Trainable QKV attention: autograd Jacobians over every parameter, measured ~20x the closed form.
QKV_SLOWDOWN = 20


# ---------------------------------------------------------------- the maps' costs and numpy references

def _gram_flops(n: float, d: float) -> float:
    """C = Z_refᵀ Z_ref (d × d) and Z C: the linear map's two GEMMs."""
    return 4 * n * d * d


def _qkv_flops(n: float, d: float) -> float:
    """Q and K (n × d_k), V (n × d), the n × n scores over d_k = min(d, 64) and their product with V."""
    dk = min(d, 64)
    return 4 * n * dk * d + 2 * n * d * d + 2 * n * n * dk + 2 * n * n * d


def _softmax_rows(S: np.ndarray) -> np.ndarray:
    import numpy as np

    E = np.exp(S - S.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def _linear_np(Z: np.ndarray, R: np.ndarray, p: float | None = None, w: Weights | None = None) -> np.ndarray:
    return Z @ (R.T @ R)  # C z, C = Rᵀ R


def _centered_np(Z: np.ndarray, R: np.ndarray, p: float | None = None, w: Weights | None = None) -> np.ndarray:
    return (Z - R.mean(axis=0)) @ (R.T @ R)


def _stacked_np(Z: np.ndarray, R: np.ndarray, p: float | None = None, w: Weights | None = None) -> np.ndarray:
    import numpy as np

    return Z @ np.linalg.matrix_power(R.T @ R, int(p or 1))  # Cᵏ z


def _truncated_np(Z: np.ndarray, R: np.ndarray, p: float | None = None, w: Weights | None = None) -> np.ndarray:
    import numpy as np

    lam, V = np.linalg.eigh(R.T @ R)  # C's eigenpairs, ascending: the top r span C_r (the code takes R's SVD)
    Vr, lr = V[:, ::-1][:, :int(p or 1)], lam[::-1][:int(p or 1)]
    return Z @ (Vr * lr) @ Vr.T


def _softmax_np(Z: np.ndarray, R: np.ndarray, p: float | None = None, w: Weights | None = None) -> np.ndarray:
    return _softmax_rows(Z @ R.T / float(p or 1)) @ R


def _qkv_np(Z: np.ndarray, R: np.ndarray, p: float | None = None, w: Weights | None = None) -> np.ndarray:
    import numpy as np

    if w is None:
        raise BadInput("the qkv reference takes the attention's weights W_Q, W_K, W_V")
    scores = (Z @ w["W_Q"]) @ (R @ w["W_K"]).T / np.sqrt(w["W_Q"].shape[1])
    return _softmax_rows(scores) @ (R @ w["W_V"])


_DECLARED = (
    AttentionVariant(Attention.LINEAR, "linear", "X Xᵀ X, the paper's", "linear", kappa_exponent=lambda p: 3,
                     flops=lambda p, n, d: _gram_flops(n, d), reference=_linear_np),
    AttentionVariant(Attention.CENTERED, "centered", "linear minus the training set's mean attention feature: a "
                     "different model", "centered",  # rank ≤ n − 1: no closed-form κ
                     flops=lambda p, n, d: _gram_flops(n, d), reference=_centered_np),
    AttentionVariant(Attention.STACKED, "stacked:K", "K layers", "stacked:2", param="layers", default_param=1,
                     bounds=(1, MAX_STACKED), integer=True, kappa_exponent=lambda p: 2 * int(p or 1) + 1,
                     flops=lambda p, n, d: _gram_flops(n, d) + max(1, int(p or 1) - 1) * 2 * n * d * d,
                     reference=_stacked_np),
    AttentionVariant(Attention.TRUNCATED, "truncated:R", "rank-R C", "truncated:10", param="directions",
                     default_param=10, bounds=(1, MAX_TRUNCATED), integer=True, kappa_exponent=lambda p: 3,
                     kappa_top=True, flops=lambda p, n, d: _gram_flops(n, d) + 4 * min(n, d) ** 3,
                     reference=_truncated_np),
    AttentionVariant(Attention.SOFTMAX, "softmax:T", "temperature T", "softmax:0.1", param="temperature",
                     default_param=0.1, bounds=SOFTMAX_T, flops=lambda p, n, d: 4 * n * n * d,
                     reference=_softmax_np),
    AttentionVariant(Attention.QKV, "qkv", "trainable query/key/value", "qkv", trainable=True,
                     slowdown=QKV_SLOWDOWN, flops=lambda p, n, d: _qkv_flops(n, d), reference=_qkv_np),
)
_VARIANTS: dict[Attention, AttentionVariant] = {}
VARIANTS: Mapping[Attention, AttentionVariant] = MappingProxyType(_VARIANTS)  # read-only; register_variant writes


def register_variant(v: AttentionVariant) -> AttentionVariant:
    """Add ``v`` to ``VARIANTS`` (the records above, or a test's throw-away one; its kind must be an
    ``Attention`` member and its feature map in ``models.ATTENTION_FNS``). ``ValueError`` if taken."""
    if v.kind in _VARIANTS:
        raise ValueError(f"attention {v.kind.value!r} is registered already")
    _VARIANTS[v.kind] = v
    return v


def unregister_variant(kind: Attention) -> None:
    """Remove a (throw-away) variant from ``VARIANTS``."""
    del _VARIANTS[kind]


for _v in _DECLARED:
    register_variant(_v)


@dataclass(frozen=True)
class AttentionSpec:
    kind: Attention
    param: float | None  # k for stacked, r for truncated, T for softmax

    def __str__(self) -> str:
        if self.param is None:
            return self.kind.value
        p = int(self.param) if self.variant.integer else self.param
        return f"{self.kind.value}:{p}"

    @property
    def variant(self) -> AttentionVariant:
        return VARIANTS[self.kind]

    @property
    def kappa_exponent(self) -> int | None:
        """p of the κ theory (κ of the features' Gram = base^p, see ``AttentionVariant``); None: none."""
        rule = self.variant.kappa_exponent
        return None if rule is None else rule(self.param)


def parse_attention(text: str) -> AttentionSpec:
    """``"linear"``, ``"centered"``, ``"stacked:k"`` (k ≥ 1), ``"truncated:r"`` (r ≥ 1), ``"softmax[:T]"``
    (T > 0), ``"qkv"``."""
    name, _, arg = str(text).strip().lower().partition(":")
    try:
        kind = Attention(name)
    except ValueError:
        allowed = ", ".join(a.value for a in Attention)
        raise BadInput(f"unknown attention {text!r}; allowed: {allowed} (e.g. stacked:2, truncated:10)") from None
    v = VARIANTS[kind]
    if v.param is None:
        if arg:
            raise BadInput(f"attention {kind.value!r} takes no parameter, got {text!r}")
        return AttentionSpec(kind, None)
    if not arg:
        return AttentionSpec(kind, v.default_param)
    try:
        value = float(arg)
    except ValueError:
        raise BadInput(f"attention parameter in {text!r} must be a number") from None
    lo, hi = v.bounds
    if v.integer:
        if not math.isfinite(value) or value != int(value) or not lo <= value <= hi:
            raise BadInput(f"attention {text!r}: {kind.value} needs an integer in [{lo}, {hi}]")
    elif not (math.isfinite(value) and lo <= value <= hi):
        raise BadInput(f"attention {text!r}: {kind.value} {v.param} must lie in [{lo:g}, {hi:g}]")
    return AttentionSpec(kind, value)


def variant(attention: str | Attention | AttentionSpec) -> AttentionVariant:
    """The record of an attention variant, from its text (``"stacked:2"``), kind or spec."""
    if isinstance(attention, AttentionSpec):
        return attention.variant
    if isinstance(attention, Attention):
        return VARIANTS[attention]
    return parse_attention(attention).variant


def attention_slowdown(attention: str, archs: tuple[str, ...] | str) -> float:
    """The estimates' factor on an MLP-Attn net's time: the variant's ``slowdown`` where ``"attn"``
    is among ``archs`` (one arch or several), else 1."""
    return variant(attention).slowdown if "attn" in ((archs,) if isinstance(archs, str) else archs) else 1


def check_init(init: str, width: int | None = None) -> str:
    """``init`` in INITS; ``antisymmetric`` pairs hidden units, so its widths must be even."""
    if init not in INITS:
        raise BadInput(f"unknown init {init!r}; allowed: {', '.join(INITS)}")
    if init == "antisymmetric" and width is not None and width % 2:
        raise BadInput(f"init 'antisymmetric' pairs hidden units: the width must be even, got {width}")
    return init


def check_width(width: object) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
        raise BadInput(f"width must be an integer in [1, {MAX_WIDTH}], got {width!r}")
    return width


# ---------------------------------------------------------------- training (engine.maths.training)

LOSSES = ("auto", "ce", "mse")
MAX_LR = 1e4   # SGD's stability limit n·c/λ₁ reaches the hundreds for well-conditioned kernels
OPTIMIZERS = ("adam", "adamw", "sgd")
# A learning rate each optimiser trains with at the quick presets' sizes, for a page that switches
# optimiser (Adam's lr left on plain SGD would barely move the net): Adam's is the paper's; SGD's 24 is
# the network preset's (below its stability limit n·c/λ₁ ≈ 30 on MNIST). On the malleability quick
# preset (200 epochs, cross-entropy; 2026-12-07) plain SGD trained 2L-ReLU to 100 % at 10-400 but only
# 86 % at 1 (under the gate), and linear MLP-Attn at no rate tried (1-400: 26-62 % train accuracy; its
# attention Gram's κ³ conditioning): the page says so beside the choice.
SUGGESTED_LR = {"adam": 1e-3, "adamw": 1e-3, "sgd": 24.0}
SGD_LINEAR_NOTE = ("plain SGD does not train linear MLP-Attn in a few hundred epochs at any rate tried (1-400: "
                   "26-62 % train accuracy on MNIST; its κ³ conditioning): use centred attention or Adam")
# What the training GEMMs multiply in: float32 (the default, the reference), or bfloat16 operands with
# float32 accumulation, weights and optimiser state (AMX / AVX512-BF16 on CPUs, tensor cores on GPUs).
TRAIN_PRECISIONS = ("float32", "bfloat16")



def quarters(epochs: int) -> tuple[int, ...]:
    """Snapshot epochs at each quarter of training, 0 to ``epochs`` (none without training): the
    snapshots the NTK convergence and Task alignment pages take (their ``Experiment.view``)."""
    return tuple(sorted({int(epochs) * k // 4 for k in range(5)})) if int(epochs) > 0 else ()

@dataclass(frozen=True)
class TrainSpec:
    """How the head is trained. Defaults are the paper's protocol (Adam, lr 1e-3, batch 128,
    L2 1e-3, 500 epochs); presets in the experiment configs pick shorter runs."""

    epochs: int = setting(500, "training epochs; 0 means no training (the paper: 500)", unit="epochs",
                          lo=0, hi=20_000)
    lr: float = setting(1e-3, "learning rate (the paper's Adam: 1e-3). Plain SGD's stability limit is "
                        "2·n·c/λ₁ (n training points, c outputs, λ₁ the largest eigenvalue of the net's eNTK): "
                        "with MSE it trains lazily below n·c/λ₁, shrinks the kernel first between the two, and "
                        "diverges beyond; cross-entropy tolerates at least as much. Influence and malleability "
                        "rows estimate the limit (sgd_lr_limit); on MNIST it is tens to hundreds",
                        lo=0, lo_open=True, hi=MAX_LR)
    batch_size: int = setting(128, "mini-batch size (the paper: 128)", unit="points", lo=1, hi=100_000)
    weight_decay: float = setting(1e-3, "L2 penalty; coupled (added to the gradient) with adam and sgd, "
                                  "decoupled with adamw (the paper: 1e-3, coupled)", lo=0, hi=1.0)
    optimizer: str = setting("adam", "adam with coupled L2 (the paper), adamw (decoupled decay), "
                             "or plain sgd (the NTK setting)", choices=OPTIMIZERS)
    loss: str = setting("auto", "training loss: auto = MSE on ±1 for 2 classes, cross-entropy otherwise",
                        choices=LOSSES)
    snapshot_epochs: tuple[int, ...] = setting((), "epochs at which the kernel is measured along training",
                                               unit="epochs", lo=0, hi=20_000, max_len=50)
    param: str = setting("ntk", "parametrisation: ntk = output scale m^-1/2, width-independent learning rate "
                         "(the paper's); mup = μP, output scale m^-1, SGD learning rate × m (Adam's unchanged)",
                         choices=PARAMS)
    train_precision: str = setting("float32", "what the training step's GEMMs (φWᵀ and its weight gradient) "
                                   "multiply in: float32 (the reference), or bfloat16 operands with float32 "
                                   "weights and optimiser state (faster where the CPU or GPU has bf16 units; "
                                   "moves test accuracy and the trained kernel slightly; float32 nets only)",
                                   choices=TRAIN_PRECISIONS)

    def __post_init__(self):
        normalised(self)
        validate(self)
        late = [e for e in self.snapshot_epochs if e > self.epochs]
        if late:
            raise BadInput(f"snapshot_epochs {late} lie beyond epochs = {self.epochs}")


# ---------------------------------------------------------------- attacks (engine.maths.attacks)

class AttackMethod(str, enum.Enum):
    FGSM = "fgsm"  # one gradient step of size ε (signed for ℓ∞, ℓ2-normalised for ℓ2)
    PGD = "pgd"    # projected gradient ascent, optional random start
    MIM = "mim"    # momentum iterative method (Dong et al. 2018)


class AttackNorm(str, enum.Enum):
    LINF = "linf"  # default: the paper's ℓ∞ budget; steps along sign(g)
    L2 = "l2"      # per-row Euclidean ball; steps along g / ‖g‖₂


NORMS = tuple(n.value for n in AttackNorm)


@dataclass(frozen=True)
class AttackSpec:
    """One attack on the training set; field order is kept for positional callers."""

    method: str = setting("pgd", "attack algorithm", choices=tuple(m.value for m in AttackMethod),
                          cli=False)  # set by the experiment's own --attack flag
    eps: float = setting(0.05, "radius of the per-row ball in the chosen norm",
                         unit="input units (pixels in [0, 1] for raw images)", lo=0, hi=1e3,
                         cli=False)  # set by the experiment's own ε sweep
    steps: int = setting(20, "iterations of PGD and MIM (FGSM takes one step)", lo=1, hi=1000)
    step_size: float | None = setting(None, "PGD / MIM step α; none: 2.5·ε/steps",
                                      unit="input units", lo=0, lo_open=True)
    random_start: bool = setting(False, "PGD: start from a uniform random point of the ball")
    momentum: float = setting(1.0, "MIM decay μ of the accumulated gradient", lo=0, hi=10)
    seed: int = setting(0, "seed of the random start (experiments set it from each network seed)", lo=0,
                        cli=False)
    norm: str = setting("linf", "norm of the ε-ball, per training point (linf: the paper's reading)",
                        choices=NORMS)

    def __post_init__(self):
        validate(self)

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else 2.5 * self.eps / self.steps


# ---------------------------------------------------------------- influence (engine.maths.influence)

INFLUENCE_TARGETS = ("true", "margin", "sum")
DEFAULT_TARGET = "true"  # what configs and pages should use; "sum" ignores one-hot labels
INVERSE_BLOCK = 512  # columns of L⁻¹ held at a time while its column norms are taken


def factor_bytes(n: int, n_test: int, c: int) -> int:
    """Peak bytes of the leave-one-out factorisation beside its inputs: L, the copy of it that
    ``cholesky_solve`` makes, the test solves and one block of L⁻¹."""
    return 8 * (2 * n * n + 3 * n_test * n + min(n, INVERSE_BLOCK) * n + 2 * n * c + 2 * n)


# ---------------------------------------------------------------- kernel storage (engine.maths.ntk)

STORAGE = ("float64", "float32")
