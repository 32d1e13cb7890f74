"""neural-tangents' empirical NTK of the same head, weights and rows, against the engine's.

neural-tangents runs in its own Python (``$ENGINE_NT_PYTHON``, an environment with jax and
neural-tangents; ``benchmarks/README.md`` lists the versions that work), fed the same arrays;
the two implementations are timed alternately and their kernels compared.
"""

from __future__ import annotations

import json
import os
import selectors
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..maths.ntk import empirical_ntk_features
from ..runtime.errors import BadInput
from .cases import entk_case, last_line
from .timing import ROOT, time_once

NT_PYTHON_ENV = "ENGINE_NT_PYTHON"  # the Python of an environment with neural-tangents and jax
NT_IMPLEMENTATIONS = ("STRUCTURED_DERIVATIVES", "JACOBIAN_CONTRACTION", "NTK_VECTOR_PRODUCTS")


class _Peer:
    """A line-protocol conversation with ``benchmarks/peer_nt.py`` under another Python, with a
    deadline on every reply."""

    def __init__(self, python: str, args: list[str], env: dict, deadline: float, cpus: set[int] | None = None):
        self.deadline = deadline
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        self.p = subprocess.Popen([python, str(ROOT / "benchmarks" / "peer_nt.py"), *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                                  preexec_fn=pin)
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
            raise RuntimeError(f"peer exited {self.p.returncode}: {last_line(self.p.stderr.read())}")
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
    With one torch thread the peer runs on one core (its CPU affinity, where the OS has one:
    jax 0.4.28's XLA ignores its thread flags and ran on two cores otherwise). Returns
    ``peer_*`` keys: medians of wall and CPU seconds of each side, ``peer_speedup`` (peer time
    / engine time; > 1 means the engine is faster; ``_cpu`` in CPU time), ``peer_max_rel_diff``
    (max |ΔK| / max |K|), the peer's versions, ``peer_cpus`` (the core it was pinned to, or
    None); or ``peer_skipped`` with a one-line reason when no such Python is given, it cannot
    import neural-tangents, or jax lacks the device; or ``peer_error`` when it fails or passes
    ``timeout`` seconds.
    """
    import numpy as np

    from ..runtime.device import resolve_device

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
    phi, head = entk_case(n, m, d, dev)
    K = empirical_ntk_features(head, phi)
    env = {**os.environ, "JAX_PLATFORMS": "cuda" if dev.type == "cuda" else "cpu"}
    env.pop("PYTHONPATH", None)  # the peer's own site-packages, never this environment's
    cpus = None
    if torch.get_num_threads() == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        if hasattr(os, "sched_getaffinity"):
            cpus = {min(os.sched_getaffinity(0))}
    row = {"peer": f"neural-tangents {implementation}", "peer_size": {"n": n, "m": m, "d": d},
           "peer_threads": torch.get_num_threads(), "peer_cpus": None if cpus is None else sorted(cpus)}
    with tempfile.TemporaryDirectory(prefix="engine-peer-") as folder:
        data = Path(folder) / "case.npz"
        np.savez(data, phi=phi.cpu().numpy(), W=head.W.detach().cpu().numpy(), a=head.a.cpu().numpy())
        peer = None
        try:
            peer = _Peer(python, [str(data), implementation], env, deadline, cpus)
            ready = peer.ask(None)
            if "skip" in ready:
                return {**row, "peer_skipped": ready["skip"]}
            if dev.type == "cuda" and ready.get("backend") != "gpu":
                return {**row, "peer_skipped": f"jax there has no CUDA backend (it runs on {ready.get('backend')})"}
            row["peer_versions"] = {k: ready[k] for k in ("neural_tangents", "jax", "jaxlib", "numpy") if k in ready}
            times = {"peer": [], "engine": []}
            peer.ask("run")  # warm-up: jax traces and compiles here
            time_once(lambda: empirical_ntk_features(head, phi), sync)
            for _ in range(max(1, repeat)):
                r = peer.ask("run")
                times["peer"].append((r["wall"], r["cpu"]))
                times["engine"].append(time_once(lambda: empirical_ntk_features(head, phi), sync))
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
