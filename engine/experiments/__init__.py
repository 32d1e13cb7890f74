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

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "registry": ["EXPERIMENTS", "Experiment", "estimate", "get", "of", "preset"],
    "runs": ["Prepared", "prepare", "tick"],
    "configs.spectrum": ["SpectrumConfig"],
    "configs.sweep": ["SweepConfig"],
    "configs.kernels": ["KernelConfig"],
    "configs.influence": ["INFLUENCE_KERNELS", "InfluenceConfig", "TRAINED"],
    "configs.malleability": ["MalleabilityConfig"],
    "configs.scaling": ["ScalingConfig"],
    "configs.dynamics": ["DynamicsConfig"],
    "configs.coord_check": ["CoordCheckConfig"],
    "configs.retrain": ["RetrainConfig"],
    "configs.alignment": ["AlignmentConfig"],
    "spectrum": ["run_spectrum"],
    "sweep": ["run_ntk_sweep"],
    "kernels": ["run_kernels"],
    "influence": ["run_influence"],
    "malleability": ["random_perturbation", "run_malleability"],
    "scaling": ["run_scaling", "theory_exponent"],
    "dynamics": ["run_dynamics"],
    "coord_check": ["run_coord_check"],
    "retrain": ["run_retrain_loo"],
    "alignment": ["run_alignment"],
})
