"""The engine's layers: packages with lazy public names, dependencies that point one way, no two
files importing each other, modules (the dashboard's too) readable in one sitting; the engine never
loads streamlit, the pages never load torch."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> list[str]:
    """Every module of the engine by its dotted name (packages by theirs), ``__main__`` left out."""
    out = []
    for p in sorted((ROOT / "engine").rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_engine_runs_without_streamlit():
    code = ("import importlib, sys\n"
            f"for m in {_modules()!r}: importlib.import_module(m)\n"
            "assert 'streamlit' not in sys.modules, 'engine imported streamlit'\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_dashboard_files_import_no_torch():
    for path in [ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "ui").glob("*.py")]:
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "torch" not in names, f"{path.relative_to(ROOT)} imports torch"


PACKAGES = ("engine", "engine.maths", "engine.data", "engine.runtime", "engine.experiments", "engine.reporting",
            "engine.grid", "engine.bench")
# What each layer may import at module level (a function may import upwards lazily, e.g. a job
# that runs a registered experiment). The metrics and gates the experiments compute live below
# them (``maths.metrics``, ``maths.gates``); ``reporting`` only presents them.
ALLOWED = {
    "maths": {"maths", "runtime", "data"},
    "data": {"data", "runtime"},
    "runtime": {"runtime", "data"},
    "experiments": {"experiments", "maths", "data", "runtime"},
    "grid": {"grid", "experiments", "runtime", "data"},
}


def _top_level_targets(path: Path, module: str) -> set[str]:
    """The engine modules ``path`` imports at module level, as dotted names below ``engine.``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("engine."):
                out.update(f"{target}.{a.name}" if not node.module else target for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("engine."))
    return {t.removeprefix("engine.") for t in out}


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for module in _modules():
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in ALLOWED:
            continue
        path = ROOT / Path(*parts)
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for target in _top_level_targets(path, module):
            if target == "_lazy":
                continue
            if not any(target == a or target.startswith(a + ".") for a in ALLOWED[parts[1]]):
                wrong.append(f"{module} imports engine.{target}")
    assert not wrong, wrong


def _all_targets(path: Path, module: str, modules: set[str]) -> set[str]:
    """The engine files ``path`` imports anywhere in it (inside functions too), as dotted names."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            found = [target, *(f"{target}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        else:
            continue
        out.update(t for t in found if t in modules and t != module)
    return out


# Cycles still to be broken, each a set of files that import each other (issue 44).
KNOWN_CYCLES = [{"engine.runtime.bundle", "engine.runtime.cache", "engine.runtime.store"}]


def test_no_two_engine_files_import_each_other():
    """A file-level import cycle (even through an import inside a function) hides a function in the
    wrong module: ``readings`` read through ``influence``'s nets and kernels while ``influence``
    called ``readings``, until those moved to ``readings``; ``span`` took ``training``'s shared pieces
    while ``training`` called ``span``, until they moved to ``heads``. Packages' ``__init__`` are
    left out (their names load lazily)."""
    files = {m: ROOT / Path(*m.split(".")).with_suffix(".py") for m in _modules()
             if (ROOT / Path(*m.split(".")).with_suffix(".py")).is_file()}
    graph = {m: _all_targets(p, m, set(files)) for m, p in files.items()}
    reach = {}
    for start in graph:  # every file each one reaches
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        reach[start] = seen
    cycles = {frozenset(m for m in reach if m == start or (m in reach[start] and start in reach[m]))
              for start in reach if start in reach[start]}
    assert sorted(map(sorted, cycles)) == sorted(map(sorted, KNOWN_CYCLES))


def test_no_module_is_longer_than_one_sitting():
    """Every module of the engine, the dashboard's helpers (ui/) and its pages, and app.py: under 400 lines."""
    files = [*(ROOT / "engine").rglob("*.py"), *(ROOT / "ui").glob("*.py"), *(ROOT / "pages").glob("*.py"), ROOT / "app.py"]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_the_packages_load_nothing_heavy_until_a_name_is_read():
    """``import engine`` and every layer package cost no torch, numpy, pandas or plotly: their
    public names are imported on first use, so ``python -m engine --help`` stays lean."""
    code = (f"import importlib, sys\nfor m in {PACKAGES!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'numpy', 'pandas', 'plotly', 'scipy') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout


HEAVY = ("torch", "numpy", "pandas", "plotly", "scipy")
LEAN_COMMANDS = [  # (argv, exit code): the help of every kind of command, a refused value, a CPU estimate
    (["--help"], 0), (["malleability", "--help"], 0), (["figure", "ntk-sweep", "--help"], 0), (["grid", "--help"], 0),
    (["doctor", "--help"], 0), (["report", "--help"], 0), (["bench", "--help"], 0), (["datasets", "--help"], 0),
    (["malleability", "--eps", "inf"], 2), (["ntk-sweep", "--widths", "0"], 2), (["retrain-loo", "--k", "0"], 2),
    (["influence", "--estimate", "--device", "cpu"], 0), (["scaling", "--preset", "paper", "--estimate", "--device", "cpu"], 0),
]


@pytest.mark.parametrize("argv,code", LEAN_COMMANDS, ids=[" ".join(a) for a, _ in LEAN_COMMANDS])
def test_the_command_line_parses_refuses_and_estimates_without_torch(argv, code):
    """The CLI builds every command's flags from the configs, refuses a bad value and prints a CPU
    estimate (at a pinned speed factor: timing the machine is a torch GEMM) without loading torch,
    numpy, pandas or plotly: the configs, presets and estimates are torch-free
    (``engine.experiments.configs``, ``engine.maths.specs``); the runs import what they compute with."""
    script = ("import sys\nfrom engine.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
              "except SystemExit as e:\n    rc = e.code\n"
              f"print('LOADED', rc, sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "ENGINE_SPEED_FACTOR": "1"}
    p = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True, text=True, env=env)
    last = p.stderr.strip().splitlines()[-1]
    assert last == f"LOADED {code} []", p.stderr[-2000:]


@pytest.mark.parametrize("argv", [["influence", "--estimate"], ["scaling", "--preset", "paper", "--estimate"]])
def test_an_estimate_at_the_defaults_times_the_machine_without_torch(argv, tmp_path, monkeypatch):
    """With the device left at auto and no pinned speed factor, an estimate finds the CPU without
    torch where no GPU can be there and times numpy's GEMM, converted by this machine's
    calibration (written here by a torch timing; engine.runtime.gemm): numpy only."""
    from engine.runtime import speed
    from engine.runtime.device import gpu_possible

    if gpu_possible():
        pytest.skip("a GPU may be here: finding it asks torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ENGINE_THREADS", "1")  # the calibration holds for the thread count the estimate will use
    monkeypatch.delenv(speed.SPEED_ENV, raising=False)
    speed.time_gemm("torch")
    script = ("import json, sys\nfrom engine.cli import main\nrc = main([*sys.argv[1:], '--json'])\n"
              f"print('LOADED', rc, sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path), "ENGINE_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True, text=True, env=env)
    assert p.stderr.strip().splitlines()[-1] == "LOADED 0 ['numpy']", p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["device"] == "cpu" and out["speed_factor_from"] == "numpy"
    assert out["estimate_seconds_here"] == pytest.approx(out["estimate_seconds"] * out["speed_factor"]
                                                         + out["import_seconds"])


def test_every_public_name_of_every_package_resolves_to_its_own_module():
    import importlib

    for name in PACKAGES:
        package = importlib.import_module(name)
        assert package.__all__ == sorted(package.__all__) and len(package.__all__) == len(set(package.__all__))
        for public in package.__all__:
            value = getattr(package, public)
            assert value is not None, (name, public)
        assert set(dir(package)) >= set(package.__all__)
    import engine

    assert engine.__version__ == engine.ENGINE_VERSION
    assert engine.maths.ntk.empirical_ntk is engine.empirical_ntk  # a submodule is an attribute too
    with pytest.raises(AttributeError, match="engine.maths.*no_such_name"):
        _ = engine.maths.no_such_name


def test_no_result_depends_on_the_presentation_layer():
    """The code fingerprint of a result leaves out ``engine.runtime.cache.PRESENTATION``: sound only
    while nothing that computes imports it, at module level or inside a function."""
    from engine.runtime.cache import PRESENTATION

    computing = [p for p in (ROOT / "engine").rglob("*.py")
                 if p.relative_to(ROOT / "engine").parts[0] not in (*PRESENTATION, "cli.py", "commands.py",
                                                                    "doctor.py", "__main__.py", "bench")]
    for path in computing:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                targets = [".".join(base + ([node.module] if node.module else []))]
                if not node.module:
                    targets = [f"{targets[0]}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            bad = [t for t in targets if any(t == f"engine.{p}" or t.startswith(f"engine.{p}.") for p in PRESENTATION)]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}: a result would depend on presentation code"
