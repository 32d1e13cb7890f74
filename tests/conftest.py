"""Shared fixtures and the numerical tolerances of the whole suite, in one place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _digits_dir() -> Path | None:
    """The folder of the real MNIST digits (``MNIST/raw/``, as ``engine.data`` reads them):
    ENGINE_DATA_DIR where it holds them (read once, at collection: fixtures change the variable
    per test), else this checkout's ``../shared/datasets``; None where neither does."""
    for folder in (os.environ.get("ENGINE_DATA_DIR"), SHARED_DATA):
        if folder and all((Path(folder) / "MNIST" / "raw" / f).is_file() for f in MNIST_FILES):
            return Path(folder)
    return None


MNIST_DIR = _digits_dir()
NO_MNIST = ("no real MNIST digits: point ENGINE_DATA_DIR at a folder holding MNIST/raw/ "
            "(python -m engine datasets --fetch mnist --data-dir FOLDER)")

# Tolerances per dtype: float64 references against float64 (or exact) implementations.
RTOL64 = 1e-10
ATOL64 = 1e-12
# float32 computations (network features, training) against float64 references.
RTOL32 = 1e-4
ATOL32 = 1e-5

# Tighter or looser cases, each for a stated reason (never to make a failing test pass).
# float64 chains of matrix products (G³ = (ZZᵀZ)(ZZᵀZ)ᵀ, Z Cᵏ, an SVD's C_r): every product
# adds rounding of O(n) sums of O(1) terms, so entries of size ~n³ carry ~1e-12 absolute error.
RTOL64_CHAIN = 1e-9
ATOL64_CHAIN = 1e-9
# float64 matrix powers up to G⁷ (stacked attention, k ≤ 3): entries grow like n⁶.
RTOL64_POWER = 1e-8
ATOL64_POWER = 1e-8
# The same float64 value computed twice, by other code or in another order (torch and math,
# pandas and numpy, by blocks and whole, a cache read-back): a few ulps of O(1) values.
RTOL64_SAME = 1e-12
ATOL64_SAME = 1e-14
# One float64 update computed twice from the same gradient: only summation order differs.
RTOL64_STEP = RTOL64_SAME
ATOL64_STEP = ATOL64_SAME
# One float32 pass without training (a kernel; the same steps batched differently) against
# float64 or reordered float32: a few ulps of O(1) values, no accumulation over epochs.
RTOL32_ONE_PASS = 1e-5
ATOL32_ONE_PASS = 1e-6
# The same float32 run on two devices (CPU, CUDA): reductions run in another order. At
# initialisation that stays small; training lets Adam amplify it over the epochs.
RTOL_DEVICES_INIT = 1e-3
RTOL_DEVICES_TRAINED = 1e-2
# A training accuracy measured twice over 40 points: one point may round differently in float32.
ATOL_ONE_OF_40 = 1 / 40 + 1e-12
# Monte-Carlo means against their analytic value (e.g. eNTKs over seeds against K∞): allowed
# error in standard errors of the mean, computed from the number of independent draws.
MC_SIGMAS = 5.0
# Brute-force leave-one-out refits (n ridge solves of condition up to ~1/ridge = 1e3) differenced
# against the full fit: the difference cancels most digits of the O(1) predictions.
RTOL64_REFIT = 1e-8
ATOL64_REFIT = 1e-10
# One float64 solve or least-squares fit (ridge-1e-3 kernel regression, a log-log line, influence
# on a kernel built by another route) against its exact value: rounding times a condition of ~1e3.
RTOL64_SOLVE = 1e-9
# A hand-derived float64 input gradient (through the feature map and the softmax) against
# autograd's: the chain rule's products run in another order and small entries cancel.
RTOL64_GRAD = 1e-8
# The kernel flow's closed form (an eigendecomposition of K) against scipy's expm (Padé) up to τ = 40.
RTOL64_EXPM = 1e-9
ATOL64_EXPM = 1e-11
# float64 eigenvalues and κ of a Gram at κ ≤ 50 against scipy's, a designed κ, or G's eigenvalues
# cubed: the smallest carry ~n·eps·λ_max absolute error, so ~n·eps·κ³ ≤ 1e-9 relative.
RTOL64_EIG = 1e-8
# K∞ of attention features read through the leave-one-out refits against numpy's: the features of
# one draw are nearly parallel, where arccos near 1 is ill-conditioned, so two float64 routes to θ
# part by ~1e-7 relative (measured 6e-7 on the synthetic draw of tests/test_design.py).
RTOL64_KINF_ATTENTION = 2e-6
# Eigenvalues that should be 0 (a low-rank Gram), in multiples of λ_max: rounding level by any route.
ATOL64_EIG = 1e-9
# κ of the attention Gram measured through its feature map against κ(G)³, and real digits'
# attention eigenvalues against G's cubed (κ far above 50): G's rounding enters cubed.
RTOL64_EIG_ATTENTION = 1e-6
# Their absolute floor in multiples of λ_max(G³): G's smallest eigenvalues cubed fall below it.
ATOL64_EIG_ATTENTION = 1e-12
# pandas' groupby mean and sample sd of a few O(1) float64 values against numpy's: the mean to a
# few ulps, the sd (a square root of a sum of squared differences) an order looser; differences
# of such means (rates of flags, an excess over a null) to a few ulps absolute.
RTOL64_MEAN = 1e-15
RTOL64_SD = 1e-14
ATOL64_MEAN = 1e-15
# float64 arithmetic on float32 inputs (a float32 net's features, each rounded once, 2⁻²⁴ ≈ 6e-8
# relative) against the same on float64 inputs: an order above that one rounding.
RTOL32_INPUT = 1e-6
# "Must differ" checks (a negated np.allclose; ATOL for O(1) entries): far above float64
# rounding, far below the effect looked for (a label change, Monte-Carlo noise).
RTOL_CHANGED = 1e-3
ATOL_CHANGED = 1e-6
# λ₁ by power iteration (stopped once a step moves it by under 1e-6 relative) against eigvalsh:
# what the unfinished convergence leaves.
RTOL_POWER_ITERATION = 1e-5
# Spearman ρ (scipy's, from ranks) of the engine's influences against the reference's: equal ranks
# give the same ρ to rounding, where one swapped neighbouring pair of n = 12 points would move it by
# 12/(n³ − n) ≈ 0.007. REDRAWN: the random null, whose perturbation the test draws again.
RTOL_SAME_RANKS = 1e-9
RTOL_SAME_RANKS_REDRAWN = 1e-6
# A float32 head retrained by the engine's batched masked trainer against a float64 loop written in
# the test: the changes f − f₋ᵢ are differences of outputs of order 1, so float32 rounding of the
# outputs (a few 1e-7) sets an absolute floor beside RTOL32.
ATOL32_RETRAIN = 1e-6
# The flow leave-one-out's closed form (one eigendecomposition of K) against scipy's expm and a solve:
# K's condition number (about 1e3 on these 24 synthetic points) multiplies the solve's rounding.
RTOL64_FLOW_CLOSED = 1e-6
ATOL64_FLOW_CLOSED = 1e-9
# Full-batch gradient descent on the linearised head against the continuous flow it discretises: the
# step's error is of order η'λ_max/2 (η' = 2η/(n·c) = 0.04, λ_max ≈ 2: about 4 % of a change at most).
RTOL_FLOW_STEP = 0.05
ATOL_FLOW_STEP = 2e-3
# The same float32 training run by two routes that perform the same operations in the same order (the
# head's closed-form gradient against autograd, engine.maths.grads): bit for bit equal where the BLAS
# picks the same kernels for both (it does on the CPUs measured here). Elsewhere a GEMM's summation
# order may differ by a few ulps per step; Adam and SGD with coupled decay carry a relative gradient
# error δ into the weights linearly, about steps·lr·δ ≈ 60·1e-2·1e-6 over these runs' 30 epochs.
RTOL32_SAME_STEPS = 1e-5
ATOL32_SAME_STEPS = 1e-6
# One step's weight gradient with its two head GEMMs in bfloat16 (train_precision) against float32, in
# norm: five roundings to 8 bits (φ, W, H = φWᵀ, the masked backward, the product; unit 2⁻⁹ ≈ 0.2 %)
# give up to ~1 %, and units whose pre-activation lies within that of 0 switch their relu mask, adding
# whole terms. Measured 0.5–1.7 % on test_grads' 48 blobs (MSE ±1 and one-hot, CE; ntk and μP);
# bound 2⁻⁵ ≈ 3 %. It must also exceed float32's rounding (RTOL32_ONE_PASS) tenfold, or the GEMMs
# did not run in bfloat16.
RTOL_BF16_GRAD = 2.0**-5
# bfloat16 training against float32 on 200 real digits (test_grads): the trained eNTK moved by 0.2–0.6 %
# (MNIST, widths 256 and 1024, three seeds, lr 1e-3 and 2e-2, 200 epochs) and test accuracy by at most
# one point in 1000, while training itself moved the kernel by 8–170 %. Bounds: 2 % of the kernel
# (three times the largest measured: a few bf16 units 2⁻⁹ ≈ 0.2 %, the rounding of one step's gradient,
# which the steps do not pile up) and at most a tenth of what training moved it (bf16 must stay small
# beside the effect the pages study); 1 % of the test
# points (ten times the largest measured: a prediction flips only where a point's margin lies within
# that change of the outputs).
RTOL_BF16_KERNEL = 0.02
BF16_KERNEL_SHARE_OF_TRAINING = 0.1
ATOL_BF16_ACCURACY = 0.01
# A reordering of the training set must move the influence columns by far more than rounding.
REL_MOVED = 1e-3
# Brent's root of the self-consistent equation, to near float64 resolution, against the engine's solver.
RTOL64_ROOT = 1e-14
# Monte-Carlo mean of 40 empirical NTKs of width 4000 against K∞: each entry averages 160,000
# Bernoulli products with a standard error below 0.0013, so this is about 4.6 standard errors.
ATOL_MC_NTK = 0.006
# The host's free memory read twice a moment apart: other processes (parallel test runs, the rest
# of the system) move it by a few percent. REREAD: the same limit read twice; REREAD_RAW:
# MemAvailable itself against a limit or a share of it, with more margin.
REL_MEMORY_REREAD = 0.1
REL_MEMORY_REREAD_RAW = 0.2
# An ETA from a steady (fake-clock) rate over a thinned history: exact but for where the window's
# ends fall between reports, well under 1 %.
REL_ETA = 0.01
# A PDF page's aspect ratio: kaleido writes the page size in whole points, so a page about 560 pt
# tall can differ from 16:9 or 4:3 by up to 1/560 ≈ 1.8e-3.
REL_PDF_ASPECT = 2e-3


MAX_WORKERS = 4  # `-n auto` (the Makefile's): one test worker per core, at most this many (memory)


def pytest_xdist_auto_num_workers(config):
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: tests that take more than a few seconds")
    config.addinivalue_line("markers", "browser: tests that drive a real Chromium")
    config.addinivalue_line("markers", "cuda: tests that need a CUDA GPU")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from engine.runtime.memory import keep_freed_blocks

    keep_freed_blocks()  # the suite runs experiments as the CLI does, with its allocator (not set by `import engine`)
    # no shipped results served to the suite (the CLI, grid and server subprocesses included): a test
    # computes what it checks; tests/test_bundle.py points ENGINE_BUNDLE_DIR at a bundle of its own
    os.environ["ENGINE_BUNDLE_DIR"] = ""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # parallel workers share the cores: oversubscribed OpenMP threads spin against each other
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # and the CLI, grid and server subprocesses too


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real-MNIST folder (``MNIST_DIR``); tests that need it skip, saying why, where there is none."""
    if MNIST_DIR is None:
        pytest.skip(NO_MNIST)
    return MNIST_DIR


@pytest.fixture()
def cache(tmp_path):
    from engine.runtime.cache import Cache

    c = Cache(tmp_path / "cache")
    yield c
    c.close()


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def steady_app_state(monkeypatch, cache_dir, data_dir) -> None:
    """Run AppTest scripts in a server's steady state with their own cache and data folders.

    A server decides once per process whether to run `pages/` as a v1 multipage app, and
    st.navigation turns that off on the first run (ui.nav.ensure_entry covers that run).
    AppTest re-decides before every run; start each run in the server's steady state, or
    every run would begin with ensure_entry's rerun, which drops button clicks. Each test also
    gets a job manager of its own."""
    from streamlit.runtime.pages_manager import PagesManager

    init = PagesManager.__init__

    def steady_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", steady_init)
    # a fresh server's job manager: the one st.cache_resource keeps would carry the finished
    # jobs (and results) of the tests before this one
    from ui.common import get_manager

    get_manager().shutdown(cancel=True, wait=True)
    get_manager.clear()
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("ENGINE_DATA_DIR", str(data_dir))
    # what starts by itself must not depend on how loaded the machine running the tests is
    monkeypatch.setenv("ENGINE_SPEED_FACTOR", "1")
# A 95 % interval's coverage estimated over simulated experiments: at least this share must cover the
# truth (the bar; the t interval over cluster means is exact for normal cluster means).
MIN_COVERAGE_95 = 0.90
# Fieller's interval against a brute-force scan of ρ on a grid of step 0.005: the scan's ends lie within
# one step (and a little) of the exact roots.
ATOL_RATIO_SCAN = 0.01
