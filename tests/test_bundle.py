"""The shipped bundle of default results (engine.runtime.bundle, ui.bundle): served only to the run
that made it, copied into the cache, refused whole when made by other code, and every damaged part
reported in one line and computed instead."""

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.data import DataSpec
from engine.runtime import bundle
from engine.runtime.cache import Cache, Result, cached_run, code_fingerprint, config_key
from engine.runtime.errors import CacheWarning
from ui.bundle import copy_out

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class _Cfg:
    data: DataSpec = DataSpec(dataset="synthetic", n=8, n_test=4)
    width: int = 16


def _made(calls: list) -> "callable":
    def compute() -> Result:
        calls.append(1)
        return Result("demo", {}, {"rows": pd.DataFrame({"x": [0.1, np.pi], "s": ["a", "b"]})},
                      {"K": np.random.default_rng(len(calls)).normal(size=(3, 3))}, {"n": 8})
    return compute


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A bundle made from a cache holding one computed result, served from ENGINE_BUNDLE_DIR."""
    first = Cache(tmp_path / "made")
    original = cached_run("demo", _Cfg(), _made([]), first)
    first.close()
    copy_out(tmp_path / "made", tmp_path / "bundle")
    monkeypatch.setenv("ENGINE_BUNDLE_DIR", str(tmp_path / "bundle"))
    return tmp_path / "bundle", original


def test_a_run_is_served_from_the_bundle_bit_for_bit_and_copied_into_the_cache(shipped, tmp_path):
    where, original = shipped
    index = json.loads((where / "index.json").read_text())
    assert index["code"] == code_fingerprint() and len(index["entries"]) == 1
    fresh, calls = Cache(tmp_path / "fresh"), []
    assert ("demo", _Cfg()) in fresh and ("demo", _Cfg(width=32)) not in fresh
    got = cached_run("demo", _Cfg(), _made(calls), fresh)
    assert calls == [] and got.bundled and got.cached
    np.testing.assert_array_equal(got.arrays["K"], original.arrays["K"])
    pd.testing.assert_frame_equal(got.frames["rows"], original.frames["rows"], check_exact=True)
    assert got.provenance == original.provenance
    again = cached_run("demo", _Cfg(), _made(calls), fresh)  # now from the cache itself
    assert calls == [] and again.cached and not again.bundled
    other = cached_run("demo", _Cfg(width=32), _made(calls), fresh)  # other settings: computed
    assert calls == [1] and not other.bundled
    assert bundle.state().usable and "1 default result(s)" in bundle.state().line


def test_a_bundle_made_by_other_code_is_refused_whole(shipped, tmp_path):
    where, _ = shipped
    index = json.loads((where / "index.json").read_text())
    (where / "index.json").write_text(json.dumps({**index, "code": "0" * 64}))
    st = bundle.state()
    assert not st.usable and "made by other code (000000000000" in st.line and "make bundle" in st.line
    fresh, calls = Cache(tmp_path / "fresh"), []
    assert ("demo", _Cfg()) not in fresh
    assert not cached_run("demo", _Cfg(), _made(calls), fresh).bundled and calls == [1]


@pytest.mark.parametrize("damage", ["truncated", "other kind", "missing file"])
def test_a_damaged_entry_is_reported_in_one_line_and_computed(shipped, tmp_path, damage):
    where, _ = shipped
    key = config_key("demo", _Cfg())
    entry = where / f"{key}.npz"
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:100])
    elif damage == "missing file":
        entry.unlink()
    else:
        index = json.loads((where / "index.json").read_text())
        index["entries"][key]["kind"] = "spectrum"
        (where / "index.json").write_text(json.dumps(index))
    fresh, calls = Cache(tmp_path / "fresh"), []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = cached_run("demo", _Cfg(), _made(calls), fresh)
    assert calls == [1] and not got.bundled
    (message,) = [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]
    assert "\n" not in message and ("ignored" in message) and key[:12] in message


def test_an_unreadable_index_is_ignored_with_one_line(tmp_path, monkeypatch):
    (tmp_path / "index.json").write_text('{"code": "abc", "entries": {"not a key": {}}}')
    monkeypatch.setenv("ENGINE_BUNDLE_DIR", str(tmp_path))
    with pytest.warns(CacheWarning, match="unreadable"):
        st = bundle.state()
    assert not st.usable and st.entries == {}
    monkeypatch.setenv("ENGINE_BUNDLE_DIR", "")
    assert bundle.state().where is None and "no bundle" in bundle.state().line


def test_the_writer_copies_finished_entries_only_and_drops_an_older_bundles_files(tmp_path):
    c = Cache(tmp_path / "c")
    cached_run("demo", _Cfg(), _made([]), c)
    c._store.set("checkpoint:" + "0" * 8, b"partial")  # a checkpoint left by a cancelled run
    c.close()
    out = tmp_path / "b"
    out.mkdir()
    (out / ("f" * 64 + ".npz")).write_bytes(b"old")
    index = copy_out(tmp_path / "c", out)
    assert sorted(p.name for p in out.iterdir()) == sorted([*(f"{k}.npz" for k in index["entries"]), "index.json"])
    assert [e["kind"] for e in index["entries"].values()] == ["demo"]


@pytest.mark.slow
def test_the_shipped_bundle_was_made_by_this_code(monkeypatch):
    """bundle/ is what `make run` and the image serve: after an edit under engine/ it is refused
    (every page computes its defaults again) until `make bundle` remakes it."""
    monkeypatch.delenv("ENGINE_BUNDLE_DIR")
    st = bundle.state()
    assert st.where == ROOT / "bundle", "no bundle/index.json: run `make bundle`"
    assert st.usable, st.line
    sizes = [p.stat().st_size for p in (ROOT / "bundle").glob("*.npz")]
    assert len(sizes) == len(st.entries) and sum(sizes) < 32 * 2**20  # small enough to ship in git


# ---------------------------------------------------------------- an entry served only to its own run

@pytest.fixture
def two(tmp_path, monkeypatch):
    """A bundle of two results (widths 16 and 32), served from ENGINE_BUNDLE_DIR."""
    made = Cache(tmp_path / "made")
    for cfg in (_Cfg(), _Cfg(width=32)):
        cached_run("demo", cfg, _made([]), made)
    made.close()
    copy_out(tmp_path / "made", tmp_path / "bundle")
    monkeypatch.setenv("ENGINE_BUNDLE_DIR", str(tmp_path / "bundle"))
    return tmp_path / "bundle"


def _lines(seen) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]


def test_an_entry_swapped_for_another_runs_is_refused_and_never_copied(two, tmp_path):
    """Each entry's bytes filed under the other's key: both runs miss (one line each naming the
    key its own config and provenance give) and compute; nothing of the bundle reaches the cache."""
    a, b = (two / f"{config_key('demo', c)}.npz" for c in (_Cfg(), _Cfg(width=32)))
    blob_a, blob_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(blob_b)
    b.write_bytes(blob_a)
    fresh, calls = Cache(tmp_path / "fresh"), []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert fresh.get("demo", _Cfg()) is None and fresh.get("demo", _Cfg(width=32)) is None
        assert list(fresh._store.iterkeys()) == []  # nothing copied
        got = cached_run("demo", _Cfg(), _made(calls), fresh)
    assert calls == [1] and not got.bundled
    lines = _lines(seen)
    assert len(lines) == 3 and all("\n" not in m and "another run's result" in m for m in lines), lines
    assert config_key("demo", _Cfg(width=32))[:12] in lines[0]  # the key the swapped-in bytes were made under
    assert list(fresh._store.iterkeys()) == [config_key("demo", _Cfg())]  # the computed result only
    assert Result.from_bytes(fresh._store.get(config_key("demo", _Cfg()))).config["width"] == 16  # its own


def _within(seconds: float, fn):
    """``fn()`` run in a daemon thread; fails the test (instead of hanging it) past ``seconds``."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s"
    return out[0]


def test_a_fifo_entry_is_answered_at_once_in_one_line(shipped, tmp_path):
    import os

    where, _ = shipped
    entry = where / f"{config_key('demo', _Cfg())}.npz"
    entry.unlink()
    os.mkfifo(entry)
    fresh, calls = Cache(tmp_path / "fresh"), []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = _within(10, lambda: cached_run("demo", _Cfg(), _made(calls), fresh))
    assert calls == [1] and not got.bundled
    (line,) = _lines(seen)
    assert "FIFO" in line and "ignored" in line and "\n" not in line


@pytest.mark.parametrize("index", ["fifo", "nested", "oversized"])
def test_a_fifo_deep_or_oversized_index_is_refused_in_one_line(tmp_path, monkeypatch, index):
    import os

    monkeypatch.setenv("ENGINE_BUNDLE_DIR", str(tmp_path))
    path = tmp_path / "index.json"
    if index == "fifo":
        os.mkfifo(path)
    elif index == "nested":
        path.write_text('{"code": ' + "[" * 100_000 + "]" * 100_000 + ', "entries": {}}')
    else:
        path.write_text('{"code": "' + "0" * (bundle.MAX_INDEX_BYTES + 1) + '", "entries": {}}')
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        st = _within(10, bundle.state)
    assert not st.usable and st.entries == {} and "unreadable" in st.line
    (line,) = _lines(seen)
    assert "\n" not in line and {"fifo": "FIFO", "nested": "RecursionError", "oversized": "limit"}[index] in line


def _bomb(blob: bytes, unpacked: int) -> bytes:
    """``blob`` (an entry) with one more member, ``a_bomb.npy``: a header declaring ``unpacked``
    bytes of float64 and that many zero bytes, deflated to about a thousandth of that."""
    import io
    import zipfile

    import numpy.lib.format as npy

    out = io.BytesIO(blob)
    with zipfile.ZipFile(out, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("a_bomb.npy", "w", force_zip64=True) as f:
            npy.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (unpacked // 8,)})
            chunk = bytes(2**22)
            for _ in range(unpacked // len(chunk)):
                f.write(chunk)
    return out.getvalue()


BOMB = 512 * 2**20  # what the bomb unpacks to: the entry it rides on is a few kB


@pytest.mark.parametrize("where", ["bundle", "cache"])
def test_a_decompression_bomb_is_refused_without_unpacking_it(shipped, tmp_path, where):
    """An entry whose members declare more than its own bytes (entries are stored uncompressed) is
    refused in one line, read as a miss, and the run computes; peak memory stays far below the bomb."""
    import tracemalloc

    spot, _ = shipped
    key = config_key("demo", _Cfg())
    bomb = _bomb((spot / f"{key}.npz").read_bytes(), BOMB)
    assert len(bomb) < 2 * 2**20
    fresh, calls = Cache(tmp_path / "fresh"), []
    if where == "bundle":
        (spot / f"{key}.npz").write_bytes(bomb)
    else:
        fresh._store.set(key, bomb)
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = cached_run("demo", _Cfg(), _made(calls), fresh) if where == "cache" else fresh.get("demo", _Cfg())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    (line,) = _lines(seen)
    assert "a_bomb.npy" in line and "512 MB" in line and "\n" not in line
    if where == "cache":
        assert calls == [1] and not got.bundled
    else:
        assert got is None and list(fresh._store.iterkeys()) == []
