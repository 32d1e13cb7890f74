"""Where computations run: ``auto`` picks CUDA when present."""

from __future__ import annotations

import torch

from .errors import BadInput

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` → cuda if available else cpu; ``cuda`` without a GPU is a BadInput."""
    if name not in DEVICES:
        raise BadInput(f"unknown device {name!r}; allowed: {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' requested but no CUDA GPU is visible; use --device cpu or auto")
    return torch.device(name)
