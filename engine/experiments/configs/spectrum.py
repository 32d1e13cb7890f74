"""The ``spectrum`` experiment's config, presets and estimate; its run is
``engine.experiments.spectrum``, which imports these (torch-free, so that the command line's flags,
``--estimate`` and the registry need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...data import DataSpec
from ...runtime import budget as B
from ...runtime.budget import Estimate
from ...runtime.errors import BadInput
from ...runtime.settings import normalised, setting, validate
from .. import options


@dataclass(frozen=True)
class SpectrumConfig:
    data: DataSpec = DataSpec(n=400, n_test=1)
    attention: str = options.attention()  # whose feature Gram is measured
    rtol: float | None = setting(None, "numerical-rank tolerance relative to λ_max (none: n·eps64)",
                                 flag="--rank-rtol", lo=0, lo_open=True, hi=1.0)
    eps: float = setting(0.1, "ε of the paper's v1 width threshold κ⁶/ε²", lo=0, lo_open=True, hi=1.0)
    growth_ns: tuple[int, ...] = setting((), "prefix sizes of the draw for κ against n (each ≤ n)",
                                         unit="points", flag="--growth", lo=2, hi=60_000, max_len=20)

    def __post_init__(self):
        normalised(self)
        validate(self)
        too_big = [g for g in self.growth_ns if g > self.data.n]
        if too_big:
            raise BadInput(f"growth sizes {too_big} exceed n = {self.data.n}")


PRESETS = {"spectrum": {  # named instances of the config: the dashboard's quick run and the paper's
    "quick": SpectrumConfig(data=DataSpec(n=200, n_test=1)),   # n_test = 1: the spectrum reads no test set
    "paper": SpectrumConfig(data=DataSpec(n=1000, n_test=1)),  # the paper's n = 1000 training rows
}}


def growth_sizes(n: int) -> tuple[int, ...]:
    """Prefix sizes for "κ against n": n/8, n/4, n/2, n (at least 2)."""
    return tuple(sorted({max(2, int(n) // k) for k in (8, 4, 2, 1)}))


def spectrum_view(cfg: SpectrumConfig) -> SpectrumConfig:
    """The settings the Spectrum page derives from the others (``Experiment.view``): no test set, and κ
    against n at the prefix sizes ``growth_sizes(n)``."""
    return replace(cfg, data=replace(cfg.data, n_test=1), growth_ns=growth_sizes(cfg.data.n))


def estimate_spectrum(cfg: SpectrumConfig) -> Estimate:
    n, d = cfg.data.n, B.input_dim(cfg.data)
    one = lambda k: B.eig_s(min(k, d)) * 2 + B.gemm_s(k, d, min(k, d), True) * 2 + B.attention_s(cfg.attention, k, d)
    seconds = B.FIXED_S + one(n) + sum(one(g) for g in cfg.growth_ns)
    return Estimate(seconds, 8 * (3 * n * d + 2 * min(n, d) ** 2 + 2 * n))
