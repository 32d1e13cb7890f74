"""engine.runtime.device.resolve_device: names and torch.devices, and the one-line errors."""

import pytest
import torch

from engine.runtime.device import DEVICES, resolve_device
from engine.runtime.errors import BadInput

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text and text
    return text


def test_cpu_is_always_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_auto_follows_the_machine():
    assert resolve_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("auto") == resolve_device()


@no_gpu
def test_auto_without_gpu_is_cpu(monkeypatch):
    assert resolve_device("auto") == torch.device("cpu")


@no_gpu
@pytest.mark.parametrize("name", ["cuda", torch.device("cuda"), torch.device("cuda", 0)])
def test_cuda_without_gpu_is_a_one_line_bad_input_naming_what_is_allowed(name):
    with pytest.raises(BadInput) as e:
        resolve_device(name)
    text = _one_line(e)
    assert "cuda" in text and "auto" in text and "cpu" in text


def test_auto_picks_cuda_when_torch_reports_one(monkeypatch):
    """The choice itself, without a GPU: torch says one is there, so auto and cuda resolve to cuda."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda") == resolve_device("cuda")
    assert resolve_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    with pytest.raises(BadInput) as e:
        resolve_device(torch.device("cuda", 3))
    assert "cuda:3" in _one_line(e)


@pytest.mark.parametrize("name", ["gpu", "CPU", "cuda:0", "mps", "", None, 0, ["cpu"], torch.device("meta")])
def test_unknown_devices_are_rejected_with_the_allowed_names(name):
    with pytest.raises(BadInput) as e:
        resolve_device(name)
    assert all(d in _one_line(e) for d in DEVICES)
