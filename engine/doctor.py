"""What this machine offers the engine: torch's build, the device it computes on, its memory,
and the time of two small kernels (``malleability doctor``, e.g. inside the container).

The timings are a sanity check ("does torch really use the GPU, and is it fast"), not a
benchmark: ``engine bench`` measures speed figures properly. Both kernels run once to warm
up (CUDA context, cuBLAS handles, allocator) and are then timed as the median of a few runs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable

from .runtime import budget as B
from .runtime.errors import BadInput, EngineError
from .runtime.speed import SPEED_GEMM_FLOPS

if TYPE_CHECKING:  # torch is imported when the report runs, not for the CLI's --help
    import torch

# Least Linux driver per CUDA major version (minor-version compatibility; NVIDIA's CUDA
# compatibility guide): torch 2.14.1's default wheel bundles the CUDA 13.0 runtime.
CUDA_DRIVER = {"13": 580, "12": 525, "11": 450}
NVIDIA_PROC = "/proc/driver/nvidia/version"  # present where the host driver is visible (a GPU container)
GPU_HINT = ("this torch is built for CUDA {cuda} but sees no GPU; to use one, the host needs an NVIDIA driver "
            ">= {driver} and a container needs the GPU passed in (docker run --gpus all with the NVIDIA Container Toolkit; "
            "podman run --device nvidia.com/gpu=all with CDI)")


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn()`` after one warm-up call, synchronising CUDA around each run."""
    import torch

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    once()
    return statistics.median(once() for _ in range(repeats))


def _memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes: the GPU's; on CPU what this process may still use (a container's
    cgroup limit counted, as the budgets count it) and the host's physical memory."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    return B.available_bytes(), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _driver() -> str | None:
    """The kernel driver's version line where the host exposes it, else None."""
    try:
        with open(NVIDIA_PROC) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def report(device: str | torch.device = "auto", n: int = 256, d: int = 64, width: int = 1024,
           gemm: int | None = None, repeats: int = 3) -> dict:
    """torch's build and the device, its memory, and the timing of one empirical NTK and one GEMM.

    device: as ``engine.runtime.device.resolve_device`` (auto, cpu, cuda). The NTK is
    ``empirical_ntk`` of an MLP-Attn ``Net`` (linear attention, float32 features) of width
    ``width`` on n random points of dimension d: an (n, n) float64 kernel; the GEMM is one
    float32 (gemm, gemm) @ (gemm, gemm) product (default 1024 on CPU, 4096 on CUDA), whose
    rate is also given against that of a machine where the run-time estimates hold
    (``engine.runtime.speed.SPEED_GEMM_FLOPS``, the speed factor's reference). Returns a
    JSON-able dict; ``hint`` says what to fix when a CUDA build sees no GPU (None otherwise).
    """
    for name, value, least in (("n", n, 2), ("d", d, 1), ("width", width, 1), ("repeats", repeats, 1)):
        if not isinstance(value, int) or value < least:
            raise BadInput(f"doctor: {name} must be an integer >= {least}, got {value!r}")
    import torch

    from .maths.models import Net
    from .maths.ntk import empirical_ntk
    from .runtime.device import resolve_device

    dev = resolve_device(device)
    size = gemm if gemm is not None else (4096 if dev.type == "cuda" else 1024)
    if not isinstance(size, int) or size < 1:
        raise BadInput(f"doctor: gemm must be an integer >= 1, got {gemm!r}")
    cuda = torch.version.cuda
    out = {
        "torch": torch.__version__,
        "cuda_build": cuda,                              # None for a CPU-only wheel
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "driver": _driver(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
    }
    out["memory_free_bytes"], out["memory_total_bytes"] = _memory(dev)

    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g).to(dev)
    net = Net("attn", X, width, n_out=10, seed=0).to(dev)
    K = empirical_ntk(net, X)
    out["ntk"] = {"n": n, "d": d, "width": width, "arch": "attn", "attention": net.attention,
                  "seconds": _median_seconds(lambda: empirical_ntk(net, X), dev, repeats),
                  "finite": bool(torch.isfinite(K).all()), "symmetric": bool(torch.equal(K, K.T))}

    A = torch.randn(size, size, generator=g).to(dev)
    Bm = torch.randn(size, size, generator=g).to(dev)
    seconds = _median_seconds(lambda: A @ Bm, dev, repeats)
    flops = 2.0 * size ** 3 / max(seconds, 1e-9)
    out["gemm"] = {"size": size, "dtype": "float32", "seconds": seconds, "gflops": flops / 1e9,
                   "vs_reference_cpu": flops / SPEED_GEMM_FLOPS,
                   "matmul_precision": torch.get_float32_matmul_precision()}
    out["hint"] = (GPU_HINT.format(cuda=cuda, driver=CUDA_DRIVER.get(cuda.split(".")[0], "?"))
                   if cuda and not torch.cuda.is_available() else None)
    return out


def describe(r: dict) -> str:
    """The report as a few human lines (what ``malleability doctor`` prints without --json)."""
    gib = 2.0 ** 30
    lines = [f"torch {r['torch']} (CUDA build: {r['cuda_build'] or 'none, CPU only'}); "
             f"CUDA available: {'yes' if r['cuda_available'] else 'no'}"
             + (f", {r['cuda_devices']} device(s)" if r["cuda_available"] else ""),
             f"device: {r['device']} ({r['device_name']}), {r['threads']} CPU threads; memory "
             f"{r['memory_free_bytes'] / gib:.1f} GiB free of {r['memory_total_bytes'] / gib:.1f} GiB"]
    if r["driver"]:
        lines.append(f"driver: {r['driver']}")
    k, m = r["ntk"], r["gemm"]
    lines.append(f"empirical NTK, {k['n']} x {k['n']} at width {k['width']} ({k['arch']}, {k['attention']}): "
                 f"{k['seconds'] * 1e3:.1f} ms" + ("" if k["finite"] and k["symmetric"] else " — NOT finite/symmetric"))
    lines.append(f"GEMM float32 {m['size']}^3: {m['seconds'] * 1e3:.1f} ms, {m['gflops']:.0f} GFLOP/s "
                 f"({m['vs_reference_cpu']:.1f}x the reference 2-core CPU of the estimates; "
                 f"matmul precision {m['matmul_precision']})")
    if r["hint"]:
        lines.append(f"hint: {r['hint']}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    """The CLI's ``doctor`` sub-command (``sub``: the CLI's ``add_subparsers`` object)."""
    p = sub.add_parser("doctor", help="what torch sees here (device, memory) and the time of two small kernels",
                       description="Print torch's build, whether it sees a CUDA GPU, the device's name and free "
                                   "memory, and the time of one empirical NTK and one float32 GEMM on it; inside "
                                   "the container this is how to check that the GPU arrived. Exit codes: 0 ok, "
                                   "2 --device cuda without a visible GPU.")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the kernels run (default: auto, the GPU when torch sees one)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def command(a) -> int:
    """Run ``doctor`` for parsed arguments ``a``: the report on stdout, an error on stderr."""
    try:
        r = report(a.device)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(r, allow_nan=False) if a.json else describe(r))
    return 0
