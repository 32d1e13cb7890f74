"""The shipped bundle: the dashboard's default results, so that every page opens on its chart.

A newcomer's first look at a page should show its chart, not a form and minutes of waiting.
The bundle is a folder of finished results (``bundle/`` in the checkout, ``ENGINE_BUNDLE_DIR``
elsewhere, e.g. the image's ``/app/bundle``) made by ``make bundle`` (``python -m ui.bundle``):
each page opened at its defaults, every run it starts computed, and the cache entries copied
here as they are, under their cache keys, with ``index.json``::

    {"code": "<code fingerprint>", "engine": "0.1.0", "made": "2026-12-05T12:00:00Z",
     "entries": {"<cache key>": {"kind": "spectrum", "file": "<cache key>.npz", "bytes": 1234}}}

A key is the SHA-256 of the experiment, its settings, the code fingerprint and the data files'
fingerprints (``engine.runtime.cache``), so an entry is served only to the very run that made
it: same code, same settings, same data bytes. A bundle made by other code is refused as a
whole (``state`` says so, in one line), never partly served. On a cache miss ``Cache`` asks
``read`` for the entry, which checks that it is a regular file of at most ``MAX_ENTRY_BYTES``,
that it decodes to no more than its own size (``Result.from_bytes``), that it is of the kind
asked for, and that the key recomputed from the config and provenance stored inside it is the
key it is filed under (an entry swapped for another run's is refused); the cache then copies
it and marks the result ``bundled``. A damaged, foreign or oversized entry or index (a FIFO, a
link, an index nested too deep to parse or over ``MAX_INDEX_BYTES``) is reported in one line
and read as a miss, so the run computes as it would have without a bundle and nothing of it
reaches the user's cache.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..data.folders import read_regular
from .errors import BadInput, CacheCorrupt, CacheWarning, EngineError

if TYPE_CHECKING:  # the cache module imports this one
    from .cache import Result

INDEX = "index.json"
MAX_ENTRY_BYTES = 64 * 2**20   # an entry larger than this is not one of the dashboard's defaults
MAX_INDEX_BYTES = 4 * 2**20    # the index of every default result is a few kB; 4 MiB holds ~25,000 entries
_KEY = re.compile(r"[0-9a-f]{64}")


def _bytes(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file (not a link) of at most ``limit`` bytes; one-line
    BadInput otherwise. Opened without blocking (``read_regular``): a FIFO answers at once."""
    if path.is_symlink():
        raise BadInput(f"{path} is a link, not a file of the bundle")
    return read_regular(path, "file", limit)


def folder() -> Path | None:
    """``ENGINE_BUNDLE_DIR`` when set (empty: no bundle), else the checkout's ``bundle/``."""
    given = os.environ.get("ENGINE_BUNDLE_DIR")
    if given is not None:
        return Path(given).expanduser() if given.strip() else None
    here = Path(__file__).resolve().parents[2] / "bundle"
    return here if (here / INDEX).is_file() else None


@dataclass(frozen=True)
class State:
    where: Path | None
    usable: bool     # its code fingerprint is this code's: its entries can be served
    line: str        # one line for a page or the CLI: what the bundle is and whether it is used
    entries: dict


_memo: dict[tuple, State] = {}


def state() -> State:
    """What the bundle folder holds and whether this code may serve it (read once per index
    file version)."""
    from .cache import code_fingerprint

    where = folder()
    index = where / INDEX if where is not None else None
    try:
        stamp = index.stat().st_mtime_ns if index is not None else None
    except OSError:
        stamp = None
    memo = (str(where), stamp)
    if memo in _memo:
        return _memo[memo]
    if where is None or index is None or stamp is None:
        out = State(where, False, "no bundle of default results: every page computes its defaults", {})
    else:
        try:
            head = json.loads(_bytes(index, MAX_INDEX_BYTES))  # bounded: a deep nesting is a RecursionError
            code, entries = str(head["code"]), dict(head["entries"])
            if not all(_KEY.fullmatch(k) and isinstance(v, dict) for k, v in entries.items()):
                raise ValueError("an entry is not a cache key with its record")
        except (OSError, ValueError, KeyError, TypeError, RecursionError, MemoryError) as exc:
            warnings.warn(f"bundle index {index} is unreadable ({type(exc).__name__}: {exc}); it is ignored",
                          CacheWarning, stacklevel=2)
            out = State(where, False, f"the bundle index {index} is unreadable: it is ignored", {})
        else:
            if code != code_fingerprint():
                out = State(where, False, f"the bundle in {where} was made by other code ({code[:12]}, this is "
                            f"{code_fingerprint()[:12]}): refused; `make bundle` remakes it", {})
            else:
                out = State(where, True, f"{len(entries)} default result(s) shipped in {where}, made by this code "
                            f"on {head.get('made', 'an unknown date')}", entries)
    _memo.clear()
    _memo[memo] = out
    return out


def read(key: str, kind: str, on_corrupt: Callable[[str], None] | None = None) -> tuple[bytes, Result] | None:
    """Entry ``key``'s blob and the ``Result`` it decodes to, when the bundle may serve it to the
    run of experiment ``kind`` whose key that is; else None. An entry that is not a regular file
    of at most ``MAX_ENTRY_BYTES``, that does not decode within its own size, holds another kind,
    or whose stored config and provenance give another key than the one it is filed under (the
    bytes of another run's entry) is reported in one line through ``on_corrupt`` (default: a
    ``CacheWarning``) and read as a miss."""
    from .cache import Result, _key

    st = state()
    record = st.entries.get(key) if st.usable else None
    if record is None or st.where is None:
        return None
    try:
        if record.get("kind") != kind:
            raise CacheCorrupt(f"the index files it as a {record.get('kind')!r} result")
        blob = _bytes(st.where / f"{key}.npz", MAX_ENTRY_BYTES)
        result = Result.from_bytes(blob)
        if result.kind != kind:
            raise CacheCorrupt(f"it holds a {result.kind!r} result")
        made = _key(kind, result.config, result.provenance)
        if made != key:
            raise CacheCorrupt(f"its own config and provenance give the key {made[:12]}: it is another run's result")
    except (OSError, EngineError, KeyError, TypeError, ValueError) as exc:
        message = f"bundle entry {key[:12]} for {kind} is ignored: {exc}"
        (on_corrupt or (lambda m: warnings.warn(m, CacheWarning, stacklevel=4)))(" ".join(message.splitlines()))
        return None
    return blob, result
