"""Settings that several experiments share, each declared once: one default, help text and set of limits.

Every config that has a ridge, network seeds, architectures, widths, an initial scale, an
initialisation, an attention variant or a kernel storage takes its field from here (``ridge: float = ridge()``),
so ``--help``, the dashboard's widgets and the validation agree across experiments. A config
may pass a different *default* (a width sweep wants several widths) or a stricter ``check``
(the linearised-head experiments refuse trainable attention); the help text and the limits
stay the same.
"""

from __future__ import annotations

from typing import Any, Callable

from ..maths.specs import ARCHS, INFLUENCE_TARGETS, INITS, MAX_WIDTH, STORAGE, VARIANTS, check_init, parse_attention
from ..runtime.errors import BadInput
from ..runtime.settings import setting

SEED_MAX = 2**31 - 1   # torch.manual_seed takes any 64-bit value; 31 bits keeps the seeds portable
MAX_SEEDS = 50         # rows per seed are kept; 50 seeds of the quick presets still fit a dashboard table
MAX_WIDTHS = 16        # widths of one sweep: each is a model trained in the same batched step

ATTENTION_HELP = "attention variant of MLP-Attn: " + ", ".join(f"{v.usage} ({v.label})" for v in VARIANTS.values())
RIDGE_HELP = ("ridge λ of kernel regression, relative to the mean diagonal of the kernel "
              "(λ_abs = ridge · mean diag K)")


def ridge(default: float = 1e-3) -> Any:
    """Ridge λ of every kernel regression (influence, baselines, whitened distances)."""
    return setting(default, RIDGE_HELP, lo=0, lo_open=True, hi=1e3)


def seeds(default: tuple[int, ...] = (0, 1, 2)) -> Any:
    """Network seeds: initialisation, batch order and an attack's random start; a row per seed."""
    return setting(default, "network seeds (initialisation, batch order, an attack's random start); "
                   "a row per seed and mean ± sd over them", lo=0, hi=SEED_MAX, max_len=MAX_SEEDS)


def data_seeds(default: tuple[int, ...] = ()) -> Any:
    """Data draws to repeat a run on (``DataSpec.seed`` of each); empty: the data spec's own draw."""
    return setting(default, "seeds of the data draw to repeat the run on (each a fresh sample of the same "
                   "size); empty: only the data spec's own seed. Rows carry data_seed; nulls pair nets "
                   "within a draw, intervals resample (draw, network seed) pairs", flag="--data-seeds",
                   lo=0, hi=SEED_MAX, max_len=20)


PRECISIONS = ("float64", "float32")


def precision(default: str = "float64") -> Any:
    """Precision of what happens after training: features, kernels, attacks (training stays float32)."""
    return setting(default, "precision of everything after training: the attack's gradients and iterates, the "
                   "features and the kernels' entries (training itself runs in float32): float64 (the "
                   "default, on every device) or float32 (faster on GPUs, but MLP-Attn's ill-conditioned kernel makes "
                   "its flips depend on it; rows record attack_precision and kernel_precision)", choices=PRECISIONS)


def seed(default: int = 0) -> Any:
    """One network seed (the views that show a single net)."""
    return setting(default, "network seed (initialisation and batch order)", flag="--net-seed", lo=0, hi=SEED_MAX)


def archs(default: tuple[str, ...] = ARCHS) -> Any:
    """Architectures compared: 2L-ReLU and MLP-Attn."""
    return setting(default, "architectures: relu (2L-ReLU), attn (MLP-Attn: attention features, then "
                   "the same ReLU net)", choices=ARCHS)


def arch(default: str = "relu") -> Any:
    """One architecture (the views that show a single net)."""
    return setting(default, "architecture: relu (2L-ReLU), attn (MLP-Attn)", choices=ARCHS)


def widths(default: tuple[int, ...]) -> Any:
    """Hidden widths of a sweep (one batched model per width)."""
    return setting(default, "hidden widths m", unit="units", lo=1, hi=MAX_WIDTH, max_len=MAX_WIDTHS)


def width(default: int = 1024) -> Any:
    """One hidden width."""
    return setting(default, "hidden width m", unit="units", lo=1, hi=MAX_WIDTH)


def init_std(default: float = 1.0) -> Any:
    """Scale of the first layer at initialisation; K∞ does not depend on it."""
    return setting(default, "standard deviation σ of the initial weights W ~ N(0, σ²); K∞ does not "
                   "depend on it", lo=0, lo_open=True, hi=100.0)


INIT_HELP = ("initialisation of the head: gaussian (W ~ N(0, σ²), readout a = ±1, the paper's) or antisymmetric "
             "(W = [W₁; W₁], a = [a₁; −a₁]: f₀ ≡ 0, the same eNTK in law as a gaussian net of half the width; "
             "needs even widths)")


def init(default: str = "gaussian") -> Any:
    """How the head is initialised (``engine.maths.specs.INITS``); the config checks even widths."""
    return setting(default, INIT_HELP, choices=INITS)


def check_init_widths(init: str, widths: int | tuple[int, ...]) -> None:
    """One-line ``BadInput`` when ``antisymmetric`` meets an odd width (call in ``__post_init__``)."""
    for w in (widths if isinstance(widths, tuple) else (widths,)):
        check_init(init, w)


def attention(default: str = "linear", check: Callable[[str], object] = parse_attention, only: str = "") -> Any:
    """The attention variant of MLP-Attn; ``check`` may be stricter (``only`` says how, in the help)."""
    return setting(default, ATTENTION_HELP + (f"; {only}" if only else ""), check=check)


def parameter_free_attention(why: str, only: str) -> Any:
    """``attention`` that refuses a trainable variant (qkv), whose trained attention parameters break
    what ``why`` says (the refusal's reason); ``only`` says so in the help."""
    def check(text: str) -> None:
        spec = parse_attention(text)
        if spec.variant.trainable:
            raise BadInput(f"attention {spec.kind.value!r} trains its own parameters, so {why}; "
                           "use a parameter-free variant")

    return attention(check=check, only=only)


def influence_target(default: str = "true") -> Any:
    """Which output an influence scores (``engine.maths.specs.INFLUENCE_TARGETS``)."""
    return setting(default, "influence on: true = each test point's own-class output; margin = own class minus the "
                   "best other class; sum = the label-free sum over outputs (binary tasks have one output: all "
                   "agree)", flag="--influence", choices=INFLUENCE_TARGETS)


SPACES = ("raw", "normalized")


def space(default: str = "raw") -> Any:
    """Where an attack's perturbation lives (``SPACES``)."""
    return setting(default, "where the perturbation lives: raw pixels, or the ℓ2-normalised rows the "
                   "networks see", choices=SPACES)


def check_space(space: str, normalize: bool) -> None:
    """One-line ``BadInput`` when the attack lives on normalised rows the nets do not see (call in
    ``__post_init__`` with the config's ``space`` and ``data.normalize``)."""
    if space == "normalized" and not normalize:
        raise BadInput("space 'normalized' needs normalised rows; drop --no-normalize or use --space raw")


def tau(default: float = 0.1) -> Any:
    """The share of training points an influence tracks (top by |aggregate influence|)."""
    return setting(default, "share of training points tracked (top by |aggregate influence|)",
                   lo=0, lo_open=True, hi=1.0)


INFLUENCE_KERNELS = ("entk", "kinf")  # the trained net's eNTK K_m (the paper's), or K∞ of the same features


def influence_kernel() -> Any:
    """The kernel an influence is read on (``INFLUENCE_KERNELS``)."""
    return setting("entk", "kernel of the influence's ridge regression: entk = the trained net's empirical NTK K_m "
                   "(the paper's), kinf = K∞ of the same features (MLP-Attn's recomputed from the perturbed set after "
                   "an attack)", flag="--influence-kernel", choices=INFLUENCE_KERNELS)


def readings(default: tuple[str, ...] = ("ridge",)) -> Any:
    """How influence is read (``engine.experiments.recipes.READINGS``); each reading its own rows."""
    from .recipes import READINGS

    return setting(default, "how influence is read, each reading its own rows: ridge = exact kernel-ridge leave-one-out "
                   "on the influence kernel (the paper's); flow = that kernel's gradient descent for the net's own "
                   "SGD steps (needs sgd and MSE); retrain = the network's own leave-one-out, the head retrained "
                   "from the same initialisation and batches without each point read (parameter-free attention)",
                   flag="--reading", choices=READINGS)


def check_readings(cfg: Any) -> None:
    """Refuse readings a config's training cannot support: flow follows plain SGD on MSE only, and
    the network's readings (flow, retrain) need features that training does not move."""
    network = [r for r in cfg.readings if r != "ridge"]
    if network and "attn" in cfg.archs and parse_attention(cfg.attention).variant.trainable:
        raise BadInput(f"reading {network[0]!r} needs fixed features, and attention "
                       f"{parse_attention(cfg.attention).kind.value!r} trains its own; "
                       "use a parameter-free attention or --reading ridge")
    if "flow" in cfg.readings and (cfg.train.optimizer != "sgd" or cfg.train.loss == "ce"):
        raise BadInput(f"reading 'flow' follows plain SGD on MSE, not {cfg.train.optimizer} with loss "
                       f"{cfg.train.loss}: use --optimizer sgd --loss mse, or drop flow from --reading")


def storage() -> Any:
    """The precision kernels are stored in (solves always run in float64)."""
    return setting("float64", "precision kernels are stored in: float64, or float32 for kernels that do not "
                   "fit otherwise (half the memory; each float64 entry rounded once, solves stay float64; "
                   "influence then moves by up to κ(K+λI)·6e-8: on 8000 MNIST digits 8e-6 for 2L-ReLU, but "
                   "4e-4 and 0.7 % of signs for MLP-Attn)", choices=STORAGE)
