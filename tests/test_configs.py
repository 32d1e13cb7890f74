"""ui/configs: the dashboard's settings are the engine's presets, and its plans the engine's estimates."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

import pytest

from conftest import REL_MEMORY_REREAD
from engine.experiments.registry import EXPERIMENTS, estimate
from engine.runtime import budget, speed
from ui import configs
from ui.common import Shared

S = Shared(base="synthetic", n=60, n_test=20, widths=(16, 64))


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_settings_are_the_engine_quick_presets(name):
    assert configs.QUICK[name] is EXPERIMENTS[name].presets["quick"]


def test_page_configs_take_the_sidebar_data_and_keep_every_other_preset_value():
    q = EXPERIMENTS["ntk-sweep"].presets["quick"]
    cfg = configs.sweep_config(S, n_seeds=3)
    assert cfg.data == S.data() and cfg.widths == (16, 64) and cfg.seeds == (0, 1, 2)
    assert (cfg.ridge, cfg.init_std, cfg.train.lr, cfg.train.optimizer) == (q.ridge, q.init_std, q.train.lr,
                                                                           q.train.optimizer)
    m = configs.malleability_config(S, norm="l2", space="normalized", target="margin", eps=(0.3,))
    qm = EXPERIMENTS["malleability"].presets["quick"]
    assert (m.attack.norm, m.space, m.target, m.eps) == ("l2", "normalized", "margin", (0.3,))
    assert (m.attack.steps, m.tau, m.train.epochs, m.seeds) == (qm.attack.steps, qm.tau, qm.train.epochs, qm.seeds)


PAGE_DEFAULTS = {  # each page's config at its controls' defaults, as the page builds it
    "spectrum": configs.spectrum_config, "ntk-sweep": configs.sweep_config, "influence": configs.influence_config,
    "malleability": configs.malleability_config, "alignment": configs.alignment_config,
    "scaling": lambda s: configs.scaling_config()}  # the scaling law reads no sidebar setting


@pytest.mark.parametrize("name", list(PAGE_DEFAULTS))
def test_figure_at_its_defaults_computes_the_page_config(name):
    """``python -m engine figure NAME`` builds the quick preset and applies the experiment's ``view`` (the
    settings its page derives: snapshots at each quarter of training, κ against n's prefix sizes): at the
    sidebar's defaults on the preset's data set that is exactly the page's config, so the chart reads the
    page's cached or bundled result."""
    exp = EXPERIMENTS[name]
    quick = exp.presets["quick"]
    want = PAGE_DEFAULTS[name](Shared(base=quick.data.dataset) if hasattr(quick, "data") else Shared())
    assert (quick if exp.view is None else exp.view(quick)) == want


def test_a_view_derives_the_snapshots_and_sizes_from_the_others():
    from engine.experiments.configs.spectrum import growth_sizes

    sweep = configs.sweep_config(S, epochs=40, n_seeds=1)
    assert sweep.train.snapshot_epochs == (0, 10, 20, 30, 40) and configs.sweep_config(S, epochs=0).train.snapshot_epochs == ()
    assert configs.spectrum_config(S).growth_ns == growth_sizes(60) == (7, 15, 30, 60)
    assert configs.spectrum_config(S).data.n_test == 1
    align = configs.alignment_config(S, epochs=6)
    assert align.train.snapshot_epochs == (0, 1, 3, 4, 6) and align.curve_ns == ()


def test_plans_follow_the_engine_estimate(monkeypatch):
    monkeypatch.setenv(speed.SPEED_ENV, "1")
    small = configs.sweep_config(S, epochs=0, n_seeds=1)
    plan = configs.plan(small)
    assert plan.seconds == pytest.approx(estimate(small).seconds)
    assert plan.auto and plan.allowed
    big = replace(small, data=replace(small.data, n=5000), widths=(65536,),
                  train=replace(small.train, epochs=20000, snapshot_epochs=()))
    heavy = configs.plan(big)
    assert heavy.seconds > budget.DASHBOARD_SECONDS and not heavy.allowed and not heavy.auto
    assert "python -m engine" in heavy.note


def test_plans_scale_by_the_machines_speed_now(monkeypatch):
    """On a machine 40x slower than the reference, a run estimated at 1 s no longer starts by itself."""
    cfg = configs.sweep_config(S, epochs=0, n_seeds=1)
    seconds = estimate(cfg).seconds
    slow = budget.QUICK_SECONDS / seconds * 1.5  # just too slow for this config to start unasked
    monkeypatch.setenv(speed.SPEED_ENV, str(slow))
    plan = configs.plan(cfg)
    assert plan.seconds == pytest.approx(seconds * slow) and plan.allowed and not plan.auto
    assert budget.duration(plan.seconds) in plan.note
    monkeypatch.delenv(speed.SPEED_ENV)
    monkeypatch.setattr(speed, "_timings", deque([speed.Timing(1.0, "torch", 200.0, 2, 0.0, 2, None,
                                                               time.perf_counter())]))  # the GEMM's factor now
    monkeypatch.setattr(speed, "_correction", {"cpu": slow})  # what finished runs measured here
    assert configs.plan(cfg).seconds == pytest.approx(seconds * slow)


def test_a_run_that_cannot_fit_in_memory_is_not_allowed():
    cfg = configs.sweep_config(replace(S, n=60000), epochs=0, n_seeds=1)
    plan = configs.plan(cfg)
    assert plan.gib * budget.GIB > budget.Budget().limit_bytes() and not plan.allowed
    assert "GiB" in plan.note


def _n_needing(cfg, share: float) -> int:
    """The smallest n at which ``cfg``'s estimate needs more than ``share`` times what fits."""
    at = lambda k: estimate(replace(cfg, data=replace(cfg.data, n=max(k, 2)))).bytes
    return budget.largest(at, int(share * budget.Budget().limit_bytes()), 60000) + 1  # 60001: never


def test_a_run_that_fits_only_in_float32_says_how_to_run_it():
    """float64 needs about 1.1x what fits, float32 about 0.9x, so the note names the command and
    flag (every experiment is a CLI command of its registry name); at 2.6x float32 does not fit
    either, and the note gives no such advice."""
    cfg = configs.malleability_config(S, epochs=0)
    n = _n_needing(cfg, 1.1)
    if n > 60000:
        pytest.skip("this machine fits float64 kernels at the largest n")
    plan = configs.plan(replace(cfg, data=replace(cfg.data, n=n)))
    assert not plan.allowed and "python -m engine malleability --storage float32" in plan.note
    assert "accuracy cost" in plan.note
    kcfg = configs.kernel_config(S, "relu", 64, epochs=0)
    plan = configs.plan(replace(kcfg, data=replace(kcfg.data, n=_n_needing(kcfg, 1.1))))
    assert not plan.allowed and "python -m engine kernels --storage float32" in plan.note
    plan = configs.plan(replace(kcfg, data=replace(kcfg.data, n=_n_needing(kcfg, 2.6))))
    assert not plan.allowed and "GiB" in plan.note and "--storage" not in plan.note


def test_obtain_planned_refuses_settings_over_the_dashboards_limits():
    from streamlit.testing.v1 import AppTest

    def script():
        from dataclasses import replace

        from engine.experiments.sweep import run_ntk_sweep
        from ui import configs
        from ui.common import Shared
        from ui.runner import obtain_planned

        s = Shared(base="synthetic", n=5000, n_test=20, widths=(65536,))
        cfg = configs.sweep_config(s, epochs=0, n_seeds=1)
        cfg = replace(cfg, train=replace(cfg.train, epochs=20000, snapshot_epochs=()))
        obtain_planned(run_ntk_sweep, cfg, "too big")

    at = AppTest.from_function(script).run()
    assert not at.exception and not at.button  # no Run button for a run the dashboard must not start
    assert len(at.error) == 1 and "python -m engine" in at.error[0].value


def test_plans_count_memory_on_the_device_runs_go_to():
    """cpu: the host's free memory; cuda: the GPU's (where there is none, the host's, and the
    run itself refuses cuda in one line)."""
    import torch

    host = budget.Budget().limit_bytes()
    assert configs._memory_limit("cpu") == pytest.approx(host, rel=REL_MEMORY_REREAD)
    gpu = budget.Budget().limit_bytes(torch.device("cuda")) if torch.cuda.is_available() else host
    assert configs._memory_limit("cuda") == pytest.approx(gpu, rel=REL_MEMORY_REREAD)
    assert configs._memory_limit("auto") == pytest.approx(gpu, rel=REL_MEMORY_REREAD)


def test_obtain_planned_can_wait_for_a_click_and_says_why(tmp_path, monkeypatch):
    """A quick run that ``wait`` holds back shows its button and the reason before the plan."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))

    def script():
        from engine.experiments.spectrum import run_spectrum
        from ui import configs
        from ui.common import Shared
        from ui.runner import obtain_planned

        cfg = configs.spectrum_config(Shared(base="synthetic", n=50, n_test=1))
        obtain_planned(run_spectrum, cfg, "held back", button="Go", wait=True, why="Because.")

    at = AppTest.from_function(script).run()
    assert not at.exception and [b.label for b in at.button] == ["Go"]
    assert any(c.value.startswith("Because. These settings take about") for c in at.caption), at.caption
