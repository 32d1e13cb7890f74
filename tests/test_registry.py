"""engine.experiments.registry: one record per experiment, read by the CLI, the grid, calibration, export and pages."""

from __future__ import annotations

import ast
import dataclasses
import importlib
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
    """Each experiment's page is pages/<name>.py, listed by ``ui.nav.pages`` at URL path <name>, and
    app.py routes that list: no page list is kept by hand."""
    from ui import nav

    listed = {p.path: p.url_path for p in nav.pages()}
    for exp in EXPERIMENTS.values():
        if exp.page:
            assert (ROOT / exp.page).exists(), exp.page
            assert listed[exp.page] == exp.name == configs.page_url(exp.page)
    assert "nav.pages()" in (ROOT / "app.py").read_text() and "st.Page(\"pages/" not in (ROOT / "app.py").read_text()


def test_every_page_file_is_named_after_its_url_path():
    """A fresh server runs its first request in Streamlit's v1 mode, which finds a page by its
    file's stem (ui.nav.ensure_entry): a deep link to a page whose file is named otherwise
    reads "Page not found" and lands on the Overview."""
    from ui import nav

    pages = nav.pages()
    assert {p.path for p in pages} == {str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py")}
    assert [p.url_path for p in pages].count("") == 1 and pages[0].url_path == ""  # the Overview, at /
    for p in pages[1:]:
        assert p.url_path == Path(p.path).stem and p.title and p.icon.startswith(":material/"), p


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


# ---------------------------------------------------------------- a new experiment, by the README alone

CONFIG_MODULE = '''"""A throw-away experiment's config, presets and estimate (tests/test_registry.py)."""
from dataclasses import dataclass

from engine.runtime.budget import Estimate
from engine.runtime.settings import setting, validate


@dataclass(frozen=True)
class ThrowawayConfig:
    steps: int = setting(3, "steps to count", lo=1, hi=100)

    def __post_init__(self):
        validate(self)


PRESETS = {"throwaway": {"quick": ThrowawayConfig(steps=2), "paper": ThrowawayConfig(steps=50)}}


def estimate_throwaway(cfg: ThrowawayConfig) -> Estimate:
    return Estimate(0.01 * cfg.steps, 1000 * cfg.steps)
'''
RUN_MODULE = '''"""A throw-away experiment's run (tests/test_registry.py)."""
import pandas as pd

from engine.runtime.cache import Result
from .runs import experiment_run


@experiment_run("throwaway")
def run_throwaway(cfg, data_dir, dev, progress, cancel):
    """Frame ``rows``: one row per step."""
    return Result("throwaway", {}, {"rows": pd.DataFrame({"step": range(cfg.steps)})})
'''
PLOT_MODULE = '''"""A throw-away experiment's chart (tests/test_registry.py)."""
import plotly.graph_objects as go

__all__ = ["throwaway_fig"]


def throwaway_fig(result, metric=None):
    return go.Figure(go.Scatter(y=result.frames["rows"]["step"]))
'''


@pytest.fixture()
def throwaway(tmp_path, monkeypatch):
    """A new experiment made the README's way ("How to add an experiment"), at runtime: its config
    module, run module and chart module written as files where their packages look (each package's
    ``__path__`` extended to a folder of this test), and its record registered. Everything goes
    again after the test."""
    import sys

    import engine.experiments
    import engine.experiments.configs
    import engine.reporting.plots
    from engine.experiments import registry

    packages = {engine.experiments.configs: CONFIG_MODULE, engine.experiments: RUN_MODULE,
                engine.reporting.plots: PLOT_MODULE}
    for i, (package, source) in enumerate(packages.items()):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "throwaway.py").write_text(source)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    importlib.invalidate_caches()
    C = importlib.import_module("engine.experiments.configs.throwaway")
    rec = registry.register(registry.Experiment(
        name="throwaway", config=C.ThrowawayConfig, run_path="throwaway:run_throwaway",
        estimate=C.estimate_throwaway, presets=C.PRESETS["throwaway"], help="counts steps", what="this count",
        tables=("rows",), probe=lambda: C.ThrowawayConfig(steps=1),
        figure="engine.reporting.plots.throwaway:throwaway_fig", figure_help="the steps counted",
        page="pages/throwaway.py", page_title="Throw-away", page_icon=":material/delete:"))
    yield rec
    registry.unregister("throwaway")
    for package in packages:
        name = f"{package.__name__}.throwaway"
        sys.modules.pop(name, None)
        for attr in ("throwaway", "run_throwaway", "ThrowawayConfig", "throwaway_fig"):
            package.__dict__.pop(attr, None)


def test_a_new_experiment_needs_no_list_but_its_record(throwaway, tmp_path, capsys):
    """Every list that names experiments picks a registered one up: the CLI command, the grid's
    kinds, the figure, the package's lazy names, the charts' re-exports, the dashboard's page
    list and the every-page test's; so the README's list of files is complete."""
    import engine.experiments
    from engine.reporting import plots
    from tests.test_app import chart_pages
    from ui import nav

    assert get("throwaway") is throwaway and of(throwaway.config()) is throwaway
    assert set(throwaway.presets) == {"default", "quick", "paper"}
    # the command line: the command, its flags from the config, a run
    assert "throwaway" in cli.build_parser()._subparsers._group_actions[0].choices
    assert cli.main(["throwaway", "--steps", "4", "--no-cache", "--json", "--quiet"]) == 0
    assert '"step"' in capsys.readouterr().out
    # the grid's kinds and the main figure
    spec = tmp_path / "one.toml"
    spec.write_text('name = "one"\n[[grid]]\nkind = "throwaway"\npreset = "quick"\n')
    assert grid_spec.load_spec(spec).cells[0].config == throwaway.presets["quick"]
    result = throwaway.run(throwaway.config(steps=5))
    assert len(throwaway.main_figure(result).data[0].y) == 5
    # the lazy names of engine.experiments and the charts' re-exports
    assert {"ThrowawayConfig", "run_throwaway"} <= set(engine.experiments.__all__)
    assert engine.experiments.run_throwaway is throwaway.runner
    assert "throwaway_fig" in plots.__all__ and plots.throwaway_fig is importlib.import_module(
        "engine.reporting.plots.throwaway").throwaway_fig
    # the dashboard's page list (app.py routes it) and the every-page AppTest's
    page = next(p for p in nav.pages() if p.path == "pages/throwaway.py")
    assert (page.url_path, page.title) == ("throwaway", "Throw-away")
    assert [p.path for p in nav.pages()][-3:] == ["pages/throwaway.py", "pages/grid.py", "pages/reproduction.py"]
    assert "pages/throwaway.py" in chart_pages()


def test_a_record_without_its_contracts_is_refused(throwaway):
    """The contracts the README states, checked when a record is registered: a name once, a quick
    and a paper preset, a page at pages/<name>.py with a title and an icon."""
    from engine.experiments.registry import register

    with pytest.raises(ValueError, match=": throwaway is registered already"):
        register(throwaway)
    other = dataclasses.replace(throwaway, name="throwaway2", config=type("Other", (), {}))
    with pytest.raises(ValueError, match="needs the presets paper"):
        register(dataclasses.replace(other, presets={"quick": throwaway.presets["quick"]}))
    with pytest.raises(ValueError, match="must be pages/throwaway2.py"):
        register(other)
    assert "throwaway2" not in EXPERIMENTS
