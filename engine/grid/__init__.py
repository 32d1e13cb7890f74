"""Grids of experiment cells: specs (TOML), backends (local processes or Ray) and the driver.

``spec`` parses a grid file into cells of the registry's experiments, ``backends`` runs them
(``local`` or ``ray``), and ``driver`` plans, runs, retries and collects them into the cache.
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "spec": ["Cell", "Grid", "load_spec", "parse_spec"],
    "backends": ["BACKENDS"],
    "driver": ["run_grid"],
})
