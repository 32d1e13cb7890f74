"""The two entry points that dispatch on ``spec.dataset``: ``load_sample`` draws the data,
``data_fingerprint`` says which bytes it would draw from."""

from __future__ import annotations

import hashlib
import os

from .folders import file_sha256, regular_file
from .images import image_files, load_images
from .npz import load_npz
from .spec import DATASETS, DataSpec, Sample, parse_dataset
from .synthetic import load_synthetic


def load_sample(spec: DataSpec, data_dir: str | os.PathLike | None = None,
                allow_download: bool = True) -> Sample:
    """Draw the sample `spec` describes; same spec -> identical tensors.

    Train points come from the train split, test points from the test split (for a user
    .npz without ``X_test``, from a disjoint seeded hold-out). Within the chosen classes each
    split is permuted with ``numpy.random.default_rng([seed, stream])`` and the first n /
    n_test are taken, so a larger n extends a smaller draw. Labels are remapped to 0..c-1
    (a pair a-b: a -> 0, b -> 1). Raises BadInput, DataMissing or DataCorrupt (one line each).
    """
    base, pair = parse_dataset(spec.dataset)
    if base == "synthetic":
        return load_synthetic(spec, pair)
    if base not in DATASETS:
        return load_npz(spec, regular_file(base, ".npz file"))
    return load_images(spec, base, pair, data_dir, allow_download)


def data_fingerprint(spec: DataSpec, data_dir: str | os.PathLike | None = None,
                     allow_download: bool = True) -> str:
    """A content fingerprint (SHA-256 hex) of the data `spec` reads, for cache keys that must
    change when the data do.

    Image sets: over the bytes of the files ``load_sample(spec, data_dir, allow_download)``
    reads (the four IDX files, or the CIFAR-10 batches), in the folder it would read them
    from; a system package's copy is unpacked first, as ``load_sample`` would. Independent of
    the folder's name: the same files elsewhere give the same fingerprint. A user .npz: the
    SHA-256 of the file's bytes. Synthetic: ``"synthetic"`` (made by code, which the code
    fingerprint covers). File hashes are memoised per (path, size, mtime_ns, inode), so asking
    again costs a few ``stat`` calls. Raises BadInput / DataMissing as ``load_sample`` would;
    pass ``allow_download=False`` for a look-up that must not try the network.
    """
    base, _ = parse_dataset(spec.dataset)
    if base == "synthetic":
        return "synthetic"
    if base not in DATASETS:
        return file_sha256(regular_file(base, ".npz file"))
    h = hashlib.sha256(base.encode())
    for f in image_files(base, data_dir, allow_download):
        h.update(f"\0{f.name}\0{file_sha256(f)}".encode())
    return h.hexdigest()
