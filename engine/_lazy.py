"""Public names of a package, imported on first use (the scientific-Python SPEC 1 pattern).

A package's ``__init__`` lists which of its modules defines each public name; the module is
imported the first time the name is read. So ``import engine`` (or ``engine.runtime``) costs
nothing, a name pulls in only its own module (``engine.BadInput`` loads no torch), and the
packages can name each other's modules without import cycles. ``attach_from`` does the same for a
table worked out from a registry or from the package's own modules when a name is read, so a
record or a module added later is exported without an edit here.
"""

from __future__ import annotations

import importlib
from typing import Callable


def attach(package: str, exports: dict[str, list[str] | str]) -> tuple[Callable, Callable, list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package`` from {module: [names]}.

    ``module`` is relative to ``package`` (``"runtime.cache"``); a name written ``"alias=name"``
    exports ``name`` of that module as ``alias``; ``"*"`` for a subpackage exports its ``__all__``. A submodule not in the table is still reached as
    an attribute (``engine.maths.ntk``), as after a plain import.
    """
    where = {}
    for module, names in exports.items():
        if names == "*":  # every public name of a subpackage (itself lazy, so this loads nothing)
            names = importlib.import_module(f"{package}.{module}").__all__
        for spec in names:
            alias, _, name = spec.partition("=")
            if alias in where:
                raise ValueError(f"{package}: {alias!r} is exported twice")
            where[alias] = (module, name or alias)

    def __getattr__(name: str):
        if name in where:
            module, source = where[name]
            value = getattr(importlib.import_module(f"{package}.{module}"), source)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        importlib.import_module(package).__dict__[name] = value   # resolved once
        return value

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__, sorted(where)


def attach_from(package: str, exports: Callable[[], dict[str, list[str]]]) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for ``package`` from ``exports()`` ({module: [names]}, as
    ``attach`` takes), called again whenever a name is not found yet: what a registry or the
    package's modules hold then is exported. ``__all__`` is not a variable of the package but
    read through ``__getattr__``, so it lists the names of that moment."""

    def __getattr__(name: str):
        get, _, names = attach(package, exports())
        return sorted(names) if name == "__all__" else get(name)

    def __dir__() -> list[str]:
        return attach(package, exports())[2]

    return __getattr__, __dir__


class LazyModule:
    """A stand-in for a module that imports it on the first attribute read (``pd.DataFrame``): a
    module of the run path names pandas with ``pd = LazyModule("pandas")`` (and the real import
    under ``TYPE_CHECKING`` for mypy), so a run's first rows do not wait for pandas' import (a quarter
    of a second on a 2-core CPU); the frames at its end import it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
