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
    "maths": "*",
    "data": "*",
    "runtime": "*",
    "runtime.cache": ["__version__=ENGINE_VERSION"],
    "experiments.registry": ["EXPERIMENTS", "Experiment", "estimate"],
    "experiments.runs": ["Prepared", "prepare", "tick"],
    "experiments.configs.spectrum": ["SpectrumConfig"],
    "experiments.configs.sweep": ["SweepConfig"],
    "experiments.configs.kernels": ["KernelConfig"],
    "experiments.configs.influence": ["INFLUENCE_KERNELS", "TRAINED", "InfluenceConfig"],
    "experiments.configs.malleability": ["MalleabilityConfig"],
    "experiments.configs.scaling": ["ScalingConfig"],
    "experiments.configs.dynamics": ["DynamicsConfig"],
    "experiments.configs.coord_check": ["CoordCheckConfig"],
    "experiments.configs.retrain": ["RetrainConfig"],
    "experiments.spectrum": ["run_spectrum"],
    "experiments.sweep": ["run_ntk_sweep"],
    "experiments.kernels": ["run_kernels"],
    "experiments.influence": ["run_influence"],
    "experiments.malleability": ["random_perturbation", "run_malleability"],
    "experiments.scaling": ["run_scaling", "theory_exponent"],
    "experiments.dynamics": ["run_dynamics"],
    "experiments.coord_check": ["run_coord_check"],
    "experiments.retrain": ["run_retrain_loo"],
    "reporting": "*",
})
