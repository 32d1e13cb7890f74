"""Run-time estimates against real runs: ``python -m engine bench --estimates``.

``estimate(cfg)`` is the registry's (``engine.experiments.registry.estimate``: the ``estimate`` of the
record whose config ``cfg`` is). ``run`` times every experiment's ``probe`` (a small real
config on synthetic data, declared in its registry record) and prints estimate / measured
side by side, so that the rates in ``engine.runtime.budget`` can be re-calibrated on a new machine;
``benchmarks/RESULTS.md`` records the ratios.
"""

from __future__ import annotations

import time

from .registry import EXPERIMENTS, estimate

__all__ = ["calibration_configs", "estimate", "run"]


def calibration_configs() -> dict:
    """Every experiment's probe config, by its registry name."""
    return {name: rec.probe() for name, rec in EXPERIMENTS.items()}


def run(progress=None, device: str = "cpu") -> dict:
    """Estimate against measured wall time for each experiment's probe (no cache)."""
    out = {}
    configs = calibration_configs()
    for i, (name, cfg) in enumerate(configs.items()):
        if progress is not None:
            progress(i / len(configs), f"calibrating {name}")
        est = estimate(cfg)
        t0 = time.perf_counter()
        EXPERIMENTS[name].run(cfg, None, None, device)
        measured = time.perf_counter() - t0
        out[name] = {"estimate_s": round(est.seconds, 3), "measured_s": round(measured, 3),
                     "estimate_over_measured": round(est.seconds / measured, 3)}
    return {"estimates": out}
