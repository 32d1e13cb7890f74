"""User data from a ``.npz`` file: X (n, d | n, h, w | n, c, h, w), integer y (n,), and
optionally X_test, y_test.

Uploaded files are untrusted: before any array is read, the zip's declared sizes and each
member's ``.npy`` header (shape, dtype) are checked against ``MAX_NPZ_BYTES``, so a small
file that unpacks to gigabytes (a zip bomb) is refused without being unpacked. Every problem
with the arrays is one line of BadInput or DataCorrupt, never a traceback.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import zipfile
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np
import numpy.lib.format as npy

from ..runtime.errors import BadInput, DataCorrupt
from .folders import regular_file
from .spec import DataSpec, Sample, draw

if TYPE_CHECKING:  # checking sizes loads no torch (the disk cache does it for every entry it reads)
    import torch

MAX_NPZ_BYTES = 200 * 2**20  # the file itself, and all its arrays once unpacked
MAX_ABS_VALUE = 1e100  # larger inputs overflow float64 Grams (x·x ~ 1e200 * d) or their kernels


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MB" if nbytes >= 2**20 else f"{nbytes:,} bytes"


def check_npz_sizes(source: str | os.PathLike | IO[bytes], name: str, limit: int = MAX_NPZ_BYTES) -> dict[str, tuple]:
    """Declared (shape, dtype) of each ``.npy`` member of an .npz, read from headers only.

    Raises BadInput (naming the member, its size and the limit) when a member or all of them
    would unpack to more than ``limit`` bytes (default ``MAX_NPZ_BYTES``; the disk cache passes
    an entry's own size), and DataCorrupt when the file is not a zip of plain numeric .npy
    arrays. Reads no array data.
    """
    try:
        zf = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as e:
        raise DataCorrupt(f"{name} cannot be read as plain numeric arrays (not a zip file: {e}); "
                          "save X and y with numpy.savez") from e
    allowed = f"the limit is {_mb(limit)} uncompressed"
    out = {}
    with zf:
        infos = zf.infolist()
        for info in infos:
            if info.file_size > limit:
                raise BadInput(f"{name}: member {info.filename} unpacks to {_mb(info.file_size)}; "
                               f"{allowed}")
        if sum(i.file_size for i in infos) > limit:
            raise BadInput(f"{name}: its members unpack to {_mb(sum(i.file_size for i in infos))} "
                           f"in all; {allowed}")
        for info in (i for i in infos if i.filename.endswith(".npy")):
            try:
                with zf.open(info) as f:
                    version = npy.read_magic(f)
                    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read(f)
            except Exception as e:  # bad magic, truncated or unparsable header, bad CRC, ...
                why = (str(e).splitlines() or [""])[0]
                raise DataCorrupt(f"{name}: member {info.filename} is not a valid .npy array "
                                  f"({why}); save X and y with numpy.savez") from e
            if dtype.hasobject:
                raise DataCorrupt(f"{name}: member {info.filename} holds Python objects, not plain "
                                  "numeric arrays; save X and y with numpy.savez")
            if any(s < 0 for s in shape):
                raise DataCorrupt(f"{name}: member {info.filename} declares the shape {shape}")
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > limit:
                raise BadInput(f"{name}: member {info.filename} declares {dtype} {shape}, "
                               f"{_mb(nbytes)} unpacked; {allowed}")
            out[info.filename[:-4]] = (tuple(shape), dtype)
        total = sum(math.prod(s) * t.itemsize for s, t in out.values())
        if total > limit:
            raise BadInput(f"{name}: its arrays declare {_mb(total)} in all; {allowed}")
    return out


def _read(path: Path) -> dict[str, np.ndarray]:
    """The arrays X, y and (if present) X_test, y_test, after the size checks."""
    path = regular_file(path, ".npz file")  # a FIFO would block np.load
    if path.stat().st_size > MAX_NPZ_BYTES:
        raise BadInput(f"{path} is {_mb(path.stat().st_size)}; the limit is {_mb(MAX_NPZ_BYTES)}")
    declared = check_npz_sizes(path, str(path))
    try:
        with np.load(path, allow_pickle=False) as f:
            a = {key: f[key] for key in ("X", "y", "X_test", "y_test") if key in f.files}
    except Exception as e:  # truncated member, bad CRC, ...
        why = (str(e).splitlines() or [""])[0]
        raise DataCorrupt(f"{path} cannot be read as plain numeric arrays ({why}); "
                          "save X and y with numpy.savez") from e
    if "X" not in a or "y" not in a or (("X_test" in a) != ("y_test" in a)):
        raise BadInput(f"{path} needs arrays X and y (and optionally both X_test and y_test); "
                       f"it holds {', '.join(declared) or 'nothing'}")
    return a


def _check(where: str, X, y, X_test, y_test) -> None:
    """One-line BadInput for arrays the engine cannot use."""
    for nm, v in (("X", X), ("X_test", X_test)):
        if v.dtype.kind not in "iuf" or v.ndim not in (2, 3, 4) or v.shape[1:] != X.shape[1:]:
            raise BadInput(f"{where}: {nm} must be numeric with shape (n, d), (n, h, w) or "
                           f"(n, c, h, w) matching X; got {v.dtype} {v.shape}")
    if math.prod(X.shape[1:]) == 0:
        raise BadInput(f"{where}: X has no features (shape {X.shape}); each row needs at least "
                       "one value")
    for nm, v, ref, rn in (("y", y, X, "X"), ("y_test", y_test, X_test, "X_test")):
        if v.dtype.kind not in "iu":
            raise BadInput(f"{where}: {nm} must be integer labels (class numbers); got {v.dtype}")
        if v.shape != (len(ref),):
            raise BadInput(f"{where}: {nm} must be one label per row of {rn}, shape "
                           f"({len(ref)},); got {v.shape}")
    for nm, v in (("X", X), ("X_test", X_test)):
        if v.dtype.kind == "f" and v.size:
            if not np.isfinite(v).all():
                raise BadInput(f"{where}: {nm} holds NaN or infinite values")
            top = float(np.abs(v).max())
            if top > MAX_ABS_VALUE:
                raise BadInput(f"{where}: {nm} holds values up to {top:.3g} in magnitude; the "
                               f"limit is {MAX_ABS_VALUE:g}, beyond which Gram matrices overflow")


def load_npz(spec: DataSpec, path: Path) -> Sample:
    """Draw from a user .npz: train rows from X, test rows from X_test, or, without X_test,
    from a seeded hold-out of X disjoint from the training rows. Integer grey levels 0-255
    are scaled to [0, 1]; labels are mapped to 0..c-1 in sorted order."""
    import torch

    a = _read(path)
    X, y = a["X"], a["y"]
    X_test, y_test = a.get("X_test", X[:0]), a.get("y_test", y[:0])
    _check(str(path), X, y, X_test, y_test)
    classes = np.unique(np.concatenate([y, y_test]))
    if len(classes) < 2:
        raise BadInput(f"{path}: labels must cover at least 2 classes; found {classes.tolist()}")
    d = math.prod(X.shape[1:])
    both = np.concatenate([X.reshape(len(X), d), X_test.reshape(len(X_test), d)])
    if X.dtype == np.uint8 or (X.dtype.kind in "iu" and both.min() >= 0 and 1 < both.max() <= 255):
        both = both / 255.0  # 0-255 grey levels
    both = both.astype(np.float64)
    Xall, Tall = both[:len(X)], both[len(X):]
    if "X_test" in a:
        i = draw(np.arange(len(X)), spec.n, spec.seed, 0, "n", f"X of {path.name}")
        j = draw(np.arange(len(X_test)), spec.n_test, spec.seed, 1, "n_test",
                 f"X_test of {path.name}")
    else:  # hold out a seeded, disjoint test part
        if spec.n_test > len(X) - 2:
            raise BadInput(f"n_test={spec.n_test} leaves fewer than 2 of the {len(X)} rows of "
                           f"{path.name} for training; the maximum is {max(len(X) - 2, 0)}")
        perm = np.random.default_rng([spec.seed, 3]).permutation(len(X))
        i = draw(perm[spec.n_test:], spec.n, spec.seed, 0, "n",
                 f"{path.name} after holding out n_test={spec.n_test}")
        j = draw(perm[:spec.n_test], spec.n_test, spec.seed, 1, "n_test", path.name)
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
    cache key) changes whenever the content does. Sizes are checked before anything is
    written (``check_npz_sizes``); a file that fails the checks of ``load_sample`` is removed
    again and the error (BadInput / DataCorrupt) propagates.
    """
    if len(blob) > MAX_NPZ_BYTES:
        raise BadInput(f"{name} is {_mb(len(blob))}; the limit is {_mb(MAX_NPZ_BYTES)}")
    check_npz_sizes(io.BytesIO(blob), name)
    stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in Path(name).stem)[:40] or "data"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}-{hashlib.sha256(blob).hexdigest()[:16]}.npz"
    if not path.exists():
        tmp = path.with_suffix(".part")
        tmp.write_bytes(blob)
        tmp.replace(path)
    try:
        load_npz(DataSpec(str(path), n=2, n_test=1), path)
    except Exception:
        path.unlink(missing_ok=True)
        raise
    return path
