"""The cache's folder and its database on disk: private to its user, checked, and set aside when damaged.

``open_folder`` creates or checks the folder (the user's own, not writable by others);
``db_damage`` says what is wrong with a database file that SQLite cannot read, and
``set_aside`` moves it away so that a fresh one starts and nothing else is lost.
``RawDisk`` reads rows only as bytes: a row that would need unpickling is refused.
``Checkpoints`` keeps a run's finished units as JSON rows; a damaged one is dropped, never read.

What a checkpoint's hash protects: each stored unit carries the SHA-256 of its values
(``engine.experiments.runs.resumable``), checked on read. It catches damage (a torn or
truncated write, a flipped byte, a hand edit that forgets the hash), not an attacker: whoever
can write the private cache folder can store any unit with its hash recomputed, and it will be
served. The folder's privacy (``open_folder`` refuses one that others may write) is what keeps
others out; the hash is not a signature.

Each checkpoint row is tagged with the code fingerprint that wrote it; opening a cache deletes
the rows of any other code (``Checkpoints.drop_older``), which no run of this code would read
(their runs' keys hold the other fingerprint), so they never pile up.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import diskcache

from .errors import CacheError, CacheWarning

if TYPE_CHECKING:  # the cache module imports this one
    from .cache import Cache

# ---------------------------------------------------------------- rows read only as bytes

class Refused(Exception):
    """A row of the Cache table that is not raw bytes of this folder."""


_MODES = {diskcache.core.MODE_NONE: "none", diskcache.core.MODE_RAW: "raw",
          diskcache.core.MODE_BINARY: "binary", diskcache.core.MODE_TEXT: "text",
          diskcache.core.MODE_PICKLE: "pickle"}
_VALUE_FILE = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")  # Disk.filename()'s names


class RawDisk(diskcache.Disk):
    """diskcache's Disk that unpickles nothing and reads or deletes only its own value files.

    Writing is unchanged (bytes go inline below ``min_file_size``, else to a value file)."""

    def _own(self, filename: object) -> str | None:
        # the real path of a value file of this folder, or None for anything else
        if not isinstance(filename, str) or not _VALUE_FILE.fullmatch(filename.replace(os.sep, "/")):
            return None
        root = os.path.realpath(self._directory)
        full = os.path.realpath(os.path.join(root, filename))
        return full if os.path.commonpath([root, full]) == root else None

    def get(self, key, raw):
        if not raw:
            raise Refused("its key is pickled")
        return super().get(key, raw)

    def fetch(self, mode, filename, value, read):
        if mode == diskcache.core.MODE_RAW and isinstance(value, (bytes, memoryview)):
            return bytes(value)
        if mode == diskcache.core.MODE_BINARY and not read:
            full = self._own(filename)
            if full is None:
                raise Refused(f"its file name {filename!r} is not a value file inside the cache folder")
            with open(full, "rb") as f:  # FileNotFoundError: deleted meanwhile, a miss
                return f.read()
        kind = type(value).__name__ if mode == diskcache.core.MODE_RAW else _MODES.get(mode, mode)
        raise Refused(f"it is stored as {kind}, not raw bytes")

    def _write(self, full_path, iterator, mode, encoding=None):
        # a value file cut short (a full disk, say) is removed before the error goes on
        try:
            return super()._write(full_path, iterator, mode, encoding)
        except BaseException:
            if os.path.isfile(full_path):
                os.remove(full_path)
            raise

    def remove(self, file_path):
        if self._own(file_path) is not None:  # a row naming any other path loses only its row
            super().remove(file_path)


# ---------------------------------------------------------------- checkpoints of a run

CHECKPOINT_PREFIX = "checkpoint:"  # checkpoint rows' keys: prefix, the run's key, ":", the unit


class Checkpoints:
    """The finished units of one run, kept in its cache as JSON until the whole result is stored.

    ``get(unit)`` is what ``put(unit, value)`` stored for that unit by this or an earlier,
    interrupted run of the same key (same config, data and code), else None; values are
    JSON-able (lists of row dicts), so floats come back bit for bit and nothing is unpickled."""

    def __init__(self, cache: Cache, key: str, on_corrupt: Callable[[str], None] | None = None):
        self.cache, self.key = cache, key
        self._seen: set[str] = set()  # units named in this process
        self.resumed = 0  # units taken from an earlier run (their time is not this run's)
        self._say = on_corrupt or (lambda m: warnings.warn(m, CacheWarning, stacklevel=5))

    def _unit_key(self, unit: str) -> str:
        return f"{CHECKPOINT_PREFIX}{self.key}:{unit}"

    def _read(self, row: str) -> Any:
        # a row's JSON, or ValueError for anything damaged: a pickle, a file outside the
        # folder, bad JSON, nesting too deep to parse, a row too large to hold
        try:
            with self.cache._errors():
                blob = self.cache._store.get(row)
            return None if blob is None else json.loads(bytes(blob))
        except (Refused, ValueError, TypeError, RecursionError, MemoryError) as exc:
            raise ValueError(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}") from None

    def _units(self) -> list[str]:
        index = f"{CHECKPOINT_PREFIX}{self.key}"
        try:
            units = self._read(index)
            if units is not None and not (isinstance(units, list) and all(isinstance(u, str) for u in units)):
                raise ValueError(f"it holds {type(units).__name__}, not a list of unit names")
        except ValueError as exc:  # the units' own rows stay: each is found by its name
            self._say(f"dropped damaged checkpoint index of run {self.key[:12]}: {exc}")
            with self.cache._errors():
                self.cache._store.delete(index)
            return []
        return units or []

    def get(self, unit: str) -> Any:
        """The JSON stored for `unit`, or None; a damaged row is dropped with one warning line."""
        self._seen.add(unit)
        try:
            return self._read(self._unit_key(unit))
        except ValueError as exc:
            self.drop(unit, str(exc))
            return None

    def drop(self, unit: str, why: str) -> None:
        """Delete `unit`'s checkpoint (damaged or foreign: `why`), with one warning line."""
        self._say(f"dropped damaged checkpoint {unit} of run {self.key[:12]}: {why}; recomputing it")
        with self.cache._errors():
            self.cache._store.delete(self._unit_key(unit))  # SQL delete; RawDisk.remove unlinks only own files

    def put(self, unit: str, value: Any) -> None:
        from .cache import code_fingerprint

        units, code = self._units(), code_fingerprint()  # the tag says which code wrote the row
        with self.cache._errors():
            self.cache._store.set(self._unit_key(unit), json.dumps(value).encode(), tag=code)
            if unit not in units:
                self.cache._store.set(f"{CHECKPOINT_PREFIX}{self.key}", json.dumps(units + [unit]).encode(), tag=code)

    @staticmethod
    def drop_older(store: diskcache.Cache, code: str) -> int:
        """Delete the checkpoint rows of ``store`` not tagged with ``code`` (written by other code,
        or by code from before rows were tagged); returns how many. A checkpoint of another code
        fingerprint is never read (its run's key holds that fingerprint): it would only take room."""
        rows = store._sql("SELECT key FROM Cache WHERE raw = 1 AND substr(key, 1, ?) = ? AND (tag IS NULL OR tag != ?)",
                          (len(CHECKPOINT_PREFIX), CHECKPOINT_PREFIX, code)).fetchall()
        for (key,) in rows:
            store.delete(key)  # diskcache's delete: the row, and its value file if it has one
        return len(rows)

    def clear(self) -> None:
        with self.cache._errors():
            for unit in set(self._units()) | self._seen:  # a unit whose index row was damaged too
                self.cache._store.delete(self._unit_key(unit))
            self.cache._store.delete(f"{CHECKPOINT_PREFIX}{self.key}")


# ---------------------------------------------------------------- the folder and its database

def open_folder(folder: Path) -> None:
    """Create `folder` with mode 0700, or check that an existing one is a private, writable folder."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700)
    except FileExistsError as exc:
        if exc.filename != str(folder):  # a parent is a file
            raise CacheError(f"cache folder {folder} cannot be created: {exc.filename} is a file") from None
    except OSError as exc:
        raise CacheError(f"cache folder {folder} cannot be created: {exc.strerror or exc}") from None
    else:
        os.chmod(folder, 0o700)  # mkdir's mode went through the umask; this folder is ours
        return
    try:
        st = folder.stat()
    except OSError as exc:
        raise CacheError(f"cache folder {folder} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"cache folder {folder} is not a folder; choose another cache folder")
    if st.st_mode & 0o022:
        raise CacheError(f"cache folder {folder} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); make it private (chmod 700) or choose another")
    # the owner's write bit is honoured even for root, who could otherwise write anywhere
    if not (os.access(folder, os.W_OK | os.X_OK) and st.st_mode & 0o200):
        raise CacheError(f"cache folder {folder} is not writable; choose another cache folder")


def db_damage(db: Path) -> str | None:
    """Why `db` is a damaged SQLite database, or None when it is absent or sound."""
    try:
        with open(db, "rb") as f:
            head = f.read(100)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheError(f"cache database {db} cannot be read: {exc.strerror or exc}") from None
    if not head:
        return "it is empty"
    if not head.startswith(b"SQLite format 3\x00"):
        return "it is not an SQLite database"
    try:
        con = sqlite3.connect(db, timeout=10)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
            return str(exc)
        raise CacheError(f"cache database {db} cannot be read: {exc}") from None
    return None if rows == [("ok",)] else f"integrity check: {rows[0][0]}".replace("\n", " ")


def set_aside(db: Path, why: str) -> Path:
    """Rename `db` and its -wal/-shm to ``<db>.corrupt-<timestamp>``; warn in one line."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = db.with_name(f"{db.name}.corrupt-{stamp}"), 1
    while aside.exists():
        aside, n = db.with_name(f"{db.name}.corrupt-{stamp}-{n}"), n + 1
    for suffix in ("", "-wal", "-shm"):
        if os.path.lexists(f"{db}{suffix}"):
            os.replace(f"{db}{suffix}", f"{aside}{suffix}")
    warnings.warn(f"cache database {db} is damaged ({why}); moved it aside as {aside} and "
                  f"started a fresh cache", CacheWarning, stacklevel=3)
    return aside
