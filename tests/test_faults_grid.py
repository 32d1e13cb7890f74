"""Fault injection on grid specs and the Ray backend: each hostile spec or address ends in one
line and exit 2, in bounded time, with the cache untouched (``refused`` from
test_faults_cli); the spec checks themselves in process, where they are cheap."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.grid.spec import MAX_CELLS, MAX_DEPTH, MAX_SPEC_BYTES, load_spec, parse_spec
from engine.runtime.errors import BadInput
from test_faults_cli import private_cache, refused
from test_grid import FAST, RAY_ENV, SLOW, cli, write

BASE = 'kind = "spectrum"\n[base]\n"data.dataset" = "synthetic"\n"data.n" = 20\n'


def spec(tmp_path, text: str, name: str = "spec.toml"):
    path = tmp_path / "specs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture()
def cache(tmp_path):
    return private_cache(tmp_path / "cache")


def _nested(depth: int, leaf=1) -> dict:
    """{"a": {"a": ... leaf}} ``depth`` tables deep, built without recursion."""
    doc = leaf
    for _ in range(depth):
        doc = {"a": doc}
    return doc


# ---------------------------------------------------------------- in process

@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_a_deep_document_is_refused_before_it_is_walked(depth):
    doc = {"kind": "spectrum", "base": _nested(depth)}
    with pytest.raises(BadInput, match=f"more than {MAX_DEPTH} deep"):
        parse_spec(doc)


def test_deep_arrays_are_refused_without_recursion():
    arr = 1
    for _ in range(5000):
        arr = [arr]
    with pytest.raises(BadInput, match="deep"):
        parse_spec({"kind": "spectrum", "axes": {"data": {"seed": arr}}})


def test_the_cell_count_is_checked_from_the_axis_lengths():
    # 10^4 x 10^4 = 10^8 cells: forming them would take minutes and gigabytes; the count alone refuses
    axes = {"data": {"seed": list(range(10_000)), "n": list(range(2, 10_002))}}
    with pytest.raises(BadInput, match=r"10000 x 10000 = 100,000,000 cells, more than the 10,000"):
        parse_spec({"kind": "spectrum", "axes": axes})


def test_the_cell_count_is_summed_over_blocks():
    block = {"kind": "spectrum", "base": {"data": {"dataset": "synthetic"}},
             "axes": {"data": {"seed": list(range(MAX_CELLS // 2 + 1))}}}
    with pytest.raises(BadInput, match=r"grid\[1\]\.axes: .* left after the blocks before"):
        parse_spec({"grid": [block, block]})


def test_a_spec_within_the_limits_still_reads():
    grid = parse_spec({"kind": "spectrum", "base": {"data": {"dataset": "synthetic", "n": 20}},
                       "axes": {"data": {"seed": [0, 1]}}, "exclude": [{"data": {"seed": 1}}]})
    assert [c.settings for c in grid.cells] == ["data.seed=0"]


@pytest.mark.parametrize("key, value", [("preset", ["quick"]), ("kind", ["spectrum"]), ("label", 3),
                                        ("name", ["x"]), ("description", {"a": 1})])
def test_keys_of_the_wrong_type_are_one_line(key, value):
    doc = {"kind": "spectrum", key: value}
    with pytest.raises(BadInput) as info:
        parse_spec(doc)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_a_fifo_spec_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="named pipe"):  # opening it for reading would block
        load_spec(fifo)


def test_a_folder_spec_is_refused(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(BadInput, match="is a folder, not a regular file"):
        load_spec(tmp_path / "dir.toml")


def test_a_spec_over_the_size_limit_is_refused(tmp_path):
    path = spec(tmp_path, BASE + "# " + "x" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(BadInput, match="the limit is"):
        load_spec(path)


# ---------------------------------------------------------------- as a user runs it

@pytest.mark.slow
def test_cli_deep_dotted_key_is_one_line(tmp_path, cache):
    path = spec(tmp_path, 'kind = "spectrum"\n[base]\n' + ".".join(["a"] * 400) + " = 1\n")
    assert "deep" in refused(2, "grid", path, "--dry-run", cache=cache, data=path.parent)


def test_cli_million_cells_are_refused_at_once(tmp_path, cache):
    seeds = ",".join(map(str, range(1000)))
    path = spec(tmp_path, BASE.replace('"data.n" = 20\n', "") + f'[axes]\n"data.seed" = [{seeds}]\n'
                f'"data.n" = [{",".join(map(str, range(2, 1002)))}]\n')
    line = refused(2, "grid", path, "--dry-run", cache=cache, data=path.parent, timeout=60)
    assert "1,000,000 cells" in line


def test_cli_fifo_spec_is_refused(tmp_path, cache):
    fifo = tmp_path / "specs" / "pipe.toml"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    assert "regular file" in refused(2, "grid", fifo, "--dry-run", cache=cache, data=fifo.parent, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("text", [
    'kind = "spectrum"\n[axes]\n"data.seed" = ' + "[" * 1000 + "1" + "]" * 1000 + "\n",
    'kind = "spectrum"\n[base]\nx = ' + "{a = " * 1000 + "1" + "}" * 1000 + "\n",
    'kind = "spectrum"\npreset = ["quick"]\n',
    'kind = ["spectrum"]\n',
    BASE.replace('"data.n" = 20', '"data.dataset" = "' + "x" * 300 + '.npz"').replace('"data.dataset" = "synthetic"\n', ""),
    BASE + '[axes]\n"data.seed" = 3\n',
], ids=["deep array", "deep inline table", "preset list", "kind list", "npz name over 255 bytes", "axis not a list"])
def test_cli_bad_spec_is_one_line(tmp_path, cache, text):
    path = spec(tmp_path, text)
    refused(2, "grid", path, "--dry-run", cache=cache, data=path.parent, timeout=60)


@pytest.mark.slow
def test_cli_folder_as_spec_is_one_line(tmp_path, cache):
    (tmp_path / "specs" / "dir.toml").mkdir(parents=True)
    assert "folder" in refused(2, "grid", tmp_path / "specs" / "dir.toml", cache=cache)


@pytest.mark.slow
@pytest.mark.parametrize("flag, value", [("--max-seconds", "nan"), ("--connect-timeout", "nan"),
                                         ("--connect-timeout", "0")])
def test_cli_bad_grid_numbers_are_one_line(tmp_path, cache, flag, value):
    path = spec(tmp_path, BASE)
    assert flag.lstrip("-").split("-")[0] in refused(2, "grid", path, flag, value, cache=cache)


# ---------------------------------------------------------------- Ray addresses

@pytest.fixture()
def silent_listener():
    """A TCP port that accepts connections and never says a word: ray.init would wait on it forever."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["closed port", "silent listener"])
def test_ray_address_with_no_head_fails_within_its_timeout(tmp_path, cache, silent_listener, where):
    pytest.importorskip("ray", reason="ray is not installed (requirements.txt pins ray==2.60.0)")
    address = "127.0.0.1:1" if where == "closed port" else silent_listener
    path = spec(tmp_path, BASE)
    # ray.init alone retried for more than 300 s here; the subprocess limit turns a hang into a failure
    line = refused(2, "grid", path, "--backend", "ray", "--address", address, "--connect-timeout", "5",
                   cache=cache, timeout=90, env_extra={"RAY_USAGE_STATS_ENABLED": "0"})
    assert address in line and ("nothing listens" if where == "closed port" else "no gRPC answer within 5 s") in line


# ---------------------------------------------------------------- a cluster that cannot run a cell

# Run inside a private network namespace (``unshare -n``: only ``lo``, ports private to the test):
# a head with no CPUs, a worker node of one CPU joined to it on 127.0.0.1, and a grid driver; the
# worker node is killed (every process of its session) once the first cell is computed, or never
# started when argv says so. Prints a JSON object: the driver's exit code, stdout and stderr.
_CLUSTER = r'''
import json, os, signal, subprocess, sys, tempfile, time
from pathlib import Path
from engine.grid.loopback import session_pids

spec, cache, with_worker = sys.argv[1], sys.argv[2], sys.argv[3] == "worker"
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
ray = str(Path(sys.executable).with_name("ray"))
temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--object-store-memory=100000000"]
started = []

def start(args, name):
    log = open(Path(temp) / f"{name}.log", "w+")
    p = subprocess.Popen([ray, "start", *common, *args], stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    started.append(p)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in (Path(temp) / f"{name}.log").read_text():
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{name} did not start: " + (Path(temp) / f"{name}.log").read_text()[-500:])
        time.sleep(0.3)
    return p

def kill(p):
    for pid in session_pids(p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

try:
    start(["--head", "--port=6390", "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={temp}"], "head")
    worker = start(["--address=127.0.0.1:6390", "--num-cpus=1"], "worker") if with_worker else None
    driver = subprocess.Popen([sys.executable, "-m", "engine", "grid", spec, "--backend", "ray", "--address",
                               "127.0.0.1:6390", "--json", "--retries", "0", "--cache-dir", cache],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = []
    for line in driver.stderr:
        err.append(line)
        if worker is not None and "computed" in line:
            kill(worker)  # the only node with CPUs dies: the other cells can run nowhere
            worker = None
    out = driver.stdout.read()
    print(json.dumps({"rc": driver.wait(), "out": out, "err": "".join(err)}))
finally:
    for p in started:
        kill(p)
'''


TIMEOUT_S = 420  # the whole cluster script: two node starts, a grid and Ray's node-death detection


def _in_namespace(*args, cwd) -> dict:
    # Multi-node on one host: Ray refuses a second node unless told (RAY_ENV says no, for the
    # heads on the shared loopback); here the loopback is the namespace's own, reachable by nobody
    # else. A dead node is noticed after about 3 s instead of Ray's default 15 or more.
    env = {**os.environ, **RAY_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_health_check_period_ms": "1000",
           "RAY_health_check_failure_threshold": "3", "PYTHONPATH": str(cwd)}
    env.pop("ENGINE_DATA_DIR", None)
    p = subprocess.Popen(["unshare", "-n", sys.executable, "-c", _CLUSTER, *map(str, args)], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)  # the bound: a driver waiting forever fails here
    except subprocess.TimeoutExpired:
        _kill_namespace(p.pid)  # the nodes run in sessions of their own: found by their namespace
        out, err = p.communicate()
        pytest.fail(f"the cluster script did not end within {TIMEOUT_S} s: {err[-2000:]}")
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _kill_namespace(pid: int) -> None:
    """SIGKILL every process in the network namespace of ``pid`` (one this test created; never
    this process's own)."""
    ns = os.readlink(f"/proc/{pid}/ns/net")
    if ns == os.readlink("/proc/self/ns/net"):
        os.kill(pid, signal.SIGKILL)
        return
    for other in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{other}/ns/net") == ns:
                os.kill(int(other), signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture()
def namespaces():
    pytest.importorskip("ray", reason="ray is not installed (requirements.txt pins ray==2.60.0)")
    if shutil.which("unshare") is None or shutil.which("ip") is None or subprocess.run(
            ["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private network namespace here (unshare -n needs CAP_SYS_ADMIN)")


def _src(tmp_path) -> Path:
    """A snapshot of the engine to run the drivers from (the checkout may change meanwhile)."""
    root = tmp_path / "src"
    shutil.copytree(Path(__file__).resolve().parents[1] / "engine", root / "engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.slow
def test_a_grid_whose_only_worker_node_dies_ends_and_resumes(namespaces, tmp_path):
    """Head at --num-cpus 0, one worker node of one CPU, killed after the first cell: the driver
    notices no live node can run the rest, ends (exit 4, as failed cells do) with the line
    naming the cells not run, and keeps the finished cell: a local rerun on the same cache
    computes only the others."""
    root = _src(tmp_path)
    spec, cache = write(tmp_path, "slow.toml", SLOW), tmp_path / "cache"
    got = _in_namespace(spec, cache, "worker", cwd=root)
    assert got["rc"] == 4, got["err"][-2000:]
    obj = json.loads(got["out"])
    done = sorted(r["cell"] for r in obj["results"] if r["status"] == "computed")
    left = sorted(r["cell"] for r in obj["results"] if r["status"] == "failed")
    assert done and left and sorted(done + left) == [0, 1, 2, 3], obj
    # the cell running when its node died fails as such (retries 0); the ones never placed are named
    why = {r["cell"]: r["error"] for r in obj["results"] if r["status"] == "failed"}
    never = sorted(c for c, e in why.items() if "no live Ray node can run a cell" in e)
    assert never and all(why[c].startswith("NodeDiedError") for c in set(left) - set(never)), why
    assert all(f"cells {', '.join(map(str, never))} were not run" in why[c] for c in never), why
    assert "each needs 1 CPU; live nodes have: 0 CPU" in why[never[0]]
    rc, out, err = cli(spec, "--backend", "local", "--workers", "1", "--json", "--cache-dir", cache, cwd=root)
    again = json.loads(out)
    assert rc == 0, err
    assert (again["cached"], again["computed"], again["failed"]) == (len(done), len(left), 0)


@pytest.mark.slow
def test_a_grid_on_a_head_without_cpus_ends_naming_every_cell(namespaces, tmp_path):
    """No node can run a cell from the start: the driver ends instead of waiting forever."""
    root = _src(tmp_path)
    spec, cache = write(tmp_path, "fast.toml", FAST), tmp_path / "cache"
    got = _in_namespace(spec, cache, "alone", cwd=root)
    assert got["rc"] == 4, got["err"][-2000:]
    obj = json.loads(got["out"])
    assert (obj["computed"], obj["failed"]) == (0, 4)
    assert "cells 0, 1, 2, 3 were not run" in got["err"] and "live nodes have: 0 CPU" in got["err"]
