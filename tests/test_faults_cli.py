"""Fault injection on the experiment commands, as a user runs them: each case a subprocess
``python -m engine ...`` under a time limit that must end in exit 2 (bad input) or 3 (data),
one line on stderr, no traceback, and neither the cache nor the data folder touched.

The helpers here (``refused``, ``snapshot``, ``private_cache``) are shared by
``test_faults_grid.py`` and ``test_faults_export.py``.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ATOL64, RTOL64

ROOT = Path(__file__).resolve().parents[1]
TINY = ("--n", "4", "--n-test", "2")  # every case fails before or at its first step


# ---------------------------------------------------------------- shared helpers

def private_cache(folder: Path) -> Path:
    """A cache folder holding one stored result, so that "unchanged" also means "nothing dropped"."""
    from engine.data import DataSpec
    from engine.experiments.configs.spectrum import SpectrumConfig
    from engine.runtime.cache import Cache, Result

    folder.mkdir(mode=0o700, parents=True)
    c = Cache(folder)
    c.put(Result("demo", {}, arrays={"K": np.eye(3)}), SpectrumConfig(data=DataSpec("synthetic", n=8, n_test=4)))
    c.close()
    return folder


def _cache_rows(db: Path) -> list:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT key, raw, size, mode, filename FROM Cache ORDER BY rowid").fetchall()
    finally:
        con.close()


def snapshot(folder: Path) -> str:
    """SHA-256 of a folder's listing: each entry's path, type, size and mtime; of a cache
    folder's database, its rows (opening a cache rewrites its settings, so cache.db's own
    mtime says nothing)."""
    h = hashlib.sha256()
    if not folder.exists():
        return "absent"
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        rel = p.relative_to(folder)
        if p.name.startswith("cache.db"):
            if p.name == "cache.db":
                h.update(repr(_cache_rows(p)).encode())
            continue
        h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def run_engine(*args, cwd=ROOT, timeout: float = 120, env_extra: dict | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE_DATA_DIR", "ENGINE_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(ROOT / ".pytest_cache" / "xdg")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "engine", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def refused(code: int, *args, cache: Path, data: Path | None = None, timeout: float = 120,
            env_extra: dict | None = None) -> str:
    """Run ``python -m engine ARGS --quiet --cache-dir CACHE`` and check it is refused: exit
    ``code``, exactly one ``error:`` line on stderr, no traceback, nothing on stdout, and the
    cache and data folders as they were. ``timeout`` bounds a hang. Returns the line."""
    folders = [cache] + ([data] if data is not None else [])
    before = [snapshot(f) for f in folders]
    p = run_engine(*args, "--quiet", "--cache-dir", cache, timeout=timeout, env_extra=env_extra)
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == code, (p.returncode, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert not p.stdout.strip(), p.stdout
    assert [snapshot(f) for f in folders] == before, "a refused run changed the cache or the data folder"
    return lines[0]


@pytest.fixture()
def cache(tmp_path) -> Path:
    return private_cache(tmp_path / "cache")


@pytest.fixture()
def data(tmp_path) -> Path:
    """A data folder with a tiny .npz whose rows repeat: its kernels are singular."""
    folder = tmp_path / "data"
    folder.mkdir()
    X = np.ones((6, 4))
    X[3:] = 2.0  # after normalisation every row is the same point
    np.savez(folder / "dup.npz", X=X, y=np.arange(6) % 2)
    return folder


# ---------------------------------------------------------------- budgets

def test_max_gib_nan_is_one_line(cache):
    line = refused(2, "spectrum", "--dataset", "synthetic", *TINY, "--max-gib", "nan", cache=cache)
    assert "--max-gib" in line and "nan" in line


@pytest.mark.slow
@pytest.mark.parametrize("command, value", [("spectrum", "inf"), ("ntk-sweep", "1e300"), ("malleability", "0"),
                                            ("dynamics", "-1"), ("scaling", "inf")])
def test_max_gib_out_of_range_is_one_line(cache, command, value):
    data = ("--n", "8") if command == "scaling" else ("--dataset", "synthetic", *TINY)  # scaling draws its own
    line = refused(2, command, *data, "--max-gib", value, cache=cache)
    assert "--max-gib" in line and "1e+06" in line


@pytest.mark.slow
@pytest.mark.parametrize("value", ["nan", "0", "-5"])
def test_max_seconds_that_no_estimate_can_be_compared_with_is_one_line(cache, value):
    line = refused(2, "ntk-sweep", "--dataset", "synthetic", *TINY, "--max-seconds", value, cache=cache)
    assert "--max-seconds" in line


# ---------------------------------------------------------------- data paths

def test_dataset_fifo_is_refused_not_waited_on(cache, tmp_path):
    fifo = tmp_path / "data" / "pipe.npz"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    line = refused(2, "spectrum", "--dataset", fifo, *TINY, cache=cache, data=fifo.parent, timeout=60)
    assert str(fifo) in line and "regular file" in line


@pytest.mark.slow
@pytest.mark.parametrize("how, command", [("long name", "ntk-sweep"), ("long path", "spectrum"),
                                          ("unknown user", "spectrum"), ("folder", "malleability")])
def test_dataset_path_the_file_system_cannot_hold_is_one_line(cache, tmp_path, how, command):
    folder = tmp_path / "data"
    (folder / "dir.npz").mkdir(parents=True)
    path = {"long name": str(folder / ("x" * 300 + ".npz")),
            "long path": str(folder / "/".join(["y" * 200] * 25)) + ".npz",
            "unknown user": "~nosuchuser-engine-test/x.npz",
            "folder": str(folder / "dir.npz")}[how]
    line = refused(2, command, "--dataset", path, *TINY, cache=cache, data=folder)
    assert "dataset" in line


@pytest.mark.slow
def test_missing_npz_is_data_missing(cache, tmp_path):
    line = refused(3, "spectrum", "--dataset", tmp_path / "gone.npz", *TINY, cache=cache)
    assert "gone.npz" in line


@pytest.mark.slow
@pytest.mark.parametrize("how", ["a file", "unknown user", "long name"])
def test_data_dir_that_cannot_be_a_folder_is_one_line(cache, tmp_path, how):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    value = {"a file": afile, "unknown user": "~nosuchuser-engine-test/data",
             "long name": tmp_path / ("d" * 300)}[how]
    line = refused(2, "spectrum", "--dataset", "mnist", *TINY, "--data-dir", value, cache=cache)
    assert "data folder" in line


@pytest.mark.slow
def test_fifo_in_place_of_an_image_file_is_data_corrupt(cache, tmp_path):
    from engine.data.images import IDX

    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    os.mkfifo(raw / IDX[0])
    for name in IDX[1:]:
        (raw / name).write_bytes(b"")
    line = refused(3, "spectrum", "--dataset", "mnist", *TINY, "--data-dir", tmp_path / "data", cache=cache,
                   data=tmp_path / "data", timeout=60)
    assert IDX[0] in line and "regular file" in line


# ---------------------------------------------------------------- singular kernels

SINGULAR = ("--dataset", "{npz}", *TINY, "--ridge", "5e-324", "--seeds", "0")


def _singular(data: Path) -> list[str]:
    return [a.format(npz=data / "dup.npz") for a in SINGULAR]


def test_singular_kernel_in_ntk_sweep_names_the_step_and_the_ridge(cache, data):
    line = refused(2, "ntk-sweep", *_singular(data), "--widths", "16", "--epochs", "1", cache=cache, data=data)
    assert "not positive definite" in line and "4 x 4" in line and "ridge" in line and "larger ridge" in line


@pytest.mark.slow
def test_singular_kernel_in_malleability_names_the_step_and_the_ridge(cache, data):
    line = refused(2, "malleability", *_singular(data), "--widths", "16", "--epochs", "1", cache=cache, data=data)
    assert "not positive definite" in line and "ridge" in line and "larger ridge" in line


# ---------------------------------------------------------------- the same checks, in process

def _duplicates(n: int = 4):
    X = torch.ones(n, 3, dtype=torch.float64)  # every row the same point: K has rank 1
    K = X @ X.T
    return K, K[:2], torch.eye(n, 2, dtype=torch.float64)


@pytest.mark.parametrize("step", ["kernel_regression", "influence_matrix", "whitened_distance"])
def test_each_factorisation_names_itself_n_and_the_ridge(step):
    from engine.maths import influence, ridge
    from engine.runtime.errors import BadInput

    K, K_test, Y = _duplicates()
    call = {"kernel_regression": lambda: ridge.kernel_regression(K, K_test, Y, 5e-324),
            "influence_matrix": lambda: influence.influence_matrix(K, K_test, Y, 5e-324),
            "whitened_distance": lambda: ridge.whitened_distance(K, K, 5e-324)}[step]
    with pytest.raises(BadInput) as info:
        call()
    text = str(info.value)
    assert "not positive definite" in text and "4 x 4" in text and "4.94066e-324" in text and "\n" not in text


@pytest.mark.parametrize("step", ["kernel_regression", "influence_matrix", "whitened_distance"])
def test_each_factorisation_refuses_a_non_finite_kernel(step):
    from engine.maths import influence, ridge
    from engine.runtime.errors import BadInput

    K, K_test, Y = _duplicates()
    K = K + 4 * torch.eye(4, dtype=torch.float64)
    K[1, 2] = K[2, 1] = float("nan")
    call = {"kernel_regression": lambda: ridge.kernel_regression(K, K_test, Y, 1e-3),
            "influence_matrix": lambda: influence.influence_matrix(K, K_test, Y, 1e-3),
            "whitened_distance": lambda: ridge.whitened_distance(K, K.nan_to_num(), 1e-3)}[step]
    with pytest.raises(BadInput, match="NaN or infinite"):
        call()


@pytest.mark.parametrize("ridge", [float("nan"), float("inf"), 0.0, -1.0])
def test_ridges_that_are_no_ridge_are_one_line(ridge):
    from engine.maths import influence, ridge
    from engine.runtime.errors import BadInput

    K, K_test, Y = _duplicates()
    for call in (lambda: ridge.kernel_regression(K, K_test, Y, ridge),
                 lambda: influence.influence_matrix(K, K_test, Y, ridge)):
        with pytest.raises(BadInput, match="finite number > 0"):
            call()


def test_a_good_kernel_still_factors():
    from engine.maths import ridge

    K, K_test, Y = _duplicates()
    eye = torch.eye(4, dtype=torch.float64)
    K = K + eye  # positive definite
    want = K_test @ torch.linalg.solve(K + 1e-3 * K.diagonal().mean() * eye, Y)
    torch.testing.assert_close(ridge.kernel_regression(K, K_test, Y, 1e-3), want, rtol=RTOL64, atol=ATOL64)


def test_a_spectrum_of_non_finite_rows_is_one_line():
    from engine.maths.spectral import gram_spectrum
    from engine.runtime.errors import BadInput

    F = torch.ones(5, 3, dtype=torch.float64)
    F[2, 1] = float("inf")
    with pytest.raises(BadInput, match="NaN or infinite"):
        gram_spectrum(F)


def test_a_fifo_swapped_in_after_the_spec_was_made_is_refused(tmp_path):
    from engine.data import DataSpec, data_fingerprint, file_sha256, load_sample
    from engine.runtime.errors import BadInput, DataCorrupt

    path = tmp_path / "later.npz"
    spec = DataSpec(str(path), n=2, n_test=1)  # absent now: allowed, DataMissing when read
    os.mkfifo(path)
    for call in (lambda: load_sample(spec), lambda: data_fingerprint(spec)):
        with pytest.raises(BadInput, match="named pipe"):
            call()
    with pytest.raises(DataCorrupt, match="not a regular file"):
        file_sha256(path)


def test_a_cache_folder_under_an_unknown_user_is_one_line(tmp_path):
    """``--cache-dir ~nosuchuser/c``: expanded where it is declared, before any work."""
    p = run_engine("spectrum", "--dataset", "synthetic", "--n", "20", "--quiet",
                   "--cache-dir", "~nosuchuser-engine-test/c")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "~nosuchuser-engine-test" in p.stderr
