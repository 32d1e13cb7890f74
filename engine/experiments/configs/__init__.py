"""Each experiment's config dataclass, presets and estimate, one module per experiment, without
torch: the registry, the command line's flags and ``--estimate`` read them; each run module of
``engine.experiments`` imports its own.
"""
