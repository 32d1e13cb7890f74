"""Benchmarks that print ratios measured side by side in one run (never timed assertions).

- ``entk_speedup_vs_torch_func``: the closed-form empirical NTK against the torch.func
  Jacobian-contraction recipe (per-sample Jacobians by ``vmap(jacrev)``, contracted by
  einsum), same net and inputs; the two kernels are checked to agree.
- ``entk_fraction_of_gemm_peak``: the FLOPs the closed form needs (Φ Wᵀ, the symmetric
  half of S Sᵀ, the symmetric half of Φ Φᵀ) over its time, divided by the rate of one large
  fp32 GEMM measured in the same run.
- ``train_fraction_of_gemm_peak``: the same ratio for the batched training of a width
  sweep (forward, readout and weight-gradient GEMMs per step).
- ``sweep_batched_speedup_vs_loop``: all widths trained as one batched model against a
  loop that trains each width alone (same epochs, same results).
- ``page_render``: a dashboard page rendered with a cold cache against the same page with
  a warm one (``benchmarks/page_render.py`` runs it, in its own process, so that this
  module never imports streamlit).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from .models import Net, TwoLayerReLU, normalize_rows
from .ntk import empirical_ntk_features
from .training import TrainSpec, train, train_many

ROOT = Path(__file__).resolve().parent.parent

SIZES = {  # quick: under a minute on a 2-core CPU; full: the sizes of issue 5
    True: {"entk": (200, 1024, 784), "gemm": 1536, "train": (500, (16, 64, 256, 1024), 10)},
    False: {"entk": (300, 4096, 784), "gemm": 2048, "train": (1000, (16, 64, 256, 1024, 4096), 5)},
}


def _best(fn, repeat: int = 3, sync=lambda: None) -> float:
    """Best wall time of ``repeat`` calls after one warm-up call."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def gemm_rate(size: int, device: torch.device, sync) -> float:
    """FLOP/s of one fp32 (size × size) @ (size × size) GEMM."""
    A = torch.rand(size, size, device=device)
    B = torch.rand(size, size, device=device)
    return 2 * size**3 / _best(lambda: A @ B, 10, sync)


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


def bench_entk(n: int, m: int, d: int, device: torch.device, sync, peak: float) -> dict:
    g = torch.Generator().manual_seed(0)
    phi = normalize_rows(torch.rand(n, d, generator=g)).to(device)
    head = TwoLayerReLU(d, m, 1, seed=0).to(device)
    t_closed = _best(lambda: empirical_ntk_features(head, phi), 30, sync)
    t_recipe = _best(lambda: torch_func_ntk(head, phi, phi), 1, sync)
    K = empirical_ntk_features(head, phi)
    K_ref = torch_func_ntk(head, phi, phi).double()
    flops = 2 * (n * d * m + n * n * m / 2 + n * n * d / 2)
    return {"entk_seconds": t_closed, "torch_func_seconds": t_recipe,
            "entk_speedup_vs_torch_func": t_recipe / t_closed,
            "entk_gflops": flops / t_closed / 1e9,
            "entk_fraction_of_gemm_peak": flops / t_closed / peak,
            "entk_max_rel_diff_vs_torch_func": float((K - K_ref).abs().max() / K_ref.abs().max()),
            "entk_size": {"n": n, "m": m, "d": d}}


def bench_training(n: int, widths, epochs: int, device: torch.device, sync, peak: float) -> dict:
    g = torch.Generator().manual_seed(1)
    d, c = 784, 10
    X = torch.rand(n, d, generator=g).to(device)
    y = torch.randint(0, c, (n,), generator=g).to(device)
    spec = TrainSpec(epochs=epochs)

    def nets():
        return [Net("relu", X, w, c, seed=0).to(device) for w in widths]

    t_batched = _best(lambda: train_many(nets(), X, y, c, spec), 2, sync)
    t_loop = _best(lambda: [train(net, X, y, c, spec) for net in nets()], 2, sync)
    M = sum(widths)
    # Per sample and step: Φ Wᵀ and the weight gradient (2·d·M each), readout and its gradient.
    flops = epochs * n * 2 * (2 * d * M + 2 * M * len(widths) * c)
    return {"train_seconds": t_batched, "train_loop_seconds": t_loop,
            "sweep_batched_speedup_vs_loop": t_loop / t_batched,
            "train_gflops": flops / t_batched / 1e9,
            "train_fraction_of_gemm_peak": flops / t_batched / peak,
            "train_size": {"n": n, "widths": list(widths), "epochs": epochs, "batch": spec.batch_size}}


def bench_page(timeout: float = 300) -> dict:
    script = ROOT / "benchmarks" / "page_render.py"
    if not script.exists():
        return {"page_render": None}
    p = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return {"page_render": None, "page_render_error": p.stderr.strip().splitlines()[-1:] or ""}
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(quick: bool = True, device: str = "cpu", page: bool = True, progress=None) -> dict:
    """All benchmarks at the quick or full sizes; returns one JSON-able dict."""
    from .device import resolve_device

    dev = resolve_device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    say = progress or (lambda f, s: None)
    sizes = SIZES[quick]
    say(0.0, "fp32 GEMM rate")
    peak = gemm_rate(sizes["gemm"], dev, sync)
    out = {"device": str(dev), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "quick": quick, "gemm_gflops": peak / 1e9}
    say(0.1, "empirical NTK against the torch.func recipe")
    out.update(bench_entk(*sizes["entk"], dev, sync, peak))
    say(0.4, "batched training against a loop over widths")
    n, widths, epochs = sizes["train"]
    out.update(bench_training(n, widths, epochs, dev, sync, peak))
    if page:
        say(0.8, "page render, cold and warm cache")
        out.update(bench_page())
    say(1.0, "done")
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
