"""GEMM rates of torch and numpy on a given thread count, and this machine's calibration of the
one to the other on disk.

``engine.runtime.speed`` turns a GEMM rate into the speed factor. Runs compute with torch, but
loading torch costs an ``--estimate`` 2-4 s, so it times numpy's GEMM there and converts it by
the ratio of numpy's rate to torch's measured on this machine: a JSON file under the user cache
folder (``calibration_path``), keyed by the CPU model and the versions of Python, torch, numpy and
numpy's BLAS (a file per key, so machines sharing a home keep their own), written atomically.
A damaged or foreign file is ignored with a one-line ``CacheWarning`` naming it.

The record::

    {"format": 1, "key": {...},
     "numpy_over_torch": {"<threads>": {"ratio": numpy's rate / torch's, "written": unix time}},
     "import_cpu_s": {"torch": s, "pandas": s, "torchvision": s}}   # measured where torch was loaded for a timing
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import BadInput, CacheWarning

CALIBRATION_FORMAT = 1
IMPORT_NAMES = ("torch", "pandas", "torchvision")  # the parts of a fresh run's imports a calibration may time
SPEED_TIME_S = 0.2        # a GEMM repeats for this long: its mean rate, with what other work takes from it
SPEED_MIN_REPEATS = 3     # ... and at least this often
_calibration: dict[str, Any] = {}  # the record last read or written in this process


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def calibration_key() -> dict[str, str]:
    """What a calibration holds for: the CPU model and the library versions (torch's read from its
    package metadata, without importing it)."""
    import importlib.metadata

    import numpy as np

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        blas_name = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        blas_name = "unknown"
    return {"cpu": cpu_model(), "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch_version, "numpy": np.__version__, "numpy_blas": blas_name}


def calibration_path(key: dict[str, str] | None = None) -> Path | None:
    """``($XDG_CACHE_HOME or ~/.cache)/influence-malleability/speed/calibration-<hash of key>.json``;
    None where there is no home folder."""
    from ..data.folders import user_cache_dir

    key = calibration_key() if key is None else key
    try:
        root = user_cache_dir().parent / "speed"
    except BadInput:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"calibration-{digest}.json"


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _damage(record: Any, key: dict[str, str]) -> str | None:
    """Why ``record`` is no calibration for ``key``; None when it is one."""
    if not isinstance(record, dict) or record.get("format") != CALIBRATION_FORMAT:
        return "not a speed calibration of this engine"
    theirs = record.get("key")
    if theirs != key:
        other = [f"{k} {theirs.get(k)!r}" for k in key if theirs.get(k) != key[k]] if isinstance(theirs, dict) else []
        return "for another machine or library (" + (", ".join(other) or "no key") + ")"
    ratios, imports = record.get("numpy_over_torch"), record.get("import_cpu_s", {})
    if not (isinstance(ratios, dict) and all(k.isdigit() and isinstance(v, dict) and _positive(v.get("ratio"))
                                             and _positive(v.get("written")) for k, v in ratios.items())):
        return "damaged (numpy_over_torch)"
    if not (isinstance(imports, dict) and all(k in IMPORT_NAMES and _positive(v) for k, v in imports.items())):
        return "damaged (import_cpu_s)"
    idle = record.get("idle_torch_gflops", {})
    if not (isinstance(idle, dict) and all(k.isdigit() and _positive(v) for k, v in idle.items())):
        return "damaged (idle_torch_gflops)"
    return None


def read_calibration(path: Path | None = None, key: dict[str, str] | None = None) -> dict | None:
    """The calibration at ``path`` (default ``calibration_path(key)``) when it holds for ``key``
    (default this machine's); None where there is none. A damaged or foreign file is ignored
    with a one-line ``CacheWarning`` naming it."""
    key = calibration_key() if key is None else key
    path = calibration_path(key) if path is None else path
    _calibration.clear()
    if path is None or not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        why = _damage(record, key)
    except (OSError, ValueError) as exc:
        why = f"unreadable ({type(exc).__name__})"
    if why:
        warnings.warn(f"speed calibration {path} is {why}; ignored", CacheWarning, stacklevel=2)
        return None
    _calibration.update(record)
    return record


def write_calibration(path: Path, record: dict) -> None:
    """Replace ``path`` by ``record`` atomically (a temporary file renamed over it); a folder
    that cannot be written leaves the calibration unwritten (the next estimate loads torch)."""
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    _calibration.clear()
    _calibration.update(record)


def torch_default_threads() -> int:
    """The threads torch starts with, without loading it: ``$MKL_NUM_THREADS``, else
    ``$OMP_NUM_THREADS``, else the machine's physical cores (torch's intra-op default)."""
    for var in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    cores: set[tuple[str, str]] = set()
    processors = 0
    with contextlib.suppress(OSError):
        physical = core = ""
        for line in Path("/proc/cpuinfo").read_text().splitlines() + [""]:
            name, _, value = (s.strip() for s in line.partition(":"))
            if name == "processor":
                processors += 1
            elif name == "physical id":
                physical = value
            elif name == "core id":
                core = value
            elif not line.strip() and core:
                cores.add((physical, core))
                physical = core = ""
    if cores and len(cores) < processors:
        return len(cores)
    return processors or os.cpu_count() or 1


def _rate(matmul: Callable[[Any, Any], Any], a: Any, b: Any, n: int) -> float:
    """FLOP/s of ``matmul(a, b)`` over ``SPEED_TIME_S`` (after one warm-up for the thread pool)."""
    matmul(a, b)
    count, t0 = 0, time.perf_counter()
    while True:
        matmul(a, b)
        count += 1
        elapsed = time.perf_counter() - t0
        if count >= SPEED_MIN_REPEATS and elapsed >= SPEED_TIME_S:
            return 2.0 * n ** 3 * count / max(elapsed, 1e-9)


def torch_rate(n: int, threads: int) -> float:
    import torch

    from .cores import limit_own_threads, restore_own_threads

    g = torch.Generator().manual_seed(0)  # not the global generator: a seeded run's draws stay its own
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    saved = limit_own_threads(threads)
    try:
        return _rate(torch.matmul, a, b, n)
    finally:
        restore_own_threads(saved)


@contextlib.contextmanager
def _numpy_threads(threads: int) -> Iterator[None]:
    """numpy's own BLAS on ``threads`` threads (threadpoolctl; scipy's, which K∞ limits under its
    own lock, is left alone where numpy's can be told apart)."""
    import numpy as np
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    own = os.path.dirname(np.__file__)  # numpy/ and the wheel's numpy.libs/
    paths = [lib["filepath"] for lib in controller.info() if str(lib.get("filepath", "")).startswith(own)]
    chosen = controller.select(filepath=paths) if paths else controller.select(user_api="blas")
    with chosen.limit(limits=threads):
        yield


def numpy_rate(n: int, threads: int) -> float:
    import numpy as np

    g = np.random.default_rng(0)
    a, b = (g.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    with _numpy_threads(threads):
        return _rate(np.matmul, a, b, n)


def last_calibration() -> dict[str, Any]:
    """The calibration record last read or written in this process ({} before one)."""
    return dict(_calibration)
