"""Benchmarks that print ratios measured side by side in one run (never timed assertions).

Every figure pairs a step with its reference in the same run: the two (or three) run
alternately, one warm-up each and then ``repeat`` rounds, and the figure is the ratio of
their medians, in wall time and in CPU time (``time.process_time``, all threads). A load
that comes and goes on a shared machine then hits both sides alike, and the CPU-time ratio
shows what wall time hides (threads waiting for a core). Keys of ``run``:

- ``machine``: CPU model, the SIMD flags that set GEMM rates (avx2, avx512*, vnni, amx),
  cores, torch threads and version (``machine_info``); every JSON-lines row repeats the threads.
- ``count_path``: ``engine.ntk.count_path_report``: which exact count GEMM the empirical NTK
  uses on the device and each path's measured rate.
- ``entk_fraction_of_gemm_peak`` (and ``_cpu``): the FLOPs the closed-form empirical NTK
  needs (Φ Wᵀ, the symmetric half of S Sᵀ, the symmetric half of Φ Φᵀ) per second, over the
  rate of an fp32 (g x g) @ (g x g) GEMM run alternately with it.
- ``entk_speedup_vs_torch_func`` (and ``_cpu``): against the torch.func Jacobian-contraction
  recipe (per-sample Jacobians by ``vmap(jacrev)``, contracted by einsum), same net and
  inputs, run alternately; ``entk_max_rel_diff_vs_torch_func`` checks the kernels agree.
- ``train_fraction_of_gemm_peak`` (and ``_cpu``) and ``sweep_batched_speedup_vs_loop``: the
  batched training of a width sweep (forward, readout and weight-gradient GEMMs per step),
  a loop that trains each width alone, and the fp32 GEMM, the three run alternately.
- ``page_render_*``: a dashboard page rendered with a cold cache against the same page with
  a warm one (``benchmarks/page_render.py``, in its own process, so that this module never
  imports streamlit).
- ``peer_*`` (``peer="neural-tangents"``): neural-tangents' empirical NTK of the same head,
  weights and rows against the engine's, alternately (``peer_neural_tangents``).
- ``run_scale`` (``run(scale=True)``): the float64 kernel algebra at n = 8000 real MNIST
  digits, each step against its floor (the plain torch call that any implementation
  needs, or that the textbook recipe uses), measured alternately in the same run:
  ``gram_spectrum`` against ``eigvalsh(Xᵀ X)`` (``X Xᵀ`` when n <= d), ``infinite_ntk``
  against the float64 GEMM ``X Xᵀ``, ``loo_influence`` (500 test points) against
  ``cholesky`` + ``cholesky_inverse`` of K + λI, and the closed-form empirical NTK at
  m = 4096 against its three GEMMs run as plain full calls. Keys ``scale_<step>_seconds``,
  ``scale_<step>_floor_seconds``, ``scale_<step>_ratio`` (time / floor; ``_cpu_`` for CPU
  time), ``scale_<step>_floor`` (what the floor is) and ``scale_<step>_max_rel_diff`` (the
  step's result checked against one computed from the floor's output).
  ``scale_storage32_<arch>_*``: what float32 kernel storage changes in exact LOO influence
  (target "true", K∞ of each architecture's features at the same n): ``influence_rel_diff``
  (Frobenius, relative to float64), ``sign_disagreement`` (share of influence signs that
  differ) and ``top10_same`` (the top-10 % by |aggregate influence| is the same set).

Parts and limits: each part (count path, eNTK, recipe, training, page, peer, each scale
step) has ``timeout`` seconds. Its rounds stop at the limit (at least one is kept;
``<part>_repeats`` says how many ran); a subprocess part is killed at it; a part that fails
or runs out of time becomes ``<part>_error`` with the reason, and the other parts still run.
With ``out``, each part's row is appended to that JSON-lines file as soon as it is measured.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .data import DataSpec, load_sample
from .errors import BadInput, DataCorrupt, DataMissing
from .influence import influence_matrix, loo_influence
from .influence import aggregate, top_indices
from .models import Net, TwoLayerReLU, features, normalize_rows
from .ntk import STORAGE, count_dtype, count_path_report, empirical_ntk_features, exact_counts, infinite_ntk
from .spectral import gram_spectrum
from .training import TrainSpec, train, train_many

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("neural-tangents",)  # values of run(peer=...)
NT_PYTHON_ENV = "ENGINE_NT_PYTHON"  # the Python of an environment with neural-tangents and jax
NT_IMPLEMENTATIONS = ("STRUCTURED_DERIVATIVES", "JACOBIAN_CONTRACTION", "NTK_VECTOR_PRODUCTS")

SIZES = {  # quick: a few minutes on a 2-core CPU; full: the sizes of issue 5
    True: {"entk": (200, 1024, 784), "gemm": 1536, "train": (500, (16, 64, 256, 1024), 10)},
    False: {"entk": (300, 4096, 784), "gemm": 2048, "train": (1000, (16, 64, 256, 1024, 4096), 5)},
}
TIMEOUT = {True: 300.0, False: 1200.0}  # seconds per part, quick and full

_SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
               "amx_tile", "amx_int8", "amx_bf16")


def machine_info(device: torch.device | None = None) -> dict:
    """CPU model and SIMD flags (from /proc/cpuinfo), cores, torch threads and version, GPU name."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("unknown", platform.processor()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    info = {"cpu_model": model, "cpu_flags": [f for f in _SIMD_FLAGS if f in flags], "cpu_cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _once(fn, sync, calls: int = 1) -> tuple[float, float]:
    """Wall and CPU seconds of one call (the mean of ``calls`` calls)."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls


def _interleaved(fns: dict, repeat: int, sync, deadline: float = math.inf, calls: dict | None = None) -> dict:
    """Run ``fns`` (name: callable) alternately: one warm-up each, then up to ``repeat`` rounds,
    fewer once ``deadline`` (a ``time.perf_counter`` value) has passed, at least one.

    Returns {name: {"seconds", "cpu_seconds"}} (medians over rounds) and "repeats". ``calls``
    (name: k) times the mean of k calls per round, for a short reference beside a long step.
    """
    calls = calls or {}
    for fn in fns.values():
        _once(fn, sync)
    rounds = {name: [] for name in fns}
    for k in range(max(1, repeat)):
        for name, fn in fns.items():
            rounds[name].append(_once(fn, sync, calls.get(name, 1)))
        if time.perf_counter() > deadline:
            break
    out = {name: {"seconds": statistics.median(w for w, _ in r), "cpu_seconds": statistics.median(c for _, c in r)}
           for name, r in rounds.items()}
    out["repeats"] = k + 1
    return out


def _gemm(size: int, device: torch.device, dtype=torch.float32):
    """The reference: one (size x size) @ (size x size) GEMM; returns (callable, FLOPs)."""
    A = torch.rand(size, size, device=device, dtype=dtype)
    B = torch.rand(size, size, device=device, dtype=dtype)
    return (lambda: A @ B), 2 * size**3


def gemm_rate(size: int, device: torch.device, sync) -> float:
    """FLOP/s of one fp32 (size × size) @ (size × size) GEMM (median of 5 after a warm-up)."""
    fn, flops = _gemm(size, device)
    return flops / _interleaved({"gemm": fn}, 5, sync)["gemm"]["seconds"]


def _rates(step: dict, ref: dict, flops: float, ref_flops: float) -> tuple[float, float]:
    """(wall, CPU) ratios of the step's FLOP rate to the reference's."""
    return ((flops / step["seconds"]) / (ref_flops / ref["seconds"]),
            (flops / step["cpu_seconds"]) / (ref_flops / ref["cpu_seconds"]))


def torch_func_ntk(head: TwoLayerReLU, phi1: torch.Tensor, phi2: torch.Tensor) -> torch.Tensor:
    """The torch.func recipe: per-sample Jacobians for every parameter, contracted by einsum."""
    from torch.func import functional_call, jacrev, vmap

    params = {k: v.detach() for k, v in head.named_parameters()}
    buffers = dict(head.named_buffers())

    def f(p, x):
        return functional_call(head, (p, buffers), (x[None],))[0]

    J1 = vmap(jacrev(f), (None, 0))(params, phi1)
    J2 = vmap(jacrev(f), (None, 0))(params, phi2)
    K = sum(torch.einsum("Naf,Mbf->NMab", J1[k].flatten(2), J2[k].flatten(2)) for k in J1)
    return K.diagonal(dim1=2, dim2=3).mean(dim=2)  # average of the per-output kernels


def _entk_case(n: int, m: int, d: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    phi = normalize_rows(torch.rand(n, d, generator=g)).to(device)
    return phi, TwoLayerReLU(d, m, 1, seed=0).to(device)


def entk_flops(n: int, m: int, d: int) -> float:
    """The FLOPs the closed form needs: Φ Wᵀ, half of S Sᵀ and half of Φ Φᵀ."""
    return 2 * (n * d * m + n * n * m / 2 + n * n * d / 2)


def bench_entk(n: int, m: int, d: int, device: torch.device, sync, gemm_size: int = 1536, repeat: int = 7,
               deadline: float = math.inf) -> dict:
    """The closed-form empirical NTK (n rows, width m, d features) and the fp32 GEMM, alternately."""
    phi, head = _entk_case(n, m, d, device)
    gemm, gemm_flops = _gemm(gemm_size, device)
    t = _interleaved({"entk": lambda: empirical_ntk_features(head, phi), "gemm": gemm}, repeat, sync, deadline)
    flops = entk_flops(n, m, d)
    wall, cpu = _rates(t["entk"], t["gemm"], flops, gemm_flops)
    return {"entk_seconds": t["entk"]["seconds"], "entk_cpu_seconds": t["entk"]["cpu_seconds"],
            "gemm_seconds": t["gemm"]["seconds"], "gemm_gflops": gemm_flops / t["gemm"]["seconds"] / 1e9,
            "gemm_size": gemm_size, "entk_gflops": flops / t["entk"]["seconds"] / 1e9,
            "entk_fraction_of_gemm_peak": wall, "entk_fraction_of_gemm_peak_cpu": cpu,
            "entk_repeats": t["repeats"], "entk_size": {"n": n, "m": m, "d": d}}


def bench_torch_func(n: int, m: int, d: int, device: torch.device, sync, repeat: int = 2,
                     deadline: float = math.inf) -> dict:
    """The closed form against the torch.func recipe, alternately; the kernels must agree."""
    phi, head = _entk_case(n, m, d, device)
    K = empirical_ntk_features(head, phi)
    K_ref = torch_func_ntk(head, phi, phi).double()
    t = _interleaved({"entk": lambda: empirical_ntk_features(head, phi),
                      "recipe": lambda: torch_func_ntk(head, phi, phi)}, repeat, sync, deadline)
    return {"torch_func_seconds": t["recipe"]["seconds"], "torch_func_cpu_seconds": t["recipe"]["cpu_seconds"],
            "entk_speedup_vs_torch_func": t["recipe"]["seconds"] / t["entk"]["seconds"],
            "entk_speedup_vs_torch_func_cpu": t["recipe"]["cpu_seconds"] / t["entk"]["cpu_seconds"],
            "entk_max_rel_diff_vs_torch_func": float((K - K_ref).abs().max() / K_ref.abs().max()),
            "torch_func_repeats": t["repeats"], "torch_func_size": {"n": n, "m": m, "d": d}}


def bench_training(n: int, widths, epochs: int, device: torch.device, sync, gemm_size: int = 1536, repeat: int = 3,
                   deadline: float = math.inf) -> dict:
    """Batched training of all widths, a loop over widths and the fp32 GEMM, alternately."""
    g = torch.Generator().manual_seed(1)
    d, c = 784, 10
    X = torch.rand(n, d, generator=g).to(device)
    y = torch.randint(0, c, (n,), generator=g).to(device)
    spec = TrainSpec(epochs=epochs)
    gemm, gemm_flops = _gemm(gemm_size, device)

    def nets():
        return [Net("relu", X, w, c, seed=0).to(device) for w in widths]

    t = _interleaved({"batched": lambda: train_many(nets(), X, y, c, spec),
                      "loop": lambda: [train(net, X, y, c, spec) for net in nets()],
                      "gemm": gemm}, repeat, sync, deadline, calls={"gemm": 5})
    M = sum(widths)
    # Per sample and step: Φ Wᵀ and the weight gradient (2·d·M each), readout and its gradient.
    flops = epochs * n * 2 * (2 * d * M + 2 * M * len(widths) * c)
    wall, cpu = _rates(t["batched"], t["gemm"], flops, gemm_flops)
    return {"train_seconds": t["batched"]["seconds"], "train_cpu_seconds": t["batched"]["cpu_seconds"],
            "train_loop_seconds": t["loop"]["seconds"], "train_loop_cpu_seconds": t["loop"]["cpu_seconds"],
            "sweep_batched_speedup_vs_loop": t["loop"]["seconds"] / t["batched"]["seconds"],
            "sweep_batched_speedup_vs_loop_cpu": t["loop"]["cpu_seconds"] / t["batched"]["cpu_seconds"],
            "train_gflops": flops / t["batched"]["seconds"] / 1e9,
            "train_fraction_of_gemm_peak": wall, "train_fraction_of_gemm_peak_cpu": cpu,
            "train_repeats": t["repeats"],
            "train_size": {"n": n, "widths": list(widths), "epochs": epochs, "batch": spec.batch_size}}


def _last_line(text: str) -> str:
    """The last line that names an exception (tracebacks end with notes too), else the last line."""
    lines = [s.strip() for s in text.strip().splitlines() if s.strip()]
    named = [s for s in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", s)]
    return (named or lines or [""])[-1]


def bench_page(timeout: float = 300, script: Path | None = None) -> dict:
    """Cold against warm render of a dashboard page, in its own process; a timeout, a failure or
    unreadable output becomes ``page_render_error`` with the reason."""
    script = script or ROOT / "benchmarks" / "page_render.py"
    if not script.exists():
        return {"page_render": None, "page_render_error": f"{script} is missing"}
    try:
        p = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"page_render": None, "page_render_error": f"timed out after {timeout:.0f} s ({script.name})"}
    if p.returncode != 0:
        return {"page_render": None,
                "page_render_error": f"exit {p.returncode}: {_last_line(p.stderr) or _last_line(p.stdout)}"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"page_render": None, "page_render_error": f"no JSON line in its output: {_last_line(p.stdout)!r}"}


class _Peer:
    """A line-protocol conversation with ``benchmarks/peer_nt.py`` under another Python, with a
    deadline on every reply."""

    def __init__(self, python: str, args: list[str], env: dict, deadline: float):
        self.deadline = deadline
        self.p = subprocess.Popen([python, str(ROOT / "benchmarks" / "peer_nt.py"), *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.p.stdout, selectors.EVENT_READ)

    def ask(self, line: str | None) -> dict:
        if line is not None:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
        left = self.deadline - time.perf_counter()
        if left <= 0 or not self.sel.select(timeout=left):
            raise TimeoutError("timed out")
        reply = self.p.stdout.readline()
        if not reply:
            self.p.wait(timeout=5)
            raise RuntimeError(f"peer exited {self.p.returncode}: {_last_line(self.p.stderr.read())}")
        return json.loads(reply)

    def close(self) -> None:
        try:
            if self.p.poll() is None:
                self.p.stdin.write("quit\n")
                self.p.stdin.flush()
                self.p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.sel.close()


def peer_neural_tangents(n: int = 300, m: int = 4096, d: int = 784, device: str | torch.device = "cpu",
                         python: str | None = None, implementation: str = "STRUCTURED_DERIVATIVES",
                         repeat: int = 5, timeout: float = 300) -> dict:
    """neural-tangents' empirical NTK of the same head, weights and rows against the engine's.

    The peer runs under ``python`` (default: ``$ENGINE_NT_PYTHON``), the interpreter of an
    environment with neural-tangents 0.6.5 and jax/jaxlib 0.4.28 (benchmarks/README.md), as a
    subprocess that computes the kernel with respect to W on each request, so that the two
    run alternately (``repeat`` rounds after one warm-up each; jax compiles in its warm-up).
    With one torch thread the peer gets one XLA thread too. Returns ``peer_*`` keys: medians
    of wall and CPU seconds of each side, ``peer_speedup`` (peer time / engine time; > 1
    means the engine is faster; ``_cpu`` in CPU time), ``peer_max_rel_diff`` (max |ΔK| / max
    |K|), the peer's versions; or ``peer_skipped`` with a one-line reason when no such
    Python is given, it cannot import neural-tangents, or jax lacks the device; or
    ``peer_error`` when it fails or passes ``timeout`` seconds.
    """
    import numpy as np

    from .device import resolve_device

    if implementation not in NT_IMPLEMENTATIONS:
        raise BadInput(f"unknown neural-tangents implementation {implementation!r}; "
                       f"allowed: {', '.join(NT_IMPLEMENTATIONS)}")
    dev = resolve_device(device)
    python = python or os.environ.get(NT_PYTHON_ENV)
    if not python:
        return {"peer_skipped": f"{NT_PYTHON_ENV} is not set (the Python of an environment with neural-tangents "
                                f"0.6.5 and jax 0.4.28; see benchmarks/README.md)"}
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return {"peer_skipped": f"{NT_PYTHON_ENV}={python!r} is not an executable file"}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    deadline = time.perf_counter() + timeout
    phi, head = _entk_case(n, m, d, dev)
    K = empirical_ntk_features(head, phi)
    env = {**os.environ, "JAX_PLATFORMS": "cuda" if dev.type == "cuda" else "cpu"}
    env.pop("PYTHONPATH", None)  # the peer's own site-packages, never this environment's
    if torch.get_num_threads() == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    row = {"peer": f"neural-tangents {implementation}", "peer_size": {"n": n, "m": m, "d": d},
           "peer_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="engine-peer-") as folder:
        data = Path(folder) / "case.npz"
        np.savez(data, phi=phi.cpu().numpy(), W=head.W.detach().cpu().numpy(), a=head.a.cpu().numpy())
        peer = None
        try:
            peer = _Peer(python, [str(data), implementation], env, deadline)
            ready = peer.ask(None)
            if "skip" in ready:
                return {**row, "peer_skipped": ready["skip"]}
            if dev.type == "cuda" and ready.get("backend") != "gpu":
                return {**row, "peer_skipped": f"jax there has no CUDA backend (it runs on {ready.get('backend')})"}
            row["peer_versions"] = {k: ready[k] for k in ("neural_tangents", "jax", "jaxlib", "numpy") if k in ready}
            times = {"peer": [], "engine": []}
            peer.ask("run")  # warm-up: jax traces and compiles here
            _once(lambda: empirical_ntk_features(head, phi), sync)
            for _ in range(max(1, repeat)):
                r = peer.ask("run")
                times["peer"].append((r["wall"], r["cpu"]))
                times["engine"].append(_once(lambda: empirical_ntk_features(head, phi), sync))
                if time.perf_counter() > deadline:
                    break
            saved = Path(folder) / "K_peer.npy"
            peer.ask(f"save {saved}")
            K_peer = torch.from_numpy(np.load(saved)).to(K)
        except (TimeoutError, subprocess.TimeoutExpired):
            return {**row, "peer_error": f"timed out after {timeout:.0f} s"}
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            return {**row, "peer_error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
        finally:
            if peer is not None:
                peer.close()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    return {**row, "peer_seconds": med["peer"][0], "peer_cpu_seconds": med["peer"][1],
            "peer_entk_seconds": med["engine"][0], "peer_entk_cpu_seconds": med["engine"][1],
            "peer_speedup": med["peer"][0] / med["engine"][0], "peer_speedup_cpu": med["peer"][1] / med["engine"][1],
            "peer_max_rel_diff": float((K - K_peer).abs().max() / K.abs().max()), "peer_repeats": len(times["peer"])}


SCALE_N = 8000       # training points of the scale benchmark (MNIST train split)
SCALE_N_TEST = 500   # test points scored by the LOO influence
SCALE_M = 4096       # width of the empirical NTK
SCALE_D = 784        # input dimension of the random fallback (MNIST's)
SCALE_RIDGE = 1e-3   # λ relative to mean diag K, as everywhere in the engine


def _scale_data(n: int, n_test: int, data_dir):
    """ℓ2-normalised float64 rows and labels of MNIST, or random rows if it is missing."""
    try:
        s = load_sample(DataSpec(dataset="mnist", n=n, n_test=n_test), data_dir, allow_download=False)
        return normalize_rows(s.X), normalize_rows(s.X_test), s.y, s.y_test, f"mnist ({s.source})", False
    except (DataMissing, DataCorrupt) as exc:
        g = torch.Generator().manual_seed(0)
        Z = normalize_rows(torch.rand(n + n_test, SCALE_D, generator=g, dtype=torch.float64))
        y = torch.randint(0, 10, (n + n_test,), generator=g)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Z[:n], Z[n:], y[:n], y[n:], f"random l2-normalised rows, d = {SCALE_D} (MNIST missing: {why})", True


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def storage_cost(phi, phi_test, Y, y_test, ridge: float = SCALE_RIDGE) -> dict:
    """What float32 kernel storage changes in exact LOO influence (target "true") under K∞
    of these features, against float64 storage: relative difference, sign disagreement and
    whether the top-10 % by |aggregate influence| stays the same set."""
    I = {}
    for storage in STORAGE:
        K, K_test = infinite_ntk(phi, storage=storage), infinite_ntk(phi_test, phi, storage=storage)
        I[storage] = influence_matrix(K, K_test, Y, ridge, target="true", y_test=y_test)
        del K, K_test
    a, b = I["float64"], I["float32"]
    top = [set(top_indices(aggregate(v), 0.1).tolist()) for v in (a, b)]
    return {"influence_rel_diff": float(torch.linalg.norm(b - a) / torch.linalg.norm(a)),
            "sign_disagreement": float((torch.sign(a) != torch.sign(b)).double().mean()),
            "top10_same": top[0] == top[1]}


def _floor_row(step: str, t: dict, floor: str, diff: float, name: str = "step") -> dict:
    """The keys of one scale step measured against its floor (``t`` from ``_interleaved``)."""
    s, f = t[name], t["floor"]
    return {f"scale_{step}_seconds": s["seconds"], f"scale_{step}_floor_seconds": f["seconds"],
            f"scale_{step}_ratio": s["seconds"] / f["seconds"],
            f"scale_{step}_cpu_seconds": s["cpu_seconds"], f"scale_{step}_floor_cpu_seconds": f["cpu_seconds"],
            f"scale_{step}_cpu_ratio": s["cpu_seconds"] / f["cpu_seconds"],
            f"scale_{step}_floor": floor, f"scale_{step}_max_rel_diff": diff, f"scale_{step}_repeats": t["repeats"]}


class _Rows:
    """Appends one JSON line per part to ``path`` as soon as it is measured (nothing when None)."""

    def __init__(self, path):
        self.path, self.run = (None if path is None else Path(path)), time.strftime("%Y-%m-%dT%H:%M:%S")
        if self.path is not None:
            try:
                with open(self.path, "a"):
                    pass
            except OSError as exc:
                raise BadInput(f"cannot write bench results to {str(path)!r}: {exc.strerror or exc}") from exc

    def write(self, part: str, row: dict) -> None:
        if self.path is not None:
            line = json.dumps(_finite({"run": self.run, "part": part, "threads": torch.get_num_threads(), **row}))
            with open(self.path, "a") as f:
                f.write(line + "\n")


def _part(name: str, fn, limit: float) -> dict:
    """``fn(deadline)``'s row; a failure becomes ``<name>_error`` with its reason, never a crash
    (a bench that stops at its first failure loses every figure after it)."""
    start = time.perf_counter()
    try:
        row = fn(start + limit)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 -- any failure of one part is that part's row
        return {f"{name}_error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    took = time.perf_counter() - start
    if took > limit:
        row[f"{name}_over_limit"] = f"took {took:.0f} s against a limit of {limit:.0f} s (a round is never cut midway)"
    return row


def _check_limits(repeat: int, timeout: float | None) -> None:
    if repeat < 1:
        raise BadInput(f"repeat must be >= 1, got {repeat}")
    if timeout is not None and not timeout > 0:
        raise BadInput(f"timeout must be > 0 seconds, got {timeout!r}")


def run_scale(n: int = SCALE_N, device: str = "auto", data_dir=None, progress=None, repeat: int = 2,
              n_test: int = SCALE_N_TEST, m: int = SCALE_M, out=None, timeout: float | None = None) -> dict:
    """The scale benchmark (see the module notes) at n training points; one JSON-able dict.

    Data: ``load_sample(DataSpec("mnist", n, n_test), data_dir)`` without downloading; when
    MNIST is absent, random ℓ2-normalised rows (d = 784) and ``scale_fallback`` True, with
    the reason in ``scale_data``. Times are medians of ``repeat`` alternate rounds after a
    warm-up. ``out``: JSON-lines file that gets each step's row as it is measured;
    ``timeout``: seconds per step (default 1200).
    """
    from .device import resolve_device

    if n < 2 or n_test < 1 or m < 1:
        raise BadInput(f"run_scale needs n >= 2, n_test >= 1, m >= 1; got {n}, {n_test}, {m}")
    _check_limits(repeat, timeout)
    dev = resolve_device(device)
    rows = _Rows(out)
    limit = timeout or TIMEOUT[False]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    say = progress or (lambda f, s: None)
    say(0.0, f"data: {n} + {n_test} digits")
    X, X_test, y, y_test, source, fallback = _scale_data(n, n_test, data_dir)
    X, X_test, y, y_test = X.to(dev), X_test.to(dev), y.to(dev), y_test.to(dev)
    result = {"device": str(dev), **machine_info(dev), "scale_data": source, "scale_fallback": fallback,
              "scale_size": {"n": n, "n_test": n_test, "d": X.shape[1], "m": m, "classes": 10, "ridge": SCALE_RIDGE}}
    rows.write("scale_machine", result)
    state = {}

    def part(name, frac, what, fn):
        say(frac, what)
        row = _part(f"scale_{name}", fn, limit)
        result.update(row)
        rows.write(f"scale_{name}", row)

    wide = n <= X.shape[1]  # then the smaller Gram, and the floor, is X Xᵀ

    def eigvalsh_floor():
        return torch.linalg.eigvalsh(X @ X.T if wide else X.T @ X)

    def spectrum(deadline):
        t = _interleaved({"step": lambda: gram_spectrum(X), "floor": eigvalsh_floor}, repeat, sync, deadline)
        spec = gram_spectrum(X)
        top = eigvalsh_floor().flip(0).clamp_min(0).cpu().numpy()
        return {**_floor_row("spectrum", t, f"torch.linalg.eigvalsh({'X @ X.T' if wide else 'X.T @ X'}), float64",
                             float(abs(spec.eigenvalues[:top.size] - top).max() / top[0])),
                "scale_spectrum_rank": spec.rank, "scale_spectrum_kappa": spec.kappa}

    def kinf(deadline):
        t = _interleaved({"step": lambda: infinite_ntk(X), "floor": lambda: X @ X.T}, repeat, sync, deadline)
        state["K"] = K = infinite_ntk(X)
        G = X[:64] @ X.T  # the floor's output on a few rows, turned into K∞ by the closed form
        cos = (G / (X[:64].norm(dim=1)[:, None] * X.norm(dim=1)).clamp_min(1e-300)).clamp(-1, 1)
        return _floor_row("kinf", t, "X @ X.T, float64 GEMM",
                          _rel(K[:64], G * (math.pi - torch.arccos(cos)) / (2 * math.pi)))

    def loo(deadline):
        if "K" not in state:
            raise RuntimeError("needs K∞, whose step failed")
        K = state["K"]
        K_test = infinite_ntk(X_test, X)
        Y = torch.nn.functional.one_hot(y, 10).double()
        lam = SCALE_RIDGE * float(K.diagonal().mean())

        def factorisation():
            A = K.clone()
            A.diagonal().add_(lam)
            return torch.cholesky_inverse(torch.linalg.cholesky(A))

        t = _interleaved({"step": lambda: loo_influence(K, K_test, Y, SCALE_RIDGE), "floor": factorisation,
                          "true": lambda: influence_matrix(K, K_test, Y, SCALE_RIDGE, target="true", y_test=y_test)},
                         repeat, sync, deadline)
        M = factorisation()
        I_ref = (K_test[:8] @ M)[:, :, None] * ((M @ Y) / M.diagonal()[:, None])[None]
        floor = "torch.cholesky_inverse(torch.linalg.cholesky(K + λI)), float64"
        return {**_floor_row("loo", t, floor, _rel(loo_influence(K, K_test[:8], Y, SCALE_RIDGE), I_ref)),
                "scale_influence_true_seconds": t["true"]["seconds"],
                "scale_influence_true_ratio": t["true"]["seconds"] / t["floor"]["seconds"],
                "scale_influence_true_cpu_ratio": t["true"]["cpu_seconds"] / t["floor"]["cpu_seconds"]}

    def storage32(deadline):
        state.clear()  # K∞ of X is not needed any more
        Y = torch.nn.functional.one_hot(y, 10).double()
        row = {}
        for arch in ("relu", "attn"):
            phi, phi_test = features(X, X, arch), features(X_test, X, arch)
            row.update({f"scale_storage32_{arch}_{k}": v for k, v in storage_cost(phi, phi_test, Y, y_test).items()})
        return row

    def entk(deadline):
        phi = X.float()
        head = TwoLayerReLU(X.shape[1], m, 1, seed=0).to(dev)
        W = head.W.detach()
        S = (phi @ W.T > 0).to(count_dtype(dev))

        def gemms():  # Φ Wᵀ, S Sᵀ and Φ Φᵀ as plain full calls, in the closed form's dtypes
            return phi @ W.T, exact_counts(S, S), phi @ phi.T

        t = _interleaved({"step": lambda: empirical_ntk_features(head, phi), "floor": gemms}, repeat, sync, deadline)
        K_m = empirical_ntk_features(head, phi)
        _, counts, gram = gemms()
        floor = "Φ Wᵀ (fp32) + S Sᵀ (exact counts, the fastest path) + Φ Φᵀ (fp32), full GEMMs"
        return _floor_row("entk", t, floor,
                          _rel(K_m, gram.double() * counts / m))

    part("spectrum", 0.05, "Gram spectrum against eigvalsh(Xᵀ X)", spectrum)
    part("kinf", 0.15, "infinite-width NTK against the float64 GEMM X Xᵀ", kinf)
    part("loo", 0.3, f"LOO influence for {n_test} test points against cholesky + cholesky_inverse", loo)
    part("storage32", 0.65, "float32 kernel storage: what it changes in LOO influence", storage32)
    part("entk", 0.7, f"empirical NTK at m = {m} against its GEMMs", entk)
    say(1.0, "done")
    return _finite(result)


def run(quick: bool = True, device: str = "cpu", page: bool = True, progress=None, scale: bool = False,
        scale_n: int = SCALE_N, data_dir=None, out=None, peer: str | None = None,
        timeout: float | None = None) -> dict:
    """All benchmarks at the quick or full sizes; returns one JSON-able dict (see the module notes).

    ``scale=True`` runs the scale benchmark instead (``run_scale`` at ``scale_n`` points,
    MNIST from ``data_dir``); ``quick``, ``page`` and ``peer`` do not apply to it.
    ``out``: a JSON-lines file; each part's row is appended to it as soon as it is measured.
    ``peer``: None or "neural-tangents" (``peer_neural_tangents`` at the eNTK size; a row
    that says why where it cannot run). ``timeout``: seconds per part (default 300 quick,
    1200 full); a part past it stops its rounds (a subprocess is killed) and says so.
    """
    from .device import resolve_device

    if peer is not None and peer not in PEERS:
        raise BadInput(f"unknown peer {peer!r}; allowed: {', '.join(PEERS)}")
    _check_limits(1, timeout)
    if scale:
        return run_scale(scale_n, device, data_dir, progress, out=out, timeout=timeout)
    dev = resolve_device(device)
    rows = _Rows(out)
    limit = timeout or TIMEOUT[quick]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    say = progress or (lambda f, s: None)
    sizes = SIZES[quick]
    result = {"device": str(dev), **machine_info(dev), "quick": quick}
    rows.write("machine", result)

    def part(name, frac, what, fn):
        say(frac, what)
        row = _part(name, fn, limit)
        result.update(row)
        rows.write(name, row)

    part("count_path", 0.0, "exact count paths", lambda dl: {"count_path": count_path_report(dev)})
    part("entk", 0.05, "empirical NTK against the fp32 GEMM",
         lambda dl: bench_entk(*sizes["entk"], dev, sync, sizes["gemm"], deadline=dl))
    part("torch_func", 0.2, "empirical NTK against the torch.func recipe",
         lambda dl: bench_torch_func(*sizes["entk"], dev, sync, deadline=dl))
    n, widths, epochs = sizes["train"]
    part("train", 0.4, "batched training against a loop over widths and the GEMM",
         lambda dl: bench_training(n, widths, epochs, dev, sync, sizes["gemm"], deadline=dl))
    if page:
        part("page", 0.75, "page render, cold and warm cache", lambda dl: bench_page(timeout=limit))
    if peer == "neural-tangents":
        part("peer", 0.9, "neural-tangents' empirical NTK against the engine's",
             lambda dl: peer_neural_tangents(*sizes["entk"], device=dev, timeout=limit))
    say(1.0, "done")
    return _finite(result)


def _finite(out):
    """JSON has no inf or nan: such floats become None, at any depth; tuples become lists."""
    if isinstance(out, dict):
        return {k: _finite(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return [_finite(v) for v in out]
    if isinstance(out, float) and not math.isfinite(out):
        return None
    return out
