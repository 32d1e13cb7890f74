"""Engine of the influence-malleability dashboard: data, nets, NTKs, spectra, experiments.

Layers, each a package whose ``__init__`` lists its public names (dependencies point down):

- ``engine.maths``: nets, empirical NTK and K∞, ridge and kernel distances, spectra,
  influence, attacks, training, the linearised head and kernel flow, leave-one-out retraining;
- ``engine.data``: data sets (torchvision, folders, ``.npz``, synthetic) and the drawn sample;
- ``engine.runtime``: settings, errors, device, budget, the disk cache, background jobs;
- ``engine.experiments``: one module per experiment (config, presets, estimate, run) and
  ``EXPERIMENTS``, the registry every caller reads;
- ``engine.reporting``: the numbers pages show (``tables``, ``paper``), protocols, figures
  (``plots``) and export;
- ``engine.grid``: grid specs, local and Ray backends, the driver;
- on top: ``engine.cli`` (``python -m engine``), ``engine.bench``, ``engine.commands``,
  ``engine.doctor``.

Names are imported on first use (``engine._lazy``): ``import engine`` loads no torch, and
``engine.BadInput`` only the errors module. This package never imports streamlit.
"""

import os as _os

from ._lazy import attach

# torch's CPU allocator backs each allocation of 2 MiB or more with transparent huge pages
# when this is set (read at its first large allocation, so it holds wherever the engine is
# imported before one). On a VM a fresh 128 MB kernel then faults in 25 ms instead of 80-110
# with 4 KiB pages: a sixth of K∞ at n = 4000. THP_MEM_ALLOC_ENABLE=0 turns it off.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
# torch's OpenMP threads sleep while they wait instead of spinning against other work on a
# shared machine (read when torch loads; engine.runtime.cores says why and what it measured).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# glibc's allocator is left as it is: changing it is a process-wide choice, made by the entry points
# that run experiments (the CLI, app.py, grid workers; engine.runtime.memory.keep_freed_blocks).

__getattr__, __dir__, __all__ = attach(__name__, {
    "maths": "*",
    "data": "*",
    "runtime": "*",
    "runtime.cache": ["__version__=ENGINE_VERSION"],
    "experiments": "*",
    "reporting": "*",
})
