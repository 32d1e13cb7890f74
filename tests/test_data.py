"""Tests for engine/data.py on real MNIST / Fashion-MNIST where present, fake CIFAR-10 files
in its own format, synthetic matrices and user .npz files."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from engine.data import (DATASETS, DataSpec, available_datasets, load_sample, parse_dataset,
                         resolve_data_dir)
from engine.errors import BadInput, DataCorrupt, DataMissing

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
MNIST_RAW = SHARED / "MNIST" / "raw"
FASHION_GZ = Path("/usr/share/datasets/fashion-mnist")
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
               "ship", "truck"]

needs_mnist = pytest.mark.skipif(not all((MNIST_RAW / f).is_file() for f in IDX),
                                 reason=f"shared MNIST subset absent ({MNIST_RAW})")
needs_fashion = pytest.mark.skipif(
    not all((FASHION_GZ / f"{f}.gz").is_file() for f in IDX),
    reason="Debian dataset-fashion-mnist not installed")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    # never touch the real user cache or inherit a data dir from the environment
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ENGINE_DATA_DIR", raising=False)


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


def test_datasets_constant():
    assert DATASETS == ("mnist", "fashion-mnist", "cifar10", "synthetic")


def test_resolve_data_dir(tmp_path, monkeypatch):
    assert resolve_data_dir(tmp_path / "a") == (tmp_path / "a").resolve()
    monkeypatch.setenv("ENGINE_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir() == (tmp_path / "env").resolve()
    monkeypatch.delenv("ENGINE_DATA_DIR")
    assert resolve_data_dir() == tmp_path / "xdg" / "influence-malleability" / "datasets"
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize("kw", [dict(n=1), dict(n_test=0), dict(seed=-1), dict(n=2.5)])
def test_bad_sizes(kw):
    with pytest.raises(BadInput):
        load_sample(DataSpec("synthetic", **kw))


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
        for img, lab in zip(images, labels):
            by_bytes.setdefault(img.tobytes(), set()).add(int(lab))
        raw = np.rint(X.numpy() * 255).astype(np.uint8)
        for row, lab in zip(raw, y.tolist()):
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
    with pytest.raises(BadInput, match="n_test=100000"):
        load_sample(DataSpec("mnist", n=10, n_test=100000), SHARED)


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
    assert info["synthetic"].available and not info["cifar10"].available
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
        for row, lab in zip(b["data"], b["labels"]):
            known[(name == "test_batch", row.tobytes())] = lab
    for X, y, test in ((s.X, s.y, False), (s.X_test, s.y_test, True)):
        raw = np.rint(X.numpy() * 255).astype(np.uint8)
        assert [known[(test, r.tobytes())] for r in raw] == y.tolist()


def test_cifar_pair_by_name(fake_cifar):
    root, _, batches, _ = fake_cifar
    s = load_sample(DataSpec("cifar10:automobile-airplane", n=10, n_test=2), root)
    assert s.class_names == ("automobile", "airplane")
    labels = {r.tobytes(): lab for b in batches.values() for r, lab in zip(b["data"], b["labels"])}
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
    assert (ev > ev[0] * 1e-12).sum() == r
    assert ev[0] / ev[r - 1] == pytest.approx(kappa, rel=1e-8)
    lam = ev[:r] / ev[0]
    if decay == "geometric" and kappa > 1:
        assert np.allclose(lam[1:] / lam[:-1], kappa ** (-1 / (r - 1)), rtol=1e-8)
    if decay == "linear":
        assert np.allclose(np.diff(lam), -(1 - 1 / kappa) / (r - 1), atol=1e-10)
    assert np.linalg.norm(X, axis=1).mean() == pytest.approx(1.0, rel=1e-12)
    # test rows: same subspace, similar scale, not copies of training rows
    T = s.X_test.numpy()
    basis = np.linalg.svd(X, full_matrices=False)[2][:r]
    assert np.allclose(T - T @ basis.T @ basis, 0, atol=1e-10)
    assert 0.5 < np.linalg.norm(T, axis=1).mean() < 2
    assert np.abs(T[:, None] - X[None]).max(-1).min() > 1e-6
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
                                dict(synthetic_d=1, synthetic_kappa=10.0)])
def test_synthetic_rejects(kw):
    with pytest.raises(BadInput):
        load_sample(DataSpec("synthetic", n=10, n_test=5, **kw))


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
    rows = {r.tobytes(): lab for r, lab in zip(X.reshape(60, -1), y)}
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
    assert np.allclose(np.sort(s.X.numpy(), 0), np.sort(X.reshape(30, -1), 0))
    assert np.allclose(np.sort(s.X_test.numpy(), 0), np.sort(X[:8].reshape(8, -1) + 0.5, 0))


@pytest.mark.parametrize("arrays, err, needle", [
    (dict(X=np.zeros((10, 3)), y=np.arange(9) % 2), BadInput, "y must be"),
    (dict(X=np.zeros((10, 3)), y=np.zeros(10, dtype=int)), BadInput, "at least 2 classes"),
    (dict(X=np.full((10, 3), np.nan), y=np.arange(10) % 2), BadInput, "NaN"),
    (dict(X=np.zeros((10, 3)), y=np.arange(10) % 2 + 0.0), BadInput, "integer labels"),
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


def test_npz_missing_and_not_zip(tmp_path):
    with pytest.raises(DataMissing, match="no such"):
        load_sample(DataSpec(str(tmp_path / "gone.npz")))
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(DataCorrupt, match="junk.npz"):
        load_sample(DataSpec(str(tmp_path / "junk.npz")))


def test_store_npz_is_content_addressed_and_validated(tmp_path):
    import io

    from engine.data import store_npz

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
    from engine.data import SYSTEM_COPIES, fetch_dataset

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
