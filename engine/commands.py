"""A config as the ``python -m engine`` command line that makes it: "copy as CLI command".

``command_line(cfg)`` writes ``python -m engine NAME --flag value …`` with one flag for every
setting (its own or a nested config's) whose value differs from the experiment's default
config, the flags being those ``engine.runtime.settings.add_arguments`` builds from the same field
metadata; parsing that line with ``engine.cli.build_parser`` gives back ``cfg`` exactly, so the
command reads the dashboard's cached result (same cache key) or computes the same one.
``figure=FILE`` gives the ``figure NAME … --out FILE`` line that draws the main chart instead.
"""

from __future__ import annotations

import dataclasses
import shlex

from .experiments.registry import NESTED, of
from .runtime.settings import settings


def _flag(f: dataclasses.Field, m) -> str:
    return m.flag or "--" + f.name.replace("_", "-")


def _text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(_text(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _flags(obj, default) -> list[str]:
    """Flags for the settings of ``obj`` whose values differ from ``default``'s."""
    out = []
    for f, m in settings(obj):
        value, base = getattr(obj, f.name), getattr(default, f.name)
        if not m.cli or value == base:
            continue
        if isinstance(f.default, bool):  # a switch: --x turns a default off on, --no-x turns it off
            out.append(_flag(f, m) if value else (m.flag or "--no-" + f.name.replace("_", "-")))
            continue
        out += [_flag(f, m), shlex.quote(_text(value))]
    return out


def command_line(cfg, figure: str | None = None) -> str:
    """``python -m engine NAME --flag value …`` for ``cfg`` (an experiment's config), or with
    ``figure`` (an output file name) ``python -m engine figure NAME … --out FIGURE``."""
    exp = of(cfg)
    default = exp.config()
    flags = []
    for name in exp.nested:
        flags += _flags(getattr(cfg, name), getattr(default, name))
    flags += _flags(cfg, default)
    head = ["python", "-m", "engine"] + (["figure"] if figure else []) + [exp.name]
    tail = ["--out", shlex.quote(figure)] if figure else []
    return " ".join(head + flags + tail)


def argv(line: str) -> list[str]:
    """The arguments after ``python -m engine`` of a ``command_line`` (for ``build_parser``)."""
    words = shlex.split(line)
    if words[:3] != ["python", "-m", "engine"]:
        raise ValueError(f"not a python -m engine command: {line!r}")
    return words[3:]


__all__ = ["argv", "command_line", "NESTED"]
