"""Every dashboard page at its defaults on real MNIST, through AppTest: what a new user sees first.

A file of its own, so that a parallel run (the Makefile's pytest-xdist hands each worker whole
files) computes the suite's longest test beside the rest of ``test_app.py``, not after it.
"""

from __future__ import annotations

import pytest

from tests.conftest import MNIST_DIR, NO_MNIST, steady_app_state
from tests.test_app import PAGES, app, check_page, open_page, settle


@pytest.fixture()
def env(tmp_path, monkeypatch):
    steady_app_state(monkeypatch, tmp_path / "cache", MNIST_DIR)


@pytest.mark.skipif(MNIST_DIR is None, reason=NO_MNIST)
@pytest.mark.slow
def test_every_page_runs_at_defaults_on_mnist(env):
    at = app()
    settle(at)
    assert at.selectbox(key="data").value == "mnist"   # the first available data set is the default
    for page in PAGES:
        check_page(open_page(at, page), page)
