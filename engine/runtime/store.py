"""The cache's folder and its database on disk: private to its user, checked, and set aside when damaged.

``open_folder`` creates or checks the folder (the user's own, not writable by others);
``db_damage`` says what is wrong with a database file that SQLite cannot read, and
``set_aside`` moves it away so that a fresh one starts and nothing else is lost.
``RawDisk`` reads rows only as bytes: a row that would need unpickling is refused.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import time
import warnings
from pathlib import Path

import diskcache

from .errors import CacheError, CacheWarning


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
