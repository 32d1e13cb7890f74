"""How much memory a run may take: the host's free memory under this process's cgroup limit,
and on CUDA the GPU's free memory plus what torch's allocator holds unused. ``budget`` reads
these for every run's ``Budget`` and re-exports them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: reading the host's memory loads no torch
    import torch

    Device = str | torch.device | None

GIB = 2**30


def available_bytes() -> int:
    """Host memory this process may use: MemAvailable from /proc/meminfo (else physical
    memory), and no more than what is left under the cgroup's limit (a container run with
    ``docker run --memory``, whose /proc/meminfo still shows the whole host)."""
    host = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if host is None:
        try:
            host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            host = 8 * GIB
    limited = cgroup_free_bytes()
    return host if limited is None else min(host, limited)


_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2^63


def _cgroup_paths(proc_cgroup: str) -> tuple[str, str]:
    """This process's cgroup v2 path and v1 memory-controller path from /proc/self/cgroup
    ("/" inside a container with its own cgroup namespace, or where the file is missing)."""
    v2 = v1 = "/"
    try:
        with open(proc_cgroup) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    v2 = path or "/"
                elif "memory" in controllers.split(","):
                    v1 = path or "/"
    except (OSError, ValueError):
        pass
    return v2, v1


def cgroup_free_bytes(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """Bytes left under this process's cgroup memory limit, reclaimable page cache (inactive
    files) counted as free; None where no limit is set or none can be read. cgroup v2:
    ``memory.max`` − ``memory.current``; v1: ``memory/memory.limit_in_bytes`` −
    ``memory/memory.usage_in_bytes``; in the process's own cgroup (``proc_cgroup``), else at
    the root."""
    v2, v1 = _cgroup_paths(proc_cgroup)
    layouts = ((os.path.join(root, v2.lstrip("/")), root, "memory.max", "memory.current", "inactive_file"),
               (os.path.join(root, "memory", v1.lstrip("/")), os.path.join(root, "memory"),
                "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    for own, top, limit_name, usage_name, cache_key in layouts:
        base = own if os.path.exists(os.path.join(own, limit_name)) else top  # a host's view: the root's
        limit_file, usage_file, stat_file = (os.path.join(base, f) for f in (limit_name, usage_name, "memory.stat"))
        try:
            with open(limit_file) as f:
                text = f.read().strip()
            if text == "max" or int(text) >= _NO_LIMIT:
                continue
            with open(usage_file) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        cache = 0
        try:
            with open(stat_file) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == cache_key:
                        cache = int(value)
                        break
        except (OSError, ValueError):
            pass
        return max(0, int(text) - used + cache)
    return None


def free_bytes(device: Device = None) -> int:
    """Memory a new allocation may take on ``device`` (a torch.device, a name, or None for
    the host): on CUDA the GPU's free memory plus what torch's allocator holds unused,
    else ``available_bytes``."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        dev = torch.device(device)
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    return available_bytes()


# glibc's malloc, as the engine's entry points set it (``keep_freed_blocks``): blocks up to MMAP_MAX_BYTES come
# from the heap, and up to TRIM_KEEP_BYTES of freed heap stay with the process.
MALLOC_ENV = "ENGINE_MALLOC_KEEP"  # 0, false, off or no leave glibc's defaults; 1, true, on or yes (or unset) tune
MALLOC_ON, MALLOC_OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
MMAP_MAX_BYTES = 32 * 2**20        # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
TRIM_KEEP_BYTES = 512 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_warned: list[str] = []  # the unknown values already warned about (once per process)


def malloc_keep_wanted() -> bool:
    """Whether ``$ENGINE_MALLOC_KEEP`` asks for the tuning: on when unset or empty, or one of
    ``MALLOC_ON``; off for one of ``MALLOC_OFF`` (any case). Any other value warns once, in one
    line naming it and what is allowed, and keeps the default (on)."""
    raw = os.environ.get(MALLOC_ENV, "")
    value = raw.strip().lower()
    if value in MALLOC_OFF:
        return False
    if value and value not in MALLOC_ON and raw not in _warned:
        _warned.append(raw)
        import warnings

        shown = " ".join(raw.split())[:60]
        warnings.warn(f"{MALLOC_ENV}={shown!r} is not understood; allowed: {', '.join(MALLOC_ON)} (keep freed "
                      f"blocks, the default) or {', '.join(MALLOC_OFF)} (glibc's defaults); keeping freed blocks",
                      RuntimeWarning, stacklevel=3)
    return True


def keep_freed_blocks() -> bool:
    """Let glibc reuse freed blocks of up to 32 MiB instead of returning them to the OS.

    By default glibc maps each block over its (adaptive) threshold afresh and unmaps it when freed,
    so a step that allocates a 6 MB activation faults its pages in again every time. Measured on a
    2-core Zen 4 VM: ``torch.relu`` of 1.6 M floats took 1.2 ms with one thread and 5.4 ms with two
    (their page faults contend), 0.17 ms into a reused buffer; the ``scaling`` quick preset went
    from 12.8 s to 7.7 s (benchmarks/RESULTS.md, "Freed blocks kept"). The cost: up to
    ``TRIM_KEEP_BYTES`` of freed memory stays with the process. It changes the whole process's
    allocator, so ``import engine`` never calls it: the entry points that run experiments do (the
    CLI's ``main``, the dashboard's ``app.py``, the grid's worker processes).
    ``$ENGINE_MALLOC_KEEP`` (``malloc_keep_wanted``) turns it off. Returns whether it was set
    (False when turned off, and off glibc)."""
    if not malloc_keep_wanted():
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_MAX_BYTES)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_KEEP_BYTES))
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator as it is
        return False
