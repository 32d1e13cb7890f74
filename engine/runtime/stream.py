"""Results as they land: a run hands every finished unit to whoever is listening.

A run calls ``landed(unit, rows)`` as soon as a unit's rows exist (a net and its attack, say), in
the order it finishes them; the caller listens with ``with landing(callback): run(...)`` — the
command line's ``--stream`` prints one JSON line per unit, a dashboard job keeps them for the
page's partial chart. Nobody listening costs nothing. The listener is per thread (a ``ContextVar``):
two jobs in two threads never see each other's units. The rows are the run's own row dicts, the
same values its final frame will hold; a unit read back from a checkpoint lands whole, at once.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

Listener = Callable[[dict, list[dict]], None]
_listener: ContextVar[Listener | None] = ContextVar("landing", default=None)


def landed(unit: dict, rows: list[dict]) -> None:
    """Hand ``rows`` of the finished ``unit`` (its own parameters) to the listener, if any."""
    listen = _listener.get()
    if listen is not None and rows:
        listen(dict(unit), [dict(r) for r in rows])


@contextlib.contextmanager
def landing(listen: Listener | None) -> Iterator[None]:
    """Listen for landed units in this thread (and contexts copied from it) while the block runs."""
    token = _listener.set(listen)
    try:
        yield
    finally:
        _listener.reset(token)


def jsonable(obj: Any) -> Any:
    """NaN/inf become null so that stdout is strict JSON. numpy and pandas values can only exist
    once their modules are loaded, so they are looked up, never imported, here."""
    np, pd = sys.modules.get("numpy"), sys.modules.get("pandas")
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if np is not None and isinstance(obj, np.integer):
        return int(obj)
    if np is not None and isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, float) or (np is not None and isinstance(obj, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if pd is not None and obj is pd.NA:
        return None
    return obj


def records(df: pd.DataFrame) -> list[dict]:
    """A DataFrame's rows as JSON-able dicts (missing values as None)."""
    return jsonable(df.astype(object).where(df.notna(), None).to_dict(orient="records"))
