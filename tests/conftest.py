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
