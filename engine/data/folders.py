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
import stat
import time
from pathlib import Path
from typing import Iterator

from ..runtime.errors import BadInput, DataCorrupt, DataMissing

NAME_MAX = 255    # bytes in one file or folder name (Linux file systems)
PATH_MAX = 4096   # bytes in a whole path, its terminating NUL included


def _short(text: str, keep: int = 60) -> str:
    return text if len(text) <= keep else text[:keep - 1] + "…"


def expand_path(path: str | os.PathLike, what: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded, checked against the file system's
    name limits; ``BadInput`` (one line naming ``what`` and the path) for an unknown user,
    a NUL byte, a name over ``NAME_MAX`` bytes or a path over ``PATH_MAX``. Touches no file."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise BadInput(f"{what} {_short(text)!r} holds a NUL byte; give a file system path")
    try:
        p = Path(text).expanduser()
    except RuntimeError:  # "~nosuchuser/...", or "~" with neither $HOME nor a password entry
        head = text.split("/", 1)[0]
        raise BadInput(f"{what} {_short(text)!r}: cannot expand {head} (no such user, or no home "
                       "folder known here); write the full path") from None
    raw = os.fsencode(p)
    if len(raw) >= PATH_MAX:
        raise BadInput(f"{what} {_short(text)!r} is {len(raw)} bytes long; a path holds at most "
                       f"{PATH_MAX - 1}")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise BadInput(f"{what}: the name {_short(os.fsdecode(part))!r} is {len(part)} bytes "
                           f"long; a file or folder name holds at most {NAME_MAX}")
    return p


def _what_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | os.PathLike, what: str, missing: type = DataMissing) -> Path:
    """``path`` (expanded by ``expand_path``) when it names a regular file, symbolic links
    followed. One line otherwise: ``missing`` (default ``DataMissing``) when nothing is there,
    ``BadInput`` for a folder, FIFO, socket or device (reading a FIFO would wait for a writer
    forever) or a path that cannot be looked at. Opens nothing."""
    p = expand_path(path, what)
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        raise missing(f"{what} {p}: no such file") from None
    except OSError as exc:
        raise BadInput(f"{what} {p}: cannot be looked at ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{what} {p} is {_what_kind(st.st_mode)}, not a regular file; give a file's path")
    return p


def read_regular(path: str | os.PathLike, what: str, limit: int, missing: type = BadInput) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; one-line ``BadInput`` (or
    ``missing`` when absent) otherwise. Opened without blocking and checked on the open file,
    so a FIFO swapped in after a check cannot make the read wait for a writer."""
    p = expand_path(path, what)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise missing(f"{what} {p}: no such file") from None
    except OSError as exc:
        raise BadInput(f"{what} {p}: cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):  # checked before fdopen, which refuses a folder in its own words
        os.close(fd)
        raise BadInput(f"{what} {p} is {_what_kind(st.st_mode)}, not a regular file; give a file's path")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise BadInput(f"{what} {p} is {st.st_size:,} bytes; the limit is {limit:,}")
        try:  # sized by the file, not the limit: a small file costs no buffer of `limit` bytes
            data = f.read(st.st_size + 1)
            if len(data) > st.st_size:  # it grew since fstat: read on, up to one byte past the limit
                data += f.read(max(limit + 1 - len(data), 0))
        except OSError as exc:
            raise BadInput(f"{what} {p}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise BadInput(f"{what} {p} grew past the limit of {limit:,} bytes while it was read")
    return data


def user_cache_dir() -> Path:
    """``($XDG_CACHE_HOME or ~/.cache)/influence-malleability/datasets``."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except (RuntimeError, KeyError):
            raise BadInput("cannot find a home folder for the data sets ($HOME is unset and this user "
                           "has no home); give --data-dir or set ENGINE_DATA_DIR") from None
    return expand_path(base, "$XDG_CACHE_HOME") / "influence-malleability" / "datasets"


def engine_data_dir() -> Path:
    """The engine's own folder for unpacked copies: ``$ENGINE_CACHE_DIR/datasets`` when that is
    set (next to the result cache, e.g. in the container), else ``user_cache_dir()``."""
    cache = os.environ.get("ENGINE_CACHE_DIR")
    return expand_path(cache, "$ENGINE_CACHE_DIR").resolve() / "datasets" if cache else user_cache_dir()


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir``, else ``$ENGINE_DATA_DIR``, else
    ``($XDG_CACHE_HOME or ~/.cache)/influence-malleability/datasets``. Nothing is created."""
    given = data_dir not in (None, "")
    chosen = data_dir if given else os.environ.get("ENGINE_DATA_DIR")
    if not chosen:
        return user_cache_dir()
    root = expand_path(chosen, "data folder" if given else "$ENGINE_DATA_DIR").resolve()
    if root.exists() and not root.is_dir():
        raise BadInput(f"{'data folder' if given else '$ENGINE_DATA_DIR'} {root} is not a folder; "
                       "give a folder that holds (or may hold) the data sets")
    return root


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
    if not stat.S_ISREG(st.st_mode):  # opening a FIFO would wait for a writer forever
        raise DataCorrupt(f"{p} is {_what_kind(st.st_mode)}, not a regular file; replace it with the data file")
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
