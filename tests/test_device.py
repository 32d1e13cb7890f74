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


# ---------------------------------------------------------------- device_type: the same answer, torch only when needed

FRESH = ("import sys\nfrom engine.runtime.device import device_type\nfrom engine.runtime.errors import BadInput\n"
         "try:\n    print(device_type(sys.argv[1]))\nexcept BadInput as e:\n    print('BadInput:', e)\n"
         "print('torch' in sys.modules)")


def _fresh(name: str, **env) -> tuple[str, bool]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", FRESH, name], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(root), **env})
    assert p.returncode == 0, p.stderr
    answer, loaded = p.stdout.strip().splitlines()
    return answer, loaded == "True"


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda"])
def test_device_type_in_a_fresh_process_answers_as_torch_does(name):
    """The answer equals resolve_device's here (with torch), the refusal too; where no GPU can be
    there (gpu_possible() False) it was found without importing torch."""
    from engine.runtime.device import gpu_possible

    try:
        want = resolve_device(name).type
    except BadInput as e:
        want = f"BadInput: {e}"
    answer, loaded = _fresh(name)
    assert answer == want
    assert loaded == (name != "cpu" and gpu_possible())


def test_gpu_possible_never_hides_a_gpu_torch_sees(monkeypatch):
    from engine.runtime.device import device_type, gpu_possible

    if torch.cuda.is_available():
        assert gpu_possible()
    assert device_type("auto") == resolve_device("auto").type
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not gpu_possible()
    assert _fresh("auto", CUDA_VISIBLE_DEVICES="") == ("cpu", False)  # and torch agrees:
    assert _fresh("auto", CUDA_VISIBLE_DEVICES="-1")[0] == "cpu"


@pytest.mark.parametrize("name", ["gpu", "", torch.device("meta")])
def test_device_type_refuses_what_resolve_device_refuses(name):
    from engine.runtime.device import device_type

    with pytest.raises(BadInput) as e:
        device_type(name)
    assert all(d in _one_line(e) for d in DEVICES)
