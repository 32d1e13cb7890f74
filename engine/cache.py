"""The disk cache: every experiment result, keyed by its canonical config.

A result is a ``Result``: the config that made it, DataFrames, numpy arrays and a small
JSON-able ``meta`` dict. It is stored as one ``.npz`` blob (``np.savez``: arrays as
``.npy`` members, frames and meta as JSON text) and read back with ``allow_pickle=False``,
so a cache folder never executes code. The key is the SHA-256 of the sorted JSON of
``{kind, config, engine version}``; the config is stored with the result. The folder is
created with mode 0700. An entry that cannot be decoded is reported, deleted and
recomputed.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from .errors import CacheCorrupt

ENGINE_VERSION = "0.1.0"
DEFAULT_CACHE_DIR = Path(__file__).resolve().parent.parent / "cache"


def canonical(obj) -> object:
    """A JSON-able, order-independent form of dataclasses, enums, tuples and numbers."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def config_key(kind: str, config) -> str:
    text = json.dumps({"kind": kind, "config": canonical(config), "engine": ENGINE_VERSION},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Result:
    kind: str
    config: dict                                         # canonical config that made it
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)             # JSON-able scalars and lists
    cached: bool = False                                 # True when read back from disk

    def to_bytes(self) -> bytes:
        head = {"kind": self.kind, "config": self.config, "meta": self.meta,
                "engine": ENGINE_VERSION,
                "frames": {k: df.to_json(orient="split", double_precision=15)
                           for k, df in self.frames.items()}}
        members = {f"a_{k}": np.ascontiguousarray(v) for k, v in self.arrays.items()}
        buf = io.BytesIO()
        np.savez(buf, __head__=np.frombuffer(json.dumps(head).encode(), dtype=np.uint8), **members)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Result":
        try:
            with np.load(io.BytesIO(blob), allow_pickle=False) as z:
                head = json.loads(z["__head__"].tobytes().decode())
                arrays = {k[2:]: z[k] for k in z.files if k.startswith("a_")}
            frames = {k: pd.read_json(io.StringIO(v), orient="split") for k, v in head["frames"].items()}
            return cls(head["kind"], head["config"], frames, arrays, head["meta"], cached=True)
        except Exception as exc:  # any decoding failure means the entry is unusable
            raise CacheCorrupt(f"cache entry cannot be decoded ({type(exc).__name__}: {exc})") from exc


class Cache:
    """A diskcache-backed store of ``Result``s in a private folder (mode 0700)."""

    def __init__(self, directory: str | os.PathLike | None = None):
        import diskcache

        self.directory = Path(directory or os.environ.get("ENGINE_CACHE_DIR") or DEFAULT_CACHE_DIR)
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self._store = diskcache.Cache(str(self.directory), size_limit=8 * 2**30)

    def get(self, kind: str, config, on_corrupt: Callable[[str], None] | None = None) -> Result | None:
        key = config_key(kind, config)
        blob = self._store.get(key)
        if blob is None:
            return None
        try:
            if not isinstance(blob, bytes):
                raise CacheCorrupt(f"cache entry holds {type(blob).__name__}, not bytes")
            return Result.from_bytes(blob)
        except CacheCorrupt as exc:
            message = f"dropped corrupt cache entry {key[:12]} for {kind}: {exc}"
            (on_corrupt or (lambda m: warnings.warn(m, stacklevel=2)))(message)
            self._store.delete(key)
            return None

    def put(self, result: Result, config) -> None:
        self._store.set(config_key(result.kind, config), result.to_bytes())

    def set_raw(self, kind: str, config, blob) -> None:
        """Store an arbitrary value under a config's key (tests use it to corrupt entries)."""
        self._store.set(config_key(kind, config), blob)

    def __contains__(self, item) -> bool:
        kind, config = item
        return config_key(kind, config) in self._store

    def clear(self) -> None:
        self._store.clear()

    def close(self) -> None:
        self._store.close()


def cached_run(kind: str, config, compute: Callable[[], Result], cache: Cache | None,
               on_corrupt: Callable[[str], None] | None = None) -> Result:
    """Return the cached result for (kind, config), or compute, store and return it."""
    if cache is not None:
        hit = cache.get(kind, config, on_corrupt)
        if hit is not None:
            return hit
    result = compute()
    result.config = canonical(config)
    if cache is not None:
        cache.put(result, config)
    return result
