"""engine.commands: "copy as CLI command" parses back to the very config that made the view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine import cli
from engine.commands import argv, command_line
from engine.experiments.registry import EXPERIMENTS
from ui import configs
from ui.common import Shared


def _parsed(line: str):
    words = argv(line)
    a = cli.build_parser(cli._preset_of(words)).parse_args(words)
    return cli.config_from_args(EXPERIMENTS[a.kind if a.command == "figure" else a.command], a)


def _views() -> dict:
    """What the pages build from the sidebar (non-default data, widths, seeds, options)."""
    s = Shared(base="mnist", classes="3-8", n=300, n_test=120, seed=4, widths=(16, 256), archs=("attn",),
               attention="softmax:0.1")
    return {
        "spectrum": configs.spectrum_config(s, rtol=1e-8, eps=0.05),
        "ntk-sweep": configs.sweep_config(s, epochs=40, n_seeds=2, ridge=1e-2, optimizer="sgd"),
        "kernels": configs.kernel_config(s, "attn", 256, epochs=0),
        "influence": configs.influence_config(s, width=64, epochs=5, ridge=1e-4),
        "malleability": configs.malleability_config(s, epochs=3, steps=4, norm="l2", n_seeds=2, eps=(0.1, 0.5)),
        "scaling": configs.scaling_config(kappas=(2.0, 8.0), epochs=7, lr=0.3, max_width=1024, seeds=(0, 1)),
        "dynamics": replace(EXPERIMENTS["dynamics"].presets["quick"], data=s.data(), widths=(16, 64), seeds=(4,)),
        "coord-check": replace(EXPERIMENTS["coord-check"].presets["quick"], steps=3, arch="attn"),
    }


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_preset_parses_back_from_its_command(name):
    for which, cfg in EXPERIMENTS[name].presets.items():
        line = command_line(cfg)
        assert line.startswith(f"python -m engine {name}")
        assert _parsed(line) == cfg, (which, line)


@pytest.mark.parametrize("name", list(_views()))
def test_a_pages_view_parses_back_from_its_command(name):
    cfg = _views()[name]
    line = command_line(cfg)
    assert _parsed(line) == cfg, line
    if EXPERIMENTS[name].figure:
        fig = command_line(cfg, figure="my slide.png")
        assert fig.startswith(f"python -m engine figure {name} ") and fig.endswith("--out 'my slide.png'")
        assert _parsed(fig) == cfg


def test_only_what_differs_from_the_default_is_written():
    assert command_line(EXPERIMENTS["spectrum"].config()) == "python -m engine spectrum"
    base = EXPERIMENTS["spectrum"].config()
    cfg = replace(base, data=replace(base.data, dataset="synthetic", n=50, normalize=False))
    assert command_line(cfg) == "python -m engine spectrum --dataset synthetic --n 50 --no-normalize"
