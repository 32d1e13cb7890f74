"""engine.experiments.registry: one record per experiment, read by the CLI, the grid, calibration, export and pages."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from engine import cli
from engine.experiments.registry import ALIASES, EXPERIMENTS, NESTED, estimate, get, of, preset
from engine.grid import spec as grid_spec
from engine.runtime.errors import BadInput
from ui import configs

ROOT = Path(__file__).resolve().parents[1]
NAMES = list(EXPERIMENTS)


@pytest.mark.parametrize("name", NAMES)
def test_a_record_is_one_name_everywhere(name):
    exp = EXPERIMENTS[name]
    assert exp.name == name and exp.runner.kind == name and exp.runner.compute is not None
    assert of(exp.config()) is exp and get(name) is exp
    assert name in cli.build_parser()._subparsers._group_actions[0].choices  # the CLI command
    assert configs.QUICK[name] is exp.presets["quick"]                         # the dashboard's default
    for n in exp.nested:
        assert isinstance(getattr(exp.config(), n), NESTED[n])


@pytest.mark.parametrize("name", NAMES)
def test_the_probe_is_a_small_config_with_a_positive_estimate(name):
    exp = EXPERIMENTS[name]
    cfg = exp.probe()
    assert type(cfg) is exp.config
    est = estimate(cfg)
    assert 0 < est.seconds < 60 and 0 < est.bytes < 2**31, est
    data = getattr(cfg, "data", None)
    assert data is None or data.dataset == "synthetic"  # calibration needs no files


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_is_a_grid_kind(name, tmp_path):
    spec = tmp_path / "one.toml"
    spec.write_text(f'name = "one"\n[[grid]]\nkind = "{name}"\npreset = "quick"\n')
    loaded = grid_spec.load_spec(spec)
    assert [c.kind for c in loaded.cells] == [name] and loaded.cells[0].config == EXPERIMENTS[name].presets["quick"]


@pytest.mark.parametrize("name", NAMES)
def test_a_main_figure_is_a_drawing_function_of_the_reporting_layer(name):
    exp = EXPERIMENTS[name]
    if exp.figure is None:
        assert not exp.figure_help
        with_one = ", ".join(n for n, e in EXPERIMENTS.items() if e.figure)
        with pytest.raises(BadInput, match=f"{name!r} has no main figure; those with one: {with_one}"):
            exp.main_figure(None)
        return
    module, fn = exp.figure.split(":")
    assert module.startswith("engine.reporting.") and callable(getattr(importlib.import_module(module), fn))
    assert exp.figure_help


def test_old_spellings_resolve():
    assert dict(ALIASES) == {"ntk": "ntk-sweep", "regime": "dynamics"}
    assert get("regime") is EXPERIMENTS["dynamics"] and get("ntk") is EXPERIMENTS["ntk-sweep"]


def test_unknown_names_and_presets_are_one_line():
    for bad in ("sweep", ["ntk-sweep"], None):
        with pytest.raises(BadInput, match="allowed: spectrum, ntk-sweep"):
            get(bad)
    with pytest.raises(BadInput, match="unknown preset 'fast' of ntk-sweep; allowed: default, paper, quick"):
        preset("ntk-sweep", "fast")
    with pytest.raises(BadInput, match="takes a SweepConfig, got MalleabilityConfig"):
        EXPERIMENTS["ntk-sweep"].run(EXPERIMENTS["malleability"].config())


def test_pages_lead_with_their_experiment_at_its_url():
    app = (ROOT / "app.py").read_text()
    for exp in EXPERIMENTS.values():
        if exp.page:
            assert (ROOT / exp.page).exists(), exp.page
    assert "url_path=page_url(" in app  # app.py takes each page's URL from the registry


def test_every_page_file_is_named_after_its_url_path():
    """A fresh server runs its first request in Streamlit's v1 mode, which finds a page by its
    file's stem (ui.common.ensure_entry): a deep link to a page whose file is named otherwise
    reads "Page not found" and lands on the Overview."""
    from ui.configs import page_url

    app = (ROOT / "app.py").read_text()
    pages = re.findall(r'st\.Page\("(pages/[^"]+)"(.*?)\)(?:,\n|\n\])', app, re.S)
    assert {p for p, _ in pages} == {str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py")}
    for path, args in pages:
        if "default=True" in args:  # the Overview is at /
            continue
        fallback = re.search(r'page_url\("[^"]+"(?:, "([^"]+)")?\)', args)
        assert fallback, (path, args)
        assert page_url(path, fallback[1]) == Path(path).stem, path


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_nothing_in_the_engine_or_the_ui_imports_the_command_line():
    users = [p for p in [*(ROOT / "engine").rglob("*.py"), *(ROOT / "ui").glob("*.py"), *(ROOT / "pages").glob("*.py")]
             if p.name not in ("cli.py", "__main__.py") and {".cli", "engine.cli", "cli"} & _imports(p)]
    assert not users, users


def test_the_engine_names_no_widget_key():
    """The pages' widget keys (``mall.eps``, ``ntk.metric``, ...) are written in ui/ and pages/
    only: no string constant of the engine starts with a page's key prefix."""
    prefixes = tuple(f"{p}." for p in ("mall", "ntk", "regime", "influence", "scaling", "spectrum", "grid",
                                       "retrain", "repro"))
    found = [(p.name, node.value) for p in (ROOT / "engine").rglob("*.py")
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefixes)]
    assert not found, found


def test_shared_settings_have_one_help_text_and_one_set_of_limits():
    """ridge, seeds, archs, widths, init_std, attention and storage read the same in every config."""
    from engine.runtime.settings import settings

    seen: dict[str, tuple] = {}
    for exp in EXPERIMENTS.values():
        for f, m in settings(exp.config):
            if f.name not in ("ridge", "seeds", "archs", "widths", "init_std", "storage", "width", "arch"):
                continue
            key = (m.help, m.unit, m.lo, m.hi, m.lo_open, m.choices, m.max_len)
            assert seen.setdefault(f.name, key) == key, (exp.name, f.name)
    assert {"ridge", "seeds", "archs", "widths", "init_std", "storage"} <= set(seen)
    assert dataclasses.is_dataclass(EXPERIMENTS["malleability"].config)


def test_importing_the_engine_leaves_scipy_stats_unloaded():
    """scipy.stats costs about a second of CPU on every ``python -m engine`` start; only the
    functions that rank or bootstrap import it, when they are called."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, engine, engine.cli, engine.experiments.registry; "
                          "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
