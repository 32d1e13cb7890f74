"""The engine's own benchmark cases: the closed-form eNTK against the GEMM rate and the torch.func
recipe, batched training of a width sweep, and a dashboard page rendered cold and warm.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import torch

from ..maths.models import Net, TwoLayerReLU, normalize_rows
from ..maths.ntk import empirical_ntk_features
from ..maths.specs import TrainSpec
from ..maths.training import train, train_many
from .timing import ROOT, gemm_case, interleave, paired_rates


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


def entk_case(n: int, m: int, d: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    phi = normalize_rows(torch.rand(n, d, generator=g)).to(device)
    return phi, TwoLayerReLU(d, m, 1, seed=0).to(device)


def entk_flops(n: int, m: int, d: int) -> float:
    """The FLOPs the closed form needs: Φ Wᵀ, half of S Sᵀ and half of Φ Φᵀ."""
    return 2 * (n * d * m + n * n * m / 2 + n * n * d / 2)


def bench_entk(n: int, m: int, d: int, device: torch.device, sync, gemm_size: int = 1536, repeat: int = 7,
               deadline: float = math.inf) -> dict:
    """The closed-form empirical NTK (n rows, width m, d features) and the fp32 GEMM, alternately."""
    phi, head = entk_case(n, m, d, device)
    gemm, gemm_flops = gemm_case(gemm_size, device)
    t = interleave({"entk": lambda: empirical_ntk_features(head, phi), "gemm": gemm}, repeat, sync, deadline)
    flops = entk_flops(n, m, d)
    wall, cpu = paired_rates(t["entk"], t["gemm"], flops, gemm_flops)
    return {"entk_seconds": t["entk"]["seconds"], "entk_cpu_seconds": t["entk"]["cpu_seconds"],
            "gemm_seconds": t["gemm"]["seconds"], "gemm_gflops": gemm_flops / t["gemm"]["seconds"] / 1e9,
            "gemm_size": gemm_size, "entk_gflops": flops / t["entk"]["seconds"] / 1e9,
            "entk_fraction_of_gemm_peak": wall, "entk_fraction_of_gemm_peak_cpu": cpu,
            "entk_repeats": t["repeats"], "entk_size": {"n": n, "m": m, "d": d}}


def bench_torch_func(n: int, m: int, d: int, device: torch.device, sync, repeat: int = 2,
                     deadline: float = math.inf) -> dict:
    """The closed form against the torch.func recipe, alternately; the kernels must agree."""
    phi, head = entk_case(n, m, d, device)
    K = empirical_ntk_features(head, phi)
    K_ref = torch_func_ntk(head, phi, phi).double()
    t = interleave({"entk": lambda: empirical_ntk_features(head, phi),
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
    gemm, gemm_flops = gemm_case(gemm_size, device)

    def nets():
        return [Net("relu", X, w, c, seed=0).to(device) for w in widths]

    t = interleave({"batched": lambda: train_many(nets(), X, y, c, spec),
                      "loop": lambda: [train(net, X, y, c, spec) for net in nets()],
                      "gemm": gemm}, repeat, sync, deadline, calls={"gemm": 5})
    M = sum(widths)
    # Per sample and step: Φ Wᵀ and the weight gradient (2·d·M each), readout and its gradient.
    flops = epochs * n * 2 * (2 * d * M + 2 * M * len(widths) * c)
    wall, cpu = paired_rates(t["batched"], t["gemm"], flops, gemm_flops)
    return {"train_seconds": t["batched"]["seconds"], "train_cpu_seconds": t["batched"]["cpu_seconds"],
            "train_loop_seconds": t["loop"]["seconds"], "train_loop_cpu_seconds": t["loop"]["cpu_seconds"],
            "sweep_batched_speedup_vs_loop": t["loop"]["seconds"] / t["batched"]["seconds"],
            "sweep_batched_speedup_vs_loop_cpu": t["loop"]["cpu_seconds"] / t["batched"]["cpu_seconds"],
            "train_gflops": flops / t["batched"]["seconds"] / 1e9,
            "train_fraction_of_gemm_peak": wall, "train_fraction_of_gemm_peak_cpu": cpu,
            "train_repeats": t["repeats"],
            "train_size": {"n": n, "widths": list(widths), "epochs": epochs, "batch": spec.batch_size}}


def last_line(text: str) -> str:
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
                "page_render_error": f"exit {p.returncode}: {last_line(p.stderr) or last_line(p.stdout)}"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"page_render": None, "page_render_error": f"no JSON line in its output: {last_line(p.stdout)!r}"}
