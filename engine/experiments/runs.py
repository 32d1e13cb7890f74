"""What every experiment run shares: progress ticks, cancellation, and the prepared draw.

A run reports progress as ``progress(fraction, stage)`` and checks ``cancel.is_set()``
(any object with that method, e.g. ``threading.Event``) between steps through ``tick``;
``Cancelled`` stops it; the units it finished (``resumable``) stay in the cache, and the
run resumes from them when it is started again. ``prepare`` loads a ``DataSpec``'s draw once
and moves it to the device once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, cast

import numpy as np
import torch

from ..data import DataSpec, Sample, load_sample
from ..maths.training import n_outputs, targets
from ..runtime.cache import canonical, checkpoints, code_fingerprint
from ..runtime.device import resolve_device
from ..runtime.errors import BadInput, Cancelled

if TYPE_CHECKING:  # annotations only
    import os
    from typing import TypeAlias

    from _typeshed import DataclassInstance

    from ..maths.heads import CancelFlag
    from ..runtime.budget import Budget
    from ..runtime.cache import Cache, Result
    from .registry import Run

    DataDir: TypeAlias = str | os.PathLike | None  # the data sets' folder (``engine.data.load_sample``)

Progress = Callable[[float, str], None]


def tick(progress: Progress | None, cancel: CancelFlag | None, frac: float, stage: str) -> None:
    """Stop with ``Cancelled`` if asked to, else report ``frac`` (clipped to [0, 1]) and ``stage``."""
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"cancelled during: {stage}")
    if progress is not None:
        progress(min(max(frac, 0.0), 1.0), stage)


def unit_name(unit: dict | str) -> str:
    """The exact key of a unit: the sorted JSON of its own parameters (floats as ``repr``, so
    κ 4 and 4.000001 never share a checkpoint), or a string used as it is."""
    return unit if isinstance(unit, str) else json.dumps(canonical(unit), sort_keys=True, ensure_ascii=False)


def shape(**types: type | tuple[type, ...]) -> Callable[[dict], None]:
    """A unit validator: the value is a dict with exactly these keys, each an instance of its
    type(s) (``list`` of row dicts, ``float``, ``np.ndarray``, ``torch.Tensor``, ``type(None)``...)."""
    def check(value: dict) -> None:
        if set(value) != set(types):
            raise BadInput(f"a unit holds keys {sorted(value)}; expected {sorted(types)}")
        for k, t in types.items():
            if not isinstance(value[k], t) or (isinstance(value[k], bool) and t in (int, float)):
                raise BadInput(f"a unit's {k!r} is {type(value[k]).__name__}; expected {t}")
            if k == "rows" and not all(isinstance(r, dict) for r in value[k]):
                raise BadInput(f"a unit's {k!r} holds something other than row dicts")
    return check


def resumable(unit: dict | str, compute: Callable[[], dict], check: Callable[[dict], None] | None = None,
              nan_ok: Collection[str] = ()) -> dict:
    """One independent unit of a run (an architecture and seed, say): computed, or read back
    from the checkpoint an earlier, cancelled run of the same config left in the cache.

    ``unit``: the unit's own parameters as a dict (``{"kappa": 4.000001, "arch": "mlp"}``),
    keyed exactly by ``unit_name``. ``compute()`` returns a dict of JSON-able pieces: row
    dicts, numbers, and numpy arrays or torch tensors (kept as .npy bytes, so every bit and
    dtype survives; tensors come back on the CPU). The pieces always pass through that
    encoding, checkpointed or not, so a resumed run's result is bit for bit that of one that
    never stopped. ``check(value)`` (e.g. ``shape(rows=list, gap=float)``) raises on a value
    of the wrong structure; given a check, the built-in test that every float and float
    array is finite except under a key in ``nan_ok`` (a null not computed, say) runs too;
    both apply to the fresh value (a failure is a one-line ``BadInput``; nothing is cached) and to a read-back one
    (a failure drops the checkpoint with one warning line and recomputes the unit). A stored
    unit also carries its name, the run's key, the code fingerprint and its values' SHA-256,
    checked on read, so another unit's or config's values, or damaged ones, are never taken (the hash
    guards against damage, not against whoever can write the private cache folder: ``engine.runtime.store``).
    A unit must not depend on the units before it (its own seed, its own nets)."""
    name, kept = unit_name(unit), checkpoints()
    stored = kept.get(name) if kept is not None else None
    if kept is not None and stored is not None:
        try:
            if not (isinstance(stored, dict) and set(stored) == {"unit", "run", "code", "sha", "value"}):
                raise ValueError("not a checkpoint envelope")
            if (stored["unit"], stored["run"], stored["code"]) != (name, kept.key, code_fingerprint()):
                raise ValueError("it belongs to another unit, run or code")
            if stored["sha"] != _sha(stored["value"]):
                raise ValueError("its values were changed after it was stored")
            value = _decode_arrays(stored["value"])
            _validate(value, check, nan_ok)
            kept.resumed += 1
            return value
        except Exception as exc:  # any damaged or foreign unit is recomputed, never trusted
            kept.drop(name, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
    encoded = json.loads(json.dumps(compute(), default=_encode_array))
    value = _decode_arrays(encoded)
    try:
        _validate(value, check, nan_ok)
    except (BadInput, ValueError, TypeError) as exc:
        raise BadInput(f"unit {name} computed an invalid value: {exc}") from None
    if kept is not None:
        kept.put(name, {"unit": name, "run": kept.key, "code": code_fingerprint(), "sha": _sha(encoded),
                        "value": encoded})
    return value


def _sha(encoded: Any) -> str:
    # SHA-256 of the value's JSON: a hand edit of a stored number no longer matches it
    return hashlib.sha256(json.dumps(encoded, sort_keys=True).encode()).hexdigest()


def _validate(value: Any, check: Callable[[dict], None] | None, nan_ok: Collection[str]) -> None:
    if not isinstance(value, dict):
        raise BadInput(f"a unit's value is {type(value).__name__}; expected a dict")
    if check is not None:  # a call site without a validator (not yet declared its NaN fields) skips this
        _finite(value, "", frozenset(nan_ok))
        check(value)


def _finite(value: Any, where: str, nan_ok: frozenset[str]) -> None:
    # every measured number finite, except under a key the unit declares may be NaN
    if where.rsplit(".", 1)[-1] in nan_ok:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, f"{where}.{k}" if where else str(k), nan_ok)
    elif isinstance(value, list):
        for v in value:
            _finite(v, where, nan_ok)
    elif isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"non-finite value {value} in {where or 'the unit'}")
    elif isinstance(value, (np.ndarray, torch.Tensor)):
        a = value.numpy() if isinstance(value, torch.Tensor) else value
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            raise BadInput(f"non-finite values in array {where or 'the unit'}")


def _encode_array(obj: Any) -> dict:
    if isinstance(obj, np.generic):
        return obj.item()
    if not isinstance(obj, (np.ndarray, torch.Tensor)):
        raise TypeError(f"a resumable unit returned {type(obj).__name__}; allowed: JSON values and arrays")
    buf = io.BytesIO()
    np.save(buf, obj.detach().cpu().numpy() if isinstance(obj, torch.Tensor) else obj, allow_pickle=False)
    return {"__array__": "tensor" if isinstance(obj, torch.Tensor) else "ndarray",
            "npy": base64.b64encode(buf.getvalue()).decode("ascii")}


def _load_npy(text: str) -> np.ndarray:
    # the header's size is checked against the bytes before anything is allocated
    raw = base64.b64decode(text, validate=True)
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shp, fortran, dtype = read(f)
    if dtype.hasobject or math.prod(shp) * dtype.itemsize != len(raw) - f.tell():
        raise ValueError(f"an array header declares {shp} of {dtype} over {len(raw) - f.tell()} bytes")
    return np.load(io.BytesIO(raw), allow_pickle=False)


def _decode_arrays(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_arrays(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__array__", "npy"}:
        if value["__array__"] not in ("tensor", "ndarray") or not isinstance(value["npy"], str):
            raise ValueError("a damaged array")
        array = _load_npy(value["npy"])
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


def to_device(sample: Sample, device: torch.device, dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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


def prepare(data: DataSpec, data_dir: DataDir, device: str | torch.device, progress: Progress | None,
            cancel: CancelFlag | None) -> Prepared:
    """Load the draw once and move it to the device once."""
    dev = resolve_device(device)
    tick(progress, cancel, 0.0, "loading data")
    sample = load_sample(data, data_dir)
    X, y, Xt, yt = to_device(sample, dev)
    return Prepared(dev, sample, X, y, Xt, yt, sample.n_classes, targets(y, sample.n_classes))


def experiment_run(name: str) -> Callable[[Callable[..., Result]], Run]:
    """Make ``compute(cfg, data_dir, device, progress, cancel) -> Result`` experiment ``name``'s run.

    The returned function has the signature every run shares, ``run(cfg, cache=None,
    data_dir=None, device="cpu", progress=None, cancel=None, budget=None)``, and is the
    registry record's ``run`` (``engine.experiments.registry.Experiment.run``): it resolves the device,
    refuses work whose estimate exceeds ``budget`` before any of it starts, and reads or
    writes the result in ``cache`` under the experiment's name. ``compute`` gets a resolved
    ``torch.device`` and does the work; ``run.kind`` is the name, ``run.compute`` the body.
    """
    def wrap(compute: Callable[..., Result]) -> Run:
        def run(cfg: DataclassInstance, cache: Cache | None = None, data_dir: DataDir = None, device: str = "cpu",
                progress: Progress | None = None, cancel: CancelFlag | None = None,
                budget: Budget | None = None) -> Result:
            from .registry import EXPERIMENTS  # the record holds the estimate and the budget's wording

            return EXPERIMENTS[name].run(cfg, cache, data_dir, device, progress, cancel, budget)

        run.__name__, run.__qualname__ = compute.__name__, compute.__qualname__
        run.__module__, run.__doc__ = compute.__module__, compute.__doc__
        typed = cast("Run", run)  # a function with the two attributes below set on it
        typed.kind, typed.compute = name, compute
        return typed

    return wrap
