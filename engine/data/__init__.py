"""Data sets as float64 tensors: MNIST, Fashion-MNIST, CIFAR-10, a synthetic matrix of chosen
condition number, or a user ``.npz`` file.

A ``DataSpec`` fixes a draw; ``load_sample(spec)`` returns the same ``Sample`` for the same spec,
and ``data_fingerprint(spec)`` hashes the bytes it reads (for cache keys). Rows are samples:
``X`` is (n, d), images flattened in C, H, W order, pixels in [0, 1]. Rows are *not*
normalised here (``spec.normalize`` tells the models to do it).

Image files are read through torchvision from a data folder (``resolve_data_dir``): the
``--data-dir`` argument, else ``$ENGINE_DATA_DIR``, else the user cache folder. Debian's
``dataset-fashion-mnist`` package is used when present (unpacked into the data folder if it is
writable, else into ``engine_data_dir()``); anything else is downloaded where the network
allows, or a ``DataMissing`` error says which files to put where.

Modules: ``spec`` (DataSpec, Sample, names, the seeded draw), ``folders`` (data folders,
writability, file hashes), ``images``, ``synthetic``, ``npz`` (user files), ``load``
(``load_sample`` and ``data_fingerprint``, which dispatch on the data set).
"""

from .folders import engine_data_dir, file_sha256, resolve_data_dir, user_cache_dir, writable
from .images import (DOWNLOAD_TIMEOUT_S, SYSTEM_COPIES, available_datasets, fetch_dataset,
                     image_files)
from .load import data_fingerprint, load_sample
from .npz import MAX_ABS_VALUE, MAX_NPZ_BYTES, check_npz_sizes, store_npz
from .spec import DATASETS, DECAYS, DataSpec, DatasetInfo, Sample, draw, parse_dataset
from .synthetic import MAX_SYNTHETIC_ENTRIES

__all__ = [
    "available_datasets", "check_npz_sizes", "data_fingerprint", "DATASETS", "DatasetInfo",
    "DataSpec", "DECAYS", "DOWNLOAD_TIMEOUT_S", "draw", "engine_data_dir", "fetch_dataset",
    "file_sha256", "image_files", "load_sample", "MAX_ABS_VALUE", "MAX_NPZ_BYTES",
    "MAX_SYNTHETIC_ENTRIES", "parse_dataset", "resolve_data_dir", "Sample", "store_npz",
    "SYSTEM_COPIES", "user_cache_dir", "writable",
]
