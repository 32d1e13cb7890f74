"""Image data sets read through torchvision: MNIST, Fashion-MNIST, CIFAR-10.

``locate`` finds the folder holding a set's files: the data folder; else a system package's
copy (Debian's ``dataset-fashion-mnist``), unpacked into the data folder when it is writable
and into the engine's own folder otherwise; else a download where the network allows. A
failed unpack or download removes what it created. ``load_images`` decodes and draws.
"""

from __future__ import annotations

import functools
import gzip
import os
import pickle
import socket
import stat
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch

from ..runtime.errors import BadInput, DataCorrupt, DataMissing
from .folders import engine_data_dir, resolve_data_dir, undone_on_failure, writable
from .spec import CLASSES, DatasetInfo, DataSpec, Sample, draw, resolve_class

DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation; an offline machine fails at once anyway
SYSTEM_COPIES = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}  # Debian package
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
FILES = {"mnist": ("MNIST/raw", IDX), "fashion-mnist": ("FashionMNIST/raw", IDX),
         "cifar10": ("cifar-10-batches-py", CIFAR)}  # folder under the data dir, file names


def present(base: str, root: Path) -> bool:
    """Whether all of `base`'s files are under the data folder `root`."""
    folder, files = FILES[base]
    return all((root / folder / f).is_file() for f in files)


def image_files(base: str, data_dir=None, allow_download: bool = True) -> list[Path]:
    """The files ``load_images`` reads for `base`, in a fixed order (locating them first)."""
    folder, files = FILES[base]
    root = locate(base, resolve_data_dir(data_dir), allow_download) / folder
    return [root / f for f in files]


def locate(base: str, root: Path, allow_download: bool) -> Path:
    """The data folder holding `base`'s files: root, or the engine's folder for unpacked
    copies. Raises DataMissing (one line naming the files and folder) when there is none."""
    _refuse_odd_files(base, root)
    if present(base, root):
        return root
    unpacked = _unpack_system_copy(base, root)
    if unpacked is not None:
        return unpacked
    reason = "download not allowed"
    if allow_download and not writable(root):
        reason = f"cannot download into read-only {root}"
    elif allow_download:
        reason = _download(base, root)
        if present(base, root):
            return root
    folder, files = FILES[base]
    raise DataMissing(f"{base} not found: put {', '.join(files)} in {root / folder} (or point "
                      f"--data-dir / ENGINE_DATA_DIR at a folder holding {folder}); {reason}")


def _refuse_odd_files(base: str, root: Path) -> None:
    """DataCorrupt for one of `base`'s files that is there but is no regular file: reading a
    FIFO would wait for a writer forever, and a download would write through it."""
    folder, files = FILES[base]
    for f in files:
        try:
            st = os.stat(root / folder / f)
        except OSError:  # absent: found elsewhere, unpacked or downloaded
            continue
        if not stat.S_ISREG(st.st_mode):
            raise DataCorrupt(f"{root / folder / f} is not a regular file (a folder, FIFO or device); "
                              "replace it with the data file, or remove it to download again")


def _unpack_system_copy(base: str, root: Path) -> Path | None:
    """Un-gzip a system package's copy into root if writable, else into the engine's folder."""
    src = SYSTEM_COPIES.get(base)
    folder, files = FILES[base]
    if src is None or not all((src / f"{f}.gz").is_file() for f in files):
        return None
    for target in ([root] if writable(root) else []) + [engine_data_dir()]:
        if present(base, target):
            return target
        if not writable(target):
            continue
        try:
            with undone_on_failure(target / folder):
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


def tv_class(base: str):
    """torchvision's data set class for `base`."""
    import torchvision.datasets as tvd  # slow import, only needed for image files

    return {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10}[base]


def _download(base: str, root: Path) -> str:
    """Try torchvision's download; returns a one-line reason (empty on success)."""
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        with undone_on_failure(root, root / FILES[base][0]):  # archives land in root itself
            tv_class(base)(str(root), train=True, download=True)
            if not present(base, root):
                raise RuntimeError(f"files still missing from {root / FILES[base][0]}")
        return ""
    except Exception as e:  # any network, disk or checksum failure means "not available"
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        return f"download failed: {type(e).__name__}: {lines[-1]}"  # last line: the cause
    finally:
        socket.setdefaulttimeout(old)


def available_datasets(data_dir: str | os.PathLike | None = None) -> list[DatasetInfo]:
    """What `load_sample` could read from `data_dir` now, without downloading or writing."""
    root, own = resolve_data_dir(data_dir), engine_data_dir()
    out = []
    for base, (folder, files) in FILES.items():
        src = SYSTEM_COPIES.get(base)
        if present(base, root):
            out.append(DatasetInfo(base, True, str(root / folder), "files found"))
        elif src is not None and present(base, own):
            out.append(DatasetInfo(base, True, str(own / folder), f"unpacked earlier from {src}"))
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
    if base not in FILES:
        raise BadInput(f"nothing to fetch for {name!r}; data sets with files: {', '.join(FILES)}")
    return image_files(base, data_dir, allow_download=True)[0].parent


# ---------------------------------------------------------------- decoding and drawing

def load_images(spec: DataSpec, base: str, pair: tuple[str, str] | None, data_dir=None,
                allow_download: bool = True) -> Sample:
    """Draw ``spec.n`` / ``spec.n_test`` images of `base` (optionally the classes `pair`):
    pixels as float64 in [0, 1], C,H,W order, labels remapped to 0..c-1."""
    root = locate(base, resolve_data_dir(data_dir), allow_download)
    Xtr, ytr, names, shape = _decoded(base, str(root), True, _stamp(base, root))
    Xte, yte, _, _ = _decoded(base, str(root), False, _stamp(base, root))
    classes = (list(range(len(names))) if pair is None
               else [resolve_class(t, names, base) for t in pair])
    where = base if pair is None else f"{base} classes {pair[0]}, {pair[1]}"
    i = draw(np.flatnonzero(np.isin(ytr, classes)), spec.n, spec.seed, 0, "n",
             f"the train split of {where}")
    j = draw(np.flatnonzero(np.isin(yte, classes)), spec.n_test, spec.seed, 1, "n_test",
             f"the test split of {where}")
    lut = np.full(len(names), -1, dtype=np.int64)
    lut[classes] = np.arange(len(classes))
    return Sample(_pixels(Xtr[i]), torch.from_numpy(lut[ytr[i]]), _pixels(Xte[j]),
                  torch.from_numpy(lut[yte[j]]), tuple(names[c] for c in classes), shape,
                  (0.0, 1.0), str(root / FILES[base][0]), spec)


def _stamp(base: str, root: Path) -> tuple:
    # part of the in-process cache key, so replaced files are read again
    folder, files = FILES[base]
    return tuple((s.st_size, s.st_mtime_ns) for s in ((root / folder / f).stat() for f in files))


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's and Fashion-MNIST's format: a big-endian header of two
    zero bytes, the type 0x08, the number of dimensions, then each dimension as a 4-byte integer,
    then the values), as a read-only uint8 array of that shape. ``DataCorrupt`` naming the file where
    the header or the length is not that. torchvision's reader gives the same array
    (``tests/test_data.py``); this one skips importing torchvision (1.4 s on a 2-core CPU) for every run."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataCorrupt(f"{path} cannot be read ({e.strerror or type(e).__name__})") from e
    head = 4 + 4 * ndim
    if len(data) < head or data[:2] != b"\0\0" or data[2] != 0x08 or data[3] != ndim:
        raise DataCorrupt(f"{path} is not an IDX file of {ndim}-dimensional unsigned bytes")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    if len(data) - head != int(np.prod(shape)):
        raise DataCorrupt(f"{path} holds {len(data) - head} values; its header says {' x '.join(map(str, shape))}")
    return np.frombuffer(data, dtype=np.uint8, offset=head).reshape(shape)


@functools.lru_cache(maxsize=6)
def _decoded(base: str, root: str, train: bool, stamp: tuple):
    """One split: uint8 images (N, d) in C,H,W order, int64 labels (N,), class names, (C, H, W).

    Kept as uint8 (read-only arrays) so that a cached CIFAR-10 split costs 150 MB, not 1.2 GB.
    MNIST's and Fashion-MNIST's IDX files are read directly (``read_idx``); CIFAR-10 by torchvision."""
    if base != "cifar10":
        raw = Path(root) / FILES[base][0]
        split = "train" if train else "t10k"
        images = read_idx(raw / f"{split}-images-idx3-ubyte", 3)[:, None]
        labels, names = read_idx(raw / f"{split}-labels-idx1-ubyte", 1).astype(np.int64), CLASSES[base]
    else:
        try:
            ds = tv_class(base)(root, train=train, download=False)
            images, names = np.asarray(ds.data).transpose(0, 3, 1, 2), tuple(ds.classes)
            labels = np.asarray(ds.targets, dtype=np.int64)
        except Exception as e:
            raise _corrupt(base, Path(root), train, e) from e
    folder = Path(root) / FILES[base][0]
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
    folder = root / FILES[base][0]
    if base == "cifar10":
        from torchvision.datasets.utils import check_integrity

        tv = tv_class(base)
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

        for name in IDX[:2] if train else IDX[2:]:
            try:
                read_sn3_pascalvincent_tensor(str(folder / name))
            except Exception as e:
                return DataCorrupt(f"{folder / name} is not a valid IDX file (bad magic number "
                                   f"or truncated: {type(e).__name__}); replace it")
    msg = f"cannot read {base} from {folder}: {type(exc).__name__}: {exc}"
    return DataCorrupt(msg.splitlines()[0])


def _pixels(rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(rows.astype(np.float64) / 255.0)
