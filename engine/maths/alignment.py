"""How well a kernel aligns with the task: centred kernel–target alignment, the cumulative power
of the targets along the kernel's eigenvectors, and the learning curve of kernel ridge regression
with its spectral prediction (Bordelon et al. 2020, Canatar et al. 2021).

Arrays in, numpy out (float64). Kernels are (n, n) symmetric positive semi-definite; targets Y
are (n,) or (n, c) (one-hot or ±1 columns), samples along axis 0. One eigendecomposition of a
kernel (``eigh_desc``) serves ``cumulative_power``, ``population`` and ``theory_curve``.
``verdict`` reads a summary of alignments per architecture with the same discipline as the
flip rates: a difference counts only beyond the spread over seeds and draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..runtime.errors import BadInput
from .kinf import blas_threads  # numpy's BLAS on one thread: beside torch's threads it would oversubscribe

ArrayLike = Any  # numpy arrays, nested lists or (CPU or CUDA) torch tensors: _np turns each into numpy


def _np(x: ArrayLike) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _targets(Y: ArrayLike, n: int) -> np.ndarray:
    Y = _np(Y).reshape(n, -1)
    if not np.isfinite(Y).all():
        raise BadInput("targets hold NaN or inf; allowed: finite numbers")
    return Y


def _square(K: ArrayLike) -> np.ndarray:
    K = _np(K)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise BadInput(f"a kernel is a square (n, n) matrix, got shape {K.shape}")
    if not np.isfinite(K).all():
        raise BadInput("the kernel holds NaN or inf; allowed: finite entries")
    return K


# ---------------------------------------------------------------- kernel–target alignment

def centered_alignment(K: ArrayLike, Y: ArrayLike) -> float:
    """Centred kernel–target alignment A(K, YYᵀ) = ⟨K_c, (YYᵀ)_c⟩_F / (‖K_c‖_F ‖(YYᵀ)_c‖_F).

    K (n, n); Y (n,) or (n, c). M_c = H M H with H = I − 11ᵀ/n (Cortes et al. 2012). In [−1, 1];
    invariant to the order of the points, to the scale of K and to adding a constant to K.
    NaN when either centred matrix is zero (a constant kernel, a single class)."""
    K = _square(K)
    n = K.shape[0]
    Yc = _targets(Y, n)
    Yc = Yc - Yc.mean(axis=0)
    Kc = K - K.mean(axis=0) - K.mean(axis=1)[:, None] + K.mean()
    num = float(np.sum(Yc * (Kc @ Yc)))            # tr(Ycᵀ K_c Yc) = ⟨K_c, Yc Ycᵀ⟩_F
    den = float(np.linalg.norm(Kc) * np.linalg.norm(Yc.T @ Yc))  # ‖Yc Ycᵀ‖_F = ‖Ycᵀ Yc‖_F
    return num / den if den > 0 else math.nan


# ---------------------------------------------------------------- spectral alignment

def eigh_desc(K: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (n,) in decreasing order and eigenvectors (n, n) as columns, of symmetric K."""
    K = _square(K)
    with blas_threads(1):
        s, V = np.linalg.eigh((K + K.T) / 2)
    return s[::-1].copy(), V[:, ::-1].copy()


def _tie_groups(s: np.ndarray, rtol: float) -> list[slice]:
    """Runs of eigenvalues equal within ``rtol`` of the largest (s decreasing)."""
    tol = rtol * max(float(np.abs(s).max(initial=0.0)), np.finfo(float).tiny)
    groups, start = [], 0
    for i in range(1, len(s) + 1):
        if i == len(s) or s[start] - s[i] > tol:
            groups.append(slice(start, i))
            start = i
    return groups


def mode_power(s: np.ndarray, V: np.ndarray, Y: ArrayLike, rtol: float = 1e-9) -> np.ndarray:
    """Share of ‖Y‖_F² on each eigenvector, (n,), summing to 1, in the order of ``s`` (decreasing).

    Within a run of tied eigenvalues (equal within ``rtol`` of λ_max) the eigenvectors are not
    unique, so the run's total power is spread evenly over its members: the result depends on
    the kernel alone, not on which basis of a degenerate eigenspace the solver returned."""
    s, V = _np(s), _np(V)
    Y = _targets(Y, V.shape[0])
    total = float(np.sum(Y ** 2))
    if total == 0:
        raise BadInput("the targets are all zero; the power along eigenvectors is undefined")
    p = np.sum((V.T @ Y) ** 2, axis=1) / total
    for g in _tie_groups(s, rtol):
        p[g] = p[g].mean()
    return p


def cumulative_power(s: np.ndarray, V: np.ndarray, Y: ArrayLike, rtol: float = 1e-9) -> np.ndarray:
    """C(k) = Σ_{i≤k} ‖v_iᵀ Y‖² / ‖Y‖_F², k = 1 … n, (n,), eigenvectors in decreasing eigenvalue
    order (``eigh_desc``); ties as in ``mode_power``. C(n) = 1 for a complete basis."""
    return np.cumsum(mode_power(s, V, Y, rtol))


def power_summary(C: np.ndarray, level: float = 0.9) -> dict:
    """One-number summaries of a cumulative power curve C (n,): ``k_at`` the smallest k with
    C(k) ≥ level, and ``auc_log`` the area under C against log k over [1, n], divided by log n
    (1: all power on the top eigenvector; about 1/ln n for power spread evenly)."""
    C = _np(C)
    n = len(C)
    if not 0 < level <= 1:
        raise BadInput(f"level must lie in (0, 1], got {level}")
    hit = np.nonzero(C >= level - 1e-12)[0]
    k_at = int(hit[0]) + 1 if len(hit) else n
    if n == 1:
        return {"k_at": k_at, "auc_log": float(C[0])}
    logk = np.log(np.arange(1, n + 1))
    return {"k_at": k_at, "auc_log": float(np.trapezoid(C, logk) / logk[-1])}


def log_grid(n: int, points: int = 60) -> np.ndarray:
    """About ``points`` distinct k in [1, n], log-spaced (the k at which a curve is stored)."""
    return np.unique(np.round(np.geomspace(1, n, points)).astype(int))


# ---------------------------------------------------------------- learning curves

def population(s: np.ndarray, V: np.ndarray, Y: ArrayLike, N: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Population eigenvalues λ_k = s_k / N (the kernel's operator on the empirical measure of
    its N points) and target weights w_k = ‖v_kᵀ Y‖² / N (the target's squared coefficient on
    the normalised eigenfunction √N v_k, summed over outputs): Σ w_k = mean_i ‖Y_i‖²."""
    s, V = _np(s), _np(V)
    N = V.shape[0] if N is None else N
    Y = _targets(Y, V.shape[0])
    return np.clip(s, 0, None) / N, np.sum((V.T @ Y) ** 2, axis=1) / N


def solve_kappa(lam: np.ndarray, p: float, ridge_abs: float, iters: int = 200) -> float:
    """κ solving κ = λ + Σ_k λ_k κ / (p λ_k + κ), by bisection (the right side minus κ falls
    in κ), for eigenvalues lam ≥ 0, p samples and absolute ridge λ ≥ 0 (κ > 0 needs λ > 0 or
    p below the number of positive eigenvalues)."""
    lam = _np(lam)
    if p <= 0 or ridge_abs < 0:
        raise BadInput(f"the learning-curve theory needs p > 0 and ridge ≥ 0, got p = {p}, ridge = {ridge_abs}")

    def g(k: float) -> float:  # positive below the root
        return ridge_abs + float(np.sum(lam * k / (p * lam + k))) - k

    lo, hi = 0.0, ridge_abs + float(lam.sum()) + 1e-300  # g(hi) ≤ 0 since each term is < λ_k
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if g(mid) > 0 else (lo, mid)
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def theory_error(lam: np.ndarray, w: np.ndarray, p: float, ridge_abs: float) -> float:
    """Predicted test error E_g(p) = 1/(1−γ) Σ_k κ² w_k / (p λ_k + κ)², γ = Σ_k p λ_k² / (p λ_k + κ)²
    (Canatar et al. 2021, eq. 4 without label noise; w_k = η_k w̄_k² in their notation), in the
    units of ``w`` (mean squared error summed over outputs)."""
    lam, w = _np(lam), _np(w)
    k = solve_kappa(lam, p, ridge_abs)
    gamma = float(np.sum(p * lam ** 2 / (p * lam + k) ** 2))
    return float(np.sum(k ** 2 * w / (p * lam + k) ** 2) / (1.0 - gamma))


def held_out_error(lam: np.ndarray, w: np.ndarray, p: float, ridge_abs: float, N: int) -> float:
    """The theory's error on the N − p points a training set of p drawn from a pool of N left out.

    ``theory_error`` is the error on the pool's whole empirical measure, whose p training points carry
    the training error (ridge/κ)² E_g (Canatar et al. 2021; Simon et al.'s eigenlearning): so the
    held-out error is (N E_g − p (ridge/κ)² E_g) / (N − p), equal to E_g for p ≪ N and above it as
    p nears N."""
    if not 0 < p < N:
        raise BadInput(f"a held-out error needs 0 < p < N, got p = {p}, N = {N}")
    e = theory_error(lam, w, p, ridge_abs)
    k = solve_kappa(_np(lam), p, ridge_abs)
    return e * (N - p * (ridge_abs / k) ** 2) / (N - p)


def theory_curve(lam: np.ndarray, w: np.ndarray, ns: Sequence[int], ridge_abs: float,
                 held_out_of: int | None = None) -> np.ndarray:
    """``theory_error`` at each training-set size in ``ns``, (len(ns),); with ``held_out_of`` = N, the
    error on the points of a pool of N a training set left out (``held_out_error``, what
    ``measured_curve`` measures)."""
    if held_out_of is not None:
        return np.array([held_out_error(lam, w, float(p), ridge_abs, int(held_out_of)) for p in ns])
    return np.array([theory_error(lam, w, float(p), ridge_abs) for p in ns])


def measured_curve(K: ArrayLike, Y: ArrayLike, ns: Sequence[int], ridge_abs: float, trials: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Kernel ridge on ``trials`` training sets of each size p in ``ns``, each drawn *without*
    replacement from the N points of K (the population the theory's λ_k, w_k describe), and tested on
    the N − p points it left out: mean and sd over trials of mean_i ‖f(x_i) − Y_i‖² over the held-out
    points, each (len(ns),). Every p must be < N (no held-out point otherwise). ``ridge_abs`` is added
    to the sampled kernel's diagonal, as in the theory, which is evaluated at the same p.

    Sampling with replacement would fit only about N(1 − e^(−p/N)) distinct points (127 of 200 at
    p = N) while the theory counts p, so the two would part at p/N ≳ ½ for that reason alone."""
    K = _square(K)
    N = K.shape[0]
    Y = _targets(Y, N)
    if trials < 1:
        raise BadInput(f"trials must be >= 1, got {trials}")
    big = [int(p) for p in ns if not 1 <= int(p) < N]
    if big:
        raise BadInput(f"training-set sizes {big} leave no held-out point of the N = {N}; allowed: 1 <= p < N")
    rng = np.random.default_rng(seed)
    with blas_threads(1):
        return _measure(K, Y, ns, ridge_abs, trials, rng)


def _measure(K, Y, ns, ridge_abs, trials, rng):
    N, mean, sd = K.shape[0], [], []
    for p in ns:
        errs = []
        for _ in range(trials):
            order = rng.permutation(N)
            S, T = order[:int(p)], order[int(p):]
            A = K[np.ix_(S, S)] + ridge_abs * np.eye(len(S))
            alpha = np.linalg.solve(A, Y[S])
            errs.append(float(np.mean(np.sum((K[np.ix_(T, S)] @ alpha - Y[T]) ** 2, axis=1))))
        mean.append(np.mean(errs))
        sd.append(np.std(errs, ddof=1) if trials > 1 else math.nan)
    return np.array(mean), np.array(sd)


# ---------------------------------------------------------------- verdict

VERDICT_WORDS = ("**holds** where MLP-Attn's centred alignment of its trained K_m with the labels exceeds "
                 "2L-ReLU's (the paired difference within each (draw, seed), its 95 % t interval over data draws "
                 "above zero) and its K_m ridge test accuracy is not lower (that difference's interval does not lie "
                 "below zero); **fails** otherwise; **uninformative** with fewer than two (draw, seed) pairs.")


def verdict(rows: pd.DataFrame, metric: str = "align_trained", acc: str = "test_acc_kernel_trained") -> pd.DataFrame:
    """"MLP-Attn's kernel is better aligned", per width, from an alignment run's per-net ``rows``
    (columns data_seed, arch, width, seed, ``metric``, ``acc``). Each (draw, seed) pairs MLP-Attn's
    net with 2L-ReLU's; the difference is pooled with data draws as the unit
    (``engine.maths.metrics.draw_interval``). One row per width: both nets' means and sds, the gap
    with its interval, the accuracy gap with its interval, the pairs and draws, and ``outcome`` in
    holds / fails / uninformative with ``why`` (``VERDICT_WORDS``)."""
    from .metrics import draw_interval

    cols = ["width", "relu_mean", "relu_sd", "attn_mean", "attn_sd", "gap", "gap_low", "gap_high", "relu_acc",
            "attn_acc", "acc_gap", "acc_low", "acc_high", "units", "n_draws", "outcome", "why"]
    out = []
    if rows.empty or not {metric, acc} <= set(rows):
        return pd.DataFrame(columns=cols)
    for width, g in rows.groupby("width", sort=True):
        r, a = g[g["arch"] == "relu"], g[g["arch"] == "attn"]
        if r.empty or a.empty:
            continue
        pairs = a.merge(r, on=["data_seed", "seed"], suffixes=("_attn", "_relu"))
        gap, lo, hi, draws = draw_interval(pairs[f"{metric}_attn"] - pairs[f"{metric}_relu"], pairs["data_seed"])
        acc_gap, acc_lo, acc_hi, _ = draw_interval(pairs[f"{acc}_attn"] - pairs[f"{acc}_relu"], pairs["data_seed"])
        row: dict[str, Any] = {"width": int(width), "relu_mean": float(r[metric].mean()), "relu_sd": float(r[metric].std()),
               "attn_mean": float(a[metric].mean()), "attn_sd": float(a[metric].std()), "gap": gap, "gap_low": lo,
               "gap_high": hi, "relu_acc": float(r[acc].mean()), "attn_acc": float(a[acc].mean()), "acc_gap": acc_gap,
               "acc_low": acc_lo, "acc_high": acc_hi, "units": len(pairs), "n_draws": draws}
        span = f"gap {gap:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        if len(pairs) < 2 or not math.isfinite(lo):
            row["outcome"], row["why"] = "uninformative", "fewer than two (draw, seed) pairs"
        elif hi < 0:
            row["outcome"], row["why"] = "fails", f"2L-ReLU's is the better aligned: {span}"
        elif lo <= 0:
            row["outcome"], row["why"] = "fails", f"the alignment {span} reaches zero"
        elif math.isfinite(acc_hi) and acc_hi < 0:
            row["outcome"] = "fails"
            row["why"] = f"better aligned, {span}, but K_m ridge accuracy lower by {-100 * acc_gap:.1f} points"
        else:
            row["outcome"], row["why"] = "holds", f"alignment {span}; K_m ridge accuracy {100 * acc_gap:+.1f} points"
        out.append(row)
    return pd.DataFrame(out, columns=cols)


REACH_ERROR = 0.6  # sample efficiency: the p at which a learning curve's error falls to 60 % of the zero predictor's
POWER_METRICS = {  # metric -> (column of the per-net rows, True where higher is better, words)
    "alignment": ("align_trained", True, "centred alignment A(K_m, YYᵀ)"),
    "k90": ("k90_trained", False, "k at which C(k) reaches 0.9"),
    "auc": ("auc_trained", True, "area under C(k) against log k"),
    "p_reach": ("p_reach", False, f"p at which the learning curve reaches {REACH_ERROR:g} of the zero predictor's error"),
}


def reach(ps: Sequence[float], errors: Sequence[float], level: float = REACH_ERROR) -> float:
    """The training-set size at which a learning curve (errors at sizes ps, increasing p) first falls
    to ``level``, interpolated linearly in log p between the sizes around it; NaN if it never does."""
    p, e = np.asarray(ps, dtype=float), np.asarray(errors, dtype=float)
    below = np.flatnonzero(e <= level)
    if not below.size:
        return math.nan
    i = int(below[0])
    if i == 0:
        return float(p[0])
    t = (e[i - 1] - level) / (e[i - 1] - e[i])
    return float(np.exp(np.log(p[i - 1]) + t * (np.log(p[i]) - np.log(p[i - 1]))))


def power_metrics(rows: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """The power half by every metric it is claimed in, per metric: each net's mean, the paired
    difference MLP-Attn − 2L-ReLU (each (draw, seed) pair at the largest width; draws the unit:
    ``engine.maths.metrics.draw_interval``) with its 95 % interval, and which net it favours
    (``favours``: attn, relu, neither when the interval reaches zero, or unmeasured where no pair has the
    metric: a learning curve that never reaches ``REACH_ERROR`` at the sizes measured). ``rows``: an alignment run's
    per-net rows; ``curves``: its learning curves (the trained K_m's give ``p_reach``)."""
    from .metrics import draw_interval

    cols = ["metric", "words", "attn", "relu", "diff", "low", "high", "n_draws", "favours"]
    if rows.empty or not {"attn", "relu"} <= set(rows["arch"]):
        return pd.DataFrame(columns=cols)
    nets = rows[rows["width"] == rows["width"].max()][["data_seed", "arch", "seed", *(c for c, _, _ in
                                                                                      POWER_METRICS.values()
                                                                                      if c in rows)]].copy()
    trained = curves[curves["kernel"] == "K_m trained"] if len(curves) else curves
    if len(trained):
        got = {k: reach(g.sort_values("p")["p"], g.sort_values("p")["measured"])
               for k, g in trained.groupby(["data_seed", "arch", "seed"])}
        nets["p_reach"] = [got.get((d, a, s), math.nan) for d, a, s in
                           zip(nets["data_seed"], nets["arch"], nets["seed"], strict=True)]
    pairs = nets[nets["arch"] == "attn"].merge(nets[nets["arch"] == "relu"], on=["data_seed", "seed"],
                                               suffixes=("_attn", "_relu"))
    out = []
    for metric, (col, higher, words) in POWER_METRICS.items():
        if f"{col}_attn" not in pairs:
            continue
        diff = pairs[f"{col}_attn"] - pairs[f"{col}_relu"]
        mean, lo, hi, g = draw_interval(diff, pairs["data_seed"])
        better = (lo > 0) if higher else (hi < 0)
        worse = (hi < 0) if higher else (lo > 0)
        out.append({"metric": metric, "words": words, "attn": float(pairs[f"{col}_attn"].mean()),
                    "relu": float(pairs[f"{col}_relu"].mean()), "diff": mean, "low": lo, "high": hi, "n_draws": g,
                    "favours": "unmeasured" if not g else "attn" if better else "relu" if worse else "neither"})
    return pd.DataFrame(out, columns=cols)


def disagreement(table: pd.DataFrame) -> str:
    """One line: whether the power metrics of ``power_metrics`` agree on which net's kernel serves the
    task better, and where they part."""
    if table.empty:
        return "The power metrics were not measured."
    sides = {f: list(table[table["favours"] == f]["metric"]) for f in ("attn", "relu", "neither", "unmeasured")}
    unmeasured = (f" ({', '.join(sides['unmeasured'])}: not reached at the sizes measured)"
                  if sides["unmeasured"] else "")
    if sides["attn"] and sides["relu"]:
        return (f"The metrics disagree: {', '.join(sides['attn'])} favour MLP-Attn, {', '.join(sides['relu'])} "
                "favour 2L-ReLU" + (f", {', '.join(sides['neither'])} neither" if sides["neither"] else "") + f"{unmeasured}.")
    lead = "MLP-Attn" if sides["attn"] else "2L-ReLU" if sides["relu"] else None
    if lead is None:
        return f"No metric separates the two nets beyond its interval{unmeasured}."
    rest = ""
    if sides["neither"]:
        rest = f"; {', '.join(sides['neither'])} {'does' if len(sides['neither']) == 1 else 'do'} not separate them"
    return (f"Every metric that separates the nets favours {lead} ({', '.join(sides['attn'] or sides['relu'])})"
            f"{rest}{unmeasured}.")


def parted(curves: pd.DataFrame, rtol: float = 0.2) -> pd.DataFrame:
    """Rows of a learning-curve frame (columns measured, measured_se, theory) where theory and the
    measured mean part: they differ by more than ``rtol`` of the theory and by more than two standard
    errors of the measured mean (its sd over trials / √trials)."""
    if curves.empty:
        return curves
    gap = (curves["measured"] - curves["theory"]).abs()
    bad = (gap > rtol * curves["theory"].abs()) & (gap > 2 * curves["measured_se"].fillna(0))
    return curves[bad & np.isfinite(curves["theory"])]
