"""Shared fixtures and the numerical tolerances of the whole suite, in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"

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
# One float64 update computed twice from the same gradient: only summation order differs.
RTOL64_STEP = 1e-12
ATOL64_STEP = 1e-14
# One float32 pass without training (a kernel; the same steps batched differently) against
# float64 or reordered float32: a few ulps of O(1) values, no accumulation over epochs.
RTOL32_ONE_PASS = 1e-5
ATOL32_ONE_PASS = 1e-6
# The same float32 run on two devices (CPU, CUDA): reductions run in another order. At
# initialisation that stays small; training lets Adam amplify it over the epochs.
RTOL_DEVICES_INIT = 1e-3
RTOL_DEVICES_TRAINED = 1e-2
# Monte-Carlo means against their analytic value (e.g. eNTKs over seeds against K∞): allowed
# error in standard errors of the mean, computed from the number of independent draws.
MC_SIGMAS = 5.0


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: tests that take more than a few seconds")
    config.addinivalue_line("markers", "browser: tests that drive a real Chromium")
    config.addinivalue_line("markers", "cuda: tests that need a CUDA GPU")
    torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The shared real-MNIST folder; tests that need it skip where it is absent."""
    if not (SHARED_DATA / "MNIST" / "raw" / "train-images-idx3-ubyte").exists():
        pytest.skip("../shared/datasets/MNIST is absent")
    return SHARED_DATA


@pytest.fixture()
def cache(tmp_path):
    from engine.cache import Cache

    c = Cache(tmp_path / "cache")
    yield c
    c.close()


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def steady_app_state(monkeypatch, cache_dir, data_dir) -> None:
    """Run AppTest scripts in a server's steady state with their own cache and data folders.

    A server decides once per process whether to run `pages/` as a v1 multipage app, and
    st.navigation turns that off on the first run (ui.common.ensure_entry covers that run).
    AppTest re-decides before every run; start each run in the server's steady state, or
    every run would begin with ensure_entry's rerun, which drops button clicks."""
    from streamlit.runtime.pages_manager import PagesManager

    init = PagesManager.__init__

    def steady_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", steady_init)
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("ENGINE_DATA_DIR", str(data_dir))
    # what starts by itself must not depend on how loaded the machine running the tests is
    monkeypatch.setenv("ENGINE_SPEED_FACTOR", "1")
