"""The disk cache: every experiment result, keyed by what made it.

A result is a ``Result``: the config that made it, DataFrames, numpy arrays, a small JSON-able
``meta`` dict and its ``provenance`` (code fingerprint, engine version, data fingerprints). It
is stored as one ``.npz`` blob: arrays and every numeric frame column as their own ``.npy``
members, so float64 values come back bit for bit; text and object columns, meta and the
description of each frame as JSON. It is read back with ``allow_pickle=False``, after its
members' declared sizes (``check_npz_sizes``): written uncompressed, an entry never unpacks to
more than its own bytes, so one that would is refused.

The key is the SHA-256 of the sorted JSON of ``{kind, canonical config, code fingerprint, data
fingerprints}``: editing any ``engine/**/*.py`` file that computes (all but ``engine/reporting``,
which only presents) or any data file a ``DataSpec`` reads gives new keys, so a stale result is
never served (``ENGINE_VERSION`` is only a label).

A cache folder never executes code and never touches files outside itself: entries are read
only as raw bytes (a pickled row, or one naming a file outside the folder, is reported and
dropped), a damaged ``cache.db`` is moved aside, a folder that others may write is refused, a
new one is created with mode 0700, and an existing one is never chmod-ed.

While a run computes, its finished units (an architecture and seed of a width sweep, say) are
kept as checkpoints under the run's key (``Checkpoints``, reached from inside the run through
``checkpoints()``): a run cancelled or failed half way resumes from them when started again,
and they are deleted once the whole result is stored.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import errno
import functools
import hashlib
import io
import json
import os
import sqlite3
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, TypeAlias, overload

import diskcache

from ..data.folders import expand_path, user_cache_dir
from ..data.spec import DataSpec
from . import bundle
from .errors import CacheCorrupt, CacheError, CacheWarning
from .store import CHECKPOINT_PREFIX, Checkpoints, RawDisk, Refused, db_damage, open_folder, set_aside  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # numpy and pandas are imported where a result is encoded or decoded: keys need neither
    import numpy as np
    import pandas as pd
    from _typeshed import DataclassInstance

    # What a result is keyed by: an experiment's frozen config dataclass, or a JSON-able dict.
    Config: TypeAlias = DataclassInstance | dict[str, Any]

ENGINE_VERSION = "0.1.0"  # a human label; keys use code_fingerprint()
_CHECKOUT = Path(__file__).resolve().parents[2]   # engine/runtime/cache.py -> the checkout
# A checkout (`make run`, `python -m engine`) caches beside its code in ./cache; an installed
# package (`pip install .`, site-packages) in the user's cache folder, next to the data sets.
DEFAULT_CACHE_DIR = (_CHECKOUT / "cache" if (_CHECKOUT / "pyproject.toml").is_file()
                     else user_cache_dir().parent / "results")
ENGINE_DIR = Path(__file__).resolve().parents[1]  # engine/: its modules but PRESENTATION are in the key
PRESENTATION = ("reporting",)  # engine packages that only present results: no run imports them (tests/test_layout.py)
SIZE_LIMIT = 8 * 2**30  # bytes; diskcache culls the least recently stored entries beyond it
DB_NAME = "cache.db"    # diskcache's database file inside the folder


# ---------------------------------------------------------------- keys

@overload
def canonical(obj: DataclassInstance | dict) -> dict[str, Any]: ...
@overload
def canonical(obj: object) -> object: ...


def canonical(obj: object) -> object:
    """A JSON-able, order-independent form of dataclasses, enums, tuples and numbers."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    np = sys.modules.get("numpy")  # a numpy number exists only once numpy is loaded
    if np is not None and isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def tree_fingerprint(root: str | os.PathLike, skip: tuple[str, ...] = ()) -> str:
    """SHA-256 (hex) over the relative paths and bytes of every ``*.py`` under `root` not in a top folder in `skip`."""
    root = Path(root)
    h = hashlib.sha256()
    for rel in sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                      if p.is_file() and p.relative_to(root).parts[0] not in skip):
        body = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(body)}\0".encode())  # lengths keep file boundaries unambiguous
        h.update(body)
    return h.hexdigest()


@functools.cache
def code_fingerprint() -> str:
    """``tree_fingerprint`` of ``engine`` (once per process) but ``PRESENTATION``, on which no number
    depends: a changed sentence keeps every cached result and the shipped bundle."""
    return tree_fingerprint(ENGINE_DIR, PRESENTATION)


def _data_specs(obj: object, path: str = "") -> Iterator[tuple[str, DataSpec]]:
    # every DataSpec inside a config, with the dotted field path that leads to it
    if isinstance(obj, DataSpec):
        yield path or "config", obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _data_specs(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(obj, dict):
        for k, v in sorted(obj.items(), key=lambda kv: str(kv[0])):
            yield from _data_specs(v, f"{path}[{k}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _data_specs(v, f"{path}[{i}]")


def provenance_of(config: Config, data_dir: str | os.PathLike | None = None, allow_download: bool = True) -> dict:
    """How a result of `config` is made: code fingerprint, engine label, data fingerprints."""
    from ..data.load import data_fingerprint  # the readers load torch and torchvision: only when a key is made

    return {"code": code_fingerprint(), "engine": ENGINE_VERSION,
            "data": {where: data_fingerprint(spec, data_dir, allow_download=allow_download)
                     for where, spec in _data_specs(config)}}


def _key(kind: str, config: Config, provenance: dict) -> str:
    text = json.dumps({"kind": kind, "config": canonical(config), "code": provenance["code"],
                       "data": provenance["data"]}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def config_key(kind: str, config: Config, data_dir: str | os.PathLike | None = None,
               allow_download: bool = False) -> str:
    """SHA-256 (hex) of (kind, canonical config, code fingerprint, fingerprint of every
    DataSpec's data as read from `data_dir`). Raises what ``data_fingerprint`` raises; a
    look-up never downloads (``DataMissing`` for absent files) unless ``allow_download``."""
    return _key(kind, config, provenance_of(config, data_dir, allow_download))


# ---------------------------------------------------------------- results as bytes

def _jsonable(v):
    import numpy as np
    import pandas as pd

    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if v is pd.NA or v is pd.NaT:
        return None
    raise TypeError(f"cannot store {type(v).__name__} in a cache entry")


def _encode(values: pd.Index | pd.Series, name: str, members: dict[str, np.ndarray]) -> dict:
    # one column or index: numpy numbers as a .npy member (bit-exact), the rest as JSON
    import numpy as np
    import pandas as pd

    if isinstance(values, pd.RangeIndex):
        return {"range": [values.start, values.stop, values.step], "name": values.name}
    dtype = values.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "biufcmM":
        members[name] = np.asarray(values)
        return {"npy": name, "name": values.name}
    items = [None if v is pd.NA or v is pd.NaT else v for v in values.tolist()]
    return {"json": items, "dtype": str(dtype), "name": values.name}


def _decode(desc: dict, z: Mapping[str, np.ndarray], as_index: bool) -> pd.Index | pd.Series:
    import pandas as pd

    if "range" in desc:
        return pd.RangeIndex(*desc["range"], name=desc["name"])
    if "npy" in desc:
        data, dtype = z[desc["npy"]], None
    else:
        data, dtype = desc["json"], desc["dtype"]
    return (pd.Index(data, dtype=dtype, name=desc["name"]) if as_index
            else pd.Series(data, dtype=dtype, copy=False))


def _frame_head(df: pd.DataFrame, i: int, members: dict[str, np.ndarray]) -> dict:
    import pandas as pd

    if isinstance(df.index, pd.MultiIndex) or isinstance(df.columns, pd.MultiIndex):
        raise TypeError("cannot store a DataFrame with a MultiIndex in a cache entry")
    return {"index": _encode(df.index, f"f{i}_index", members),
            "columns": _encode(df.columns, f"f{i}_columns", members),
            "data": [_encode(df.iloc[:, j], f"f{i}_{j}", members) for j in range(df.shape[1])]}


def _frame(desc: dict, z: Mapping[str, np.ndarray]) -> pd.DataFrame:
    import pandas as pd

    index, columns = _decode(desc["index"], z, True), _decode(desc["columns"], z, True)
    cols = [_decode(d, z, False).set_axis(index) for d in desc["data"]]
    df = pd.concat(cols, axis=1) if cols else pd.DataFrame(index=index)
    df.columns = columns
    return df


@dataclass
class Result:
    kind: str
    config: dict                                         # canonical config that made it
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)             # JSON-able scalars and lists
    cached: bool = False                                 # True when read back from disk
    bundled: bool = False                                # True when it came from the shipped bundle
    provenance: dict = field(default_factory=dict)       # code, engine, data fingerprints

    def to_bytes(self) -> bytes:
        """The ``.npz`` blob; float64 arrays and columns round-trip bit for bit."""
        import numpy as np

        members: dict[str, np.ndarray] = {}
        for k, v in self.arrays.items():
            v = np.ascontiguousarray(v)
            if v.dtype.hasobject:  # np.savez would pickle it
                raise TypeError(f"array {k!r} has object dtype; a cache entry holds no pickles")
            members[f"a_{k}"] = v
        frames = {k: _frame_head(df, i, members) for i, (k, df) in enumerate(self.frames.items())}
        head = {"kind": self.kind, "config": self.config, "meta": self.meta, "frames": frames,
                "engine": ENGINE_VERSION, "code": self.provenance.get("code"),
                "provenance": self.provenance}
        text = json.dumps(head, default=_jsonable)  # floats as repr(): exact; NaN as NaN
        buf = io.BytesIO()
        # allow_pickle=False: numpy refuses object arrays too; passed by name, mypy sees **members cannot fill it
        np.savez(buf, allow_pickle=False, __head__=np.frombuffer(text.encode(), dtype=np.uint8), **members)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Result":
        import numpy as np

        from ..data.npz import check_npz_sizes

        try:  # written uncompressed (np.savez): an entry that would unpack to more than its own bytes is a bomb
            check_npz_sizes(io.BytesIO(blob), "the entry", limit=len(blob))
            with np.load(io.BytesIO(blob), allow_pickle=False) as z:
                head = json.loads(z["__head__"].tobytes().decode())
                arrays = {k[2:]: z[k] for k in z.files if k.startswith("a_")}
                frames = {k: _frame(d, z) for k, d in head["frames"].items()}
            return cls(head["kind"], head["config"], frames, arrays, head["meta"], cached=True,
                       provenance=head.get("provenance", {}))
        except Exception as exc:  # any decoding failure means the entry is unusable
            raise CacheCorrupt(f"cache entry cannot be decoded ({type(exc).__name__}: {exc})") from exc


# ---------------------------------------------------------------- the cache

class Cache:
    """A diskcache-backed store of ``Result``s in a private folder.

    `directory`: default ``$ENGINE_CACHE_DIR``, else ``DEFAULT_CACHE_DIR``. Raises
    ``CacheError`` (one line, exit code 2) for a folder that is a file, not writable,
    writable by others, or whose database cannot be read. `data_dir` arguments are the data
    folder the run reads (as in ``load_sample``): it decides the data fingerprints."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = expand_path(directory or os.environ.get("ENGINE_CACHE_DIR") or DEFAULT_CACHE_DIR, "cache folder")
        open_folder(self.directory)
        db = self.directory / DB_NAME
        why = db_damage(db)
        if why is not None:
            set_aside(db, why)
        try:
            self._store = diskcache.Cache(str(self.directory), size_limit=SIZE_LIMIT, disk=RawDisk)
        except (sqlite3.Error, OSError, ValueError, TypeError) as exc:
            raise CacheError(f"cache database {db} cannot be opened: {exc}") from None
        with self._errors():  # no run of this code reads another code's checkpoints: they only take room
            Checkpoints.drop_older(self._store, code_fingerprint())

    def get(self, kind: str, config: Config, on_corrupt: Callable[[str], None] | None = None,
            data_dir: str | os.PathLike | None = None) -> Result | None:
        """The stored result for (kind, config), or None. A corrupt entry is reported
        through `on_corrupt` (default: a ``CacheWarning``), deleted, and read as a miss."""
        return self._read(config_key(kind, config, data_dir), kind, on_corrupt)

    def put(self, result: Result, config: Config, data_dir: str | os.PathLike | None = None) -> None:
        """Store `result` under its key; sets its ``config`` and ``provenance`` first."""
        provenance = provenance_of(config, data_dir)
        result.config, result.provenance = canonical(config), provenance
        self._write(_key(result.kind, config, provenance), result)

    def set_raw(self, kind: str, config: Config, blob: object, data_dir: str | os.PathLike | None = None) -> None:
        """Store an arbitrary value under a config's key (tests use it to corrupt entries)."""
        with self._errors():
            self._store.set(config_key(kind, config, data_dir), blob)

    def __contains__(self, item: tuple) -> bool:
        """``(kind, config)`` or ``(kind, config, data_dir)`` in cache (or in the bundle it may serve)."""
        key = config_key(*item)
        with self._errors():
            return key in self._store or key in bundle.state().entries

    def clear(self) -> None:
        with self._errors():
            self._store.clear()

    def close(self) -> None:
        self._store.close()

    def _read(self, key: str, kind: str, on_corrupt: Callable[[str], None] | None) -> Result | None:
        try:
            with self._errors():
                blob = self._store.get(key)
            return self._from_bundle(key, kind, on_corrupt) if blob is None else Result.from_bytes(blob)
        except (Refused, CacheCorrupt) as exc:
            message = f"dropped corrupt cache entry {key[:12]} for {kind}: {exc}"
            (on_corrupt or (lambda m: warnings.warn(m, CacheWarning, stacklevel=4)))(message)
            with self._errors():
                self._store.delete(key)  # SQL delete; RawDisk.remove unlinks only own files
            return None

    def _from_bundle(self, key: str, kind: str, on_corrupt: Callable[[str], None] | None) -> Result | None:
        """The bundle's entry for ``key``, copied into the cache; None where the bundle refuses it (``bundle.read``)."""
        found = bundle.read(key, kind, on_corrupt)
        if found is None:
            return None
        blob, result = found
        with self._errors():
            self._store.set(key, blob)
        result.bundled = True
        return result

    def _write(self, key: str, result: Result) -> None:
        blob = result.to_bytes()
        with self._errors():
            self._store.set(key, blob)

    @contextlib.contextmanager
    def _errors(self):
        # a database failing after it was opened becomes one CacheError line, not a traceback
        try:
            yield
        except sqlite3.Error as exc:
            if "full" in str(exc).lower():  # SQLITE_FULL: the disk, not the database, is at fault
                raise CacheError(f"cache folder {self.directory} is on a full disk ({exc}); "
                                 f"free some space there and retry") from None
            raise CacheError(f"cache database {self.directory / DB_NAME} failed: {exc}; "
                             f"move it aside and retry") from None
        except OSError as exc:  # a value file beside the database: a full disk, a quota, a lost mount
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheError(f"cache folder {self.directory} is on a full disk ({exc.strerror}); free some "
                                 f"space there (or choose another with --cache-dir) and retry") from None
            raise CacheError(f"cache folder {self.directory} cannot be written: {exc.strerror or exc}") from None


_current: contextvars.ContextVar[Checkpoints | None] = contextvars.ContextVar("checkpoints", default=None)


def checkpoints() -> Checkpoints | None:
    """The checkpoints of the cached run computing in this thread (None without a cache)."""
    return _current.get()


def cached_run(kind: str, config: Config, compute: Callable[[], Result], cache: Cache | None,
               on_corrupt: Callable[[str], None] | None = None, data_dir: str | os.PathLike | None = None) -> Result:
    """The cached result for (kind, config, data as read from `data_dir`), or compute, store and
    return it. The result's ``config`` and ``provenance`` say how it was made."""
    if cache is None:
        result = compute()
        result.config, result.provenance = canonical(config), provenance_of(config, data_dir)
        return result
    provenance = provenance_of(config, data_dir)
    hit = cache._read(key := _key(kind, config, provenance), kind, on_corrupt)
    if hit is not None:
        return hit
    kept = Checkpoints(cache, key, on_corrupt)
    token = _current.set(kept)
    try:
        result = compute()
    finally:
        _current.reset(token)
    if kept.resumed:  # part of the work was an earlier run's: this run's time is not the whole run's
        result.meta["resumed_units"] = kept.resumed
    result.config, result.provenance = canonical(config), provenance
    cache._write(key, result)
    kept.clear()
    return result
