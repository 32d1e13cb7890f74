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
whole (``state`` says so, in one line), never partly served. On a cache miss ``Cache`` reads the
entry from here, checks that it decodes and is of the kind asked for, copies it into the cache
and marks the result ``bundled``; a damaged entry or index is reported in one line and read as
a miss, so the run computes as it would have without a bundle.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import CacheWarning

INDEX = "index.json"
MAX_ENTRY_BYTES = 64 * 2**20   # an entry larger than this is not one of the dashboard's defaults
_KEY = re.compile(r"[0-9a-f]{64}")


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
            head = json.loads(index.read_text())
            code, entries = str(head["code"]), dict(head["entries"])
            if not all(_KEY.fullmatch(k) and isinstance(v, dict) for k, v in entries.items()):
                raise ValueError("an entry is not a cache key with its record")
        except (OSError, ValueError, KeyError, TypeError) as exc:
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


def read(key: str, kind: str) -> bytes | None:
    """The blob of entry ``key`` (of experiment ``kind``) when the bundle may serve it, else None.
    A missing, oversized or mislabelled file is reported in one line and read as a miss."""
    st = state()
    record = st.entries.get(key) if st.usable else None
    if record is None or st.where is None:
        return None
    path = st.where / f"{key}.npz"
    if record.get("kind") != kind:
        warnings.warn(f"bundle entry {path.name} is a {record.get('kind')!r} result, not {kind!r}: ignored",
                      CacheWarning, stacklevel=2)
        return None
    try:
        if path.is_symlink() or path.stat().st_size > MAX_ENTRY_BYTES:
            raise OSError("a link, or larger than any default result")
        return path.read_bytes()
    except OSError as exc:
        warnings.warn(f"bundle entry {path} cannot be read ({exc}): ignored", CacheWarning, stacklevel=2)
        return None
