"""What every experiment run shares: progress ticks, cancellation, and the prepared draw.

A run reports progress as ``progress(fraction, stage)`` and checks ``cancel.is_set()``
(any object with that method, e.g. ``threading.Event``) between steps through ``tick``;
``Cancelled`` stops it; the units it finished (``resumable``) stay in the cache, and the
run resumes from them when it is started again. ``prepare`` loads a ``DataSpec``'s draw once
and moves it to the device once.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..data import DataSpec, Sample, load_sample
from ..runtime.device import resolve_device
from ..runtime.cache import checkpoints
from ..runtime.errors import BadInput, Cancelled
from ..maths.training import n_outputs, targets

Progress = Callable[[float, str], None]


def tick(progress: Progress | None, cancel, frac: float, stage: str) -> None:
    """Stop with ``Cancelled`` if asked to, else report ``frac`` (clipped to [0, 1]) and ``stage``."""
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"cancelled during: {stage}")
    if progress is not None:
        progress(min(max(frac, 0.0), 1.0), stage)


def resumable(unit: str, compute: Callable[[], dict]) -> dict:
    """One independent unit of a run (an architecture and seed, say): computed, or read back
    from the checkpoint an earlier, cancelled run of the same config left in the cache.

    ``compute()`` returns JSON-able pieces: row dicts, numbers, and numpy arrays or torch
    tensors (kept as .npy bytes, so every bit and dtype survives; tensors come back on the
    CPU). The pieces always pass through that encoding, checkpointed or not, so a resumed
    run's result is bit for bit that of one that never stopped. A unit must not depend on
    the units before it (its own seed, its own nets)."""
    kept = checkpoints()
    value = kept.get(unit) if kept is not None else None
    if value is not None:
        try:
            return _decode_arrays(value)
        except (ValueError, TypeError, KeyError):  # a damaged array: recomputed, never trusted
            pass
    value = json.loads(json.dumps(compute(), default=_encode_array))
    if kept is not None:
        kept.put(unit, value)
    return _decode_arrays(value)


def _encode_array(obj) -> dict:
    if isinstance(obj, np.generic):
        return obj.item()
    if not isinstance(obj, (np.ndarray, torch.Tensor)):
        raise TypeError(f"a resumable unit returned {type(obj).__name__}; allowed: JSON values and arrays")
    buf = io.BytesIO()
    np.save(buf, obj.detach().cpu().numpy() if isinstance(obj, torch.Tensor) else obj, allow_pickle=False)
    return {"__array__": "tensor" if isinstance(obj, torch.Tensor) else "ndarray",
            "npy": base64.b64encode(buf.getvalue()).decode("ascii")}


def _decode_arrays(value):
    if isinstance(value, list):
        return [_decode_arrays(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__array__", "npy"}:
        array = np.load(io.BytesIO(base64.b64decode(value["npy"])), allow_pickle=False)
        return torch.from_numpy(array) if value["__array__"] == "tensor" else array
    return {k: _decode_arrays(v) for k, v in value.items()}


def sub_progress(progress: Progress | None, lo: float, hi: float, prefix: str) -> Progress | None:
    """A callback that maps a sub-step's [0, 1] onto [lo, hi] of the whole run."""
    if progress is None:
        return None
    return lambda f, s: progress(lo + f * (hi - lo), f"{prefix}: {s}")


def check_finite(value: torch.Tensor | float, stage: str, hint: str = "") -> None:
    """Raise a one-line ``BadInput`` naming the stage when a NaN or inf appeared there."""
    ok = math.isfinite(value) if isinstance(value, float) else bool(torch.isfinite(value).all())
    if not ok:
        raise BadInput(f"non-finite values appeared during {stage}{'; ' + hint if hint else ''}")


def to_device(sample: Sample, device: torch.device, dtype=torch.float32):
    """Training and test inputs and labels moved once to the device."""
    return (sample.X.to(device, dtype), sample.y.to(device),
            sample.X_test.to(device, dtype), sample.y_test.to(device))


@dataclass
class Prepared:
    """A drawn sample on the device: the preamble every experiment shares."""

    device: torch.device
    sample: Sample
    X: torch.Tensor    # (n, d) float32 training inputs
    y: torch.Tensor    # (n,) labels
    Xt: torch.Tensor   # (n_test, d) float32 test inputs
    yt: torch.Tensor   # (n_test,)
    c: int             # classes
    Y: torch.Tensor    # (n, n_out) float64 regression targets: ±1 (binary) or one-hot

    @property
    def n_out(self) -> int:
        return n_outputs(self.c)


def prepare(data: DataSpec, data_dir, device: str, progress: Progress | None, cancel) -> Prepared:
    """Load the draw once and move it to the device once."""
    dev = resolve_device(device)
    tick(progress, cancel, 0.0, "loading data")
    sample = load_sample(data, data_dir)
    X, y, Xt, yt = to_device(sample, dev)
    return Prepared(dev, sample, X, y, Xt, yt, sample.n_classes, targets(y, sample.n_classes))


def experiment_run(name: str):
    """Make ``compute(cfg, data_dir, device, progress, cancel) -> Result`` experiment ``name``'s run.

    The returned function has the signature every run shares, ``run(cfg, cache=None,
    data_dir=None, device="cpu", progress=None, cancel=None, budget=None)``, and is the
    registry record's ``run`` (``engine.experiments.registry.Experiment.run``): it resolves the device,
    refuses work whose estimate exceeds ``budget`` before any of it starts, and reads or
    writes the result in ``cache`` under the experiment's name. ``compute`` gets a resolved
    ``torch.device`` and does the work; ``run.kind`` is the name, ``run.compute`` the body.
    """
    def wrap(compute: Callable) -> Callable:
        def run(cfg, cache=None, data_dir=None, device: str = "cpu", progress: Progress | None = None,
                cancel=None, budget=None):
            from .registry import EXPERIMENTS  # the record holds the estimate and the budget's wording

            return EXPERIMENTS[name].run(cfg, cache, data_dir, device, progress, cancel, budget)

        run.__name__, run.__qualname__ = compute.__name__, compute.__qualname__
        run.__module__, run.__doc__ = compute.__module__, compute.__doc__
        run.kind, run.compute = name, compute
        return run

    return wrap
