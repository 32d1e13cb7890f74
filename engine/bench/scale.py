"""``bench --scale``: the float64 kernel algebra at n = 8000 real MNIST digits, each step against its floor.

The floor is the plain torch call any implementation needs (``eigvalsh``, one GEMM, one
Cholesky); both run alternately in the same run, and each step's result is checked against one
computed from the floor's output. ``storage_cost`` says what float32 kernel storage changes in
exact leave-one-out influence.
"""

from __future__ import annotations

import math

import torch

from ..data import DataSpec, load_sample
from ..maths.counts import count_dtype, exact_counts
from ..maths.influence import aggregate, influence_matrix, loo_influence, top_indices
from ..maths.kinf import infinite_ntk
from ..maths.models import TwoLayerReLU, features, normalize_rows
from ..maths.ntk import empirical_ntk_features
from ..maths.specs import STORAGE
from ..maths.spectral import gram_spectrum
from ..runtime.errors import BadInput, DataCorrupt, DataMissing
from .timing import TIMEOUT, RowLog, check_limits, floor_row, interleave, json_finite, machine_info, timed_part

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


def run_scale(n: int = SCALE_N, device: str = "auto", data_dir=None, progress=None, *, repeat: int = 2,
              n_test: int = SCALE_N_TEST, m: int = SCALE_M, out=None, timeout: float | None = None) -> dict:
    """The scale benchmark (see the module notes) at n training points; one JSON-able dict.

    Data: ``load_sample(DataSpec("mnist", n, n_test), data_dir)`` without downloading; when
    MNIST is absent, random ℓ2-normalised rows (d = 784) and ``scale_fallback`` True, with
    the reason in ``scale_data``. Times are medians of ``repeat`` alternate rounds after a
    warm-up. ``out``: JSON-lines file that gets each step's row as it is measured;
    ``timeout``: seconds per step (default 1200).
    """
    from ..runtime.device import resolve_device

    if n < 2 or n_test < 1 or m < 1:
        raise BadInput(f"run_scale needs n >= 2, n_test >= 1, m >= 1; got {n}, {n_test}, {m}")
    check_limits(repeat, timeout)
    dev = resolve_device(device)
    rows = RowLog(out)
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
        row = timed_part(f"scale_{name}", fn, limit)
        result.update(row)
        rows.write(f"scale_{name}", row)

    wide = n <= X.shape[1]  # then the smaller Gram, and the floor, is X Xᵀ

    def eigvalsh_floor():
        return torch.linalg.eigvalsh(X @ X.T if wide else X.T @ X)

    def spectrum(deadline):
        t = interleave({"step": lambda: gram_spectrum(X), "floor": eigvalsh_floor}, repeat, sync, deadline)
        spec = gram_spectrum(X)
        top = eigvalsh_floor().flip(0).clamp_min(0).cpu().numpy()
        return {**floor_row("spectrum", t, f"torch.linalg.eigvalsh({'X @ X.T' if wide else 'X.T @ X'}), float64",
                             float(abs(spec.eigenvalues[:top.size] - top).max() / top[0])),
                "scale_spectrum_rank": spec.rank, "scale_spectrum_kappa": spec.kappa}

    def kinf(deadline):
        t = interleave({"step": lambda: infinite_ntk(X), "floor": lambda: X @ X.T}, repeat, sync, deadline)
        state["K"] = K = infinite_ntk(X)
        G = X[:64] @ X.T  # the floor's output on a few rows, turned into K∞ by the closed form
        cos = (G / (X[:64].norm(dim=1)[:, None] * X.norm(dim=1)).clamp_min(1e-300)).clamp(-1, 1)
        return floor_row("kinf", t, "X @ X.T, float64 GEMM",
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

        t = interleave({"step": lambda: loo_influence(K, K_test, Y, SCALE_RIDGE), "floor": factorisation,
                          "true": lambda: influence_matrix(K, K_test, Y, SCALE_RIDGE, target="true", y_test=y_test)},
                         repeat, sync, deadline)
        M = factorisation()
        I_ref = (K_test[:8] @ M)[:, :, None] * ((M @ Y) / M.diagonal()[:, None])[None]
        floor = "torch.cholesky_inverse(torch.linalg.cholesky(K + λI)), float64"
        return {**floor_row("loo", t, floor, _rel(loo_influence(K, K_test[:8], Y, SCALE_RIDGE), I_ref)),
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

        t = interleave({"step": lambda: empirical_ntk_features(head, phi), "floor": gemms}, repeat, sync, deadline)
        K_m = empirical_ntk_features(head, phi)
        _, counts, gram = gemms()
        floor = "Φ Wᵀ (fp32) + S Sᵀ (exact counts, the fastest path) + Φ Φᵀ (fp32), full GEMMs"
        return floor_row("entk", t, floor,
                          _rel(K_m, gram.double() * counts / m))

    part("spectrum", 0.05, "Gram spectrum against eigvalsh(Xᵀ X)", spectrum)
    part("kinf", 0.15, "infinite-width NTK against the float64 GEMM X Xᵀ", kinf)
    part("loo", 0.3, f"LOO influence for {n_test} test points against cholesky + cholesky_inverse", loo)
    part("storage32", 0.65, "float32 kernel storage: what it changes in LOO influence", storage32)
    part("entk", 0.7, f"empirical NTK at m = {m} against its GEMMs", entk)
    say(1.0, "done")
    return json_finite(result)
