"""Run-time estimates against real runs: ``python -m engine bench --estimates``.

``estimate(cfg)`` is the registry's (``engine.experiments.registry.estimate``: the ``estimate`` of the
record whose config ``cfg`` is). ``run`` takes every experiment's dashboard default (its ``quick``
preset) as a user would: ``python -m engine NAME --preset quick --estimate`` in a fresh process
(the estimate the command line prints: reference seconds times this machine's speed now, on the
threads the run would get, plus the run's imports), then ``python -m engine NAME --preset quick
--no-cache`` in another, timed from start to exit. The ratio estimate / actual is the figure
that matters (target 0.5-2x, idle and beside busy processes); ``benchmarks/RESULTS.md`` records
it with the CPU model and the load. Image data sets missing here are replaced by the first one
present with the same shape (MNIST by Fashion-MNIST), else by synthetic data.

``calibration_configs`` gives each experiment's probe (a small synthetic config, seconds), which
the tests run.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .registry import EXPERIMENTS, estimate

__all__ = ["calibration_configs", "estimate", "run", "table"]

ROOT = Path(__file__).resolve().parents[2]  # the checkout, for `python -m engine` in a child process
SAME_SHAPE = ("mnist", "fashion-mnist")     # 28 x 28 grey images, ten classes: one estimate for both


def calibration_configs() -> dict:
    """Every experiment's probe config, by its registry name."""
    return {name: rec.probe() for name, rec in EXPERIMENTS.items()}


def _data_flags(name: str, preset: str, available: set[str]) -> list[str]:
    """``--dataset`` for a preset whose image data set is not here: one of the same shape, else
    synthetic data of the same dimension (784)."""
    data = getattr(EXPERIMENTS[name].presets[preset], "data", None)
    if data is None:
        return []
    base, sep, pair = str(data.dataset).partition(":")
    if base in available or base not in SAME_SHAPE:
        return []
    other = next((b for b in SAME_SHAPE if b in available), None)
    if other is not None:
        return ["--dataset", other + sep + pair]
    return ["--dataset", "synthetic", "--synthetic-d", "784"]


def _engine(argv: list[str], timeout: float) -> tuple[dict, float, float]:
    """``python -m engine ARGV --json`` in a fresh process: (its JSON, wall seconds from start to
    exit, its CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "engine", *argv, "--json", "--quiet"], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise RuntimeError((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:300])
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return json.loads(p.stdout.strip().splitlines()[-1]), wall, cpu


def run(progress: Callable[[float, str], None] | None = None, preset: str = "quick", names: list[str] | None = None,
        timeout: float = 1800.0, out: str | None = None) -> dict:
    """Estimate against actual wall time of every experiment's ``preset`` run, each in a fresh
    process, no cache. ``rows``: one per experiment (estimate and actual seconds, their ratio, the
    speed factor and threads of the estimate, the threads the run took, or the error);
    ``summary``: the CPU model and the load average before and after. ``out``: a JSON-lines file
    each row is appended to as it is measured."""
    from ..data import available_datasets
    from ..runtime.gemm import cpu_model

    here = {d.name for d in available_datasets() if d.available}
    names = list(EXPERIMENTS) if names is None else names
    before = os.getloadavg()
    rows = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(i / len(names), f"estimating and running {name}")
        argv = [name, "--preset", preset, *_data_flags(name, preset, here)]
        row: dict = {"experiment": name, "argv": " ".join(argv)}
        try:
            est, _, _ = _engine([*argv, "--estimate"], timeout)
            res, actual, cpu = _engine([*argv, "--no-cache"], timeout)
            threads = (res.get("meta") or {}).get("threads") or {}
            row.update(estimate_s=round(est["estimate_seconds_here"], 2), actual_s=round(actual, 2),
                       estimate_over_actual=round(est["estimate_seconds_here"] / actual, 2), cpu_s=round(cpu, 2),
                       reference_s=round(est["estimate_seconds"], 2), speed_factor=round(est["speed_factor"], 2),
                       factor_from=est["speed_factor_from"], import_s=round(est["import_seconds"], 2),
                       estimate_threads=est.get("threads"), run_threads=threads.get("threads"),
                       run_busy=threads.get("busy"))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
    summary = [{"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)),
                "load_before": " ".join(f"{x:.2f}" for x in before),
                "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()), "preset": preset}]
    return {"rows": rows, "summary": summary}


def table(result: dict) -> str:
    """``run``'s rows as a Markdown table (for ``benchmarks/RESULTS.md``)."""
    head = ("| experiment | estimate s | actual s | estimate ÷ actual | speed factor (from) | imports s "
            "| threads: estimate, run |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['experiment']} | — | — | {r['error']} | | | |")
            continue
        lines.append(f"| {r['experiment']} | {r['estimate_s']:.1f} | {r['actual_s']:.1f} | "
                     f"**{r['estimate_over_actual']:.2f}** | {r['speed_factor']:.2f} ({r['factor_from']}) | "
                     f"{r['import_s']:.1f} | {r['estimate_threads']}, {r['run_threads']} |")
    return "\n".join(lines)
