"""Folders the data layer reads and writes, and the file hashes behind ``data_fingerprint``.

Two folders matter: the *data folder* (``resolve_data_dir``), which may be shared or read-only,
and the engine's *own folder* (``engine_data_dir``), where a system package's copy is unpacked
when the data folder cannot be written. Nothing here creates a folder by itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Iterator


def user_cache_dir() -> Path:
    """``($XDG_CACHE_HOME or ~/.cache)/influence-malleability/datasets``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "influence-malleability" / "datasets"


def engine_data_dir() -> Path:
    """The engine's own folder for unpacked copies: ``$ENGINE_CACHE_DIR/datasets`` when that is
    set (next to the result cache, e.g. in the container), else ``user_cache_dir()``."""
    cache = os.environ.get("ENGINE_CACHE_DIR")
    return Path(cache).expanduser().resolve() / "datasets" if cache else user_cache_dir()


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir``, else ``$ENGINE_DATA_DIR``, else
    ``($XDG_CACHE_HOME or ~/.cache)/influence-malleability/datasets``. Nothing is created."""
    chosen = data_dir if data_dir not in (None, "") else os.environ.get("ENGINE_DATA_DIR")
    return Path(chosen).expanduser().resolve() if chosen else user_cache_dir()


def writable(path: str | os.PathLike) -> bool:
    """Whether the engine may create files under `path` (or its nearest existing parent).

    False when that folder is on a read-only mount, lacks write permission, or has no write
    bit at all: read-only permission bits are honoured even for root, who could otherwise
    write into a folder meant to stay read-only, such as a shared data set folder."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        if not p.is_dir() or os.statvfs(p).f_flag & os.ST_RDONLY:
            return False
        return os.access(p, os.W_OK | os.X_OK) and bool(p.stat().st_mode & 0o222)
    except OSError:
        return False


def _outermost_missing(path: Path) -> Path | None:
    top = None
    while not path.exists() and path != path.parent:
        top, path = path, path.parent
    return top


@contextlib.contextmanager
def undone_on_failure(*folders: Path) -> Iterator[None]:
    """Run a step that writes into `folders`; if it raises, remove what it created there.

    A folder that did not exist is removed from its outermost new parent down; in one that
    existed, only the entries that appeared during the step are removed. So a failed
    download or unpack never leaves empty folders or partial files behind."""
    before = []
    for folder in folders:
        top = _outermost_missing(folder)
        seen = set(folder.iterdir()) if top is None and folder.is_dir() else set()
        before.append((folder, top, seen))
    try:
        yield
    except BaseException:
        for folder, top, seen in before:
            if top is not None:
                shutil.rmtree(top, ignore_errors=True)
            elif folder.is_dir():
                for entry in set(folder.iterdir()) - seen:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
        raise


_HASHES: dict[tuple, str] = {}  # (path, size, mtime_ns, inode) -> sha256 hex
_MAX_HASHES = 256
_RACY_NS = 2 * 10**9  # file clocks tick coarsely: a file this fresh may change, stat unchanged


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes, memoised per (resolved path, size, mtime_ns, inode),
    so asking again for an unchanged file costs one ``stat``. A file modified in the last
    two seconds is hashed afresh each time: a rewrite within the file system's clock tick
    could otherwise keep its size, mtime and inode and return a stale hash."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _HASHES:
        return _HASHES[key]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    if time.time_ns() - st.st_mtime_ns > _RACY_NS:
        if len(_HASHES) >= _MAX_HASHES:
            _HASHES.pop(next(iter(_HASHES)))  # oldest first: dicts keep insertion order
        _HASHES[key] = h.hexdigest()
    return h.hexdigest()
