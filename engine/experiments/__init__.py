"""The experiments, one module each (config, presets, estimate, run), and the registry.

``EXPERIMENTS`` (``registry``) maps one name per experiment (the CLI command, cache kind,
preset key, grid ``kind``, ``figure`` kind and page URL) to its record. ``options`` declares
the settings several configs share, once; ``runs`` the scaffolding every run shares;
``calibration`` times each estimate against a real run.

Every ``run_*`` takes a config dataclass (its canonical form, with fingerprints of the data
and the engine's code, is the cache key and is stored with the result), returns a
``cache.Result`` of DataFrames and arrays, reports progress as ``progress(fraction, stage)``
and stops with ``Cancelled`` when ``cancel.is_set()``. ``estimate(cfg)`` beside each run
gives its time and memory from all parameters; a run over its ``Budget`` is refused before
it starts. The device is not part of the key: CPU and CUDA compute the same quantities.
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "registry": ["EXPERIMENTS", "Experiment", "estimate", "get", "of", "preset"],
    "spectrum": ["SpectrumConfig", "run_spectrum"],
    "sweep": ["SweepConfig", "run_ntk_sweep"],
    "kernels": ["KernelConfig", "run_kernels"],
    "influence": ["InfluenceConfig", "run_influence"],
    "malleability": ["MalleabilityConfig", "run_malleability"],
    "scaling": ["ScalingConfig", "run_scaling"],
    "dynamics": ["DynamicsConfig", "run_dynamics"],
    "coord_check": ["CoordCheckConfig", "run_coord_check"],
    "retrain": ["RetrainConfig", "run_retrain_loo"],
})
