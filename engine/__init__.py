"""Engine of the influence-malleability dashboard: data, nets, NTKs, spectra, experiments.

The public names are re-exported here; the implementation lives in one module per topic.
``EXPERIMENTS`` (``engine.registry``) holds every experiment as one record: config, run,
estimate, presets, tables and main figure, under the one name the CLI, grid and pages use.
This package never imports streamlit.
"""

from .cache import ENGINE_VERSION, Cache, Result, cached_run
from .data import DataSpec, Sample, available_datasets, load_sample, resolve_data_dir
from .device import resolve_device
from .errors import BadInput, CacheCorrupt, Cancelled, DataCorrupt, DataMissing, EngineError
from .budget import Budget, Estimate
from .registry import EXPERIMENTS, Experiment, estimate
from .experiments import (KernelConfig, SpectrumConfig, SweepConfig, run_kernels, run_ntk_sweep,
                          run_spectrum)
from .attacks import AttackMethod, AttackSpec, attack
from .influence import (DEFAULT_TARGET, INFLUENCE_TARGETS, aggregate, influence_matrix, loo_influence,
                        net_influence, top_indices)
from .malleability import (INFLUENCE_KERNELS, TRAINED, InfluenceConfig, MalleabilityConfig, random_perturbation,
                           run_influence, run_malleability)
from .paper import TRAIN_GATE, flip_rule, passes_gate, readme_tables
from .retrain import RetrainConfig, run_retrain_loo
from .tables import excess_interval, flip_rate, rank_correlation
from .runs import Prepared, prepare, tick
from .settings import setting, validate
from .models import ARCHS, INITS, Attention, Net, TwoLayerReLU, attention_features, features, parse_attention
from .ntk import (STORAGE, NTKMethod, empirical_ntk, infinite_ntk, kernel_regression, prediction_gap,
                  relative_distance, whitened_distance)
from .scaling import ScalingConfig, run_scaling, theory_exponent
from .spectral import Spectrum, eig_spectrum, gram_spectrum, width_thresholds_log10
from .training import TrainSpec, sgd_lr_limit, top_eigenvalue, train

__version__ = ENGINE_VERSION

__all__ = [
    "__version__", "EXPERIMENTS", "Experiment", "aggregate", "DEFAULT_TARGET", "INFLUENCE_TARGETS", "Budget", "Estimate", "estimate", "prediction_gap", "Prepared", "prepare",
    "setting", "tick", "validate", "whitened_distance", "ARCHS", "attack", "AttackMethod", "AttackSpec", "Attention",
    "attention_features", "available_datasets", "BadInput", "Cache", "CacheCorrupt", "cached_run",
    "Cancelled", "DataCorrupt", "DataMissing", "DataSpec", "eig_spectrum", "empirical_ntk",
    "ENGINE_VERSION", "EngineError", "features", "gram_spectrum", "infinite_ntk",
    "influence_matrix", "InfluenceConfig", "kernel_regression", "KernelConfig", "load_sample",
    "loo_influence", "MalleabilityConfig", "Net", "net_influence", "NTKMethod", "parse_attention",
    "relative_distance", "resolve_data_dir", "resolve_device", "Result", "run_influence",
    "run_kernels", "run_malleability", "run_ntk_sweep", "run_scaling", "run_spectrum", "Sample",
    "ScalingConfig", "Spectrum", "SpectrumConfig", "STORAGE", "SweepConfig", "theory_exponent", "top_indices",
    "train", "TrainSpec", "TwoLayerReLU", "width_thresholds_log10",
    # the nulls, the kernels and the nets that train (issue 21), retraining (issue 22)
    "excess_interval", "flip_rate", "flip_rule", "INFLUENCE_KERNELS", "INITS", "passes_gate",
    "random_perturbation", "rank_correlation", "readme_tables", "RetrainConfig", "run_retrain_loo",
    "sgd_lr_limit", "top_eigenvalue", "TRAIN_GATE", "TRAINED",
]
