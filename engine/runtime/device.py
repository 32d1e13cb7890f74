"""Where computations run: ``auto`` picks CUDA when present."""

from __future__ import annotations

import torch

from .errors import BadInput

DEVICES = ("auto", "cpu", "cuda")


def _cuda_missing(what: str) -> BadInput:
    return BadInput(f"device {what!r} requested but no CUDA GPU is visible; allowed here: auto, cpu")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` to compute on.

    ``name``: one of ``DEVICES`` (``auto`` → cuda if available else cpu), or a
    ``torch.device`` of type cpu or cuda, returned as is. Asking for cuda without a GPU
    (or for a GPU index that does not exist) and any other value raise a one-line BadInput.
    """
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
