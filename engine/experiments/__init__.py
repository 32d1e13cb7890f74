"""The experiments, one run module each, their configs (``configs``: config, presets and estimate
per experiment, torch-free), and the registry.

``EXPERIMENTS`` (``registry``) maps one name per experiment (the CLI command, cache kind,
preset key, grid ``kind``, ``figure`` kind and page URL) to its record. ``options`` declares
the settings several configs share, once; ``runs`` the scaffolding every run shares;
``calibration`` times each estimate against a real run.

Every ``run_*`` takes a config dataclass (its canonical form, with fingerprints of the data
and the engine's code, is the cache key and is stored with the result), returns a
``cache.Result`` of DataFrames and arrays, reports progress as ``progress(fraction, stage)``
and stops with ``Cancelled`` when ``cancel.is_set()``. ``estimate(cfg)`` beside each config
(one import away from its run) gives its time and memory from all parameters; a run over its
``Budget`` is refused before it starts. The device is not part of the key: CPU and CUDA compute
the same quantities.
"""

import importlib

from .._lazy import attach_from

# Public names besides each experiment's config class and run function (which the registry gives).
_MORE = {
    "registry": ["EXPERIMENTS", "Experiment", "estimate", "get", "of", "preset"],
    "runs": ["Prepared", "prepare", "tick"],
    "configs.influence": ["INFLUENCE_KERNELS", "TRAINED"],
    "malleability": ["random_perturbation"],
    "scaling": ["theory_exponent"],
}


def _exports() -> dict[str, list[str]]:
    """{module: names}: ``_MORE`` and every registered experiment's config class (from its
    ``configs`` module) and run function (``run_path``), so a new record needs no line here."""
    registry = importlib.import_module(f"{__name__}.registry")  # not ``from . import``: that reads this package's names
    out = {module: list(names) for module, names in _MORE.items()}
    for exp in registry.EXPERIMENTS.values():
        run_module, run = exp.run_path.split(":")
        out.setdefault(exp.config.__module__.removeprefix(f"{__name__}."), []).append(exp.config.__name__)
        out.setdefault(run_module, []).append(run)
    return out


__getattr__, __dir__ = attach_from(__name__, _exports)
