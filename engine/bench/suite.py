"""Benchmarks that print ratios measured side by side in one run (never timed assertions).

Every figure pairs a step with its reference in the same run: the two (or three) run
alternately, one warm-up each and then ``repeat`` rounds, and the figure is the ratio of
their medians, in wall time and in CPU time (``time.process_time``, all threads). A load
that comes and goes on a shared machine then hits both sides alike, and the CPU-time ratio
shows what wall time hides (threads waiting for a core). Keys of ``run``:

- ``machine``: CPU model, the SIMD flags that set GEMM rates (avx2, avx512*, vnni, amx),
  cores, torch threads and version (``machine_info``); every JSON-lines row repeats the threads.
- ``count_path``: ``engine.maths.counts.count_path_report``: which exact count GEMM the empirical NTK
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

import torch

from ..maths.counts import count_path_report
from ..runtime.errors import BadInput
from .cases import bench_entk, bench_page, bench_torch_func, bench_training
from .peer import peer_neural_tangents
from .scale import SCALE_N, run_scale
from .timing import TIMEOUT, RowLog, check_limits, json_finite, machine_info, timed_part

PEERS = ("neural-tangents",)  # values of run(peer=...)

SIZES = {  # quick: a few minutes on a 2-core CPU; full: the sizes of issue 5
    True: {"entk": (200, 1024, 784), "gemm": 1536, "train": (500, (16, 64, 256, 1024), 10)},
    False: {"entk": (300, 4096, 784), "gemm": 2048, "train": (1000, (16, 64, 256, 1024, 4096), 5)},
}

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
    from ..runtime.device import resolve_device

    if peer is not None and peer not in PEERS:
        raise BadInput(f"unknown peer {peer!r}; allowed: {', '.join(PEERS)}")
    check_limits(1, timeout)
    if scale:
        return run_scale(scale_n, device, data_dir, progress, out=out, timeout=timeout)
    dev = resolve_device(device)
    rows = RowLog(out)
    limit = timeout or TIMEOUT[quick]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    say = progress or (lambda f, s: None)
    sizes = SIZES[quick]
    result = {"device": str(dev), **machine_info(dev), "quick": quick}
    rows.write("machine", result)

    def part(name, frac, what, fn):
        say(frac, what)
        row = timed_part(name, fn, limit)
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
    return json_finite(result)
