"""What every run stands on: settings, errors, the device, budgets, the disk cache and jobs.

``settings`` (one declaration per setting: default, bounds, unit, help), ``errors`` (the
one-line errors users see), ``device``, ``budget`` (time and memory estimates, the limits
a run is checked against), ``cache`` (results on disk, keyed by the config and the code) and
``jobs`` (background runs with progress and Cancel, for the dashboard).
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "settings": ["setting", "validate"],
    "errors": ["BadInput", "CacheCorrupt", "Cancelled", "DataCorrupt", "DataMissing", "EngineError"],
    "device": ["resolve_device"],
    "budget": ["Budget", "Estimate"],
    "cache": ["ENGINE_VERSION", "Cache", "Result", "cached_run"],
    "jobs": ["Job", "JobManager", "JobState"],
})
