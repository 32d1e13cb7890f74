"""Data sets as float64 tensors: MNIST, Fashion-MNIST, CIFAR-10, a synthetic matrix of chosen
condition number, or a user ``.npz`` file.

A ``DataSpec`` fixes a draw; ``load_sample(spec)`` returns the same ``Sample`` for the same spec.
Rows are samples: ``X`` is (n, d), images flattened in C, H, W order, pixels in [0, 1]. Rows
are *not* normalised here (``spec.normalize`` tells the models to do it).

Image files are read through torchvision from a data folder (``resolve_data_dir``): the
``--data-dir`` argument, else ``$ENGINE_DATA_DIR``, else the user cache folder. Debian's
``dataset-fashion-mnist`` package is used when present; anything else is downloaded where the
network allows, or a ``DataMissing`` error says which files to put where.
"""

from __future__ import annotations

import functools
import gzip
import os
import pickle
import socket
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import BadInput, DataCorrupt, DataMissing

DATASETS = ("mnist", "fashion-mnist", "cifar10", "synthetic")  # plus a path to a user .npz
DECAYS = ("geometric", "linear", "power")  # eigenvalue profiles of the synthetic Gram
MAX_NPZ_BYTES = 200 * 2**20
MAX_SYNTHETIC_ENTRIES = 50_000_000  # n * d and n_test * d: 400 MB of float64 each
DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation; an offline machine fails at once anyway
SYSTEM_COPIES = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}  # Debian package

_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_CIFAR = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
_FILES = {"mnist": ("MNIST/raw", _IDX), "fashion-mnist": ("FashionMNIST/raw", _IDX),
          "cifar10": ("cifar-10-batches-py", _CIFAR)}  # folder under the data dir, file names
_CLASSES = {  # fashion-mnist as torchvision's FashionMNIST.classes; cifar10 as batches.meta
    "mnist": tuple(str(i) for i in range(10)),
    "fashion-mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                      "Shirt", "Sneaker", "Bag", "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                "ship", "truck"),
}


@dataclass(frozen=True)
class DataSpec:
    dataset: str = "mnist"       # name in DATASETS, "name:a-b" for two classes, or a .npz path
    n: int = 400                 # training points drawn from the train split
    n_test: int = 200            # test points drawn from the test split (never overlaps train)
    seed: int = 0                # draw seed; same spec -> same sample
    normalize: bool = True       # rows l2-normalised before they enter a network (models apply it)
    synthetic_d: int = 64        # synthetic only: input dimension
    synthetic_kappa: float = 100.0     # synthetic only: max/min nonzero eigenvalue of G = X Xᵀ
    synthetic_decay: str = "geometric"  # synthetic only: eigenvalue profile, one of DECAYS
    synthetic_classes: int = 10  # synthetic only: classes of the random linear teacher


@dataclass(frozen=True, eq=False)
class Sample:
    """A drawn data set. Tensors are float64 (inputs) and int64 (labels 0..c-1) on the CPU."""

    X: torch.Tensor              # (n, d) raw inputs; images: pixels in [0, 1], C,H,W order
    y: torch.Tensor              # (n,) labels 0..c-1
    X_test: torch.Tensor         # (n_test, d)
    y_test: torch.Tensor         # (n_test,)
    class_names: tuple[str, ...]  # original names of labels 0..c-1 (a pair: a, b in order)
    image_shape: tuple[int, int, int] | None  # (C, H, W); None for synthetic / flat npz
    box: tuple[float, float] | None  # valid input range for attacks; None if unbounded
    source: str                  # folder or file read, or "generated"
    spec: DataSpec

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def binary(self) -> bool:
        return self.n_classes == 2

    def class_counts(self) -> dict[str, tuple[int, int]]:
        """Class name -> (training count, test count)."""
        tr = torch.bincount(self.y, minlength=self.n_classes).tolist()
        te = torch.bincount(self.y_test, minlength=self.n_classes).tolist()
        return {name: (tr[i], te[i]) for i, name in enumerate(self.class_names)}


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    available: bool
    where: str    # folder holding the files (or that would hold them), or "generated"
    reason: str   # one line for the user


# ---------------------------------------------------------------- names and folders

def parse_dataset(name: str) -> tuple[str, tuple[str, str] | None]:
    """Split ``"mnist:3-8"`` into ``("mnist", ("3", "8"))``; ``"mnist"`` gives ``("mnist", None)``.

    Class parts are returned as written (index or case-insensitive name) after checking them
    against the data set's classes. A path ending in ``.npz`` is returned unchanged with None.
    Raises BadInput for unknown data sets or classes, listing what is allowed.
    """
    text = str(name).strip()
    if text.lower().endswith(".npz"):
        return text, None
    base, sep, pair = text.partition(":")
    base = base.strip().lower()
    if base not in DATASETS:
        raise BadInput(f"unknown data set {name!r}: allowed are {', '.join(DATASETS)}, "
                       "NAME:a-b for two classes (e.g. mnist:3-8), or a path to a .npz file")
    if not sep:
        return base, None
    known = _CLASSES.get(base)
    cuts = [(pair[:i].strip(), pair[i + 1:].strip()) for i, ch in enumerate(pair) if ch == "-"]
    cuts = [c for c in cuts if c[0] and c[1]]
    if known is not None and len(cuts) > 1:  # names like "T-shirt/top" hold a hyphen
        cuts = [c for c in cuts if all(_class_index(t, known) is not None for t in c)] or cuts[:1]
    if len(cuts) != 1:
        raise BadInput(f"cannot read the class pair in {name!r}: write {base}:a-b with two "
                       "class indices or names, e.g. mnist:3-8")
    a, b = cuts[0]
    if known is not None:
        if _resolve_class(a, known, base) == _resolve_class(b, known, base):
            raise BadInput(f"the pair in {name!r} names the same class twice")
    elif not (a.isdigit() and b.isdigit()) or int(a) == int(b):  # synthetic: class indices
        raise BadInput(f"synthetic classes are indices 0..synthetic_classes-1; got {name!r}")
    return base, (a, b)


def _class_index(token: str, names: tuple[str, ...]) -> int | None:
    if token.isdigit() and int(token) < len(names):
        return int(token)
    lowered = [c.lower() for c in names]
    return lowered.index(token.lower()) if token.lower() in lowered else None


def _resolve_class(token: str, names: tuple[str, ...], base: str) -> int:
    i = _class_index(token, names)
    if i is None:
        raise BadInput(f"unknown class {token!r} for {base}: allowed are indices "
                       f"0-{len(names) - 1} or names {', '.join(names)}")
    return i


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "influence-malleability" / "datasets"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir``, else ``$ENGINE_DATA_DIR``, else
    ``($XDG_CACHE_HOME or ~/.cache)/influence-malleability/datasets``. Nothing is created."""
    chosen = data_dir if data_dir not in (None, "") else os.environ.get("ENGINE_DATA_DIR")
    return Path(chosen).expanduser().resolve() if chosen else _user_cache_dir()


def _writable(path: Path) -> bool:
    """Whether files may be created under `path` (or its nearest existing parent).

    Read-only permission bits are honoured even for root, who could otherwise write into a
    folder meant to stay read-only, such as a shared data set folder."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return os.access(p, os.W_OK | os.X_OK) and bool(p.stat().st_mode & 0o222)


def _present(base: str, root: Path) -> bool:
    folder, files = _FILES[base]
    return all((root / folder / f).is_file() for f in files)


# ---------------------------------------------------------------- public entry points

def load_sample(spec: DataSpec, data_dir: str | os.PathLike | None = None,
                allow_download: bool = True) -> Sample:
    """Draw the sample `spec` describes; same spec -> identical tensors.

    Train points come from the train split, test points from the test split (for a user
    .npz without ``X_test``, from a disjoint seeded hold-out). Within the chosen classes each
    split is permuted with ``numpy.random.default_rng([seed, stream])`` and the first n /
    n_test are taken, so a larger n extends a smaller draw. Labels are remapped to 0..c-1
    (a pair a-b: a -> 0, b -> 1). Raises BadInput, DataMissing or DataCorrupt (one line each).
    """
    for field, low in (("n", 2), ("n_test", 1), ("seed", 0)):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise BadInput(f"{field} must be an integer >= {low}; got {value!r}")
    base, pair = parse_dataset(spec.dataset)
    if base == "synthetic":
        return _synthetic(spec, pair)
    if base not in DATASETS:
        return _npz(spec, Path(base).expanduser())
    root = _locate(base, resolve_data_dir(data_dir), allow_download)
    Xtr, ytr, names, shape = _decoded(base, str(root), True, _stamp(base, root))
    Xte, yte, _, _ = _decoded(base, str(root), False, _stamp(base, root))
    classes = (list(range(len(names))) if pair is None
               else [_resolve_class(t, names, base) for t in pair])
    where = base if pair is None else f"{base} classes {pair[0]}, {pair[1]}"
    i = _take(np.flatnonzero(np.isin(ytr, classes)), spec.n, spec.seed, 0, "n",
              f"the train split of {where}")
    j = _take(np.flatnonzero(np.isin(yte, classes)), spec.n_test, spec.seed, 1, "n_test",
              f"the test split of {where}")
    lut = np.full(len(names), -1, dtype=np.int64)
    lut[classes] = np.arange(len(classes))
    return Sample(_pixels(Xtr[i]), torch.from_numpy(lut[ytr[i]]), _pixels(Xte[j]),
                  torch.from_numpy(lut[yte[j]]), tuple(names[c] for c in classes), shape,
                  (0.0, 1.0), str(root / _FILES[base][0]), spec)


def available_datasets(data_dir: str | os.PathLike | None = None) -> list[DatasetInfo]:
    """What `load_sample` could read from `data_dir` now, without downloading or writing."""
    root, cache = resolve_data_dir(data_dir), _user_cache_dir()
    out = []
    for base, (folder, files) in _FILES.items():
        src = SYSTEM_COPIES.get(base)
        if _present(base, root):
            out.append(DatasetInfo(base, True, str(root / folder), "files found"))
        elif src is not None and _present(base, cache):
            out.append(DatasetInfo(base, True, str(cache / folder), f"unpacked earlier from {src}"))
        elif src is not None and all((src / f"{f}.gz").is_file() for f in files):
            out.append(DatasetInfo(base, True, str(src),
                                   "system package copy; unpacked on first use"))
        else:
            missing = [f for f in files if not (root / folder / f).is_file()]
            out.append(DatasetInfo(base, False, str(root / folder),
                                   f"missing {', '.join(missing)}; downloaded on first use "
                                   "where the network allows"))
    out.append(DatasetInfo("synthetic", True, "generated", "no files needed"))
    return out


def fetch_dataset(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Make an image data set's files present (system copy or download); returns its folder.

    Raises BadInput for names without files and DataMissing, naming the files and folder,
    when they cannot be had here (no network, read-only folder).
    """
    base = name.strip().lower()
    if base not in _FILES:
        raise BadInput(f"nothing to fetch for {name!r}; data sets with files: {', '.join(_FILES)}")
    root = resolve_data_dir(data_dir)
    return _locate(base, root, allow_download=True) / _FILES[base][0]


# ---------------------------------------------------------------- image files

def _locate(base: str, root: Path, allow_download: bool) -> Path:
    """The data folder holding `base`'s files (root, or the user cache for unpacked copies)."""
    if _present(base, root):
        return root
    unpacked = _unpack_system_copy(base, root)
    if unpacked is not None:
        return unpacked
    reason = "download not allowed"
    if allow_download and not _writable(root):
        reason = f"cannot download into read-only {root}"
    elif allow_download:
        reason = _download(base, root)
        if _present(base, root):
            return root
    folder, files = _FILES[base]
    raise DataMissing(f"{base} not found: put {', '.join(files)} in {root / folder} (or point "
                      f"--data-dir / ENGINE_DATA_DIR at a folder holding {folder}); {reason}")


def _unpack_system_copy(base: str, root: Path) -> Path | None:
    """Un-gzip a system package's copy into root, or the user cache when root is read-only."""
    src = SYSTEM_COPIES.get(base)
    folder, files = _FILES[base]
    if src is None or not all((src / f"{f}.gz").is_file() for f in files):
        return None
    for target in ([root] if _writable(root) else []) + [_user_cache_dir()]:
        if _present(base, target):
            return target
        try:
            (target / folder).mkdir(parents=True, exist_ok=True)
            for f in files:
                if not (target / folder / f).is_file():
                    _gunzip(src / f"{f}.gz", target / folder / f)
            return target
        except OSError:
            continue
    return None


def _gunzip(src: Path, dst: Path) -> None:
    # write beside the target and rename, so a crash never leaves a half file under its name
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=dst.name + ".")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as inp:
            while chunk := inp.read(1 << 22):
                out.write(chunk)
        os.replace(tmp, dst)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataCorrupt(f"{src} is not a valid gzip file ({e})") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _tv_class(base: str):
    import torchvision.datasets as tvd  # slow import, only needed for image files

    return {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10}[base]


def _download(base: str, root: Path) -> str:
    """Try torchvision's download; returns a one-line reason (empty on success)."""
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        _tv_class(base)(str(root), train=True, download=True)
        return ""
    except Exception as e:  # any network, disk or checksum failure means "not available"
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        return f"download failed: {type(e).__name__}: {lines[-1]}"  # last line: the cause
    finally:
        socket.setdefaulttimeout(old)


def _stamp(base: str, root: Path) -> tuple:
    # part of the in-process cache key, so replaced files are read again
    folder, files = _FILES[base]
    return tuple((s.st_size, s.st_mtime_ns) for s in ((root / folder / f).stat() for f in files))


@functools.lru_cache(maxsize=6)
def _decoded(base: str, root: str, train: bool, stamp: tuple):
    """One split: uint8 images (N, d) in C,H,W order, int64 labels (N,), class names, (C, H, W).

    Kept as uint8 (read-only arrays) so that a cached CIFAR-10 split costs 150 MB, not 1.2 GB."""
    try:
        ds = _tv_class(base)(root, train=train, download=False)
        if base == "cifar10":
            images, names = np.asarray(ds.data).transpose(0, 3, 1, 2), tuple(ds.classes)
        else:
            images, names = ds.data.numpy()[:, None], _CLASSES[base]
        labels = np.asarray(ds.targets, dtype=np.int64)
    except Exception as e:
        raise _corrupt(base, Path(root), train, e) from e
    folder = Path(root) / _FILES[base][0]
    if images.dtype != np.uint8 or len(images) != len(labels) or len(labels) == 0:
        raise DataCorrupt(f"{folder}: {'train' if train else 'test'} split has "
                          f"{len(images)} images of type {images.dtype} but {len(labels)} labels")
    if labels.min() < 0 or labels.max() >= len(names):
        raise DataCorrupt(f"{folder}: labels outside 0..{len(names) - 1}")
    shape = tuple(int(s) for s in images.shape[1:])
    images = np.ascontiguousarray(images.reshape(len(images), -1))
    images.flags.writeable = labels.flags.writeable = False
    return images, labels, names, shape


def _corrupt(base: str, root: Path, train: bool, exc: Exception) -> DataCorrupt:
    """Find which file made torchvision fail and say so in one line."""
    folder = root / _FILES[base][0]
    if base == "cifar10":
        from torchvision.datasets.utils import check_integrity

        tv = _tv_class(base)
        for name, md5 in tv.train_list + tv.test_list + [[tv.meta["filename"], tv.meta["md5"]]]:
            if not check_integrity(str(folder / name), md5):
                return DataCorrupt(f"{folder / name} fails its MD5 check (truncated or altered); "
                                   "replace it or delete the folder to download again")
            try:
                with open(folder / name, "rb") as f:
                    pickle.load(f, encoding="latin1")
            except Exception as e:
                return DataCorrupt(f"{folder / name} is not a readable CIFAR-10 pickle ({e})")
    else:
        from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

        for name in _IDX[:2] if train else _IDX[2:]:
            try:
                read_sn3_pascalvincent_tensor(str(folder / name))
            except Exception as e:
                return DataCorrupt(f"{folder / name} is not a valid IDX file (bad magic number "
                                   f"or truncated: {type(e).__name__}); replace it")
    msg = f"cannot read {base} from {folder}: {type(exc).__name__}: {exc}"
    return DataCorrupt(msg.splitlines()[0])


def _take(pool: np.ndarray, k: int, seed: int, stream: int, what: str, where: str) -> np.ndarray:
    """First k of a seeded permutation of the candidate indices `pool`."""
    if k > len(pool):
        raise BadInput(f"{what}={k} is more than the {len(pool)} points in {where}; "
                       f"the maximum is {len(pool)}")
    return pool[np.random.default_rng([seed, stream]).permutation(len(pool))[:k]]


def _pixels(rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(rows.astype(np.float64) / 255.0)


# ---------------------------------------------------------------- synthetic

def _profile(decay: str, r: int, kappa: float) -> np.ndarray:
    """r eigenvalues from 1 down to 1/kappa."""
    t = np.arange(r) / max(r - 1, 1)
    if decay == "geometric":
        lam = kappa ** -t
    elif decay == "linear":
        lam = 1.0 - (1.0 - 1.0 / kappa) * t
    else:  # power: (i+1)^-p with r^-p = 1/kappa
        lam = (1.0 + np.arange(r)) ** (-np.log(kappa) / np.log(r)) if r > 1 else np.ones(1)
    lam[0], lam[-1] = 1.0, 1.0 / kappa
    return lam


def _orthonormal(rng: np.random.Generator, m: int, r: int) -> np.ndarray:
    q, rr = np.linalg.qr(rng.standard_normal((m, r)))
    return q * np.sign(np.diag(rr))  # Haar-distributed and independent of LAPACK's sign choice


def _synthetic(spec: DataSpec, pair: tuple[str, str] | None) -> Sample:
    """X = U diag(sqrt(lam)) Vᵀ scaled to mean row norm 1, so G = X Xᵀ has exactly
    r = min(n, d) nonzero eigenvalues with max/min = kappa. Test rows are V diag(sqrt(lam/n)) z,
    z ~ N(0, I_r), at the same scale: same subspace and spread as the training rows.
    Labels: argmax over `synthetic_classes` random teacher directions; for a pair a-b, the
    argmax over directions a and b only, so every point is kept and the Gram stays exact."""
    d, kappa, decay = spec.synthetic_d, spec.synthetic_kappa, spec.synthetic_decay
    k = spec.synthetic_classes
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise BadInput(f"synthetic_d must be an integer >= 1; got {d!r}")
    if not isinstance(kappa, (int, float)) or not np.isfinite(kappa) or kappa < 1:
        raise BadInput(f"synthetic_kappa must be a finite number >= 1; got {kappa!r}")
    if decay not in DECAYS:
        raise BadInput(f"synthetic_decay must be one of {', '.join(DECAYS)}; got {decay!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise BadInput(f"synthetic_classes must be an integer >= 2; got {k!r}")
    if max(spec.n, spec.n_test) * d > MAX_SYNTHETIC_ENTRIES:
        raise BadInput(f"synthetic data of {max(spec.n, spec.n_test)} x {d} is too large; "
                       f"keep n * d and n_test * d <= {MAX_SYNTHETIC_ENTRIES}")
    r = min(spec.n, d)
    if r == 1 and kappa != 1:
        raise BadInput("with min(n, synthetic_d) = 1 the Gram has one nonzero eigenvalue: "
                       "synthetic_kappa must be 1")
    classes = list(range(k)) if pair is None else [int(t) for t in pair]
    if max(classes) >= k:
        raise BadInput(f"unknown class {max(classes)} for synthetic: allowed are 0-{k - 1}")
    # one stream per part, so that n_test never changes the training set or its labels
    rng_u, rng_v, rng_t, rng_z = (np.random.default_rng([spec.seed, 2, p]) for p in range(4))
    lam = _profile(decay, r, float(kappa))
    U, V = _orthonormal(rng_u, spec.n, r), _orthonormal(rng_v, d, r)
    X = (U * np.sqrt(lam)) @ V.T                                       # (n, d)
    scale = 1.0 / np.linalg.norm(X, axis=1).mean()
    Z = rng_z.standard_normal((spec.n_test, r))
    X_test = (Z * np.sqrt(lam / spec.n)) @ V.T                         # (n_test, d)
    teacher = rng_t.standard_normal((k, d))[classes]                   # (c, d)
    X, X_test = X * scale, X_test * scale

    def label(A: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.argmax(A @ teacher.T, axis=1).astype(np.int64))

    return Sample(torch.from_numpy(X), label(X), torch.from_numpy(X_test), label(X_test),
                  tuple(str(c) for c in classes), None, None, "generated", spec)


# ---------------------------------------------------------------- user .npz

def _npz(spec: DataSpec, path: Path) -> Sample:
    """Read X (n, d | n, h, w | n, c, h, w) and integer y (n,), optional X_test, y_test."""
    if not path.is_file():
        raise DataMissing(f"no such .npz file: {path}")
    if path.stat().st_size > MAX_NPZ_BYTES:
        raise BadInput(f"{path} is {path.stat().st_size / 2**20:.0f} MB; the limit is "
                       f"{MAX_NPZ_BYTES // 2**20} MB")
    try:
        with np.load(path, allow_pickle=False) as f:
            a = {key: f[key] for key in ("X", "y", "X_test", "y_test") if key in f.files}
            keys = f.files
    except Exception as e:  # not a zip, pickled objects, truncated member, ...
        why = (str(e).splitlines() or [""])[0]
        raise DataCorrupt(f"{path} cannot be read as plain numeric arrays ({why}); "
                          "save X and y with numpy.savez") from e
    if "X" not in a or "y" not in a or (("X_test" in a) != ("y_test" in a)):
        raise BadInput(f"{path} needs arrays X and y (and optionally both X_test and y_test); "
                       f"it holds {', '.join(keys) or 'nothing'}")
    X, y = a["X"], a["y"]
    X_test, y_test = a.get("X_test", X[:0]), a.get("y_test", y[:0])
    for nm, v in (("X", X), ("X_test", X_test)):
        if v.dtype.kind not in "iuf" or v.ndim not in (2, 3, 4) or v.shape[1:] != X.shape[1:]:
            raise BadInput(f"{path}: {nm} must be numeric with shape (n, d), (n, h, w) or "
                           f"(n, c, h, w) matching X; got {v.dtype} {v.shape}")
    for nm, v, ref in (("y", y, X), ("y_test", y_test, X_test)):
        if v.dtype.kind not in "iu" or v.shape != (len(ref),):
            raise BadInput(f"{path}: {nm} must be integer labels of shape ({len(ref)},); "
                           f"got {v.dtype} {v.shape}")
    if not (np.isfinite(X).all() and np.isfinite(X_test).all()):
        raise BadInput(f"{path}: X holds NaN or infinite values")
    classes = np.unique(np.concatenate([y, y_test]))
    if len(classes) < 2:
        raise BadInput(f"{path}: labels must cover at least 2 classes; found {classes.tolist()}")
    d = int(np.prod(X.shape[1:]))
    both = np.concatenate([X.reshape(len(X), d), X_test.reshape(len(X_test), d)])
    if X.dtype == np.uint8 or (X.dtype.kind in "iu" and both.min() >= 0 and 1 < both.max() <= 255):
        both = both / 255.0  # 0-255 grey levels
    both = both.astype(np.float64)
    Xall, Tall = both[:len(X)], both[len(X):]
    if "X_test" in a:
        i = _take(np.arange(len(X)), spec.n, spec.seed, 0, "n", f"X of {path.name}")
        j = _take(np.arange(len(X_test)), spec.n_test, spec.seed, 1, "n_test",
                  f"X_test of {path.name}")
    else:  # hold out a seeded, disjoint test part
        if spec.n_test > len(X) - 2:
            raise BadInput(f"n_test={spec.n_test} leaves fewer than 2 of the {len(X)} rows of "
                           f"{path.name} for training; the maximum is {len(X) - 2}")
        perm = np.random.default_rng([spec.seed, 3]).permutation(len(X))
        i = _take(perm[spec.n_test:], spec.n, spec.seed, 0, "n",
                  f"{path.name} after holding out n_test={spec.n_test}")
        j = _take(perm[:spec.n_test], spec.n_test, spec.seed, 1, "n_test", path.name)
        Tall, y_test = Xall, y
    shape = None if X.ndim == 2 else ((1,) + X.shape[1:] if X.ndim == 3 else X.shape[1:])
    box = (0.0, 1.0) if both.min() >= 0 and both.max() <= 1 else None

    def lab(v: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.searchsorted(classes, v).astype(np.int64))

    return Sample(torch.from_numpy(Xall[i]), lab(y[i]), torch.from_numpy(Tall[j]), lab(y_test[j]),
                  tuple(str(c) for c in classes.tolist()),
                  None if shape is None else tuple(int(s) for s in shape), box,
                  str(path.resolve()), spec)


def store_npz(blob: bytes, name: str, folder: str | os.PathLike) -> Path:
    """Save an uploaded ``.npz`` under ``folder`` by content hash and check it loads.

    The file name carries the SHA-256 of the bytes, so the path (which is part of every
    cache key) changes whenever the content does. A file that fails the checks of
    ``load_sample`` is removed again and the error (BadInput / DataCorrupt) propagates.
    """
    import hashlib

    if len(blob) > MAX_NPZ_BYTES:
        raise BadInput(f"{name} is {len(blob) / 2**20:.0f} MB; the limit is {MAX_NPZ_BYTES // 2**20} MB")
    stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in Path(name).stem)[:40] or "data"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}-{hashlib.sha256(blob).hexdigest()[:16]}.npz"
    if not path.exists():
        tmp = path.with_suffix(".part")
        tmp.write_bytes(blob)
        tmp.replace(path)
    try:
        _npz(DataSpec(str(path), n=2, n_test=1), path)
    except Exception:
        path.unlink(missing_ok=True)
        raise
    return path
