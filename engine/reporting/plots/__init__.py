"""Plotly figures of experiment results; no streamlit here, so scripts can use them too.

Each chart comes as a pair: ``*_data(...)`` returns the exact table the chart shows (the
dashboard offers it as CSV) and ``*_fig(data)`` draws it. Figures carry axis titles with
units and hover values. Heatmaps never ship more than ``MAX_SIDE`` x ``MAX_SIDE`` cells:
larger matrices are block-averaged (``block_average``) and sent as float32 arrays, which
plotly encodes as binary, not as lists.

One module per family of charts (``kernels``, ``influence``, ``nulls``, ``readings``, ``scaling``, ``regime``,
``retrain``, ``alignment``, ...) over the shared labels and layout of ``style``. Each module lists its
public names in its ``__all__``, and every one is re-exported here, read from the modules when a name
is first asked for: callers write ``plots.spectrum_fig``, and a new chart module needs no line here.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..._lazy import attach_from


def _exports() -> dict[str, list[str]]:
    """{module: its ``__all__``} for every module of this package; one without ``__all__`` is refused."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        names = getattr(importlib.import_module(f"{__name__}.{info.name}"), "__all__", None)
        if names is None:
            raise ImportError(f"{__name__}.{info.name} declares no __all__: list its public names there")
        out[info.name] = list(names)
    return out


__getattr__, __dir__ = attach_from(__name__, _exports)
