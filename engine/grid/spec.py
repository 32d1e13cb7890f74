"""Grid specs: TOML files of experiment blocks, read into validated cells.

A grid spec is a TOML file (``grids/*.toml``) holding one block, or several as ``[[grid]]``:

    kind     an experiment command of the CLI: spectrum, ntk-sweep, malleability, scaling, ...
    preset   the named config the block starts from (default: the dataclass's defaults)
    base     settings every cell of the block shares
    axes     setting -> list of values; the block's cells are their Cartesian product
    exclude  list of rules, each setting -> value (or list of values); a cell matching
             every entry of one rule is left out

Settings are config fields; nested ones are dotted (``data.dataset``, ``train.optimizer``,
``attack.norm``). A scalar given for a tuple setting is a 1-tuple, so ``seeds = [0, 1, 2]``
as an axis makes three cells of one seed each. Every cell is built, hence validated, when the
spec is read: a bad spec is one ``BadInput`` line naming its key before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.folders import read_regular
from ..experiments.registry import EXPERIMENTS
from ..runtime.cache import ENGINE_DIR, canonical
from ..runtime.errors import BadInput
from ..runtime.settings import meta

GRIDS_DIR = ENGINE_DIR.parent / "grids"   # the specs the dashboard lists ($ENGINE_GRIDS_DIR overrides)
SPEC_KEYS = ("name", "description", "grid")
BLOCK_KEYS = ("kind", "preset", "base", "axes", "exclude", "label")
MAX_SPEC_BYTES = 1 << 20  # a spec is a few hundred bytes; a file near this size is not one
MAX_DEPTH = 10            # tables and arrays within one another; the deepest a spec needs is 8
MAX_CELLS = 10_000        # cells of one spec: the product of each block's axis lengths, summed
MAX_RULES = 256           # exclude rules of one block (each is checked against every cell)


@dataclass(frozen=True)
class Cell:
    """One experiment of a grid: a config of a CLI kind, and the axis values that made it."""

    index: int                         # position in the grid (results are listed in this order)
    kind: str                          # experiment name (engine.experiments.registry): spectrum, ntk-sweep, …
    choices: tuple[tuple[str, Any], ...]  # (axis, value) of this cell, in axis order
    config: Any                        # the experiment's frozen config dataclass
    block: str = ""                    # its block's label, when the spec gives one

    @property
    def cache_kind(self) -> str:
        """The kind its result is stored under: the experiment's one name."""
        return self.kind

    @property
    def settings(self) -> str:
        """The axis values in words, e.g. ``data.dataset=mnist train.optimizer=sgd``."""
        return " ".join(f"{k}={_show(v)}" for k, v in self.choices) or "(base)"

    @property
    def label(self) -> str:
        return f"{self.kind}{f' [{self.block}]' if self.block else ''} {self.settings}"


@dataclass(frozen=True)
class Grid:
    name: str
    description: str
    path: str            # the spec file ("" when parsed from a dict)
    sha: str             # SHA-256 of the spec's text: a run started from the page checks it
    cells: tuple[Cell, ...]


def _show(v) -> str:
    return ",".join(str(e) for e in v) if isinstance(v, tuple) else str(v)


def _flat(table, where: str, prefix: str = "") -> dict:
    """A TOML table with nested tables (``data.dataset = ...`` unquoted) as dotted keys."""
    if not isinstance(table, dict):
        raise BadInput(f"{where} must be a table of settings, got {table!r}")
    out = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, where, name + "."))
        else:
            out[name] = v
    return out


def _owner(cls, dotted: str, where: str):
    """(dataclass that holds the setting, field name) of a dotted setting name of ``cls``."""
    head, _, rest = dotted.partition(".")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    known = sorted([n for n, f in fields.items() if "setting" in f.metadata]
                   + [f"{n}.*" for n, f in fields.items() if dataclasses.is_dataclass(f.default)])
    f = fields.get(head)
    if rest and f is not None and dataclasses.is_dataclass(f.default) and "." not in rest:
        owner, name = type(f.default), rest
    elif not rest and f is not None and "setting" in f.metadata:
        owner, name = cls, head
    else:
        raise BadInput(f"{where}: unknown setting {dotted!r} of {cls.__name__}; known: {', '.join(known)}")
    try:
        m = meta(owner, name)
    except KeyError:
        raise BadInput(f"{where}: unknown setting {dotted!r} of {cls.__name__}; known: "
                       f"{', '.join(known)}") from None
    if not m.cli:
        raise BadInput(f"{where}: {dotted!r} is set by the experiment itself and cannot be chosen")
    return owner, name


def _coerce(owner, name: str, value):
    """A TOML value as the setting holds it: lists as tuples, a scalar as a 1-tuple for tuple
    settings, integers as floats for float settings (1 and 1.0 must give one cache key)."""
    t = typing.get_type_hints(owner)[name]
    args = typing.get_args(t)
    if type(None) in args:  # X | None
        t = next(a for a in args if a is not type(None))
    as_float = lambda v: float(v) if isinstance(v, int) and not isinstance(v, bool) else v  # noqa: E731
    if typing.get_origin(t) is tuple:
        elem = typing.get_args(t)[0]
        items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        return tuple(as_float(v) for v in items) if elem is float else items
    if isinstance(value, list):
        return tuple(value)  # not a tuple setting: validation says so in its own words
    return as_float(value) if t is float else value


def _build(cls, base, values: dict):
    """``base`` with dotted settings replaced (nested configs rebuilt, so each validates)."""
    top, nested = {}, {}
    for k, v in values.items():
        head, _, rest = k.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = v
        else:
            top[k] = v
    for head, changes in nested.items():
        top[head] = dataclasses.replace(getattr(base, head), **changes)
    return dataclasses.replace(base, **top) if top else base


def _check_shape(doc) -> None:
    """Refuse, before anything is expanded, a document nested deeper than ``MAX_DEPTH`` (counted
    without recursion, so no depth can overflow Python's stack)."""
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadInput(f"tables or arrays nest more than {MAX_DEPTH} deep; a spec needs a few levels "
                           "(e.g. [[grid]] > axes > data.seed = [0, 1])")
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        stack.extend((e, depth + 1) for e in inner if isinstance(e, (dict, list)))


def _count_cells(axes: dict, w: str, room: int) -> int:
    """The cells a block's axes make (the product of their lengths, exclusions not counted),
    refused above ``room`` before any of them is formed."""
    lengths = [len(v) if isinstance(v, list) else 1 for v in axes.values()]
    count = math.prod(lengths)
    if count > room:
        limit = f"the {MAX_CELLS:,} a spec may hold" + (f" ({room:,} left after the blocks before)"
                                                         if room < MAX_CELLS else "")
        raise BadInput(f"{w}axes: {' x '.join(map(str, lengths))} = {count:,} cells, more than {limit}; "
                       "use fewer values or split the spec")
    return count


def _block_cells(block: dict, w: str) -> list[tuple[str, tuple, Any]]:
    """(kind, choices, config) of every cell of one block, in axis order."""
    if not isinstance(block.get("label", ""), str):
        raise BadInput(f"{w}label: must be text, got {block['label']!r}")
    unknown = sorted(set(block) - set(BLOCK_KEYS))
    if unknown:
        raise BadInput(f"{w}{unknown[0]}: unknown key; a block takes {', '.join(BLOCK_KEYS)}")
    kind = block.get("kind")
    if not isinstance(kind, str) or kind not in EXPERIMENTS:
        raise BadInput(f"{w}kind: unknown kind {kind!r}; allowed: {', '.join(EXPERIMENTS)}")
    exp = EXPERIMENTS[kind]
    preset = block.get("preset", "default")
    if not isinstance(preset, str) or preset not in exp.presets:
        raise BadInput(f"{w}preset: unknown preset {preset!r} of {kind}; allowed: "
                       f"{', '.join(sorted(exp.presets))}")
    cls, start = exp.config, exp.presets[preset]

    def values(table: dict, where: str, listed: bool) -> dict:
        out = {}
        for k, v in _flat(table, where).items():
            owner, name = _owner(cls, k, f"{where}.{k}")
            if listed:
                if not isinstance(v, list) or not v:
                    raise BadInput(f"{where}.{k}: an axis is a non-empty list of values, got {v!r}")
                out[k] = [_coerce(owner, name, e) for e in v]
            else:
                out[k] = _coerce(owner, name, v)
        return out

    base = values(block.get("base", {}), f"{w}base", False)
    try:
        start = _build(cls, start, base)
    except (BadInput, TypeError, ValueError) as exc:
        raise BadInput(f"{w}base: {exc}") from None
    axes = values(block.get("axes", {}), f"{w}axes", True)
    for k, vs in axes.items():  # each value alone first, so that an error names its axis
        for v in vs:
            try:
                _build(cls, start, {k: v})
            except (BadInput, TypeError, ValueError) as exc:
                raise BadInput(f"{w}axes.{k} = {_show(v)}: {exc}") from None
    rules = block.get("exclude", [])
    if isinstance(rules, dict):
        rules = [rules]
    if not isinstance(rules, list):
        raise BadInput(f"{w}exclude must be a list of rules ([[exclude]] tables), got {rules!r}")
    if len(rules) > MAX_RULES:
        raise BadInput(f"{w}exclude: {len(rules)} rules, more than the {MAX_RULES} a block may hold")
    excludes = []
    for j, rule in enumerate(rules):
        rule = _flat(rule, f"{w}exclude[{j}]")
        if not rule:
            raise BadInput(f"{w}exclude[{j}]: an empty rule would exclude every cell")
        one = {}
        for k, v in rule.items():
            if k not in axes:
                raise BadInput(f"{w}exclude[{j}].{k}: not an axis of this block; axes: {', '.join(axes) or 'none'}")
            owner, name = _owner(cls, k, f"{w}exclude[{j}].{k}")
            one[k] = [_coerce(owner, name, e) for e in (v if isinstance(v, list) else [v])]  # a list: any of
        excludes.append(one)
    cells = []
    for combo in itertools.product(*axes.values()):
        choices = tuple(zip(axes, combo, strict=True))
        if any(all(dict(choices)[k] in vs for k, vs in rule.items()) for rule in excludes):
            continue
        try:
            cfg = _build(cls, start, dict(choices))
        except (BadInput, TypeError, ValueError) as exc:
            raise BadInput(f"{w}cell {' '.join(f'{k}={_show(v)}' for k, v in choices)}: {exc}") from None
        cells.append((kind, choices, cfg))
    return cells


def parse_spec(doc: dict, name: str = "grid", path: str = "", sha: str = "") -> Grid:
    """A ``Grid`` from a parsed TOML document; raises ``BadInput`` (one line naming the key).
    Depth, types and the cell count (at most ``MAX_CELLS``) are checked before cells are formed."""
    if not isinstance(doc, dict):
        raise BadInput(f"a spec is a table of keys, got {type(doc).__name__}")
    _check_shape(doc)
    for k in ("name", "description"):
        if k in doc and not isinstance(doc[k], str):
            raise BadInput(f"{k}: must be text, got {doc[k]!r}")
    unknown = sorted(set(doc) - set(SPEC_KEYS) - set(BLOCK_KEYS))
    if unknown:
        raise BadInput(f"{unknown[0]}: unknown key; a spec takes {', '.join(SPEC_KEYS + BLOCK_KEYS)}")
    top = {k: doc[k] for k in BLOCK_KEYS if k in doc}
    if "grid" in doc:
        if top:
            raise BadInput(f"{sorted(top)[0]}: belongs inside a [[grid]] block when the spec has [[grid]] blocks")
        blocks = doc["grid"]
        if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
            raise BadInput("grid: must be a non-empty list of [[grid]] blocks")
        named = [(f"grid[{i}].", b) for i, b in enumerate(blocks)]
    else:
        named = [("", top)]
    cells, seen = [], set()
    counted = 0
    for w, block in named:  # every block's count, before any cell or value is formed
        counted += _count_cells(_flat(block.get("axes", {}), f"{w}axes"), w, MAX_CELLS - counted)
    for w, block in named:
        for kind, choices, cfg in _block_cells(block, w):
            ident = json.dumps([kind, canonical(cfg)], sort_keys=True, default=str)
            if ident not in seen:  # the same config twice (two blocks) is one cell
                seen.add(ident)
                cells.append(Cell(len(cells), kind, choices, cfg, block.get("label", "")))
    return Grid(str(doc.get("name", name)), str(doc.get("description", "")), path, sha, tuple(cells))


def load_spec(path: str | os.PathLike) -> Grid:
    """Read and check a grid spec file; raises ``BadInput`` with one line naming the bad key.
    Only a regular file of at most ``MAX_SPEC_BYTES`` is read (a FIFO is refused, not waited on)."""
    p = Path(path)
    text = read_regular(p, "grid spec", MAX_SPEC_BYTES)
    try:
        doc = tomllib.loads(text.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"grid spec {p}: not valid TOML ({' '.join(str(exc).split())})") from None
    except RecursionError:  # tomllib reads nested arrays and inline tables recursively
        raise BadInput(f"grid spec {p}: arrays or inline tables nest more than {MAX_DEPTH} deep") from None
    try:
        return parse_spec(doc, p.stem, str(p), hashlib.sha256(text).hexdigest())
    except BadInput as exc:
        raise BadInput(f"grid spec {p}: {' '.join(str(exc).split())}") from None


def grids_dir() -> Path:
    """Where the dashboard looks for specs: ``$ENGINE_GRIDS_DIR``, else the repository's ``grids/``."""
    return Path(os.environ.get("ENGINE_GRIDS_DIR") or GRIDS_DIR)


def spec_files(folder: str | os.PathLike | None = None) -> list[Path]:
    """The ``*.toml`` specs of a folder (default ``grids_dir()``), sorted by name."""
    return sorted(Path(folder or grids_dir()).glob("*.toml"))

