import io
import json
import math
import os
import stat
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

import engine.runtime.cache as cache_mod
from engine.data import DataSpec, data_fingerprint
from engine.runtime.cache import (
    ENGINE_VERSION,
    Cache,
    Result,
    cached_run,
    code_fingerprint,
    config_key,
    tree_fingerprint,
)
from engine.runtime.errors import CacheCorrupt

SYNTH = DataSpec(dataset="synthetic", n=8, n_test=4)


@dataclass(frozen=True)
class _Cfg:  # a config shaped like the engine's: a DataSpec plus settings
    data: DataSpec = SYNTH
    widths: tuple[int, ...] = (16, 64)


@dataclass(frozen=True)
class _Pair:  # DataSpecs nested one and two levels deep
    first: _Cfg = field(default_factory=_Cfg)
    others: tuple = ()


def _result():
    return Result("demo", {}, {"rows": pd.DataFrame({"a": [1, 2], "b": [0.1, np.pi], "c": ["x", None]})},
                  {"K": np.arange(12.0).reshape(3, 4), "idx": np.array([3, 1], dtype=np.int64)},
                  {"note": "hi", "values": [1.5, 2]})


def test_round_trip_is_exact(cache):
    cfg = _Cfg(widths=(4, 8))
    cache.put(_result(), cfg)
    back = cache.get("demo", cfg)
    assert back.cached
    np.testing.assert_array_equal(back.arrays["K"], np.arange(12.0).reshape(3, 4))
    assert back.arrays["idx"].dtype == np.int64
    pd.testing.assert_frame_equal(back.frames["rows"], _result().frames["rows"], check_exact=True)
    assert back.meta == {"note": "hi", "values": [1.5, 2]}


def test_awkward_values_round_trip_bit_for_bit():
    floats = [1 / 3, 0.1 + 0.2, 1e-300, float("nan"), -0.0, 5e-324, float("inf")]
    df = pd.DataFrame({
        "f": floats,
        "f32": np.array(floats, dtype=np.float32),
        "i": np.array([0, -1, 2**62, 3, 4, 5, -(2**63)], dtype=np.int64),
        "s": ["x", None, "ü", "", "1.0", "y", "z"],                      # pandas' string dtype
        "o": np.array(["a", None, 1 / 3, True, 7, float("nan"), "b"], dtype=object),
        "b": [True, False, True, True, False, False, True],
        "t": pd.date_range("2024-01-01", periods=7, freq="37s"),
    }, index=pd.Index([10, 11, 12, 13, 14, 15, 16], name="row"))
    meta = {"third": 1 / 3, "sum": 0.1 + 0.2, "tiny": 1e-300, "nan": float("nan"), "n": 3,
            "np": np.float64(2) / 3, "nested": {"v": [0.1, None, True]}}
    back = Result.from_bytes(Result("demo", {}, {"df": df, "empty": df.iloc[:0]}, {}, meta).to_bytes())
    pd.testing.assert_frame_equal(back.frames["df"], df, check_exact=True)
    pd.testing.assert_frame_equal(back.frames["empty"], df.iloc[:0], check_exact=True)
    assert back.frames["df"]["f"].to_numpy().view(np.int64).tolist() == \
        np.array(floats).view(np.int64).tolist()  # NaN payload and -0.0 too
    assert back.frames["df"]["o"].iloc[1] is None and math.isnan(back.frames["df"]["o"].iloc[5])
    assert back.meta["third"] == 1 / 3 and back.meta["sum"] == 0.1 + 0.2 and back.meta["tiny"] == 1e-300
    assert math.isnan(back.meta["nan"]) and back.meta["np"] == 2 / 3 and back.meta["nested"] == meta["nested"]


def test_cached_run_equals_fresh_run_exactly(cache):
    def compute():
        rng = np.random.default_rng(0)
        return Result("demo", {}, {"rows": pd.DataFrame({"x": rng.standard_normal(50) / 3})},
                      {"K": rng.standard_normal((5, 5))}, {"loss": float(rng.standard_normal() / 7)})

    fresh = cached_run("demo", _Cfg(), compute, cache)
    again = cached_run("demo", _Cfg(), compute, cache)
    assert again.cached
    pd.testing.assert_frame_equal(again.frames["rows"], fresh.frames["rows"], check_exact=True)
    assert again.arrays["K"].tobytes() == fresh.arrays["K"].tobytes() and again.meta == fresh.meta


def test_key_depends_on_every_field_and_is_stable():
    a, b = _Cfg(), _Cfg(data=DataSpec(dataset="synthetic", n=8, n_test=4, seed=1))
    assert config_key("k", a) == config_key("k", _Cfg())
    assert config_key("k", a) != config_key("k", b) != config_key("j", b)
    assert config_key("k", a) != config_key("k", _Cfg(widths=(16,)))


def test_tree_fingerprint_covers_paths_and_bytes(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    base = tree_fingerprint(tmp_path / "pkg")
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    assert tree_fingerprint(tmp_path / "pkg") == base
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    edited = tree_fingerprint(tmp_path / "pkg")
    (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "c.py")
    assert len({base, edited, tree_fingerprint(tmp_path / "pkg")}) == 3
    # a skipped top-level folder (the engine's presentation layer) does not count, a nested one of that name does
    (tmp_path / "pkg" / "reporting").mkdir()
    (tmp_path / "pkg" / "reporting" / "words.py").write_text("RULE = 'holds'\n")
    kept = tree_fingerprint(tmp_path / "pkg", ("reporting",))
    (tmp_path / "pkg" / "reporting" / "words.py").write_text("RULE = 'fails'\n")
    assert tree_fingerprint(tmp_path / "pkg", ("reporting",)) == kept
    assert tree_fingerprint(tmp_path / "pkg") != kept
    (tmp_path / "pkg" / "sub" / "reporting").mkdir()
    (tmp_path / "pkg" / "sub" / "reporting" / "d.py").write_text("z = 3\n")
    assert tree_fingerprint(tmp_path / "pkg", ("reporting",)) != kept
    assert code_fingerprint() == tree_fingerprint(cache_mod.ENGINE_DIR, cache_mod.PRESENTATION)


def test_key_follows_the_code_fingerprint(monkeypatch):
    before = config_key("k", _Cfg())
    monkeypatch.setattr(cache_mod, "code_fingerprint", lambda: "0" * 64)
    assert config_key("k", _Cfg()) != before


def test_key_and_provenance_follow_the_data_bytes(tmp_path, cache):
    path = tmp_path / "d.npz"
    np.savez(path, X=np.zeros((6, 3)), y=np.arange(6) % 2)
    cfg = _Pair(_Cfg(DataSpec(dataset=str(path), n=4, n_test=2)), (_Cfg(),))
    first = cached_run("demo", cfg, _result, cache)
    assert first.provenance == {"code": code_fingerprint(), "engine": ENGINE_VERSION,
                                "data": {"first.data": data_fingerprint(cfg.first.data),
                                         "others[0].data": data_fingerprint(SYNTH)}}
    assert cache.get("demo", cfg).provenance == first.provenance
    key = config_key("demo", cfg)
    np.savez(path, X=np.ones((6, 3)), y=np.arange(6) % 2)
    os.utime(path, ns=(1, 1))  # a new mtime, whatever the clock's resolution
    assert config_key("demo", cfg) != key and ("demo", cfg) not in cache
    assert not cached_run("demo", cfg, _result, cache).cached


def test_second_call_does_not_recompute(cache):
    calls = []

    def compute():
        calls.append(1)
        return _result()

    first = cached_run("demo", _Cfg(), compute, cache)
    second = cached_run("demo", _Cfg(), compute, cache)
    assert len(calls) == 1 and not first.cached and second.cached
    assert second.config["widths"] == [16, 64] and second.config["data"]["dataset"] == "synthetic"
    assert second.provenance["code"] == code_fingerprint() and second.provenance["engine"] == ENGINE_VERSION


def test_no_cache_still_records_provenance():
    res = cached_run("demo", _Cfg(), _result, None)
    assert not res.cached and res.provenance["data"] == {"data": data_fingerprint(SYNTH)}


@pytest.mark.parametrize("blob", [b"garbage", b"PK\x03\x04broken", 12345, "text"])
def test_corrupt_entry_is_reported_dropped_and_recomputed(cache, blob):
    cfg = _Cfg()
    cache.set_raw("demo", cfg, blob)
    reports = []
    res = cached_run("demo", cfg, _result, cache, on_corrupt=reports.append)
    assert not res.cached and len(reports) == 1 and "corrupt cache entry" in reports[0]
    assert "\n" not in reports[0]
    assert cache.get("demo", cfg).cached


def test_corrupt_entry_warns_without_callback(cache):
    cache.set_raw("demo", _Cfg(), b"garbage")
    with pytest.warns(cache_mod.CacheWarning, match="dropped corrupt cache entry"):
        assert cache.get("demo", _Cfg()) is None
    assert ("demo", _Cfg()) not in cache


def test_pickled_arrays_are_refused():
    buf = io.BytesIO()
    np.savez(buf, __head__=np.frombuffer(json.dumps({}).encode(), dtype=np.uint8),
             a_x=np.array([object()], dtype=object))
    with pytest.raises(CacheCorrupt):
        Result.from_bytes(buf.getvalue())
    with pytest.raises(TypeError, match="object dtype"):
        Result("demo", {}, arrays={"x": np.array([object()], dtype=object)}).to_bytes()


def test_large_entries_live_in_value_files(cache):
    big = Result("demo", {}, arrays={"K": np.random.default_rng(0).standard_normal((100, 100))})
    cache.put(big, _Cfg())
    assert list(cache.directory.rglob("*.val"))  # above diskcache's 32 KiB inline limit
    np.testing.assert_array_equal(cache.get("demo", _Cfg()).arrays["K"], big.arrays["K"])


def test_cache_folder_is_private(tmp_path):
    c = Cache(tmp_path / "c")
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    c.close()
