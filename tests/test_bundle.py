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
