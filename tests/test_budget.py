"""engine.runtime.budget and engine.experiments.calibration: estimates follow every parameter, budgets refuse early.

No wall-clock timings are asserted: only how estimates move with their parameters and what
a refusal says.
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import engine.cli as cli
from conftest import REL_MEMORY_REREAD
from engine.data import DataSpec
from engine.experiments.configs.influence import InfluenceConfig
from engine.experiments.configs.kernels import KernelConfig
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.scaling import ScalingConfig
from engine.experiments.configs.spectrum import SpectrumConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.malleability import run_malleability
from engine.experiments.registry import EXPERIMENTS, estimate
from engine.experiments.scaling import run_scaling
from engine.experiments.sweep import run_ntk_sweep
from engine.maths.specs import AttackSpec, TrainSpec
from engine.runtime import budget as B
from engine.runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
SYN = DataSpec("synthetic", n=300, n_test=100, synthetic_d=64)
MALL = MalleabilityConfig(data=SYN, attacks=("pgd",), eps=(0.05,), seeds=(0,))


def _data(**kw):
    return DataSpec("synthetic", **{"n": 300, "n_test": 100, "synthetic_d": 64, **kw})


# (name, smaller config, larger config): the second must be estimated slower than the first
GROWS = [
    # width sweep
    ("sweep epochs", SweepConfig(data=SYN, train=TrainSpec(epochs=10)),
     SweepConfig(data=SYN, train=TrainSpec(epochs=20))),
    ("sweep more widths", SweepConfig(data=SYN, widths=(16, 64)), SweepConfig(data=SYN, widths=(16, 64, 256))),
    ("sweep larger width", SweepConfig(data=SYN, widths=(16, 64)), SweepConfig(data=SYN, widths=(16, 128))),
    ("sweep seeds", SweepConfig(data=SYN, seeds=(0,)), SweepConfig(data=SYN, seeds=(0, 1))),
    ("sweep n", SweepConfig(data=SYN), SweepConfig(data=_data(n=600))),
    ("sweep n_test", SweepConfig(data=SYN), SweepConfig(data=_data(n_test=300))),
    ("sweep d", SweepConfig(data=SYN), SweepConfig(data=_data(synthetic_d=128))),
    ("sweep archs", SweepConfig(data=SYN, archs=("relu",)), SweepConfig(data=SYN)),
    ("sweep stacked:k", SweepConfig(data=SYN, attention="stacked:2"), SweepConfig(data=SYN, attention="stacked:8")),
    ("sweep snapshots", SweepConfig(data=SYN, train=TrainSpec(epochs=20)),
     SweepConfig(data=SYN, train=TrainSpec(epochs=20, snapshot_epochs=(5, 10)))),
    # kernels
    ("kernels epochs", KernelConfig(data=SYN, train=TrainSpec(epochs=10)),
     KernelConfig(data=SYN, train=TrainSpec(epochs=20))),
    ("kernels width", KernelConfig(data=SYN, width=64), KernelConfig(data=SYN, width=128)),
    ("kernels n", KernelConfig(data=SYN), KernelConfig(data=_data(n=600))),
    ("kernels stacked:k", KernelConfig(data=SYN, arch="attn", attention="stacked:2"),
     KernelConfig(data=SYN, arch="attn", attention="stacked:8")),
    # spectrum
    ("spectrum n", SpectrumConfig(data=SYN), SpectrumConfig(data=_data(n=600))),
    ("spectrum growth", SpectrumConfig(data=SYN), SpectrumConfig(data=SYN, growth_ns=(100, 200))),
    ("spectrum stacked:k", SpectrumConfig(data=SYN, attention="stacked:2"),
     SpectrumConfig(data=SYN, attention="stacked:8")),
    # influence
    ("influence epochs", InfluenceConfig(data=SYN, train=TrainSpec(epochs=10)),
     InfluenceConfig(data=SYN, train=TrainSpec(epochs=20))),
    ("influence width", InfluenceConfig(data=SYN, width=256), InfluenceConfig(data=SYN, width=512)),
    ("influence seeds", InfluenceConfig(data=SYN, seeds=(0,)), InfluenceConfig(data=SYN, seeds=(0, 1))),
    ("influence n", InfluenceConfig(data=SYN), InfluenceConfig(data=_data(n=600))),
    ("influence n_test", InfluenceConfig(data=SYN), InfluenceConfig(data=_data(n_test=300))),
    ("influence stacked:k", InfluenceConfig(data=SYN, attention="stacked:2"),
     InfluenceConfig(data=SYN, attention="stacked:8")),
    # malleability
    ("malleability epochs", MALL, replace(MALL, train=TrainSpec(epochs=1000))),
    ("malleability width", MALL, replace(MALL, widths=(2048,))),
    ("malleability seeds", MALL, replace(MALL, seeds=(0, 1))),
    ("malleability n", MALL, replace(MALL, data=_data(n=600))),
    ("malleability stacked:k", replace(MALL, attention="stacked:2"), replace(MALL, attention="stacked:8")),
    ("malleability attack steps", MALL, replace(MALL, attack=AttackSpec(steps=40))),
    ("malleability number of eps", MALL, replace(MALL, eps=(0.05, 0.1, 0.3))),
    ("malleability attacks", MALL, replace(MALL, attacks=("pgd", "mim"))),
    ("malleability fgsm only", replace(MALL, attacks=("fgsm",)), MALL),
    ("malleability retrain", MALL, replace(MALL, retrain=True)),
    ("malleability interventions", MALL, replace(MALL, interventions=True)),
    ("malleability adversarial training", MALL, replace(MALL, adversarial_training=True)),
    # scaling
    ("scaling epochs", ScalingConfig(train=TrainSpec(epochs=10)), ScalingConfig(train=TrainSpec(epochs=20))),
    ("scaling max width", ScalingConfig(max_width=1024), ScalingConfig(max_width=4096)),
    ("scaling per octave", ScalingConfig(per_octave=1), ScalingConfig(per_octave=2)),
    ("scaling seeds", ScalingConfig(seeds=(0,)), ScalingConfig(seeds=(0, 1))),
    ("scaling n", ScalingConfig(n=64), ScalingConfig(n=128)),
    ("scaling d", ScalingConfig(d=32), ScalingConfig(d=64)),
    ("scaling kappas", ScalingConfig(kappas=(2.0, 4.0)), ScalingConfig(kappas=(2.0, 4.0, 8.0))),
    ("scaling attentions", ScalingConfig(), ScalingConfig(attentions=("linear", "stacked:2"))),
    ("scaling stacked:k", ScalingConfig(attentions=("stacked:2",)), ScalingConfig(attentions=("stacked:8",))),
]


@pytest.mark.parametrize("name,small,large", GROWS, ids=[g[0] for g in GROWS])
def test_estimates_grow_with_every_parameter(name, small, large):
    a, b = estimate(small), estimate(large)
    assert b.seconds > a.seconds > 0, name
    assert b.bytes >= a.bytes > 0, name


@pytest.mark.parametrize("make,n", [
    (lambda n: SweepConfig(data=_data(n=n, n_test=10, synthetic_d=16), widths=(16,)), 20_000),
    (lambda n: KernelConfig(data=_data(n=n, n_test=1, synthetic_d=16), width=16), 20_000),
    (lambda n: InfluenceConfig(data=_data(n=n, n_test=10, synthetic_d=16), width=16), 20_000),
    (lambda n: MalleabilityConfig(data=_data(n=n, n_test=10, synthetic_d=16), widths=(16,)), 20_000),
    (lambda n: ScalingConfig(n=n, d=8, min_width=16, max_width=32), 1000),
], ids=["sweep", "kernels", "influence", "malleability", "scaling"])
def test_memory_grows_with_n_squared(make, n):
    one, two = estimate(make(n)).bytes, estimate(make(2 * n)).bytes
    assert 3.5 <= two / one <= 4.0


def test_every_config_has_an_estimate():
    """Every ``*Config`` class declared in ``engine.experiments.configs`` is one record's config."""
    import importlib
    import pkgutil

    import engine.experiments.configs as package

    declared = {cls for info in pkgutil.iter_modules(package.__path__)
                for cls in vars(importlib.import_module(f"{package.__name__}.{info.name}")).values()
                if isinstance(cls, type) and cls.__name__.endswith("Config") and cls.__module__.endswith(info.name)}
    assert declared and declared == {e.config for e in EXPERIMENTS.values()}
    assert len(declared) == len(EXPERIMENTS)  # one record per config class
    with pytest.raises(BadInput, match="no experiment takes a DataSpec"):
        estimate(SYN)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_preset_has_a_positive_estimate(name):
    for which, cfg in EXPERIMENTS[name].presets.items():
        est = estimate(cfg)
        assert est is not None and 0 < est.seconds < float("inf") and 0 < est.bytes, (which, est)


# ---------------------------------------------------------------- check

def test_check_refuses_over_budget_work_with_one_line():
    B.check(B.Estimate(10.0, B.GIB), B.Budget(seconds=11.0, bytes=2 * B.GIB), "this run")  # fits: no error
    with pytest.raises(BadInput) as info:
        B.check(B.Estimate(7200.0, B.GIB), B.Budget(seconds=60.0, bytes=2 * B.GIB), "this run")
    text = str(info.value)
    assert "\n" not in text and "this run" in text and "2.0 h" in text and "1.0 min" in text and "--max-seconds" in text
    with pytest.raises(BadInput) as info:
        B.check(B.Estimate(1.0, 3 * B.GIB), B.Budget(seconds=60.0, bytes=B.GIB), "this run", "use n below 1000")
    text = str(info.value)
    assert "\n" not in text and "3.0 GiB" in text and "1.0 GiB" in text and text.endswith("use n below 1000")
    with pytest.raises(BadInput, match="GiB"):  # memory is checked first
        B.check(B.Estimate(1e9, 3 * B.GIB), B.Budget(seconds=60.0, bytes=B.GIB), "this run")
    B.check(B.Estimate(1e9, 2**61), B.UNLIMITED, "this run")


def test_estimates_add_time_and_keep_the_largest_memory():
    s = B.Estimate(1.0, 10) + B.Estimate(2.0, 5)
    assert s == B.Estimate(3.0, 10)
    assert [B.duration(v) for v in (5, 90, 7200)] == ["5 s", "1.5 min", "2.0 h"]
    assert B.Budget(bytes=None).limit_bytes() > 0 and B.Budget(bytes=123).limit_bytes() == 123


@pytest.mark.parametrize("run,cfg,kind", [
    (run_ntk_sweep, SweepConfig(data=_data(n=40, n_test=10, synthetic_d=8), widths=(16,), seeds=(0,),
                                train=TrainSpec(epochs=2)), "ntk-sweep"),
    (run_malleability, MalleabilityConfig(data=_data(n=40, n_test=10, synthetic_d=8), widths=(16,), seeds=(0,),
                                          train=TrainSpec(epochs=2)), "malleability"),
    (run_scaling, ScalingConfig(n=16, d=8, kappas=(2.0,), max_width=32, seeds=(0,), train=TrainSpec(epochs=2)),
     "scaling"),
], ids=["ntk-sweep", "malleability", "scaling"])
def test_runs_refuse_before_computing_anything(cache, run, cfg, kind):
    stages = []
    with pytest.raises(BadInput, match="over the budget") as info:
        run(cfg, cache, progress=lambda f, s: stages.append(s), budget=B.Budget(seconds=1e-3))
    assert "\n" not in str(info.value)
    assert stages == [] and (kind, cfg) not in cache and len(cache._store) == 0
    with pytest.raises(BadInput, match="GiB"):
        run(cfg, cache, progress=lambda f, s: stages.append(s), budget=B.Budget(bytes=1))
    assert stages == [] and len(cache._store) == 0
    assert not run(cfg, cache, budget=B.Budget()).cached and (kind, cfg) in cache  # the same run fits the default


def test_runaway_attention_is_refused_at_construction():
    with pytest.raises(BadInput, match="attention"):
        SpectrumConfig(attention="stacked:100000000")
    with pytest.raises(BadInput, match="attention"):
        SweepConfig(attention="truncated:1e9")


# ---------------------------------------------------------------- command line

def test_cli_estimate_prints_an_estimate_without_running(tmp_path):
    cache = tmp_path / "cache"
    p = subprocess.run([sys.executable, "-m", "engine", "ntk-sweep", "--dataset", "synthetic", "--n", "300",
                        "--n-test", "100", "--synthetic-d", "64", "--estimate", "--json", "--cache-dir", str(cache)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ENGINE_SPEED_FACTOR": "2.5"})  # a machine 2.5x slower than the reference
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    want = estimate(SweepConfig(data=SYN))
    assert out["estimate_seconds"] == pytest.approx(want.seconds) and out["estimate_bytes"] == want.bytes
    here = 2.5 * want.seconds + out["import_seconds"]  # and the run's own process imports torch and pandas
    assert out["speed_factor"] == 2.5 and out["import_seconds"] > 0 and out["estimate_seconds_here"] == pytest.approx(here)
    assert out["describe"].startswith(B.Estimate(here, want.bytes).describe())
    assert "rows" not in out and "%]" not in p.stderr  # no result, no progress: nothing ran
    assert not cache.exists() or not any(cache.iterdir())


def test_cli_max_seconds_refuses_with_one_line(capsys, tmp_path):
    rc = cli.main(["ntk-sweep", "--dataset", "synthetic", "--n", "300", "--n-test", "100", "--synthetic-d", "64",
                   "--max-seconds", "0.001", "--cache-dir", str(tmp_path), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out and err.startswith("error: this width sweep would take") and err.count("\n") == 1
    assert "--max-seconds" in err


def _cgroup(root, files: dict) -> str:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_cgroup_limits_bound_the_memory_a_run_may_use(tmp_path):
    """A container's limit, written as the kernel writes it: v2 and v1 layouts, page cache that
    can be reclaimed counted as free, no limit at all, and a process in a nested cgroup (no
    cgroup namespace) whose limit sits in its own folder, not at the root."""
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/\n")

    def free(root, cgroup_line=None):
        if cgroup_line is not None:
            proc.write_text(cgroup_line)
        return B.cgroup_free_bytes(str(root), str(proc))

    v2 = _cgroup(tmp_path / "v2", {"memory.max": "8589934592\n", "memory.current": "3221225472\n",
                                   "memory.stat": "anon 100\ninactive_file 1073741824\nactive_file 5\n"})
    assert free(v2) == 8 * B.GIB - 3 * B.GIB + B.GIB
    v1 = _cgroup(tmp_path / "v1", {"memory/memory.limit_in_bytes": "4294967296\n",
                                   "memory/memory.usage_in_bytes": "1073741824\n",
                                   "memory/memory.stat": "cache 9\ntotal_inactive_file 0\n"})
    assert free(v1, "4:memory:/\n0::/\n") == 3 * B.GIB
    assert free(_cgroup(tmp_path / "max", {"memory.max": "max\n", "memory.current": "1\n"})) is None
    assert free(_cgroup(tmp_path / "v1max", {"memory/memory.limit_in_bytes": "9223372036854771712\n",
                                             "memory/memory.usage_in_bytes": "1\n"})) is None
    assert free(tmp_path / "none") is None
    assert free(_cgroup(tmp_path / "over", {"memory.max": "100\n", "memory.current": "200\n"})) == 0
    nested = _cgroup(tmp_path / "nested", {"memory.max": "max\n", "memory.current": "9\n",
                                           "system.slice/dash.service/memory.max": "2147483648\n",
                                           "system.slice/dash.service/memory.current": "1073741824\n"})
    assert free(nested, "0::/system.slice/dash.service\n") == B.GIB
    nested_v1 = _cgroup(tmp_path / "nested_v1", {"memory/user/memory.limit_in_bytes": "3221225472\n",
                                                 "memory/user/memory.usage_in_bytes": "1073741824\n"})
    assert free(nested_v1, "7:cpu,cpuacct:/x\n4:memory:/user\n") == 2 * B.GIB


def test_gpu_runs_are_bounded_by_host_memory_too():
    """A CUDA run keeps data and results on the host: its limit is never above the host's."""
    import torch

    host = B.Budget().limit_bytes()
    assert B.Budget().limit_bytes(torch.device("cpu")) == pytest.approx(host, rel=REL_MEMORY_REREAD)
    if torch.cuda.is_available():
        gpu = B.Budget().limit_bytes(torch.device("cuda"))
        assert gpu <= 1.1 * host and gpu <= 0.8 * B.free_bytes(torch.device("cuda")) * 1.1


# ---------------------------------------------------------------- estimates count what the data has

@pytest.mark.parametrize("name", [n for n, e in EXPERIMENTS.items() if "data" in e.nested and n != "spectrum"])
def test_estimates_grow_with_the_number_of_classes(name):
    """Readouts, outputs, targets and leave-one-out solves scale with the classes of the data
    (every experiment that trains a net; the spectrum reads no labels)."""
    cfg = EXPERIMENTS[name].probe()
    few, many = (replace(cfg, data=replace(cfg.data, synthetic_classes=c)) for c in (10, 100))
    assert estimate(many).bytes > estimate(few).bytes, name
    assert B.n_classes(many.data) == 100 and B.n_outputs(replace(cfg.data, dataset="mnist:3-8")) == 1


def test_a_user_npz_counts_its_own_labels(tmp_path):
    import numpy as np

    path = tmp_path / "many.npz"
    np.savez(path, X=np.zeros((30, 4), np.float32), y=np.arange(30) % 15)
    assert B.n_classes(DataSpec(dataset=str(path), n=20, n_test=1)) == 15
    assert B.n_classes(DataSpec(dataset=str(tmp_path / "absent.npz"))) == 10  # loading says what is wrong


def _own_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory folder where a child group can be made (root only)."""
    root = Path("/sys/fs/cgroup/memory")
    try:
        line = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if "memory" in ln.split(":")[1].split(","))
    except (OSError, StopIteration, IndexError):
        return None
    own = root / line.split(":", 2)[2].lstrip("/")
    return own if (own / "memory.limit_in_bytes").exists() and os_access(own) else None


def os_access(path: Path) -> bool:
    import os

    return os.access(path, os.W_OK)


@pytest.mark.slow
def test_a_run_over_a_real_cgroup_limit_is_refused_not_killed(tmp_path):
    """A real child process in a real memory cgroup (v1, as on these machines) whose limit the run's
    estimate exceeds: exit 2 with the GiB it needs, never the kernel's signal 9."""
    import os

    import numpy as np

    parent = _own_memory_cgroup()
    if parent is None:
        pytest.skip("no writable cgroup v1 memory controller here")
    group = parent / f"engine-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup: {exc}")
    try:
        (group / "memory.limit_in_bytes").write_text(str(int(1.5 * B.GIB)))
        data = tmp_path / "c600.npz"
        rng = np.random.default_rng(0)
        np.savez(data, X=rng.random((3000, 64)).astype(np.float32), y=np.arange(3000) % 600,
                 X_test=rng.random((300, 64)).astype(np.float32), y_test=np.arange(300) % 600)
        args = [sys.executable, "-m", "engine", "dynamics", "--dataset", str(data), "--n", "2900", "--n-test", "300",
                "--widths", "4096,16384", "--seeds", "0", "--epochs", "2", "--no-cache", "--quiet"]
        est = json.loads(subprocess.run([*args, "--estimate", "--json"], capture_output=True, text=True,
                                        cwd=Path(__file__).resolve().parents[1]).stdout)["estimate_bytes"]
        assert est > 1.5 * B.GIB  # so the limit is what refuses it
        shell = f'echo $$ > {group}/cgroup.procs && exec "$@"'
        p = subprocess.run(["sh", "-c", shell, "sh", *args], capture_output=True, text=True, timeout=600,
                           cwd=Path(__file__).resolve().parents[1])
        assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
        assert "GiB" in p.stderr and "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr
    finally:
        try:
            group.rmdir()
        except OSError:
            pass


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("shape,where", [((1500, 1500), "first"), ((1500, 1500), "last"), ((3000, 700), "middle"),
                                         ((2**21,), "last"), ((10, 10), "middle")])
def test_all_finite_is_torch_isfinite_all_without_the_n_squared_temporary(monkeypatch, shape, where, bad):
    """The blocked check answers what ``torch.isfinite(t).all()`` answers, wherever the one bad
    entry sits (first, middle or last block, the last block short), on contiguous tensors and on
    a transposed view (the Cholesky factors' layout), with a block much smaller than the tensor."""
    import torch

    monkeypatch.setattr(B, "FINITE_BLOCK", 4096)
    g = torch.Generator().manual_seed(len(shape) + shape[0])
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    if bad is not None:
        flat = t.view(-1)
        flat[{"first": 0, "middle": flat.numel() // 2 + 7, "last": flat.numel() - 1}[where]] = bad
    want = bool(torch.isfinite(t).all())
    assert want == (bad is None)
    assert B.all_finite(t) is want
    if t.ndim == 2:
        assert B.all_finite(t.mT) is want
        assert B.all_finite(t.to(torch.float32)) is want
