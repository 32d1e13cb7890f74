"""Tests for engine/data/ on real MNIST / Fashion-MNIST where present, fake CIFAR-10 files
in its own format, synthetic matrices and user .npz files (including hostile ones)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import pickle
import shutil
import zipfile
from pathlib import Path
from urllib.error import URLError

import numpy as np
import numpy.lib.format as npy
import pytest
import torch

from conftest import ATOL32, ATOL64, MNIST_DIR, NO_MNIST, RTOL64, SHARED_DATA
from engine.data import (
    DATASETS,
    DECAYS,
    MAX_ABS_VALUE,
    MAX_NPZ_BYTES,
    DataSpec,
    available_datasets,
    data_fingerprint,
    engine_data_dir,
    fetch_dataset,
    load_sample,
    parse_dataset,
    resolve_data_dir,
    store_npz,
    writable,
)
from engine.runtime.errors import BadInput, DataCorrupt, DataMissing
from engine.runtime.settings import meta, settings

SHARED = MNIST_DIR or SHARED_DATA  # the real digits: $ENGINE_DATA_DIR or ../shared/datasets (conftest)
MNIST_RAW = SHARED / "MNIST" / "raw"
FASHION_GZ = Path("/usr/share/datasets/fashion-mnist")
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
               "ship", "truck"]

needs_mnist = pytest.mark.skipif(MNIST_DIR is None, reason=NO_MNIST)
needs_fashion = pytest.mark.skipif(
    not all((FASHION_GZ / f"{f}.gz").is_file() for f in IDX),
    reason="Debian dataset-fashion-mnist not installed")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    # never touch the real user cache or inherit a data dir from the environment
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ENGINE_DATA_DIR", raising=False)
    monkeypatch.delenv("ENGINE_CACHE_DIR", raising=False)


def _tv_mnist(train: bool):
    import torchvision

    ds = torchvision.datasets.MNIST(str(SHARED), train=train, download=False)
    return ds.data.reshape(len(ds.data), -1).numpy(), ds.targets.numpy()


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- names

@pytest.mark.parametrize("name, expected", [
    ("mnist", ("mnist", None)),
    (" MNIST ", ("mnist", None)),
    ("mnist:3-8", ("mnist", ("3", "8"))),
    ("cifar10:automobile-airplane", ("cifar10", ("automobile", "airplane"))),
    ("fashion-mnist:T-shirt/top-trouser", ("fashion-mnist", ("T-shirt/top", "trouser"))),
    ("synthetic:0-1", ("synthetic", ("0", "1"))),
    ("runs/my data.npz", ("runs/my data.npz", None)),
])
def test_parse_dataset(name, expected):
    assert parse_dataset(name) == expected


@pytest.mark.parametrize("name, needle", [
    ("imagenet", "mnist, fashion-mnist, cifar10, synthetic"),
    ("mnist:3-12", "0-9"),
    ("cifar10:car-airplane", "automobile"),
    ("mnist:3-3", "same class"),
    ("mnist:38", "a-b"),
    ("synthetic:a-b", "indices"),
])
def test_parse_dataset_rejects(name, needle):
    with pytest.raises(BadInput) as e:
        parse_dataset(name)
    assert needle in _one_line(e)


def test_every_dataset_name_is_served(tmp_path):
    # a name added to DATASETS must parse, be listed, and be named wherever names are offered
    listed = [i.name for i in available_datasets(tmp_path / "none")]
    assert sorted(listed) == sorted(DATASETS)
    with pytest.raises(BadInput) as e:
        parse_dataset("imagenet")
    help_text = meta(DataSpec, "dataset").help
    for name in DATASETS:
        assert parse_dataset(f" {name.upper()} ") == (name, None)
        assert name in _one_line(e) and name in help_text
    assert load_sample(DataSpec("synthetic", n=4, n_test=2)).source == "generated"


def test_resolve_data_dir(tmp_path, monkeypatch):
    assert resolve_data_dir(tmp_path / "a") == (tmp_path / "a").resolve()
    monkeypatch.setenv("ENGINE_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir() == (tmp_path / "env").resolve()
    monkeypatch.delenv("ENGINE_DATA_DIR")
    assert resolve_data_dir() == tmp_path / "xdg" / "influence-malleability" / "datasets"
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize("kw, needle", [
    (dict(n=1), "n must be >= 2"), (dict(n=60001), "<= 60000 points"), (dict(n=2.5), "integer"),
    (dict(n=True), "integer"), (dict(n_test=0), "n_test"), (dict(n_test=10001), "<= 10000"),
    (dict(seed=-1), "seed"), (dict(normalize=1), "true or false"),
    (dict(dataset=""), "empty"), (dict(dataset="   "), "empty"), (dict(dataset=None), "dataset"),
    (dict(synthetic_d=4097), "<= 4096"), (dict(synthetic_kappa=1e13), "<= 1e+12"),
    (dict(synthetic_kappa=float("inf")), "finite"), (dict(synthetic_classes=101), "<= 100"),
    (dict(synthetic_decay="cubic"), "geometric, linear, power"),
])
def test_spec_rejects_on_construction(kw, needle):
    with pytest.raises(BadInput) as e:
        DataSpec(**{"dataset": "synthetic", **kw})
    assert needle in _one_line(e)


def test_spec_declares_every_setting_once():
    declared = {f.name: m for f, m in settings(DataSpec)}
    assert set(declared) == {f.name for f in dataclasses.fields(DataSpec)}
    for name, m in declared.items():
        assert m.help and m.help[0].islower(), name
    for name in ("n", "n_test", "seed", "synthetic_d", "synthetic_kappa", "synthetic_classes"):
        assert declared[name].lo is not None and declared[name].hi is not None, name
    assert declared["synthetic_decay"].choices == DECAYS
    assert "ℓ2" in declared["normalize"].help and "row" in declared["normalize"].help
    spec = DataSpec(n=np.int64(10), synthetic_kappa=5)  # numpy ints and int kappa are coerced
    assert type(spec.n) is int and type(spec.synthetic_kappa) is float
    assert spec == DataSpec(n=10, synthetic_kappa=5.0)


# ---------------------------------------------------------------- MNIST (shared subset)

@needs_mnist
def test_mnist_shapes_and_range():
    s = load_sample(DataSpec("mnist", n=120, n_test=60), SHARED)
    assert s.X.shape == (120, 784) and s.X_test.shape == (60, 784)
    assert s.X.dtype == s.X_test.dtype == torch.float64
    assert s.y.dtype == s.y_test.dtype == torch.int64
    assert 0 <= s.X.min() and s.X.max() <= 1 and s.X.max() > 0.9
    assert set(s.y.tolist()) <= set(range(10))
    assert s.class_names == tuple(str(i) for i in range(10))
    assert (s.n, s.d, s.n_classes, s.binary) == (120, 784, 10, False)
    assert s.image_shape == (1, 28, 28) and s.box == (0.0, 1.0)
    assert Path(s.source) == MNIST_RAW
    counts = s.class_counts()
    assert sum(a for a, _ in counts.values()) == 120 and sum(b for _, b in counts.values()) == 60


@needs_mnist
def test_mnist_reproducible_and_seeded():
    a = load_sample(DataSpec("mnist", n=50, n_test=20, seed=3), SHARED)
    b = load_sample(DataSpec("mnist", n=50, n_test=20, seed=3), SHARED)
    c = load_sample(DataSpec("mnist", n=50, n_test=20, seed=4), SHARED)
    for t in ("X", "y", "X_test", "y_test"):
        assert torch.equal(getattr(a, t), getattr(b, t))
    assert not torch.equal(a.X, c.X) and not torch.equal(a.X_test, c.X_test)
    bigger = load_sample(DataSpec("mnist", n=80, n_test=20, seed=3), SHARED)
    assert torch.equal(bigger.X[:50], a.X)  # a larger n extends the draw


@needs_mnist
def test_mnist_pair_matches_torchvision():
    s = load_sample(DataSpec("mnist:3-8", n=300, n_test=150), SHARED)
    assert s.binary and s.class_names == ("3", "8")
    assert set(s.y.tolist()) == {0, 1} and set(s.y_test.tolist()) == {0, 1}
    for X, y, train in ((s.X, s.y, True), (s.X_test, s.y_test, False)):
        images, labels = _tv_mnist(train)
        by_bytes = {}
        for img, lab in zip(images, labels, strict=True):
            by_bytes.setdefault(img.tobytes(), set()).add(int(lab))
        raw = np.rint(X.numpy() * 255).astype(np.uint8)
        for row, lab in zip(raw, y.tolist(), strict=True):
            assert by_bytes[row.tobytes()] == {(3, 8)[lab]}
    train_rows = {r.tobytes() for r in s.X.numpy()}
    assert not any(r.tobytes() in train_rows for r in s.X_test.numpy())
    flipped = load_sample(DataSpec("mnist:8-3", n=300, n_test=150), SHARED)
    assert flipped.class_names == ("8", "3")


@needs_mnist
def test_mnist_n_too_large():
    _, labels = _tv_mnist(True)
    most = int(np.isin(labels, [3, 8]).sum())
    with pytest.raises(BadInput) as e:
        load_sample(DataSpec("mnist:3-8", n=most + 1), SHARED)
    assert f"n={most + 1}" in _one_line(e) and f"maximum is {most}" in str(e.value)
    with pytest.raises(BadInput, match="n_test=9000 .* maximum is 2000"):  # 2,000 test digits
        load_sample(DataSpec("mnist", n=10, n_test=9000), SHARED)


@needs_mnist
def test_unknown_dataset_and_class():
    with pytest.raises(BadInput, match="allowed are"):
        load_sample(DataSpec("emnist"), SHARED)
    with pytest.raises(BadInput, match="0-9"):
        load_sample(DataSpec("mnist:3-x"), SHARED)


def test_missing_files(tmp_path):
    with pytest.raises(DataMissing) as e:
        load_sample(DataSpec("mnist"), tmp_path, allow_download=False)
    msg = _one_line(e)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path / "MNIST" / "raw") in msg
    assert "ENGINE_DATA_DIR" in msg and "--data-dir" in msg
    assert list(tmp_path.iterdir()) == []


def test_failed_download_is_missing(tmp_path, monkeypatch):
    import torchvision

    def offline(self):
        raise URLError("no network here")

    monkeypatch.setattr(torchvision.datasets.MNIST, "download", offline)
    with pytest.raises(DataMissing, match="download failed.*no network"):
        load_sample(DataSpec("mnist"), tmp_path / "d", allow_download=True)


@needs_mnist
@pytest.mark.parametrize("victim, how", [("train-images-idx3-ubyte", "truncate"),
                                         ("train-labels-idx1-ubyte", "magic"),
                                         ("t10k-images-idx3-ubyte", "truncate")])
def test_corrupt_idx(tmp_path, victim, how):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in IDX:
        shutil.copyfile(MNIST_RAW / f, raw / f)
    data = (raw / victim).read_bytes()
    (raw / victim).write_bytes(data[:1000] if how == "truncate" else b"\x00\x00\x99\x07" + data[4:])
    with pytest.raises(DataCorrupt) as e:
        load_sample(DataSpec("mnist", n=10, n_test=10), tmp_path, allow_download=False)
    assert str(raw / victim) in _one_line(e)


@needs_mnist
def test_available_datasets_only_looks(tmp_path):
    before = sorted(p for p in SHARED.rglob("*"))
    info = {i.name: i for i in available_datasets(SHARED)}
    assert info["mnist"].available and Path(info["mnist"].where) == MNIST_RAW
    assert info["synthetic"].available  # (cifar10 may sit beside the digits where ENGINE_DATA_DIR points)
    assert sorted(p for p in SHARED.rglob("*")) == before
    empty = {i.name: i for i in available_datasets(tmp_path / "none")}
    assert not empty["mnist"].available and "train-images-idx3-ubyte" in empty["mnist"].reason
    assert not (tmp_path / "none").exists() and not (tmp_path / "xdg").exists()


# ---------------------------------------------------------------- Fashion-MNIST (Debian copy)

@needs_fashion
def test_fashion_unpacked_into_data_dir(tmp_path):
    import torchvision

    s = load_sample(DataSpec("fashion-mnist", n=40, n_test=20), tmp_path / "data")
    assert s.class_names == tuple(torchvision.datasets.FashionMNIST.classes)
    assert s.X.shape == (40, 784) and 0 <= s.X.min() and s.X.max() <= 1
    assert all((tmp_path / "data" / "FashionMNIST" / "raw" / f).is_file() for f in IDX)
    pair = load_sample(DataSpec("fashion-mnist:T-shirt/top-ankle boot", n=30, n_test=10),
                       tmp_path / "data")
    assert pair.class_names == ("T-shirt/top", "Ankle boot") and pair.binary


@needs_fashion
def test_fashion_read_only_dir_uses_user_cache(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        s = load_sample(DataSpec("fashion-mnist", n=20, n_test=10), ro)
    finally:
        ro.chmod(0o755)
    cache = tmp_path / "xdg" / "influence-malleability" / "datasets"
    assert Path(s.source) == cache / "FashionMNIST" / "raw"
    assert all((cache / "FashionMNIST" / "raw" / f).is_file() for f in IDX)
    assert list(ro.iterdir()) == []


# ---------------------------------------------------------------- CIFAR-10 (fake files)

@pytest.fixture
def fake_cifar(tmp_path, monkeypatch):
    """20 images per batch in CIFAR-10's own pickle format, torchvision's MD5s patched."""
    import torchvision

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches[name] = {"batch_label": name, "labels": rng.permutation(20).tolist(),
                         "data": rng.integers(0, 256, (20, 3072), dtype=np.uint8)}
        batches[name]["labels"] = [v % 10 for v in batches[name]["labels"]]
    files = dict(batches, **{"batches.meta": {"label_names": CIFAR_NAMES,
                                             "num_cases_per_batch": 20, "num_vis": 3072}})
    for name, obj in files.items():
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))

    def patch():  # point torchvision's checksums at the files as they are now
        md5 = {n: hashlib.md5((folder / n).read_bytes()).hexdigest() for n in files}
        C = torchvision.datasets.CIFAR10
        monkeypatch.setattr(C, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]]
                                              for i in range(1, 6)])
        monkeypatch.setattr(C, "test_list", [["test_batch", md5["test_batch"]]])
        monkeypatch.setattr(C, "meta", dict(C.meta, md5=md5["batches.meta"]))

    patch()
    return tmp_path, folder, batches, patch


def test_cifar_fake(fake_cifar):
    root, folder, batches, _ = fake_cifar
    s = load_sample(DataSpec("cifar10", n=60, n_test=15), root, allow_download=False)
    assert s.X.shape == (60, 3072) and s.image_shape == (3, 32, 32)
    assert s.class_names == tuple(CIFAR_NAMES) and Path(s.source) == folder
    # rows keep CIFAR's own C,H,W order and their labels
    known = {}
    for name, b in batches.items():
        for row, lab in zip(b["data"], b["labels"], strict=True):
            known[(name == "test_batch", row.tobytes())] = lab
    for X, y, test in ((s.X, s.y, False), (s.X_test, s.y_test, True)):
        raw = np.rint(X.numpy() * 255).astype(np.uint8)
        assert [known[(test, r.tobytes())] for r in raw] == y.tolist()


def test_cifar_pair_by_name(fake_cifar):
    root, _, batches, _ = fake_cifar
    s = load_sample(DataSpec("cifar10:automobile-airplane", n=10, n_test=2), root)
    assert s.class_names == ("automobile", "airplane")
    labels = {r.tobytes(): lab for b in batches.values() for r, lab in zip(b["data"], b["labels"], strict=True)}
    raw = np.rint(s.X.numpy() * 255).astype(np.uint8)
    assert [labels[r.tobytes()] for r in raw] == [(1, 0)[v] for v in s.y.tolist()]
    with pytest.raises(BadInput, match="maximum is 20"):  # 2 per class per batch
        load_sample(DataSpec("cifar10:automobile-airplane", n=21, n_test=2), root)


def test_cifar_corrupt(fake_cifar):
    root, folder, _, patch = fake_cifar
    data = (folder / "data_batch_3").read_bytes()
    (folder / "data_batch_3").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataCorrupt, match="data_batch_3.*MD5"):
        load_sample(DataSpec("cifar10", n=10, n_test=5), root, allow_download=False)
    patch()  # checksum now matches the broken pickle: the unpickling must be caught too
    with pytest.raises(DataCorrupt, match="data_batch_3.*pickle"):
        load_sample(DataSpec("cifar10", n=10, n_test=5), root, allow_download=False)


def test_cifar_missing(tmp_path):
    with pytest.raises(DataMissing) as e:
        load_sample(DataSpec("cifar10"), tmp_path, allow_download=False)
    assert "data_batch_1" in _one_line(e) and str(tmp_path / "cifar-10-batches-py") in str(e.value)


# ---------------------------------------------------------------- synthetic

@pytest.mark.parametrize("decay", ["geometric", "linear", "power"])
@pytest.mark.parametrize("n, d, kappa", [(40, 16, 100.0), (12, 30, 1e4), (20, 20, 1.0)])
def test_synthetic_spectrum(decay, n, d, kappa):
    s = load_sample(DataSpec("synthetic", n=n, n_test=25, synthetic_d=d, synthetic_kappa=kappa,
                             synthetic_decay=decay))
    X = s.X.numpy()
    ev = np.linalg.eigvalsh(X @ X.T)[::-1]  # float64, descending
    r = min(n, d)
    assert (ev > ev[0] * ATOL64).sum() == r  # zero eigenvalues sit at rounding level
    assert ev[0] / ev[r - 1] == pytest.approx(kappa, rel=RTOL64)
    lam = ev[:r] / ev[0]
    if decay == "geometric" and kappa > 1:
        np.testing.assert_allclose(lam[1:] / lam[:-1], kappa ** (-1 / (r - 1)), rtol=RTOL64)
    if decay == "linear":
        np.testing.assert_allclose(np.diff(lam), -(1 - 1 / kappa) / (r - 1), rtol=RTOL64,
                                   atol=ATOL64)
    assert np.linalg.norm(X, axis=1).mean() == pytest.approx(1.0, rel=RTOL64)
    # test rows: same subspace, similar scale, not copies of training rows
    T = s.X_test.numpy()
    basis = np.linalg.svd(X, full_matrices=False)[2][:r]
    np.testing.assert_allclose(T - T @ basis.T @ basis, 0, atol=ATOL64)
    assert 0.5 < np.linalg.norm(T, axis=1).mean() < 2
    assert np.abs(T[:, None] - X[None]).max(-1).min() > ATOL32  # no test row copies a train row
    assert s.box is None and s.image_shape is None and s.source == "generated"
    assert s.class_names == tuple(str(i) for i in range(10)) and s.y.max() < 10


def test_synthetic_reproducible_and_pair():
    spec = DataSpec("synthetic", n=30, n_test=10, seed=5)
    a, b = load_sample(spec), load_sample(spec)
    assert torch.equal(a.X, b.X) and torch.equal(a.y, b.y) and torch.equal(a.X_test, b.X_test)
    assert not torch.equal(a.X, load_sample(DataSpec("synthetic", n=30, n_test=10, seed=6)).X)
    p = load_sample(DataSpec("synthetic:2-7", n=30, n_test=10, seed=5))
    assert p.binary and p.class_names == ("2", "7") and set(p.y.tolist()) <= {0, 1}
    assert torch.equal(p.X, a.X)  # the pair relabels the same matrix
    more = load_sample(DataSpec("synthetic", n=30, n_test=40, seed=5))
    assert torch.equal(more.X, a.X) and torch.equal(more.y, a.y)  # n_test leaves train alone


@pytest.mark.parametrize("kw", [dict(synthetic_kappa=0.5), dict(synthetic_kappa=float("nan")),
                                dict(synthetic_decay="cubic"), dict(synthetic_d=0),
                                dict(synthetic_classes=1),
                                dict(synthetic_d=1, synthetic_kappa=10.0),
                                dict(n=20000, synthetic_d=4096)])
def test_synthetic_rejects(kw):
    with pytest.raises(BadInput) as e:
        load_sample(DataSpec("synthetic", **{"n": 10, "n_test": 5, **kw}))
    _one_line(e)


def test_synthetic_unknown_class():
    with pytest.raises(BadInput, match="0-9"):
        load_sample(DataSpec("synthetic:3-12", n=10, n_test=5))


# ---------------------------------------------------------------- user .npz

def test_npz_round_trip_holdout(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.integers(0, 256, (60, 5, 5), dtype=np.uint8)
    y = np.arange(60) % 3 + 10
    np.savez(tmp_path / "u.npz", X=X, y=y)
    s = load_sample(DataSpec(str(tmp_path / "u.npz"), n=40, n_test=20))
    assert s.X.shape == (40, 25) and s.image_shape == (1, 5, 5) and s.box == (0.0, 1.0)
    assert s.class_names == ("10", "11", "12")
    rows = {r.tobytes(): lab for r, lab in zip(X.reshape(60, -1), y, strict=True)}
    for Z, lab in ((s.X, s.y), (s.X_test, s.y_test)):
        raw = np.rint(Z.numpy() * 255).astype(np.uint8)
        assert [rows[r.tobytes()] - 10 for r in raw] == lab.tolist()
    train = {r.tobytes() for r in s.X.numpy()}
    assert not any(r.tobytes() in train for r in s.X_test.numpy())
    again = load_sample(DataSpec(str(tmp_path / "u.npz"), n=40, n_test=20))
    assert torch.equal(again.X, s.X) and torch.equal(again.X_test, s.X_test)
    with pytest.raises(BadInput, match="maximum is 40"):
        load_sample(DataSpec(str(tmp_path / "u.npz"), n=41, n_test=20))


def test_npz_with_test_split_and_floats(tmp_path):
    X = np.linspace(-2, 2, 30 * 3 * 2 * 2).reshape(30, 3, 2, 2)
    np.savez(tmp_path / "f.npz", X=X, y=np.arange(30) % 2, X_test=X[:8] + 0.5,
             y_test=np.arange(8) % 2)
    s = load_sample(DataSpec(str(tmp_path / "f.npz"), n=30, n_test=8))
    assert s.image_shape == (3, 2, 2) and s.box is None and s.d == 12
    np.testing.assert_allclose(np.sort(s.X.numpy(), 0), np.sort(X.reshape(30, -1), 0),
                               rtol=RTOL64, atol=ATOL64)
    np.testing.assert_allclose(np.sort(s.X_test.numpy(), 0),
                               np.sort(X[:8].reshape(8, -1) + 0.5, 0), rtol=RTOL64, atol=ATOL64)


@pytest.mark.parametrize("arrays, err, needle", [
    (dict(X=np.zeros((10, 3)), y=np.arange(9) % 2), BadInput, "one label per row of X, shape (10,)"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2, X_test=np.zeros((4, 3)),
          y_test=np.arange(5) % 2), BadInput, "y_test must be one label per row of X_test"),
    (dict(X=np.zeros((10, 3)), y=np.zeros(10, dtype=int)), BadInput, "at least 2 classes"),
    (dict(X=np.full((10, 3), np.nan), y=np.arange(10) % 2), BadInput, "NaN"),
    (dict(X=np.r_[np.zeros((9, 3)), [[0, np.inf, 0]]], y=np.arange(10) % 2), BadInput, "infinite"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2, X_test=np.full((4, 3), -np.inf),
          y_test=np.arange(4) % 2), BadInput, "X_test holds NaN or infinite"),
    (dict(X=np.full((10, 3), 1e101), y=np.arange(10) % 2), BadInput, "limit is 1e+100"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2, X_test=np.full((4, 3), -2e150),
          y_test=np.arange(4) % 2), BadInput, "X_test holds values up to 2e+150"),
    (dict(X=np.zeros((10, 0)), y=np.arange(10) % 2), BadInput, "X has no features"),
    (dict(X=np.zeros((10, 0, 4)), y=np.arange(10) % 2), BadInput, "X has no features"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2 + 0.0), BadInput, "integer labels"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2 == 0), BadInput, "integer labels"),
    (dict(X=np.zeros((10, 3)), y=np.array(["a", "b"] * 5)), BadInput, "integer labels"),
    (dict(X=np.zeros((10, 3), dtype=complex), y=np.arange(10) % 2), BadInput, "numeric"),
    (dict(X=np.zeros(10), y=np.arange(10) % 2), BadInput, "shape"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2, X_test=np.zeros((4, 3))), BadInput, "X_test"),
    (dict(images=np.zeros((10, 3))), BadInput, "needs arrays X and y"),
    (dict(X=np.array([1, "a", None], dtype=object), y=np.arange(3)), DataCorrupt, "numeric"),
])
def test_npz_rejects(tmp_path, arrays, err, needle):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(err) as e:
        load_sample(DataSpec(str(tmp_path / "bad.npz"), n=4, n_test=2))
    assert needle in _one_line(e)
    buf = io.BytesIO()  # an upload gets the same one-line error and leaves nothing behind
    np.savez(buf, **arrays)
    with pytest.raises(err) as e:
        store_npz(buf.getvalue(), "bad.npz", tmp_path / "uploads")
    assert needle in _one_line(e) and list((tmp_path / "uploads").glob("*")) == []


def test_npz_large_but_finite_values_load(tmp_path):
    X = np.full((10, 3), MAX_ABS_VALUE) * (np.arange(10) % 2 * 2 - 1)[:, None]
    np.savez(tmp_path / "big.npz", X=X, y=np.arange(10) % 2)
    s = load_sample(DataSpec(str(tmp_path / "big.npz"), n=6, n_test=4))
    assert s.X.abs().max().item() == MAX_ABS_VALUE and torch.isfinite(s.X @ s.X.T).all()


def test_npz_missing_and_not_zip(tmp_path):
    with pytest.raises(DataMissing, match="no such"):
        load_sample(DataSpec(str(tmp_path / "gone.npz")))
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(DataCorrupt, match="junk.npz"):
        load_sample(DataSpec(str(tmp_path / "junk.npz")))


def test_store_npz_is_content_addressed_and_validated(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, X=np.random.default_rng(0).random((12, 3, 3)), y=np.arange(12) % 2)
    p1 = store_npz(buf.getvalue(), "my data.npz", tmp_path)
    assert p1.parent == tmp_path and p1.name.startswith("my_data-") and p1.suffix == ".npz"
    assert store_npz(buf.getvalue(), "my data.npz", tmp_path) == p1
    s = load_sample(DataSpec(str(p1), n=8, n_test=4))
    assert s.X.shape == (8, 9) and s.image_shape == (1, 3, 3)
    bad = io.BytesIO()
    np.savez(bad, X=np.zeros((5, 2)), y=np.zeros(5, dtype=np.int64))  # one class only
    with pytest.raises(BadInput, match="2 classes"):
        store_npz(bad.getvalue(), "bad.npz", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [p1.name]
    with pytest.raises(DataCorrupt):
        store_npz(b"not a zip", "junk.npz", tmp_path)


def test_fetch_dataset_unpacks_the_system_copy_or_names_the_files(tmp_path, monkeypatch):
    from engine.data import SYSTEM_COPIES

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(BadInput, match="nothing to fetch"):
        fetch_dataset("synthetic", tmp_path)
    if (SYSTEM_COPIES["fashion-mnist"] / "train-images-idx3-ubyte.gz").exists():
        folder = fetch_dataset("fashion-mnist", tmp_path / "data")
        assert (folder / "train-images-idx3-ubyte").is_file()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    with pytest.raises(DataMissing, match="cifar-10-batches-py"):
        fetch_dataset("cifar10", ro)


# ---------------------------------------------------------------- fingerprints

def _rewrite_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:  # same inode
        f.write(data)
        f.truncate()


def test_fingerprint_npz_follows_content(tmp_path):
    path = tmp_path / "u.npz"
    np.savez(path, X=np.zeros((6, 2)), y=np.arange(6) % 2)
    spec = DataSpec(str(path), n=3, n_test=2)
    first = data_fingerprint(spec)
    assert first == data_fingerprint(spec) == hashlib.sha256(path.read_bytes()).hexdigest()
    buf = io.BytesIO()
    np.savez(buf, X=np.ones((6, 2)), y=np.arange(6) % 2)
    before = path.stat()
    _rewrite_in_place(path, buf.getvalue())
    assert (path.stat().st_ino, path.stat().st_size) == (before.st_ino, before.st_size)
    assert data_fingerprint(spec) == hashlib.sha256(buf.getvalue()).hexdigest() != first


def test_fingerprint_is_memoised_per_file_state(tmp_path):
    path = tmp_path / "u.npz"
    np.savez(path, X=np.zeros((6, 2)), y=np.arange(6) % 2)
    old = path.stat().st_mtime_ns - 3600 * 10**9  # an hour old: not racy, so memoised
    os.utime(path, ns=(old, old))
    spec = DataSpec(str(path), n=3, n_test=2)
    first = data_fingerprint(spec)
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    _rewrite_in_place(path, bytes(data))
    os.utime(path, ns=(old, old))  # same path, size, mtime and inode: the memo answers
    assert data_fingerprint(spec) == first
    os.utime(path, ns=(old + 10**9, old + 10**9))  # any change of state: read again
    assert data_fingerprint(spec) == hashlib.sha256(bytes(data)).hexdigest() != first


def test_fingerprint_rereads_freshly_written_files(tmp_path):
    # a rewrite within one tick of the file clock keeps size, mtime and inode: not memoised
    path = tmp_path / "u.npz"
    np.savez(path, X=np.zeros((6, 2)), y=np.arange(6) % 2)
    stamp = path.stat().st_mtime_ns
    spec = DataSpec(str(path), n=3, n_test=2)
    first = data_fingerprint(spec)
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    _rewrite_in_place(path, bytes(data))
    os.utime(path, ns=(stamp, stamp))
    assert data_fingerprint(spec) == hashlib.sha256(bytes(data)).hexdigest() != first


@needs_mnist
def test_fingerprint_mnist_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "MNIST" / "raw").mkdir(parents=True)
        for f in IDX:
            shutil.copyfile(MNIST_RAW / f, root / "MNIST" / "raw" / f)
    labels = b / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    data = bytearray(labels.read_bytes())
    data[-1] = (data[-1] + 1) % 10  # one test label differs
    labels.write_bytes(bytes(data))
    fa = data_fingerprint(DataSpec("mnist"), a)
    assert len(fa) == 64 and fa == data_fingerprint(DataSpec("mnist:3-8", n=10), a)
    assert data_fingerprint(DataSpec("mnist"), SHARED) == fa  # same files, another folder
    assert data_fingerprint(DataSpec("mnist"), b) != fa
    assert data_fingerprint(DataSpec("mnist"), a) == fa


def test_fingerprint_cifar_and_synthetic(fake_cifar):
    root, folder, _, _ = fake_cifar
    spec = DataSpec("cifar10", n=10, n_test=5)
    first = data_fingerprint(spec, root, allow_download=False)
    (folder / "batches.meta").write_bytes((folder / "batches.meta").read_bytes() + b"\0")
    assert data_fingerprint(spec, root, allow_download=False) != first
    assert data_fingerprint(DataSpec("synthetic:0-1", seed=3)) == "synthetic"


@pytest.mark.parametrize("dataset", ["mnist", "cifar10", "gone.npz"])
def test_fingerprint_missing_is_load_samples_error(tmp_path, dataset):
    spec = DataSpec(str(tmp_path / dataset) if dataset.endswith(".npz") else dataset)
    with pytest.raises(DataMissing) as loading:
        load_sample(spec, tmp_path, allow_download=False)
    with pytest.raises(DataMissing) as hashing:
        data_fingerprint(spec, tmp_path, allow_download=False)
    assert _one_line(hashing) == _one_line(loading)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- hostile .npz files

def _npz_with_headers(members: dict[str, tuple], payload: int = 0) -> bytes:
    """An .npz whose members declare (dtype, shape) but hold only `payload` zero bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (dtype, shape) in members.items():
            with zf.open(name, "w", force_zip64=True) as f:
                npy.write_array_header_1_0(f, {"descr": np.dtype(dtype).str,
                                               "fortran_order": False, "shape": shape})
                for _ in range(payload >> 20):
                    f.write(bytes(1 << 20))
    return buf.getvalue()


@pytest.fixture(scope="module")
def zip_bomb() -> bytes:
    """A real zip bomb: ~0.25 MB of zip holding X.npy, 1 MB over the limit of zeros."""
    size = MAX_NPZ_BYTES + 2**20
    bomb = _npz_with_headers({"X.npy": ("u1", (size,))}, payload=size)
    buf = io.BytesIO(bomb)
    with zipfile.ZipFile(buf, "a") as zf:
        with zf.open("y.npy", "w") as f:
            npy.write_array(f, np.arange(3))
    return buf.getvalue()


@pytest.fixture
def no_unpacking(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the arrays were read before the sizes were checked")

    monkeypatch.setattr(np, "load", refuse)


def test_zip_bomb_is_refused_unread(tmp_path, zip_bomb, no_unpacking):
    assert len(zip_bomb) < MAX_NPZ_BYTES // 100  # small on disk, the bound is on what it unpacks
    path = tmp_path / "bomb.npz"
    path.write_bytes(zip_bomb)
    with pytest.raises(BadInput) as e:
        load_sample(DataSpec(str(path), n=2, n_test=1))
    msg = _one_line(e)
    assert "X.npy" in msg and "201 MB" in msg and "limit is 200 MB" in msg
    with pytest.raises(BadInput, match="X.npy.*201 MB.*limit is 200 MB"):
        store_npz(zip_bomb, "bomb.npz", tmp_path / "uploads")
    assert not (tmp_path / "uploads").exists()


@pytest.mark.parametrize("members, needle", [
    ({"X.npy": ("f8", (10**6, 10**6)), "y.npy": ("i8", (10**6,))},
     "X.npy declares float64 (1000000, 1000000), 7,629,395 MB unpacked; the limit is 200 MB"),
    ({"X.npy": ("u1", (60 * 2**20,)), "y.npy": ("u1", (60 * 2**20,)),
      "X_test.npy": ("u1", (60 * 2**20,)), "y_test.npy": ("u1", (60 * 2**20,))},
     "arrays declare 240 MB in all; the limit is 200 MB"),
])
def test_npz_headers_are_checked_before_reading(tmp_path, members, needle, no_unpacking):
    blob = _npz_with_headers(members)  # headers that lie: the data are not there
    (tmp_path / "lie.npz").write_bytes(blob)
    with pytest.raises(BadInput) as e:
        load_sample(DataSpec(str(tmp_path / "lie.npz"), n=2, n_test=1))
    assert needle in _one_line(e)
    with pytest.raises(BadInput) as e:
        store_npz(blob, "lie.npz", tmp_path / "uploads")
    assert needle in _one_line(e)


def test_npz_truncated_member_is_corrupt(tmp_path):
    blob = _npz_with_headers({"X.npy": ("f8", (10, 3)), "y.npy": ("i8", (10,))})
    (tmp_path / "short.npz").write_bytes(blob)
    with pytest.raises(DataCorrupt) as e:
        load_sample(DataSpec(str(tmp_path / "short.npz"), n=4, n_test=2))
    assert "short.npz" in _one_line(e)


# ---------------------------------------------------------------- read-only folders, clean failures

def test_writable(tmp_path):
    assert writable(tmp_path) and writable(tmp_path / "new" / "deeper")
    (tmp_path / "file").write_text("x")
    assert not writable(tmp_path / "file" / "child")
    assert not writable("/proc/influence-malleability/data")  # fails for root too
    assert not writable("/sys/influence-malleability")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)  # root could write here, but the engine leaves a read-only folder alone
    try:
        assert not writable(ro) and not writable(ro / "data")
    finally:
        ro.chmod(0o755)


def test_engine_data_dir(tmp_path, monkeypatch):
    assert engine_data_dir() == tmp_path / "xdg" / "influence-malleability" / "datasets"
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    assert engine_data_dir() == tmp_path / "cache" / "datasets"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "xdg").exists()


@needs_fashion
def test_fashion_unwritable_data_dir_uses_engine_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    spec = DataSpec("fashion-mnist", n=20, n_test=10)
    s = load_sample(spec, "/proc/influence-malleability/data", allow_download=False)
    own = tmp_path / "cache" / "datasets" / "FashionMNIST" / "raw"
    assert Path(s.source) == own and all((own / f).is_file() for f in IDX)
    fp = data_fingerprint(spec, "/proc/influence-malleability/data", allow_download=False)
    assert fp == data_fingerprint(spec, tmp_path / "data")  # same bytes, unpacked elsewhere
    info = {i.name: i for i in available_datasets("/proc/influence-malleability/data")}
    assert Path(info["fashion-mnist"].where) == own


def test_failed_unpack_leaves_nothing(tmp_path, monkeypatch):
    from engine.data import SYSTEM_COPIES

    src = tmp_path / "system"
    src.mkdir()
    for f in IDX:  # the third file is broken, after two were unpacked
        (src / f"{f}.gz").write_bytes(b"not gzip" if f == IDX[2] else gzip.compress(b"x" * 64))
    monkeypatch.setitem(SYSTEM_COPIES, "fashion-mnist", src)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for root in (tmp_path / "new" / "data", kept):
        with pytest.raises(DataCorrupt) as e:
            load_sample(DataSpec("fashion-mnist"), root, allow_download=False)
        assert IDX[2] in _one_line(e)
    assert not (tmp_path / "new").exists()
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "xdg").exists()


@pytest.mark.parametrize("cls, leftover", [("MNIST", "MNIST/raw/train-images-idx3-ubyte.gz"),
                                           ("CIFAR10", "cifar-10-python.tar.gz")])
def test_failed_download_leaves_no_folders(tmp_path, monkeypatch, cls, leftover):
    import torchvision

    def half_done(self):  # as torchvision does: folders first, then part of a file, then the error
        (Path(self.root) / leftover).parent.mkdir(parents=True, exist_ok=True)
        (Path(self.root) / leftover).write_bytes(b"partial")
        raise URLError("connection reset")

    monkeypatch.setattr(getattr(torchvision.datasets, cls), "download", half_done)
    name = {"MNIST": "mnist", "CIFAR10": "cifar10"}[cls]
    with pytest.raises(DataMissing, match="download failed.*connection reset"):
        load_sample(DataSpec(name), tmp_path / "new" / "data")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    (kept / "MNIST").mkdir(parents=True)  # existed before: stays, with nothing new inside
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(DataMissing):
        fetch_dataset(name, kept)
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*")) == ["MNIST", "notes.txt"]


@needs_mnist
def test_idx_files_read_as_torchvision_reads_them():
    """The direct IDX reader against torchvision's own MNIST decoding: every image byte and label."""
    import torchvision.datasets as tvd

    from engine.data.images import read_idx

    for train, split in ((True, "train"), (False, "t10k")):
        ref = tvd.MNIST(str(SHARED), train=train, download=False)
        images = read_idx(MNIST_RAW / f"{split}-images-idx3-ubyte", 3)
        labels = read_idx(MNIST_RAW / f"{split}-labels-idx1-ubyte", 1)
        assert images.dtype == np.uint8 and not images.flags.writeable
        np.testing.assert_array_equal(images, ref.data.numpy())
        np.testing.assert_array_equal(labels.astype(np.int64), ref.targets.numpy())


def test_idx_header_and_length_are_checked(tmp_path):
    from engine.data.images import read_idx

    good = b"\0\0\x08\x01" + (3).to_bytes(4, "big") + bytes([1, 2, 3])
    (tmp_path / "ok").write_bytes(good)
    np.testing.assert_array_equal(read_idx(tmp_path / "ok", 1), [1, 2, 3])
    for name, data, words in (("short", good[:-1], "holds 2 values; its header says 3"),
                              ("type", b"\0\0\x0d\x01" + good[4:], "unsigned bytes"),
                              ("dims", good, "3-dimensional")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataCorrupt, match=words) as e:
            read_idx(tmp_path / name, 3 if name == "dims" else 1)
        assert str(tmp_path / name) in str(e.value) and "\n" not in str(e.value)
