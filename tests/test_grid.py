"""Grids (``engine.grid.driver``, ``python -m engine grid``): specs, dry runs, failing cells, the page,
and the same results from a local pool and from a real Ray head on loopback, also when the
worker running a cell is killed half-way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from engine.cli import main
from engine.experiments.registry import EXPERIMENTS
from engine.grid import driver as G, spec as S
from engine.grid.loopback import free_port, session_pids
from engine.runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
TINY = """
name = "tiny"
kind = "ntk-sweep"
preset = "quick"
[base]
"data.dataset" = "synthetic"
"data.n" = {n}
"data.n_test" = 20
"data.synthetic_d" = 16
widths = [16, 64]
seeds = [0]
"train.epochs" = {epochs}
[axes]
"train.optimizer" = ["adam", "sgd"]
archs = ["relu", "attn"]
"""
# Ray on loopback only, and without token authentication whatever ~/.ray holds: the head and
# every driver must agree (a token file there would turn it on for the head alone).
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
FAST = TINY.format(n=40, epochs=5)      # 4 cells, well under a second of work each
SLOW_EPOCHS = 2000
SLOW = TINY.format(n=100, epochs=SLOW_EPOCHS)  # 4 cells of 2-3 s each on 2 cores: long enough to be killed mid-run


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def results(out: dict) -> dict:
    """cell -> (digest, rows without the wall-time columns)."""
    return {r["cell"]: (r["digest"], [{k: v for k, v in row.items() if k not in G.VOLATILE} for row in r["rows"]])
            for r in out["results"]}


# ---------------------------------------------------------------- specs

def test_axes_exclude_rules_and_dotted_names():
    doc = tomllib.loads("""
kind = "ntk-sweep"
preset = "quick"
base.data.synthetic_kappa = 100
base.ridge = 1
axes.data.dataset = ["synthetic", "mnist", "fashion-mnist"]
axes."train.optimizer" = ["adam", "sgd"]
axes.seeds = [0, [1, 2]]
[[exclude]]
"data.dataset" = "mnist"
"train.optimizer" = "sgd"
[[exclude]]
"data.dataset" = "fashion-mnist"
seeds = [[1, 2]]
""")
    grid = S.parse_spec(doc)
    got = [(c.config.data.dataset, c.config.train.optimizer, c.config.seeds) for c in grid.cells]
    want = [(d, o, s) for d in ("synthetic", "mnist", "fashion-mnist") for o in ("adam", "sgd")
            for s in ((0,), (1, 2))
            if not (d == "mnist" and o == "sgd") and not (d == "fashion-mnist" and s == (1, 2))]
    assert got == want and [c.index for c in grid.cells] == list(range(len(want)))
    cfg = grid.cells[0].config
    # integers become floats where the setting is a float: one cache key for 1 and 1.0
    assert isinstance(cfg.data.synthetic_kappa, float) and cfg.ridge == 1.0 and isinstance(cfg.ridge, float)
    assert cfg.widths == EXPERIMENTS["ntk-sweep"].presets["quick"].widths  # the preset's own values otherwise
    assert grid.cells[0].label == "ntk-sweep data.dataset=synthetic train.optimizer=adam seeds=0"


def test_blocks_of_several_kinds_and_no_duplicate_cells():
    doc = tomllib.loads("""
[[grid]]
kind = "spectrum"
axes.attention = ["linear", "stacked:2"]
[[grid]]
kind = "spectrum"
label = "again"
axes.attention = ["linear"]
[[grid]]
kind = "scaling"
preset = "quick"
""")
    grid = S.parse_spec(doc)
    assert [(c.kind, c.settings) for c in grid.cells] == [
        ("spectrum", "attention=linear"), ("spectrum", "attention=stacked:2"), ("scaling", "(base)")]


@pytest.mark.parametrize("text, needle", [
    ('kind = "ntk-swep"', "kind: unknown kind 'ntk-swep'"),
    ('kind = "ntk-sweep"\npreset = "huge"', "preset: unknown preset 'huge'"),
    ('kind = "ntk-sweep"\naxes."train.optimiser" = ["adam"]', "axes.train.optimiser: unknown setting"),
    ('kind = "ntk-sweep"\naxes."train.optimizer" = ["adam", "adamx"]', "axes.train.optimizer = adamx"),
    ('kind = "ntk-sweep"\naxes.widths = 16', "axes.widths: an axis is a non-empty list"),
    ('kind = "ntk-sweep"\naxes.archs = ["relu"]\n[[exclude]]\nseeds = 0', "exclude[0].seeds: not an axis"),
    ('kind = "malleability"\nbase."attack.eps" = 0.1', "base.attack.eps"),
    ('[[grid]]\nkind = "scaling"\n[[grid]]\nkind = "scaling"\nbase.n = 1', "grid[1].base"),
    ('kind = "scaling"\ncolour = "red"', "colour: unknown key"),
    ('kind = "scaling"\nbase = [1', "not valid TOML"),
])
def test_bad_spec_exits_2_with_one_line_naming_the_key(tmp_path, capsys, text, needle):
    spec = write(tmp_path, "bad.toml", text)
    with pytest.raises(BadInput):
        G.load_spec(spec)
    assert main(["grid", str(spec), "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: grid spec") and needle in err, err


def test_dry_run_lists_estimates_and_computes_nothing(tmp_path, capsys):
    spec = write(tmp_path, "tiny.toml", FAST)
    cache = tmp_path / "cache"
    assert main(["grid", str(spec), "--dry-run", "--json", "--workers", "2", "--cache-dir", str(cache)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cells"] == 4 and out["cached"] == 0 and out["workers"] == 2
    assert [p["status"] for p in out["plan"]] == ["to do"] * 4
    assert all(p["estimate_s"] > 0 and p["memory_gib"] > 0 for p in out["plan"])
    assert out["estimate_seconds"] == pytest.approx(sum(p["estimate_s"] for p in out["plan"]))
    assert out["wall_seconds_left"] < out["estimate_seconds"]
    assert main(["grid", str(spec), "--dry-run", "--cache-dir", str(cache)]) == 0
    text = capsys.readouterr().out
    assert "train.optimizer=sgd archs=attn" in text and "total: 4 cells" in text
    from engine.runtime.cache import Cache

    c = Cache(cache)
    assert not any((cell.cache_kind, cell.config) in c for cell in G.load_spec(spec).cells)
    c.close()


def test_the_paper_grid_reads_and_says_where_cifar10_is_missing(tmp_path):
    grid = G.load_spec(ROOT / "grids" / "paper.toml")
    table = G.plan(grid, None, tmp_path / "empty")
    cifar = table[table["settings"].str.contains("cifar10")]
    assert len(cifar) >= 4 and cifar["note"].str.startswith("data missing").all()
    assert all(c.config.seeds == (0, 1, 2) for c in grid.cells if hasattr(c.config, "seeds"))  # 3 seeds
    assert G.totals(table)["cannot_run"] == len(table[table["note"] != ""])
    assert len(G.load_spec(ROOT / "grids" / "quick.toml").cells) >= 8


# ---------------------------------------------------------------- runs

@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """A snapshot of the engine to run the drivers from: the code fingerprint (part of every
    cache key) must not change between two runs when someone edits the checkout meanwhile."""
    root = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT / "engine", root / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def cli(*args, cwd=ROOT, timeout=300) -> tuple[int, str, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(ROOT / ".pytest_cache" / "xdg"), **RAY_ENV}
    env.pop("ENGINE_DATA_DIR", None)
    p = subprocess.run([sys.executable, "-m", "engine", "grid", *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow
def test_failing_cell_exits_4_lists_it_and_keeps_the_rest(src, tmp_path):
    spec = write(tmp_path, "mixed.toml", FAST.replace('"train.optimizer" = ["adam", "sgd"]\narchs = ["relu", "attn"]',
                                                      'archs = ["relu"]\n"data.dataset" = ["synthetic", "cifar10"]'))
    args = (spec, "--json", "--workers", "1", "--data-dir", tmp_path / "empty", "--cache-dir", tmp_path / "cache")
    rc, out, err = cli(*args, cwd=src)
    assert rc == 4, err
    obj = json.loads(out)
    assert (obj["cells"], obj["computed"], obj["cached"], obj["failed"]) == (2, 1, 0, 1)
    bad = obj["results"][1]
    assert bad["status"] == "failed" and bad["error"].startswith("data missing: cifar10") and bad["rows"] is None
    assert "failed: cell 1 ntk-sweep archs=relu data.dataset=cifar10: data missing" in err
    rc, out, _ = cli(*args, cwd=src)  # resumes: the good cell comes from the cache, the bad one fails again
    obj = json.loads(out)
    assert rc == 4 and (obj["computed"], obj["cached"], obj["failed"]) == (0, 1, 1)


@pytest.mark.slow
def test_the_page_runs_a_grid_in_the_background(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    write(tmp_path / "grids", "tiny.toml", FAST.replace('archs = ["relu", "attn"]', 'archs = ["relu"]'))
    monkeypatch.setenv("ENGINE_GRIDS_DIR", str(tmp_path / "grids"))
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    at = AppTest.from_file(str(ROOT / "pages" / "grid.py"), default_timeout=60).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["status"]) == ["to do", "to do"]
    assert any("--backend ray" in i.value for i in at.info)  # cluster runs: from the CLI
    next(b for b in at.button if b.label == "Start the grid").click().run()
    deadline = time.monotonic() + 120
    while at.get("progress") and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()
    at.run()  # the run that saw the job end drew the cell table (above the button) just before it ended
    assert not at.exception and not at.get("progress") and not at.error, [e.value for e in at.error]
    assert list(at.dataframe[0].value["status"]) == ["cached", "cached"]
    assert any("2 computed" in s.value for s in at.success)


# ---------------------------------------------------------------- a real Ray head on loopback

def _kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ray_head():
    """``ray start --head`` on 127.0.0.1 in its own session; every process of it killed at the end."""
    pytest.importorskip("ray", reason="ray is not installed (requirements.txt pins ray==2.60.0)")
    ray_bin = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    env = {**os.environ, **RAY_ENV}
    log = open(Path(temp) / "head.log", "w+")
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}",
         "--object-store-memory=200000000", f"--dashboard-agent-listen-port={free_port()}",
         f"--metrics-export-port={free_port()}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in Path(temp, "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                tail = Path(temp, "head.log").read_text().strip().splitlines()[-3:]
                pytest.skip(f"ray cannot start a head on 127.0.0.1:{port} here: {' | '.join(tail)}")
            time.sleep(0.3)
        yield {"address": f"127.0.0.1:{port}", "sid": head.pid}
    finally:
        _kill_session(head.pid)  # the head's processes only: no `ray stop`, which kills every Ray here
        head.wait(timeout=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def local_slow(src, tmp_path_factory) -> tuple[Path, dict]:
    """The SLOW grid on the local backend (2 worker processes): the reference the Ray runs must match."""
    folder = tmp_path_factory.mktemp("local")
    spec = write(folder, "slow.toml", SLOW)
    rc, out, err = cli(spec, "--backend", "local", "--workers", "2", "--json", "--cache-dir", folder / "cache",
                       cwd=src)
    assert rc == 0, err
    return spec, json.loads(out)


@pytest.mark.slow
def test_ray_and_local_give_the_same_results_bit_for_bit(ray_head, src, local_slow, tmp_path):
    spec, local = local_slow
    rc, out, err = cli(spec, "--backend", "ray", "--address", ray_head["address"], "--json",
                       "--cache-dir", tmp_path / "ray", cwd=src)
    assert rc == 0, err
    on_ray = json.loads(out)  # stdout is the JSON alone, whatever Ray prints
    assert (on_ray["cells"], on_ray["computed"], on_ray["failed"]) == (4, 4, 0)
    assert "[  4/4] computed" in err and "ETA" in err
    assert results(on_ray) == results(local)
    assert all(r["digest"] and len(r["rows"]) == 2 for r in on_ray["results"])
    assert [r["config"] for r in on_ray["results"]] == [r["config"] for r in local["results"]]
    rc, out, err = cli(spec, "--backend", "ray", "--address", ray_head["address"], "--json",
                       "--cache-dir", tmp_path / "ray", cwd=src)
    again = json.loads(out)
    assert rc == 0 and (again["computed"], again["cached"]) == (0, 4), err
    assert results(again) == results(on_ray)


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_nothing_is_lost_or_doubled(ray_head, src, local_slow, tmp_path):
    import diskcache

    from engine.runtime.cache import Cache

    spec, local = local_slow
    env = {**os.environ, "XDG_CACHE_HOME": str(ROOT / ".pytest_cache" / "xdg"), **RAY_ENV}
    driver = subprocess.Popen(
        [sys.executable, "-m", "engine", "grid", str(spec), "--backend", "ray", "--address", ray_head["address"],
         "--json", "--retries", "2", "--cache-dir", str(tmp_path / "ray")],
        cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed, seen, deadline = None, {}, time.monotonic() + 120
    while killed is None and driver.poll() is None and time.monotonic() < deadline:
        for pid in session_pids(ray_head["sid"]):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::run_cell"):  # a worker while it runs a cell
                seen.setdefault(pid, time.monotonic())
                if time.monotonic() - seen[pid] > 0.5:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
                    break
        time.sleep(0.1)
    out, err = driver.communicate(timeout=300)
    assert killed is not None, f"no worker was seen running a cell: {err}"
    assert driver.returncode == 0, err
    obj = json.loads(out)
    assert (obj["cells"], obj["computed"], obj["failed"]) == (4, 4, 0)
    assert sorted(r["cell"] for r in obj["results"]) == [0, 1, 2, 3]
    with diskcache.Cache(str(tmp_path / "ray")) as raw:
        assert len(raw) == 4  # one entry per cell: none doubled, none missing
    cache = Cache(tmp_path / "ray")
    for cell in G.load_spec(spec).cells:  # every entry whole: it decodes and says what the cell says
        res = cache.get(cell.cache_kind, cell.config)
        assert res is not None and G.digest(res) == obj["results"][cell.index]["digest"]
        assert len(res.frames["rows"]) == 2 and res.frames["losses"]["epoch"].max() == SLOW_EPOCHS
    cache.close()
    assert results(obj) == results(local)  # the same as a run nobody disturbed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_local_worker_ends_when_its_driver_is_killed(tmp_path):
    """A grid driver killed from outside (SIGKILL: no cleanup runs) leaves no worker computing cells that
    nobody will collect: each worker asked the kernel for SIGTERM when its parent dies."""
    script = tmp_path / "driver.py"
    script.write_text(
        "import multiprocessing, os, sys, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from engine.grid.backends import _init_worker\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),\n"
        "                               initializer=_init_worker, initargs=(1,))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    time.sleep(600)\n")
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(driver.stdout.readline())
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    for _ in range(200):  # the kernel signals at once; the worker's exit is awaited, not timed
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail(f"worker {worker} outlived its killed driver")
