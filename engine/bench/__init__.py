"""Benchmarks that print ratios measured side by side in one run (never timed assertions).

``python -m engine bench``: ``suite.run`` measures the engine's cases (``cases``: the
closed-form eNTK against the GEMM rate and the torch.func recipe, batched training, a page
render), ``peer`` sets neural-tangents beside them, and ``scale`` the float64 kernel
algebra at n = 8000 against its floors. ``timing`` holds how every figure is paired, and
``suite``'s docstring lists every key of the result.
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "suite": ["PEERS", "SIZES", "run"],
    "cases": ["entk_flops"],
    "scale": ["run_scale", "storage_cost"],
    "peer": ["NT_PYTHON_ENV", "peer_neural_tangents"],
    "timing": ["TIMEOUT", "gemm_rate", "machine_info"],
})
