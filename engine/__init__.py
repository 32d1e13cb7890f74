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

from ._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "runtime.cache": ["__version__=ENGINE_VERSION", "ENGINE_VERSION", "Cache", "Result", "cached_run"],
    "runtime.device": ["resolve_device"],
    "runtime.errors": ["BadInput", "CacheCorrupt", "Cancelled", "DataCorrupt", "DataMissing", "EngineError"],
    "runtime.budget": ["Budget", "Estimate"],
    "runtime.settings": ["setting", "validate"],
    "data": ["DataSpec", "Sample", "available_datasets", "load_sample", "resolve_data_dir"],
    "experiments.registry": ["EXPERIMENTS", "Experiment", "estimate"],
    "experiments.runs": ["Prepared", "prepare", "tick"],
    "experiments.spectrum": ["SpectrumConfig", "run_spectrum"],
    "experiments.sweep": ["SweepConfig", "run_ntk_sweep"],
    "experiments.kernels": ["KernelConfig", "run_kernels"],
    "experiments.influence": ["INFLUENCE_KERNELS", "TRAINED", "InfluenceConfig", "run_influence"],
    "experiments.malleability": ["MalleabilityConfig", "random_perturbation", "run_malleability"],
    "experiments.scaling": ["ScalingConfig", "run_scaling", "theory_exponent"],
    "experiments.retrain": ["RetrainConfig", "run_retrain_loo"],
    "maths.models": ["ARCHS", "INITS", "Attention", "Net", "TwoLayerReLU", "attention_features", "features",
                     "parse_attention"],
    "maths.ntk": ["STORAGE", "NTKMethod", "empirical_ntk"],
    "maths.kinf": ["infinite_ntk"],
    "maths.ridge": ["kernel_regression", "prediction_gap", "relative_distance", "whitened_distance"],
    "maths.spectral": ["Spectrum", "eig_spectrum", "gram_spectrum", "width_thresholds_log10"],
    "maths.influence": ["DEFAULT_TARGET", "INFLUENCE_TARGETS", "aggregate", "influence_matrix", "loo_influence",
                        "net_influence", "top_indices"],
    "maths.attacks": ["AttackMethod", "AttackSpec", "attack"],
    "maths.training": ["TrainSpec", "sgd_lr_limit", "top_eigenvalue", "train"],
    "reporting.paper": ["flip_rule"],
    "reporting.gates": ["TRAIN_GATE", "passes_gate"],
    "reporting.tables": ["excess_interval", "flip_rate", "rank_correlation"],
    "reporting.report": ["readme_tables"],
})
