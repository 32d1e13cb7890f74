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
- ``run_scale`` (``run(scale=True)``): the float64 kernel algebra at n = 8000 real MNIST
  digits, each step against its floor (the plain torch call that any implementation
  needs, or that the textbook recipe uses), measured alternately in the same run:
  ``gram_spectrum`` against ``eigvalsh(Xᵀ X)`` (``X Xᵀ`` when n <= d), ``infinite_ntk``
  against the float64 GEMM ``X Xᵀ``, ``loo_influence`` (500 test points) against
  ``cholesky`` + ``cholesky_inverse`` of K + λI, and the closed-form empirical NTK at
  m = 4096 against its three GEMMs run as plain full calls. Keys ``scale_<step>_seconds``,
  ``scale_<step>_floor_seconds``, ``scale_<step>_ratio`` (time / floor), ``scale_<step>_floor``
  (what the floor is) and ``scale_<step>_max_rel_diff`` (the step's result checked against
  one computed from the floor's output). ``scale_storage32_<arch>_*``: what float32 kernel
  storage changes in exact LOO influence (target "true", K∞ of each architecture's features
  at the same n): ``influence_rel_diff`` (Frobenius, relative to float64),
  ``sign_disagreement`` (share of influence signs that differ) and ``top10_same`` (the
  top-10 % by |aggregate influence| is the same set).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from .data import DataSpec, load_sample
from .errors import BadInput, DataCorrupt, DataMissing
from .influence import influence_matrix, loo_influence
from .influence import aggregate, top_indices
from .models import Net, TwoLayerReLU, features, normalize_rows
from .ntk import STORAGE, exact_counts, cpu_count_dtype, empirical_ntk_features, infinite_ntk
from .spectral import gram_spectrum
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


SCALE_N = 8000       # training points of the scale benchmark (MNIST train split)
SCALE_N_TEST = 500   # test points scored by the LOO influence
SCALE_M = 4096       # width of the empirical NTK
SCALE_D = 784        # input dimension of the random fallback (MNIST's)
SCALE_RIDGE = 1e-3   # λ relative to mean diag K, as everywhere in the engine


def _paired(fn, floor, repeat: int, sync) -> tuple[float, float]:
    """Best wall times of ``fn`` and ``floor``, one warm-up each, then run alternately so that
    a load that comes and goes on a shared machine hits both alike."""
    times = ([], [])
    for k in range(repeat + 1):
        for f, ts in zip((fn, floor), times):
            t0 = time.perf_counter()
            f()
            sync()
            if k:
                ts.append(time.perf_counter() - t0)
    return min(times[0]), min(times[1])


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


def run_scale(n: int = SCALE_N, device: str = "auto", data_dir=None, progress=None, repeat: int = 2,
              n_test: int = SCALE_N_TEST, m: int = SCALE_M) -> dict:
    """The scale benchmark (see the module notes) at n training points; one JSON-able dict.

    Data: ``load_sample(DataSpec("mnist", n, n_test), data_dir)`` without downloading; when
    MNIST is absent, random ℓ2-normalised rows (d = 784) and ``scale_fallback`` True, with
    the reason in ``scale_data``. Times are the best of ``repeat`` runs after a warm-up.
    """
    from .device import resolve_device

    if n < 2 or n_test < 1 or m < 1 or repeat < 1:
        raise BadInput(f"run_scale needs n >= 2, n_test >= 1, m >= 1, repeat >= 1; got {n}, {n_test}, {m}, {repeat}")
    dev = resolve_device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    say = progress or (lambda f, s: None)
    say(0.0, f"data: {n} + {n_test} digits")
    X, X_test, y, y_test, source, fallback = _scale_data(n, n_test, data_dir)
    X, X_test, y, y_test = X.to(dev), X_test.to(dev), y.to(dev), y_test.to(dev)
    out = {"device": str(dev), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "scale_data": source, "scale_fallback": fallback,
           "scale_size": {"n": n, "n_test": n_test, "d": X.shape[1], "m": m, "classes": 10, "ridge": SCALE_RIDGE}}

    def record(step, t, t_floor, floor, diff):
        out.update({f"scale_{step}_seconds": t, f"scale_{step}_floor_seconds": t_floor,
                    f"scale_{step}_ratio": t / t_floor, f"scale_{step}_floor": floor,
                    f"scale_{step}_max_rel_diff": diff})

    say(0.05, "Gram spectrum against eigvalsh(Xᵀ X)")
    wide = n <= X.shape[1]  # then the smaller Gram, and the floor, is X Xᵀ

    def eigvalsh_floor():
        return torch.linalg.eigvalsh(X @ X.T if wide else X.T @ X)

    t, t_floor = _paired(lambda: gram_spectrum(X), eigvalsh_floor, repeat, sync)
    spec = gram_spectrum(X)
    top = eigvalsh_floor().flip(0).clamp_min(0).cpu().numpy()
    record("spectrum", t, t_floor, f"torch.linalg.eigvalsh({'X @ X.T' if wide else 'X.T @ X'}), float64",
           float(abs(spec.eigenvalues[:top.size] - top).max() / top[0]))
    out.update({"scale_spectrum_rank": spec.rank, "scale_spectrum_kappa": spec.kappa})

    say(0.15, "infinite-width NTK against the float64 GEMM X Xᵀ")
    t, t_floor = _paired(lambda: infinite_ntk(X), lambda: X @ X.T, repeat, sync)
    K = infinite_ntk(X)
    G = X[:64] @ X.T  # the floor's output on a few rows, turned into K∞ by the closed form
    cos = (G / (X[:64].norm(dim=1)[:, None] * X.norm(dim=1)).clamp_min(1e-300)).clamp(-1, 1)
    record("kinf", t, t_floor, "X @ X.T, float64 GEMM",
           _rel(K[:64], G * (math.pi - torch.arccos(cos)) / (2 * math.pi)))
    del G, cos

    say(0.3, f"LOO influence for {n_test} test points against cholesky + cholesky_inverse")
    K_test = infinite_ntk(X_test, X)
    Y = torch.nn.functional.one_hot(y, 10).double()
    lam = SCALE_RIDGE * float(K.diagonal().mean())

    def factorisation():
        A = K.clone()
        A.diagonal().add_(lam)
        return torch.cholesky_inverse(torch.linalg.cholesky(A))

    t, t_floor = _paired(lambda: loo_influence(K, K_test, Y, SCALE_RIDGE), factorisation, repeat, sync)
    M = factorisation()
    I_ref = (K_test[:8] @ M)[:, :, None] * ((M @ Y) / M.diagonal()[:, None])[None]
    record("loo", t, t_floor, "torch.cholesky_inverse(torch.linalg.cholesky(K + λI)), float64",
           _rel(loo_influence(K, K_test[:8], Y, SCALE_RIDGE), I_ref))
    del M, I_ref
    say(0.6, "influence matrix, target 'true'")
    t = _best(lambda: influence_matrix(K, K_test, Y, SCALE_RIDGE, target="true", y_test=y_test), repeat, sync)
    out.update({"scale_influence_true_seconds": t, "scale_influence_true_ratio": t / t_floor})
    del K, K_test

    say(0.65, "float32 kernel storage: what it changes in LOO influence")
    for arch in ("relu", "attn"):
        phi, phi_test = features(X, X, arch), features(X_test, X, arch)
        out.update({f"scale_storage32_{arch}_{k}": v for k, v in storage_cost(phi, phi_test, Y, y_test).items()})
    del phi, phi_test

    say(0.7, f"empirical NTK at m = {m} against its GEMMs")
    phi = X.float()
    head = TwoLayerReLU(X.shape[1], m, 1, seed=0).to(dev)
    W = head.W.detach()
    cdt = torch.bfloat16 if dev.type == "cuda" else cpu_count_dtype()
    S = (phi @ W.T > 0).to(cdt)

    def gemms():  # Φ Wᵀ, S Sᵀ and Φ Φᵀ as plain full calls, in the closed form's dtypes
        return phi @ W.T, exact_counts(S, S), phi @ phi.T

    t, t_floor = _paired(lambda: empirical_ntk_features(head, phi), gemms, repeat, sync)
    K_m = empirical_ntk_features(head, phi)
    _, counts, gram = gemms()
    record("entk", t, t_floor, "Φ Wᵀ (fp32) + S Sᵀ (exact low-precision counts) + Φ Φᵀ (fp32), full GEMMs",
           _rel(K_m, gram.double() * counts / m))
    say(1.0, "done")
    return out


def run(quick: bool = True, device: str = "cpu", page: bool = True, progress=None, scale: bool = False,
        scale_n: int = SCALE_N, data_dir=None) -> dict:
    """All benchmarks at the quick or full sizes; returns one JSON-able dict.

    ``scale=True`` runs the scale benchmark instead (``run_scale`` at ``scale_n`` points,
    MNIST from ``data_dir``); ``quick`` and ``page`` do not apply to it.
    """
    from .device import resolve_device

    if scale:
        return _finite(run_scale(scale_n, device, data_dir, progress))
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
    return _finite(out)


def _finite(out: dict) -> dict:
    """JSON has no inf or nan: such floats become None."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
