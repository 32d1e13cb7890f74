"""Where computations run: ``auto`` picks CUDA when present.

``resolve_device`` asks torch; ``device_type`` answers "cpu" without loading torch where no GPU
can be there (no GPU device node or driver), so that an estimate costs no torch import.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import TYPE_CHECKING

from .errors import BadInput

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")
# Where a GPU torch could use shows itself on Linux: the NVIDIA driver and its device nodes,
# WSL's GPU paravirtualisation, and ROCm's kernel driver (torch.cuda on AMD GPUs).
GPU_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")


def _cuda_missing(what: str) -> BadInput:
    return BadInput(f"device {what!r} requested but no CUDA GPU is visible; allowed here: auto, cpu")


def gpu_possible() -> bool:
    """False where torch certainly sees no GPU: ``CUDA_VISIBLE_DEVICES`` hides every device, or
    (Linux) none of ``GPU_PATHS`` exists. True means only that torch has to be asked."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    if not sys.platform.startswith("linux"):
        return True
    return any(glob.glob(p) for p in GPU_PATHS)


def device_type(name: str | torch.device = "auto") -> str:
    """``resolve_device(name).type`` ("cpu" or "cuda"), without importing torch where no GPU can
    be there (``gpu_possible``): then ``auto`` is the CPU and ``cuda`` is refused in the same
    one line as ``resolve_device``'s."""
    if not isinstance(name, str) or name not in DEVICES:
        return resolve_device(name).type  # a torch.device, or its one-line refusal
    if name == "cpu":
        return "cpu"
    if "torch" not in sys.modules and not gpu_possible():
        if name == "cuda":
            raise _cuda_missing(name)
        return "cpu"
    return resolve_device(name).type


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` to compute on.

    ``name``: one of ``DEVICES`` (``auto`` → cuda if available else cpu), or a
    ``torch.device`` of type cpu or cuda, returned as is. Asking for cuda without a GPU
    (or for a GPU index that does not exist) and any other value raise a one-line BadInput.
    """
    import torch

    if isinstance(name, torch.device):
        if name.type == "cpu":
            return name
        if name.type == "cuda":
            if not torch.cuda.is_available():
                raise _cuda_missing(str(name))
            if name.index is not None and name.index >= torch.cuda.device_count():
                raise BadInput(f"device {str(name)!r} does not exist; this machine has "
                               f"{torch.cuda.device_count()} CUDA GPU(s)")
            return name
        raise BadInput(f"unsupported device {str(name)!r}; allowed: {', '.join(DEVICES)}")
    if not isinstance(name, str) or name not in DEVICES:
        raise BadInput(f"unknown device {name!r}; allowed: {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise _cuda_missing(name)
    return torch.device(name)
