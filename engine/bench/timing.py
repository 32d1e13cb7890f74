"""How the benchmarks time: paired rounds, medians, wall and CPU time, and each part's limit.

Every figure pairs a step with its reference in the same run (``interleave``: one warm-up
each, then rounds in turn), so a load that comes and goes hits both alike. ``machine_info``
names the CPU, its SIMD flags and the thread count beside every figure; ``timed_part`` turns a
part that fails or runs out of time into an ``<part>_error`` row instead of a crash.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from ..runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]  # engine/bench/timing.py -> the checkout
TIMEOUT = {True: 300.0, False: 1200.0}  # seconds per part, quick and full
_SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
               "amx_tile", "amx_int8", "amx_bf16")


def machine_info(device: torch.device | None = None) -> dict:
    """CPU model and SIMD flags (from /proc/cpuinfo), cores, torch threads and version, GPU name."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("unknown", platform.processor()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    info = {"cpu_model": model, "cpu_flags": [f for f in _SIMD_FLAGS if f in flags], "cpu_cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def time_once(fn, sync, calls: int = 1) -> tuple[float, float]:
    """Wall and CPU seconds of one call (the mean of ``calls`` calls)."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls


def interleave(fns: dict, repeat: int, sync, deadline: float = math.inf, calls: dict | None = None) -> dict:
    """Run ``fns`` (name: callable) alternately: one warm-up each, then up to ``repeat`` rounds,
    fewer once ``deadline`` (a ``time.perf_counter`` value) has passed, at least one.

    Returns {name: {"seconds", "cpu_seconds"}} (medians over rounds) and "repeats". ``calls``
    (name: k) times the mean of k calls per round, for a short reference beside a long step.
    """
    calls = calls or {}
    for fn in fns.values():
        time_once(fn, sync)
    rounds = {name: [] for name in fns}
    done = 0
    for _ in range(max(1, repeat)):
        for name, fn in fns.items():
            rounds[name].append(time_once(fn, sync, calls.get(name, 1)))
        done += 1
        if time.perf_counter() > deadline:
            break
    out = {name: {"seconds": statistics.median(w for w, _ in r), "cpu_seconds": statistics.median(c for _, c in r)}
           for name, r in rounds.items()}
    out["repeats"] = done
    return out


def gemm_case(size: int, device: torch.device, dtype=torch.float32):
    """The reference: one (size x size) @ (size x size) GEMM; returns (callable, FLOPs)."""
    A = torch.rand(size, size, device=device, dtype=dtype)
    B = torch.rand(size, size, device=device, dtype=dtype)
    return (lambda: A @ B), 2 * size**3


def gemm_rate(size: int, device: torch.device, sync) -> float:
    """FLOP/s of one fp32 (size × size) @ (size × size) GEMM (median of 5 after a warm-up)."""
    fn, flops = gemm_case(size, device)
    return flops / interleave({"gemm": fn}, 5, sync)["gemm"]["seconds"]


def paired_rates(step: dict, ref: dict, flops: float, ref_flops: float) -> tuple[float, float]:
    """(wall, CPU) ratios of the step's FLOP rate to the reference's."""
    return ((flops / step["seconds"]) / (ref_flops / ref["seconds"]),
            (flops / step["cpu_seconds"]) / (ref_flops / ref["cpu_seconds"]))


def floor_row(step: str, t: dict, floor: str, diff: float, name: str = "step") -> dict:
    """The keys of one scale step measured against its floor (``t`` from ``interleave``)."""
    s, f = t[name], t["floor"]
    return {f"scale_{step}_seconds": s["seconds"], f"scale_{step}_floor_seconds": f["seconds"],
            f"scale_{step}_ratio": s["seconds"] / f["seconds"],
            f"scale_{step}_cpu_seconds": s["cpu_seconds"], f"scale_{step}_floor_cpu_seconds": f["cpu_seconds"],
            f"scale_{step}_cpu_ratio": s["cpu_seconds"] / f["cpu_seconds"],
            f"scale_{step}_floor": floor, f"scale_{step}_max_rel_diff": diff, f"scale_{step}_repeats": t["repeats"]}


class RowLog:
    """Appends one JSON line per part to ``path`` as soon as it is measured (nothing when None)."""

    def __init__(self, path):
        self.path, self.run = (None if path is None else Path(path)), time.strftime("%Y-%m-%dT%H:%M:%S")
        if self.path is not None:
            try:
                with open(self.path, "a"):
                    pass
            except OSError as exc:
                raise BadInput(f"cannot write bench results to {str(path)!r}: {exc.strerror or exc}") from exc

    def write(self, part: str, row: dict) -> None:
        if self.path is not None:
            line = json.dumps(json_finite({"run": self.run, "part": part, "threads": torch.get_num_threads(), **row}))
            with open(self.path, "a") as f:
                f.write(line + "\n")


def timed_part(name: str, fn, limit: float) -> dict:
    """``fn(deadline)``'s row; a failure becomes ``<name>_error`` with its reason, never a crash
    (a bench that stops at its first failure loses every figure after it)."""
    start = time.perf_counter()
    try:
        row = fn(start + limit)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 -- any failure of one part is that part's row
        return {f"{name}_error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    took = time.perf_counter() - start
    if took > limit:
        row[f"{name}_over_limit"] = f"took {took:.0f} s against a limit of {limit:.0f} s (a round is never cut midway)"
    return row


def check_limits(repeat: int, timeout: float | None) -> None:
    if repeat < 1:
        raise BadInput(f"repeat must be >= 1, got {repeat}")
    if timeout is not None and not timeout > 0:
        raise BadInput(f"timeout must be > 0 seconds, got {timeout!r}")


def json_finite(out):
    """JSON has no inf or nan: such floats become None, at any depth; tuples become lists."""
    if isinstance(out, dict):
        return {k: json_finite(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return [json_finite(v) for v in out]
    if isinstance(out, float) and not math.isfinite(out):
        return None
    return out
