"""Settings declared once: default, bounds, unit and help text live on a dataclass field.

A config dataclass declares each setting with ``setting(default, "help", unit=..., lo=...,
hi=..., choices=...)`` and calls ``validate(self)`` in ``__post_init__``. The CLI builds its
flags from the same fields (``add_arguments`` / ``from_args``), and the dashboard reads
defaults, bounds and help from ``meta(cls, name)``, so a setting cannot disagree with itself
between the engine, the command line and the browser.

Every check raises ``BadInput`` with one line naming the setting, the bad value and what is
allowed. Floats must be finite unless a setting says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable

from .errors import BadInput

_KEY = "setting"


@dataclass(frozen=True)
class Meta:
    """What a setting is: help text, unit, bounds and allowed values."""

    help: str
    unit: str = ""
    lo: float | None = None          # smallest allowed value (of each element, for tuples)
    hi: float | None = None          # largest allowed value
    lo_open: bool = False            # True: lo itself is not allowed
    choices: tuple | None = None     # allowed values (of each element, for tuples)
    flag: str | None = None          # CLI flag, default --field-name
    cli: bool = True                 # False: not a CLI flag (set by the command itself)
    check: Callable[[Any], Any] | None = None  # extra check, raises BadInput (e.g. parse_attention)
    max_len: int | None = None       # tuples: most elements allowed
    repeats: bool = False            # tuples: True where a value may appear twice (none does yet: a repeated
    #                                  seed, draw, width, reading or κ would do the same work twice and count twice)

    def allowed(self) -> str:
        """The allowed values in words, for errors and help."""
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        lo = None if self.lo is None else (f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}")
        hi = None if self.hi is None else f"<= {self.hi:g}"
        return " and ".join(p for p in (lo, hi) if p) or "any value"


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field carrying its ``Meta``; use as ``x: int = setting(3, "what x is", lo=1)``."""
    m = Meta(help=help, **meta)
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings hold immutable defaults (use a tuple)")
    return dataclasses.field(default=default, metadata={_KEY: m})


def meta(cls_or_obj: Any, name: str) -> Meta:
    """The ``Meta`` of one setting of a config class (or instance)."""
    for f in dataclasses.fields(cls_or_obj):
        if f.name == name and _KEY in f.metadata:
            return f.metadata[_KEY]
    raise KeyError(f"{name!r} is not a setting of {getattr(cls_or_obj, '__name__', type(cls_or_obj).__name__)}")


def default(cls: type, name: str) -> Any:
    """The declared default of one setting."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def settings(cls_or_obj: Any) -> list[tuple[dataclasses.Field, Meta]]:
    """The fields of a config that are settings (nested configs are not)."""
    return [(f, f.metadata[_KEY]) for f in dataclasses.fields(cls_or_obj) if _KEY in f.metadata]


# ---------------------------------------------------------------- types

@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _kind(cls: type, f: dataclasses.Field) -> tuple[str, bool, bool]:
    """(element type name, is tuple, may be None) from the field's annotation."""
    hints = _hints(cls)
    t = hints[f.name]
    optional = False
    args = typing.get_args(t)
    if type(None) in args:
        optional = True
        t = next(a for a in args if a is not type(None))
    if typing.get_origin(t) is tuple:
        return typing.get_args(t)[0].__name__, True, optional
    return t.__name__, False, optional


def _check_scalar(cls_name: str, name: str, m: Meta, kind: str, v: Any) -> None:
    where = f"{name}"
    if kind == "bool":
        if not isinstance(v, bool):
            raise BadInput(f"{where} must be true or false, got {v!r}")
        return
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                import numpy as np
                if isinstance(v, np.integer):
                    v = int(v)
                else:
                    raise TypeError
            except TypeError:
                raise BadInput(f"{where} must be an integer ({m.allowed()}), got {v!r}") from None
    elif kind == "float":
        if isinstance(v, (bool, str, bytes)):  # float("0.1") would pass and leave text in the config
            raise BadInput(f"{where} must be a number ({m.allowed()}), got {v!r}")
        if not isinstance(v, (int, float)):
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise BadInput(f"{where} must be a number ({m.allowed()}), got {v!r}") from None
        if not math.isfinite(v):
            raise BadInput(f"{where} must be a finite number ({m.allowed()}), got {v!r}")
    elif kind == "str":
        if not isinstance(v, str):
            raise BadInput(f"{where} must be text, got {v!r}")
    if m.choices is not None and v not in m.choices:
        raise BadInput(f"unknown {where} {v!r}; allowed: {', '.join(str(c) for c in m.choices)}")
    if kind in ("int", "float"):
        if m.lo is not None and (v < m.lo or (m.lo_open and v == m.lo)):
            raise BadInput(f"{where} must be {m.allowed()}{' ' + m.unit if m.unit else ''}, got {v!r}")
        if m.hi is not None and v > m.hi:
            raise BadInput(f"{where} must be {m.allowed()}{' ' + m.unit if m.unit else ''}, got {v!r}")
    if m.check is not None:
        try:
            m.check(v)
        except BadInput as exc:  # the check's own words, but always naming the setting
            if name in str(exc):
                raise
            raise BadInput(f"{name}: {exc}") from None


def validate(obj: Any) -> None:
    """Check every setting of a config instance; raises ``BadInput`` (one line) on the first bad one."""
    cls = type(obj)
    for f in dataclasses.fields(obj):  # nested configs (data, train, attack) must be what they say
        if _KEY not in f.metadata and dataclasses.is_dataclass(f.default) \
                and not isinstance(getattr(obj, f.name), type(f.default)):
            raise BadInput(f"{f.name} must be a {type(f.default).__name__}, got {getattr(obj, f.name)!r}")
    for f, m in settings(obj):
        v = getattr(obj, f.name)
        kind, is_tuple, optional = _kind(cls, f)
        if v is None:
            if optional:
                continue
            raise BadInput(f"{f.name} must be set ({m.allowed()})")
        if is_tuple:
            if not isinstance(v, tuple):
                raise BadInput(f"{f.name} must be a list of values, got {v!r}")
            if not v and f.default != ():
                raise BadInput(f"{f.name} must not be empty ({m.allowed()})")
            if m.max_len is not None and len(v) > m.max_len:
                raise BadInput(f"{f.name} takes at most {m.max_len} values, got {len(v)}")
            twice = [e for i, e in enumerate(v) if e in v[:i]]
            if twice and not m.repeats:
                raise BadInput(f"{f.name} lists {twice[0]!r} more than once ({', '.join(map(str, v))}): give each "
                               "value once")
            for e in v:
                _check_scalar(cls.__name__, f.name, m, kind, e)
        else:
            _check_scalar(cls.__name__, f.name, m, kind, v)


def normalised(obj: Any) -> None:
    """Coerce list values to tuples and numpy scalars to Python ones (call before validate)."""
    for f, _ in settings(obj):
        v = getattr(obj, f.name)
        if isinstance(v, list):
            object.__setattr__(obj, f.name, tuple(v))


# ---------------------------------------------------------------- command line

def _parse_one(kind: str, text: str) -> int | float | str:
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text.strip()


def _parser_for(kind: str, is_tuple: bool, optional: bool) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if optional and text.strip().lower() in ("none", "auto", ""):
            return None
        try:
            if is_tuple:
                return tuple(_parse_one(kind, t) for t in text.split(",") if t.strip())
            return _parse_one(kind, text)
        except ValueError:
            what = {"int": "integers", "float": "numbers"}.get(kind, "values")
            raise argparse.ArgumentTypeError(
                f"expected {'comma-separated ' if is_tuple else ''}{what}, got {text!r}") from None
    return parse


def _flag(f: dataclasses.Field, m: Meta, prefix: str) -> str:
    return m.flag or "--" + (prefix + f.name).replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type, prefix: str = "", skip: tuple[str, ...] = (),
                  defaults: dict | None = None) -> None:
    """Add one flag per setting of ``cls`` (not nested configs). ``defaults`` overrides
    the declared defaults (a preset's values), so ``--help`` shows what a run will use."""
    defaults = defaults or {}
    for f, m in settings(cls):
        if not m.cli or f.name in skip:
            continue
        kind, is_tuple, optional = _kind(cls, f)
        value = defaults.get(f.name, f.default)
        shown = ",".join(str(v) for v in value) if isinstance(value, tuple) else value
        if isinstance(value, bool):
            shown = "on" if value else "off"
        unit = f" [{m.unit}]" if m.unit else ""
        bounds = "" if m.allowed() == "any value" or kind in ("bool", "str") and m.choices is None \
            else f"; {m.allowed()}"
        text = f"{m.help}{unit} (default: {shown}{bounds})".replace("%", "%%")  # argparse formats help with %
        dest = prefix + f.name
        if kind == "bool" and not is_tuple:
            if value:
                name = m.flag or "--no-" + (prefix + f.name).replace("_", "-")
                parser.add_argument(name, dest=dest, action="store_false", help=text)
            else:
                parser.add_argument(_flag(f, m, prefix), dest=dest, action="store_true", help=text)
            parser.set_defaults(**{dest: value})
            continue
        parser.add_argument(_flag(f, m, prefix), dest=dest, type=_parser_for(kind, is_tuple, optional),
                            default=value, metavar=kind.upper() + ("S" if is_tuple else ""), help=text)


def from_args(cls: type, ns: argparse.Namespace, prefix: str = "", **nested: Any) -> Any:
    """An instance of ``cls`` from parsed flags (as added by ``add_arguments``); nested configs
    and settings the command fills itself are passed as keywords."""
    kwargs = {}
    for f, m in settings(cls):
        dest = prefix + f.name
        # Not a flag of this config: a same-named dest belongs to another config's flag
        # (MalleabilityConfig's --eps tuple must not land in AttackSpec.eps).
        if f.name in nested or not m.cli:
            continue
        if hasattr(ns, dest):
            kwargs[f.name] = getattr(ns, dest)
    kwargs.update(nested)
    return cls(**kwargs)


def describe(cls: type) -> list[dict]:
    """Every setting of a config class as plain rows (name, default, unit, allowed, help)."""
    rows = []
    for f, m in settings(cls):
        rows.append({"name": f.name, "default": f.default, "unit": m.unit, "allowed": m.allowed(),
                     "help": m.help})
    return rows
