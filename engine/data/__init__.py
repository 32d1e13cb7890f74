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

Public names are imported on first use (``engine._lazy``).
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "folders": ["engine_data_dir", "file_sha256", "resolve_data_dir", "user_cache_dir", "writable"],
    "images": ["DOWNLOAD_TIMEOUT_S", "SYSTEM_COPIES", "available_datasets", "fetch_dataset", "image_files"],
    "load": ["data_fingerprint", "load_sample"],
    "npz": ["MAX_ABS_VALUE", "MAX_NPZ_BYTES", "check_npz_sizes", "store_npz"],
    "spec": ["DATASETS", "DECAYS", "DataSpec", "DatasetInfo", "Sample", "draw", "parse_dataset"],
    "synthetic": ["MAX_SYNTHETIC_ENTRIES"],
})
