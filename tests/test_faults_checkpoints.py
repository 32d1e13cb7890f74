"""Fault injection on checkpoints (issue 34): every damaged, foreign or hand-made unit is
dropped with one warning line and recomputed, never a traceback and never the cached result;
unit keys are exact; ``report --run`` exits 130 on a real SIGINT and 4 on a failed cell; a
full disk (a real tmpfs) while a checkpoint is written is one line, exit 2, no partial file."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from engine.experiments.runs import resumable, shape, unit_name
from engine.runtime.cache import CHECKPOINT_PREFIX, Cache, Checkpoints, Result, _key, cached_run, provenance_of
from engine.runtime.errors import BadInput, CacheError, CacheWarning
from test_grid import FAST, TINY, write

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"what": "checkpoint faults"}   # any JSON-able config keys a cached run
UNIT = {"seed": 0, "kappa": 4.0}


class Stop(Exception):
    """Interrupts the first run once its unit is checkpointed."""


def fresh() -> dict:
    return {"rows": [{"seed": 0, "flip_rate": 0.25}], "gap": 0.5, "K": np.arange(4.0).reshape(2, 2)}


CHECK = shape(rows=list, gap=float, K=np.ndarray)


def _run(cache: Cache, calls: list, interrupt: bool = False) -> dict:
    """The unit's value as a cached run of CONFIG sees it; ``calls`` counts its computations."""
    seen = []

    def compute():
        seen.append(resumable(UNIT, lambda: (calls.append(1), fresh())[1], CHECK))
        if interrupt:
            raise Stop
        return Result("faults", {})

    cached_run("faults", CONFIG, compute, cache)
    return seen[0]


def _whole(cache: Cache, unit) -> dict:
    seen = []
    cached_run("faults", CONFIG, lambda: (seen.append(unit()), Result("faults", {}))[1], cache)
    return seen[0]


def _row(cache: Cache) -> str:
    run = _key("faults", CONFIG, provenance_of(CONFIG))
    return f"{CHECKPOINT_PREFIX}{run}:{unit_name(UNIT)}"


def _stored(cache: Cache) -> dict:
    return json.loads(bytes(cache._store.get(_row(cache))))


@pytest.fixture()
def kept(tmp_path) -> Cache:
    """A cache holding one checkpointed unit of an interrupted run."""
    cache, calls = Cache(tmp_path / "cache"), []
    with pytest.raises(Stop):
        _run(cache, calls, interrupt=True)
    assert calls == [1] and _stored(cache)["value"]["gap"] == 0.5
    return cache


def _npy(shape_text: str) -> str:
    header = ("{'descr': '<f8', 'fortran_order': False, 'shape': %s, }" % shape_text).ljust(117) + "\n"
    return base64.b64encode(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()).decode()


def _envelope(cache: Cache, value) -> dict:
    from engine.experiments.runs import _sha

    return {**_stored(cache), "value": value, "sha": _sha(value)}


def _deep(n: int) -> str:
    return "[" * n + "]" * n


DAMAGE = {  # name -> a function of the cache giving the row's new bytes (or None: done in place)
    "empty dict": lambda c: b"{}",
    "empty list": lambda c: b"[]",
    "a string": lambda c: b'"x"',
    "rows a number": lambda c: b'{"rows": 5}',
    "bad json": lambda c: b'{"unit": ',
    "nested 5000 deep": lambda c: _deep(5000).encode(),
    "rows a number, sealed": lambda c: json.dumps(_envelope(c, {"rows": 5, "gap": 0.5, "K": None})).encode(),
    "a changed number": lambda c: json.dumps({**_stored(c), "value": {**_stored(c)["value"], "gap": 0.75}}).encode(),
    "a NaN, sealed": lambda c: json.dumps(_envelope(c, {**_stored(c)["value"], "gap": math.nan})).encode(),
    "a 3x3 array for a float, sealed": lambda c: json.dumps(_envelope(c, {
        **_stored(c)["value"], "gap": _stored(c)["value"]["K"]})).encode(),
    "another unit's": lambda c: json.dumps({**_stored(c), "unit": unit_name({"seed": 1, "kappa": 4.0})}).encode(),
    "another run's": lambda c: json.dumps({**_stored(c), "run": "0" * 64}).encode(),
    "npy declaring 1e13 values": lambda c: json.dumps(_envelope(c, {
        **_stored(c)["value"], "K": {"__array__": "ndarray", "npy": _npy("(10000000000000,)")}})).encode(),
    "empty base64": lambda c: json.dumps(_envelope(c, {
        **_stored(c)["value"], "K": {"__array__": "ndarray", "npy": ""}})).encode(),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_or_foreign_unit_is_dropped_with_one_line_and_recomputed(kept, damage):
    before = _stored(kept)
    kept._store.set(_row(kept), DAMAGE[damage](kept))
    calls = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run(kept, calls)
    lines = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(lines) == 1 and "dropped damaged checkpoint" in lines[0] and "\n" not in lines[0], lines
    assert calls == [1]  # recomputed, not taken
    assert result["gap"] == 0.5 and result["rows"] == before["value"]["rows"]
    np.testing.assert_array_equal(result["K"], np.arange(4.0).reshape(2, 2))


@pytest.mark.parametrize("how", ["pickle", "outside file"])
def test_a_pickled_row_or_one_naming_a_file_outside_is_dropped_not_read(kept, tmp_path, how):
    row = _row(kept)
    if how == "pickle":
        kept._store.set(row, {"rows": 5})  # diskcache pickles what is not bytes
    else:
        outside = tmp_path / "secret"
        outside.write_bytes(b'{"unit": "x"}')
        kept.close()
        con = sqlite3.connect(tmp_path / "cache" / "cache.db")
        con.execute("UPDATE Cache SET mode = 2, filename = ?, value = NULL WHERE key = ?", (str(outside), row))
        con.commit()
        con.close()
        kept = Cache(tmp_path / "cache")
    calls = []
    with pytest.warns(CacheWarning, match="dropped damaged checkpoint"):
        result = _run(kept, calls)
    assert calls == [1] and result["gap"] == 0.5
    if how == "outside file":
        assert (tmp_path / "secret").read_bytes() == b'{"unit": "x"}'  # never deleted


@pytest.mark.parametrize("index", [b"{}", b'{"a": 1}', b"[1, 2]", b"not json", _deep(5000).encode()])
def test_a_damaged_index_row_is_dropped_and_the_finished_unit_kept(kept, index):
    index_row = CHECKPOINT_PREFIX + _key("faults", CONFIG, provenance_of(CONFIG))
    kept._store.set(index_row, index)
    calls = []
    with pytest.warns(CacheWarning, match="checkpoint index"):
        result = _run(kept, calls)
    assert calls == [] and result["gap"] == 0.5  # the unit itself was sound: nothing finished is lost
    assert not [k for k in kept._store.iterkeys() if str(k).startswith(CHECKPOINT_PREFIX)]  # all cleared


def test_a_fresh_nan_is_one_line_and_never_cached(tmp_path):
    cache = Cache(tmp_path / "cache")

    with pytest.raises(BadInput, match="non-finite value nan in gap") as info:
        _whole(cache, lambda: resumable(UNIT, lambda: {**fresh(), "gap": math.nan}, CHECK))
    assert "\n" not in str(info.value)
    assert not list(cache._store.iterkeys())
    # a field the unit declares may be NaN (a null not computed) is kept as NaN
    ok = _whole(cache, lambda: resumable(UNIT, lambda: {**fresh(), "gap": math.nan}, CHECK, nan_ok=("gap",)))
    assert math.isnan(ok["gap"])


def test_a_fresh_value_of_the_wrong_shape_is_one_line(tmp_path):
    with pytest.raises(BadInput, match="expected"):
        _whole(Cache(tmp_path / "c"), lambda: resumable(UNIT, lambda: {"rows": 5}, CHECK))


def test_unit_keys_are_exact():
    """κ 4 and 4.000001 (and 1000000 and 1000001) once shared a name through ``:g``."""
    assert f"{4.0:g}" == f"{4.000001:g}" and f"{1000000.0:g}" == f"{1000001.0:g}"
    assert unit_name({"kappa": 4.0}) != unit_name({"kappa": 4.000001})
    assert unit_name({"kappa": 1e6}) != unit_name({"kappa": 1000001.0})
    assert json.loads(unit_name({"kappa": 4.000001}))["kappa"] == 4.000001


def test_scaling_gives_each_kappa_its_own_distances(tmp_path):
    """Two κ that ``:g`` formats alike: each gets its own units and curve, not the other's."""
    from engine.experiments.configs.scaling import ScalingConfig
    from engine.experiments.registry import EXPERIMENTS
    from engine.maths.training import TrainSpec

    cfg = ScalingConfig(n=16, d=8, kappas=(4.0, 4.000001), min_width=16, max_width=32, per_octave=1, seeds=(0,),
                        archs=("relu",), train=TrainSpec(epochs=1), measure="init")
    ev = EXPERIMENTS["scaling"].run(cfg, cache=Cache(tmp_path / "cache")).frames["evaluations"]
    one = EXPERIMENTS["scaling"].run(dataclasses.replace(cfg, kappas=(4.000001,))).frames["evaluations"]
    a, b = (ev[ev.kappa == k].distance.to_numpy() for k in (4.0, 4.000001))
    assert len(a) == len(b) == 2 and not np.array_equal(a, b)
    np.testing.assert_array_equal(b, one.distance.to_numpy())  # κ 4.000001 alone, no cache: the same curve


# ---------------------------------------------------------------- report --run, real processes

def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE_DATA_DIR", "ENGINE_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(ROOT / ".pytest_cache" / "xdg")
    return env


@pytest.mark.slow
def test_report_run_exits_4_naming_the_failed_cell(tmp_path):
    spec = write(tmp_path, "mixed.toml", FAST.replace('"train.optimizer" = ["adam", "sgd"]\narchs = ["relu", "attn"]',
                                                      'archs = ["relu"]\n"data.dataset" = ["synthetic", "cifar10"]'))
    p = subprocess.run([sys.executable, "-m", "engine", "report", str(spec), "--run", "--quiet", "--data-dir",
                        str(tmp_path / "empty"), "--cache-dir", str(tmp_path / "cache")], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr
    assert "failed: cell 1 ntk-sweep archs=relu data.dataset=cifar10: data missing" in p.stderr, p.stderr


@pytest.mark.slow
def test_report_run_ctrl_c_is_one_line_and_exit_130(tmp_path):
    # minutes of work, so that the Ctrl-C always lands inside it, whatever the machine's speed and load
    spec = write(tmp_path, "slow.toml", TINY.format(n=100, epochs=20_000))
    # Ctrl-C as a user's shell delivers it: the child starts with SIGINT's default action even where this
    # test process ignores it (an ignored SIGINT is inherited, and Python then installs no handler)
    p = subprocess.Popen([sys.executable, "-m", "engine", "report", str(spec), "--run", "--cache-dir",
                          str(tmp_path / "cache")], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "cache").glob("cache.db")):
        time.sleep(0.2)
    time.sleep(3)  # inside run_grid by now
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("error: interrupted"), err


# ---------------------------------------------------------------- a full disk

@pytest.fixture()
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("tmpfs cannot be mounted here")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line_and_leaves_no_partial_file(tmpfs):
    cache = Cache(tmpfs / "cache")
    kept = Checkpoints(cache, "0" * 64)
    kept.put("small", {"x": 1})                         # the database and the index exist
    free = os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize
    (tmpfs / "filler").write_bytes(b"\0" * (free - 16 * 1024))  # 16 KiB left
    with pytest.raises(CacheError) as info:
        kept.put("big", {"x": "y" * (64 * 1024)})       # a value file of 64 KiB
    line = str(info.value)
    assert "\n" not in line and "full disk" in line and "move it aside" not in line and info.value.exit_code == 2
    assert not list((tmpfs / "cache").rglob("*.val")), "a partial value file was left"
    (tmpfs / "filler").unlink()
    assert kept.get("small") == {"x": 1}                 # what was finished is still there


def test_checkpoints_of_older_code_are_deleted_when_the_code_moves_on(kept, monkeypatch):
    """Rows are tagged with the code that wrote them; a cache opened by other code deletes them
    (its runs' keys hold its own fingerprint: they would never be read), and rows from before
    the tags (older code) go too. The same code reopening its cache keeps them."""
    import engine.runtime.cache as C

    rows = lambda c: sorted(str(k) for k in c._store.iterkeys() if str(k).startswith(CHECKPOINT_PREFIX))  # noqa: E731
    folder, before = kept.directory, rows(kept)
    assert len(before) == 2  # the run's unit and its list of units
    kept.close()
    again = Cache(folder)
    assert rows(again) == before  # same code: kept, and resumed from
    again._store.set(f"{CHECKPOINT_PREFIX}{'e' * 64}", b'["old"]')  # untagged: written before rows carried a tag
    again.close()
    assert rows(Cache(folder)) == before
    monkeypatch.setattr(C, "code_fingerprint", lambda: "f" * 64)  # an edit under engine/
    assert rows(Cache(folder)) == []
