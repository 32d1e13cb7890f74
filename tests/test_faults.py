"""Fault injection with real files: each case a user or an attacker could produce."""

import os
import pickle
import sqlite3
import stat
from dataclasses import dataclass

import numpy as np
import pytest

# ---- cache
from diskcache.core import MODE_BINARY, MODE_PICKLE

from engine.data import DataSpec
from engine.runtime.cache import Cache, CacheWarning, Result, config_key
from engine.runtime.errors import CacheError

ROOT = os.geteuid() == 0


@dataclass(frozen=True)
class _Cfg:
    data: DataSpec = DataSpec(dataset="synthetic", n=8, n_test=4)
    width: int = 16


def _stored(folder, n=1):
    """A cache folder holding `n` small results; closed, so cache.db is checkpointed."""
    c = Cache(folder)
    for i in range(n):
        c.put(Result("demo", {}, arrays={"K": np.full((4, 4), float(i))}), _Cfg(width=i))
    c.close()
    return folder / "cache.db"


def _tamper(db, key, **columns):
    con = sqlite3.connect(db)
    sets = ", ".join(f"{k} = ?" for k in columns)
    assert con.execute(f"UPDATE Cache SET {sets} WHERE key = ?", (*columns.values(), key)).rowcount == 1
    con.commit()
    con.close()


def _rows(db, key):
    con = sqlite3.connect(db)
    n = con.execute("SELECT COUNT(*) FROM Cache WHERE key = ?", (key,)).fetchone()[0]
    con.close()
    return n


def _one_line(exc_info, folder):
    text = str(exc_info.value)
    assert "\n" not in text and str(folder) in text and exc_info.value.exit_code == 2


class _Touch:  # unpickling this creates `path`
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("where", ["inline", "value file"])
def test_cache_pickled_row_is_dropped_not_unpickled(tmp_path, where):
    folder, marker = tmp_path / "c", tmp_path / "pwned"
    db, key = _stored(folder), config_key("demo", _Cfg(width=0))
    payload = pickle.dumps(_Touch(marker))
    if where == "inline":
        _tamper(db, key, mode=MODE_PICKLE, value=payload, filename=None)
    else:
        (folder / "ab" / "cd").mkdir(parents=True)
        name = "ab/cd/" + "e" * 28 + ".val"
        (folder / name).write_bytes(payload)
        _tamper(db, key, mode=MODE_PICKLE, value=None, filename=name)
    c, reports = Cache(folder), []
    assert c.get("demo", _Cfg(width=0), on_corrupt=reports.append) is None
    assert not marker.exists() and _rows(db, key) == 0
    assert len(reports) == 1 and "pickle" in reports[0] and "\n" not in reports[0]
    c.close()


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "symlink", "cache.db"])
def test_cache_row_naming_another_file_leaves_that_file(tmp_path, how):
    folder, outside = tmp_path / "c", tmp_path / "precious.txt"
    outside.write_bytes(b"keep me")
    db, key = _stored(folder, n=2), config_key("demo", _Cfg(width=0))
    name = {"absolute": str(outside), "dot-dot": "../precious.txt", "cache.db": "cache.db",
            "symlink": "ab/cd/" + "f" * 28 + ".val"}[how]
    if how == "symlink":
        (folder / "ab" / "cd").mkdir(parents=True)
        (folder / name).symlink_to(outside)
    _tamper(db, key, mode=MODE_BINARY, value=None, filename=name)
    c, reports = Cache(folder), []
    assert c.get("demo", _Cfg(width=0), on_corrupt=reports.append) is None
    assert len(reports) == 1 and "not a value file" in reports[0] and _rows(db, key) == 0
    _tamper(db, config_key("demo", _Cfg(width=1)), mode=MODE_BINARY, value=None, filename=name)
    c.clear()  # deleting rows in bulk goes through the same guard
    assert outside.read_bytes() == b"keep me" and db.stat().st_size > 0
    c.put(Result("demo", {}, meta={"ok": 1}), _Cfg())
    assert c.get("demo", _Cfg()).meta == {"ok": 1}
    c.close()


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_cache_damaged_database_is_moved_aside(tmp_path, damage):
    folder = tmp_path / "c"
    db = _stored(folder, n=40)
    body = db.read_bytes()
    db.write_bytes({"truncated": body[: len(body) // 2], "empty": b"",
                    "garbage": os.urandom(8192)}[damage])
    broken = db.read_bytes()
    with pytest.warns(CacheWarning, match=r"cache\.db\.corrupt-") as seen:
        c = Cache(folder)
    (warning,) = [w for w in seen if issubclass(w.category, CacheWarning)]
    (aside,) = folder.glob("cache.db.corrupt-*")
    assert str(aside) in str(warning.message) and "\n" not in str(warning.message)
    assert aside.read_bytes() == broken
    assert c.get("demo", _Cfg(width=0)) is None  # a fresh cache
    c.put(Result("demo", {}, meta={"ok": 1}), _Cfg())
    assert c.get("demo", _Cfg()).meta == {"ok": 1}
    c.close()


def test_cache_existing_folder_keeps_its_mode(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    os.chmod(folder, 0o755)
    Cache(folder).close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    Cache(tmp_path / "new" / "c").close()
    assert stat.S_IMODE((tmp_path / "new" / "c").stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o757, 0o1777])
def test_cache_folder_others_may_write_is_refused(tmp_path, mode):
    folder = tmp_path / "c"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(CacheError, match="writable by group or others") as exc:
        Cache(folder)
    _one_line(exc, folder)
    assert stat.S_IMODE(folder.stat().st_mode) == mode and not (folder / "cache.db").exists()


def test_cache_folder_that_is_a_file_is_refused(tmp_path):
    folder = tmp_path / "c"
    folder.write_text("not a folder")
    with pytest.raises(CacheError, match="is not a folder") as exc:
        Cache(folder)
    _one_line(exc, folder)
    assert folder.read_text() == "not a folder"


def test_cache_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CacheError, match="cannot be created") as exc:
        Cache(tmp_path / "f" / "c")
    _one_line(exc, tmp_path / "f" / "c")


def test_cache_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    os.chmod(folder, 0o500)  # refused by its mode bits, even for root
    with pytest.raises(CacheError, match="not writable") as exc:
        Cache(folder)
    _one_line(exc, folder)


def test_cache_database_that_is_a_folder_is_refused(tmp_path):
    folder = tmp_path / "c"
    (folder / "cache.db").mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)
    with pytest.raises(CacheError, match="cannot be read") as exc:
        Cache(folder)
    _one_line(exc, folder)


@pytest.mark.skipif(ROOT, reason="root reads a mode-000 file anyway")
def test_cache_database_without_read_permission_is_refused(tmp_path):
    db = _stored(tmp_path / "c")
    os.chmod(db, 0)
    with pytest.raises(CacheError, match="cannot be read") as exc:
        Cache(tmp_path / "c")
    _one_line(exc, tmp_path / "c")
