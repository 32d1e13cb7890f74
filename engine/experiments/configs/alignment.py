"""The ``alignment`` experiment's config, presets and estimate; its run is
``engine.experiments.alignment``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...data import DataSpec
from ...maths.specs import AttackSpec, TrainSpec, quarters
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.errors import BadInput
from ...runtime.settings import normalised, setting, validate
from .. import options


@dataclass(frozen=True)
class AlignmentConfig:
    data: DataSpec = DataSpec(n=1000, n_test=200)  # n: the pool the kernels, C(k) and learning curves read
    train: TrainSpec = TrainSpec(epochs=200, lr=1e-3, weight_decay=0.0, snapshot_epochs=(0, 25, 50, 100, 200))
    widths: tuple[int, ...] = options.widths((256, 1024, 4096))
    archs: tuple[str, ...] = options.archs()
    attention: str = options.parameter_free_attention(
        "its kernel after training is not the head's eNTK alone", "parameter-free variants only (centered included)")
    seeds: tuple[int, ...] = options.seeds((0, 1, 2))
    data_seeds: tuple[int, ...] = options.data_seeds((0, 1))
    init_std: float = options.init_std()
    init: str = options.init()
    ridge: float = options.ridge()  # of every kernel ridge regression and of the learning-curve theory
    curve_ns: tuple[int, ...] = setting((), "training-set sizes p of the learning curves (each < n; drawn "
                                        "without replacement from the n pool points and tested on the n − p left "
                                        "out; the theory is evaluated at the same p); empty: six sizes "
                                        "log-spaced from 10 to n/2, following n", unit="points",
                                        flag="--curve-ns", lo=1, hi=60_000, max_len=20)
    curve_trials: int = setting(5, "kernel-ridge samples per size p of the measured learning curve (mean ± sd)",
                                flag="--curve-trials", lo=2, hi=200)
    # flip rates along training (engine.experiments.along): the vulnerability half at the same snapshots
    flips: bool = setting(True, "flip rates along training: at every snapshot epoch of the largest width, the "
                          "ridge influence on the net's own K_m(t) before and after a PGD attack on that epoch's net "
                          "(its top-τ rows move), beside the seed and random nulls (adds an attack per snapshot)")
    design: bool = setting(False, "the causal design along training (needs the flip rates): at every snapshot, "
                           "the influence read on K_m(0), K_m(t) or K∞ × the attack climbing the epoch-0 or the "
                           "epoch-t net's loss, so that the excess can be traced to the kernel's movement or to "
                           "the attacker's training (about 3 more attacks per snapshot)")
    eps: float = setting(0.3, "radius ε of the attack at every snapshot, in the attack space's units (raw: pixels "
                         "in [0, 1]; normalized: fractions of a unit row)", flag="--eps", lo=0, lo_open=True, hi=100.0)
    attack: AttackSpec = AttackSpec(steps=10, norm="l2")  # norm, steps, step size, random start
    space: str = options.space("normalized")
    tau: float = options.tau()
    target: str = options.influence_target()
    precision: str = options.precision()

    def __post_init__(self):
        normalised(self)
        validate(self)
        options.check_init_widths(self.init, self.widths)
        options.check_space(self.space, self.data.normalize)
        if self.design and not self.flips:
            raise BadInput("design reads the flip rates along training; drop --no-flips, or --design")
        big = [p for p in self.curve_ns if p >= self.data.n]
        if big:
            raise BadInput(f"curve sizes {big} leave no held-out point of the pool n = {self.data.n}; allowed: "
                           "each < n")

    @property
    def curve_sizes(self) -> tuple[int, ...]:
        """The learning curves' sizes p: ``curve_ns``, or six log-spaced from 10 to n/2 when it is empty."""
        if self.curve_ns:
            return self.curve_ns
        top = max(2, self.data.n // 2)
        lo = min(10, top)  # six sizes log-spaced from lo to top (no numpy: configs load none)
        return tuple(sorted({int(round(lo * (top / lo) ** (i / 5))) for i in range(6)}))


PRESETS = {"alignment": {  # named instances of the config: the dashboard's quick run and the paper's
    # the page opens on its chart: two draws of 300 MNIST points, two seeds, two widths, 40 epochs
    "quick": AlignmentConfig(data=DataSpec(n=200, n_test=100),  # the Task alignment page's defaults (``alignment_view``)
                             train=TrainSpec(epochs=40, lr=1e-3, weight_decay=0.0, snapshot_epochs=quarters(40)),
                             widths=(128, 512), seeds=(0, 1), curve_trials=3),
    # the paper's protocol (Adam 1e-3, coupled L2 1e-3, 500 epochs) on a 2000-point pool
    "paper": AlignmentConfig(data=DataSpec(n=2000, n_test=500),
                             train=TrainSpec(epochs=500, snapshot_epochs=(0, 50, 100, 200, 500)),
                             widths=(256, 1024, 4096)),  # curve sizes follow n (up to n/2)
}}


CELL_SHARE = 0.6  # of the attack-and-three-readings cost model, per flip cell along training (below)


def alignment_view(cfg: AlignmentConfig) -> AlignmentConfig:
    """The settings the Task alignment page derives from the others (``Experiment.view``): the kernel at
    each quarter of training, the learning curves at their sizes following n (``curve_sizes``)."""
    return replace(cfg, train=replace(cfg.train, snapshot_epochs=quarters(cfg.train.epochs)), curve_ns=())


def estimate_alignment(cfg: AlignmentConfig) -> Estimate:
    n, nt, d = cfg.data.n, cfg.data.n_test, B.input_dim(cfg.data)
    tr, draws = cfg.train, max(1, len(cfg.data_seeds))
    c_out = B.n_outputs(cfg.data)
    curve = sum(cfg.curve_trials * (B.chol_s(p) + B.gemm_s(n, p, c_out, True)) + B.gemm_s(p, p, 1, True) * p / 8
                for p in cfg.curve_sizes)
    curve += len(cfg.curve_sizes) * 1e-3  # the theory's bisections
    kinf = B.attention_s(cfg.attention, n + nt, d) + B.gemm_s(n + nt, n, d, True) + 3 * B.eig_s(n) + B.chol_s(n) + curve
    per_group = B.train_s(n, d, sum(cfg.widths), tr.epochs, tr.batch_size, c_out)
    for w in cfg.widths:
        per_group += (2 + len(tr.snapshot_epochs)) * B.ntk_s(n, n, d, w) + 2 * B.ntk_s(nt, n, d, w)
        per_group += 2 * (3 * B.eig_s(n) + B.chol_s(n)) + len(tr.snapshot_epochs) * B.gemm_s(n, n, c_out, True)
    per_group += curve  # the trained K_m's learning curve at the largest width
    if cfg.flips:  # per snapshot of the largest width: the attack, then three readings (clean, attacked, random)
        m, double = max(cfg.widths), cfg.precision == "float64"
        attn_share = sum(a == "attn" for a in cfg.archs) / len(cfg.archs)  # per_group is per (arch, seed)
        grad_step = 2 * B.gemm_s(n, m, d, double) + attn_share * B.attention_s(cfg.attention, n, d) + B.STEP_OVERHEAD_S
        reading = (B.ntk_s(n, n, d, m) + B.ntk_s(nt, n, d, m) + B.chol_s(n)) * (2.0 if double else 1.0)
        cells = len(tr.snapshot_epochs) + (2 + 3 * (len(tr.snapshot_epochs) - 1) if cfg.design else 0)
        # FLOPS64 is the AVX2 reference's; a cell took 0.28-0.31 s on a 2-core Zen 4 against 0.61 s
        # estimated (quick preset, 2026-12-07): 0.6 keeps both CPUs within 0.5-2x
        per_group += CELL_SHARE * cells * (cfg.attack.steps * grad_step + 3 * reading)
    units = draws * len(cfg.archs)
    seconds = B.FIXED_S + draws * 0.05 + units * (kinf + len(cfg.seeds) * per_group)
    memory = (8 * (8 * n * n + 2 * nt * n) + 16 * sum(cfg.widths) * d + 2 * (n + nt) * max(cfg.widths) * 4
              + B.head_bytes(sum(cfg.widths), n + nt, c_out))
    return Estimate(seconds, int(memory))
