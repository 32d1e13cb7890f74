import io
import stat

import numpy as np
import pandas as pd
import pytest

from engine.cache import Cache, Result, cached_run, config_key
from engine.data import DataSpec
from engine.errors import CacheCorrupt
from engine.experiments import SweepConfig


def _result():
    return Result("demo", {}, {"rows": pd.DataFrame({"a": [1, 2], "b": [0.1, np.pi], "c": ["x", None]})},
                  {"K": np.arange(12.0).reshape(3, 4), "idx": np.array([3, 1], dtype=np.int64)},
                  {"note": "hi", "values": [1.5, 2]})


def test_round_trip_is_exact(cache):
    cfg = SweepConfig(widths=(4, 8))
    cache.put(_result(), cfg)
    back = cache.get("demo", cfg)
    assert back.cached
    np.testing.assert_array_equal(back.arrays["K"], np.arange(12.0).reshape(3, 4))
    assert back.arrays["idx"].dtype == np.int64
    pd.testing.assert_frame_equal(back.frames["rows"], _result().frames["rows"])
    assert back.meta == {"note": "hi", "values": [1.5, 2]}


def test_key_depends_on_every_field_and_is_stable():
    a, b = SweepConfig(), SweepConfig(data=DataSpec(seed=1))
    assert config_key("k", a) == config_key("k", SweepConfig())
    assert config_key("k", a) != config_key("k", b) != config_key("j", b)


def test_second_call_does_not_recompute(cache):
    calls = []

    def compute():
        calls.append(1)
        return _result()

    first = cached_run("demo", SweepConfig(), compute, cache)
    second = cached_run("demo", SweepConfig(), compute, cache)
    assert len(calls) == 1 and not first.cached and second.cached
    assert second.config["widths"] == [16, 64, 256, 1024, 4096]


@pytest.mark.parametrize("blob", [b"garbage", b"PK\x03\x04broken", 12345])
def test_corrupt_entry_is_reported_dropped_and_recomputed(cache, blob):
    cfg = SweepConfig()
    cache.set_raw("demo", cfg, blob)
    reports = []
    res = cached_run("demo", cfg, _result, cache, on_corrupt=reports.append)
    assert not res.cached and len(reports) == 1 and "corrupt cache entry" in reports[0]
    assert cache.get("demo", cfg).cached


def test_pickled_arrays_are_refused():
    buf = io.BytesIO()
    np.savez(buf, __head__=np.frombuffer(b"{}", dtype=np.uint8), a_x=np.array([object()], dtype=object))
    with pytest.raises(CacheCorrupt):
        Result.from_bytes(buf.getvalue())


def test_cache_folder_is_private(tmp_path):
    c = Cache(tmp_path / "c")
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    c.close()
