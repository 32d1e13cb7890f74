"""The maths: nets, kernels, spectra, influence, attacks and training, on tensors only.

``models`` (the nets and attention features), ``ntk`` (empirical NTK; ``counts`` and ``tiles``
beneath it), ``kinf`` (the infinite-width NTK), ``ridge`` (kernel ridge regression and kernel
distances), ``spectral``, ``influence`` (NTK leave-one-out), ``attacks``, ``training`` (with
``grads``: the head's weight gradient in closed form, and the training precisions; ``span``: plain SGD
in the features' span; ``heads``: what every trainer shares),
``flow`` (the linearised head and the closed-form K∞ gradient flow) and ``loo`` (leave-one-out
by retraining masked heads), and ``metrics`` (seed averages, flip rates, rank correlation, the
flip excess with its interval, slopes: the numbers every experiment and page reads) and ``gates``
(when a trained net's numbers can be read). No function here knows about configs, caches or pages. ``specs``
holds the settings and names the configs need, without torch.
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "specs": ["ARCHS", "INITS", "STORAGE", "DEFAULT_TARGET", "INFLUENCE_TARGETS", "Attention", "AttackMethod",
              "AttackSpec", "TrainSpec", "parse_attention"],
    "models": ["Net", "TwoLayerReLU", "attention_features", "features"],
    "ntk": ["NTKMethod", "empirical_ntk", "empirical_ntk_at", "empirical_ntk_features"],
    "counts": ["count_dtype", "count_path_report", "exact_counts"],
    "kinf": ["infinite_ntk"],
    "ridge": ["kernel_regression", "prediction_gap", "relative_distance", "whitened_distance"],
    "spectral": ["Spectrum", "eig_spectrum", "gram_spectrum", "width_thresholds_log10"],
    "influence": ["aggregate", "influence_matrix", "loo_influence", "net_influence", "top_indices"],
    "attacks": ["attack"],
    "training": ["sgd_lr_limit", "top_eigenvalue", "train", "train_many"],
    "grads": ["StackedHead"],
    "flow": ["KernelFlow", "lin_gap", "linearised_head", "train_pair"],
    "loo": ["flow_loo", "kernel_loo", "train_masked"],
    "gates": ["TRAIN_GATE", "passes_gate"],
    "metrics": ["Excess", "excess_interval", "flip_rate", "loglog_slope", "rank_correlation", "sign_flipped",
                "summarize"],
})
