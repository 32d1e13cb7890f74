"""Every config's time and memory estimate in one place, and their check against real runs.

``estimate(cfg)`` dispatches to the ``estimate_*`` function beside each run.
``python -m engine bench --estimates`` (``run``) times small real runs of every kind and
prints estimate / measured side by side, so that the rates in ``engine.budget`` can be
re-calibrated on a new machine; ``benchmarks/RESULTS.md`` records the ratios.
"""

from __future__ import annotations

import time

from .budget import Estimate
from .errors import BadInput
from .dynamics import ESTIMATES as _DYN
from .experiments import ESTIMATES as _EXP
from .malleability import ESTIMATES as _MALL
from .scaling import ESTIMATES as _SCALING

ESTIMATES = {**_EXP, **_MALL, **_SCALING, **_DYN}


def estimate(cfg) -> Estimate:
    """Estimated seconds (reference 2-core CPU) and peak bytes of running ``cfg``."""
    fn = ESTIMATES.get(type(cfg))
    if fn is None:
        raise BadInput(f"no estimate for {type(cfg).__name__}; known: "
                       f"{', '.join(c.__name__ for c in ESTIMATES)}")
    return fn(cfg)


def calibration_configs() -> dict:
    """Small real runs of every kind (synthetic data: no files needed), a few seconds each."""
    from .data import DataSpec
    from .dynamics import CoordCheckConfig, DynamicsConfig
    from .experiments import SpectrumConfig, SweepConfig
    from .malleability import InfluenceConfig, MalleabilityConfig
    from .scaling import ScalingConfig
    from .training import TrainSpec

    syn = DataSpec(dataset="synthetic", n=300, n_test=100, synthetic_d=256, synthetic_kappa=100.0)
    return {
        "spectrum": SpectrumConfig(data=DataSpec(dataset="synthetic", n=1500, n_test=1, synthetic_d=512),
                                   growth_ns=(200, 800)),
        "ntk_sweep": SweepConfig(data=syn, train=TrainSpec(epochs=30), widths=(64, 512, 2048), seeds=(0, 1)),
        "influence": InfluenceConfig(data=syn, train=TrainSpec(epochs=30), width=1024, seeds=(0,)),
        "malleability": MalleabilityConfig(data=syn, train=TrainSpec(epochs=30), width=1024, seeds=(0,),
                                           attacks=("fgsm", "pgd"), eps=(0.05, 0.3)),
        "scaling": ScalingConfig(train=TrainSpec(epochs=30, lr=1e-2), kappas=(2.0, 8.0), max_width=1024,
                                 seeds=(0, 1)),
        "dynamics": DynamicsConfig(data=syn, train=TrainSpec(epochs=30, optimizer="sgd", lr=1.0, weight_decay=0.0),
                                   widths=(64, 512, 2048), seeds=(0,)),
        "coord_check": CoordCheckConfig(data=syn),
    }


def run(progress=None, device: str = "cpu") -> dict:
    """Estimate against measured wall time for each calibration config (no cache)."""
    from .dynamics import run_coord_check, run_dynamics
    from .experiments import run_ntk_sweep, run_spectrum
    from .malleability import run_influence, run_malleability
    from .scaling import run_scaling

    runs = {"spectrum": run_spectrum, "ntk_sweep": run_ntk_sweep, "influence": run_influence,
            "malleability": run_malleability, "scaling": run_scaling, "dynamics": run_dynamics,
            "coord_check": run_coord_check}
    out = {}
    configs = calibration_configs()
    for i, (name, cfg) in enumerate(configs.items()):
        if progress is not None:
            progress(i / len(configs), f"calibrating {name}")
        est = estimate(cfg)
        t0 = time.perf_counter()
        runs[name](cfg, None, None, device)
        measured = time.perf_counter() - t0
        out[name] = {"estimate_s": round(est.seconds, 3), "measured_s": round(measured, 3),
                     "estimate_over_measured": round(est.seconds / measured, 3)}
    return {"estimates": out}
