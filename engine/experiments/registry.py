"""Every experiment as one value: ``EXPERIMENTS[name]`` holds its config, run, estimate, presets,
tables and main figure.

The name is the experiment's only name: the CLI command (``python -m engine NAME``), the cache
kind, the preset key, the grid spec's ``kind``, the ``figure`` kind and the dashboard page's URL
path where the page leads with it. The CLI, the grid, calibration, export, the dashboard's page
list (``ui.nav``), the package's public names (``engine.experiments``) and the tests all read this
mapping; none keeps its own table, so a new experiment is one more record here (its config,
presets and estimate in ``engine.experiments.configs``, its ``@experiment_run`` body in its run
module). ``register`` is how a record gets in (the records below, or a test's throw-away one).

The records hold the configs and estimates themselves but only the *path* of each run function
(``"sweep:run_ntk_sweep"``), imported on first use: reading the registry, and so
the command line's flags and ``--estimate``, costs no torch.

Old spellings (``figure ntk``, ``figure regime``) resolve through ``get`` for one release.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ..data import DataSpec
from ..maths.specs import AttackSpec, TrainSpec
from ..runtime import budget as B
from ..runtime.budget import Estimate
from ..runtime.errors import BadInput
from .configs import (
    alignment,
    coord_check,
    dynamics,
    influence,
    kernels,
    malleability,
    retrain,
    scaling,
    spectrum,
    sweep,
)

if TYPE_CHECKING:  # annotations only: the cache loads pandas
    import os

    import plotly.graph_objects as go
    from _typeshed import DataclassInstance

    from ..maths.heads import CancelFlag
    from ..runtime.cache import Cache, Result


class Run(Protocol):
    """What ``engine.experiments.runs.experiment_run`` makes of a run body: the signature every run
    shares, with ``kind`` (the experiment's name) and ``compute`` (the body) on it."""

    kind: str
    compute: Callable[..., Result]

    def __call__(self, cfg: DataclassInstance, cache: Cache | None = None, data_dir: str | os.PathLike | None = None,
                 device: str = "cpu", progress: Callable[[float, str], None] | None = None,
                 cancel: CancelFlag | None = None, budget: B.Budget | None = None) -> Result: ...


@dataclass(frozen=True)
class Experiment:
    """One kind of experiment. ``runner`` is its public run function (``engine.experiments.runs.experiment_run``),
    imported from ``run_path`` on first use."""

    name: str                       # CLI command, cache kind, preset key, grid kind, figure kind, page URL
    config: type                    # frozen config dataclass; its fields are the CLI flags and widgets
    run_path: str                   # "module:function" of its run_* in this package (imported on first use)
    estimate: Callable[[Any], Estimate]     # seconds on the reference CPU and peak bytes, from all fields
    presets: Mapping[str, object]   # "default" (the dataclass's own), "quick", "paper", ...
    help: str                       # one line: what it measures
    what: str                       # how a budget refusal names it ("this width sweep needs …")
    tables: tuple[str, ...]         # result frames the CLI prints; the first is the main table ("rows")
    probe: Callable[[], object]     # a small real config on synthetic data (calibration, tests): seconds
    figure: str | None = None       # "module:function" drawing the main chart from a Result
    figure_help: str = ""           # what the main chart shows, for `figure --help`
    page: str | None = None         # pages/<name>.py, the page that leads with it (its URL path is ``name``)
    page_title: str = ""            # the page's name in the sidebar's page list (needed with ``page``)
    page_icon: str = ""             # its icon there, e.g. ":material/bar_chart:"
    hint: str = ""                  # what to change when over budget (default: fewer widths, seeds, epochs)
    aliases: tuple[str, ...] = ()   # old spellings, accepted for one release
    nested: tuple[str, ...] = field(default=())  # nested config fields whose settings are flags too
    view: Callable[[Any], Any] | None = None  # the settings its page derives from the others (snapshots at each
    #                                           quarter of training, …): the page and ``figure`` apply it

    @property
    def runner(self) -> Run:
        """The run function (signature of every run; ``.compute`` is the body), imported now."""
        module, fn = self.run_path.split(":")
        runner = getattr(importlib.import_module(f"{__package__}.{module}"), fn)
        if runner.kind != self.name:
            raise RuntimeError(f"{self.run_path} is registered as {runner.kind!r}, not {self.name!r}")
        return runner

    def run(self, cfg: DataclassInstance, cache: Cache | None = None, data_dir: str | os.PathLike | None = None,
            device: str = "cpu", progress: Callable[[float, str], None] | None = None,
            cancel: CancelFlag | None = None, budget: B.Budget | None = None) -> Result:
        """Resolve the device, refuse work over ``budget`` before it starts, then read the cached
        result or compute it and store it (see ``engine.runtime.cache.cached_run``)."""
        from ..runtime.cache import cached_run
        from ..runtime.cores import for_run, look_ahead
        from ..runtime.device import resolve_device

        if type(cfg) is not self.config:  # MalleabilityConfig is an InfluenceConfig, but not that run's
            raise BadInput(f"experiment {self.name!r} takes a {self.config.__name__}, got {type(cfg).__name__}")
        look_ahead()  # the look at the load overlaps torch's import below
        dev = resolve_device(device)

        def compute() -> Result:
            B.check(self.estimate(cfg), budget, self.what, self.hint, device=dev)
            with for_run(dev.type) as threads:  # the cores free now, in this thread only
                result = self.runner.compute(cfg, data_dir, dev, progress, cancel)
            if threads is not None:
                result.meta.setdefault("threads", threads.as_dict())
            return result

        return cached_run(self.name, cfg, compute, cache, data_dir=data_dir)

    def main_figure(self, result: Result, metric: str | None = None) -> go.Figure:
        """The chart the page leads with, drawn from ``result`` (plotly imported only here)."""
        if self.figure is None:
            raise BadInput(f"experiment {self.name!r} has no main figure; those with one: "
                           f"{', '.join(n for n, e in EXPERIMENTS.items() if e.figure)}")
        module, fn = self.figure.split(":")
        return getattr(importlib.import_module(module), fn)(result, metric)


def _nested(cls: type) -> tuple[str, ...]:
    import dataclasses

    return tuple(f.name for f in dataclasses.fields(cls)
                 if dataclasses.is_dataclass(f.default) and f.name in NESTED)


NESTED = {"data": DataSpec, "train": TrainSpec, "attack": AttackSpec}  # flags of nested configs

# Probes: synthetic draws, a few seconds each on 2 cores, that exercise every stage of the run.
_SYN = dict(dataset="synthetic", n=300, n_test=100, synthetic_d=256, synthetic_kappa=100.0)


def _records() -> list[Experiment]:
    Sp, Sw, K, I, M, S, D, C = spectrum, sweep, kernels, influence, malleability, scaling, dynamics, coord_check
    syn = DataSpec(**_SYN)
    recs = [
        Experiment(name="spectrum", config=Sp.SpectrumConfig, run_path="spectrum:run_spectrum",
                   estimate=Sp.estimate_spectrum, presets=Sp.PRESETS["spectrum"],
                   help="Gram spectrum, condition numbers and width thresholds", what="this spectrum",
                   tables=("growth",),
                   probe=lambda: Sp.SpectrumConfig(data=DataSpec(dataset="synthetic", n=1500, n_test=1,
                                                                 synthetic_d=512), growth_ns=(200, 800)),
                   figure="engine.reporting.export:spectrum_figure",
                   figure_help="eigenvalues of G and of the attention features' Gram (Spectrum page)",
                   view=Sp.spectrum_view,
                   page="pages/spectrum.py", page_title="Spectrum",
                   page_icon=":material/bar_chart:"),
        Experiment(name="ntk-sweep", config=Sw.SweepConfig, run_path="sweep:run_ntk_sweep",
                   estimate=Sw.estimate_sweep, presets=Sw.PRESETS["ntk-sweep"],
                   help="kernel and function distances to K∞ across widths, per seed", what="this width sweep",
                   tables=("rows", "summary"),
                   probe=lambda: Sw.SweepConfig(data=syn, train=TrainSpec(epochs=30), widths=(64, 512, 2048),
                                                seeds=(0, 1)),
                   figure="engine.reporting.export:ntk_figure",
                   figure_help="kernel distance to K∞ against width (NTK convergence page)", view=Sw.sweep_view,
                   page="pages/ntk-sweep.py", page_title="NTK convergence",
                   page_icon=":material/show_chart:", aliases=("ntk",)),
        Experiment(name="kernels", config=K.KernelConfig, run_path="kernels:run_kernels",
                   estimate=K.estimate_kernels, presets=K.PRESETS["kernels"],
                   help="K_m at init and after training and K∞ of one net, as arrays", what="these kernels",
                   tables=(),
                   probe=lambda: K.KernelConfig(data=DataSpec(**{**_SYN, "n_test": 1}), train=TrainSpec(epochs=30))),
        Experiment(name="influence", config=I.InfluenceConfig, run_path="influence:run_influence",
                   estimate=I.estimate_influence, presets=I.PRESETS["influence"],
                   help="NTK leave-one-out influence of trained nets on one draw", what="this influence run",
                   tables=("summary", "aggregate"),
                   probe=lambda: I.InfluenceConfig(data=syn, train=TrainSpec(epochs=30), width=1024, seeds=(0,)),
                   page="pages/influence.py", page_title="Influence",
                   page_icon=":material/image_search:"),
        Experiment(name="malleability", config=M.MalleabilityConfig, run_path="malleability:run_malleability",
                   estimate=M.estimate_malleability, presets=M.PRESETS["malleability"],
                   help="influence flip rates under attacks on the training data", what="this malleability run",
                   tables=("rows", "summary", "verdict", "interventions", "interventions_summary"),
                   probe=lambda: M.MalleabilityConfig(data=syn, train=TrainSpec(epochs=30), widths=(1024,),
                                                      seeds=(0,), attacks=("fgsm", "pgd"), eps=(0.05, 0.3)),
                   figure="engine.reporting.export:malleability_figure",
                   figure_help="influence flip rates per attack at the largest ε (Malleability page)",
                   page="pages/malleability.py", page_title="Malleability",
                   page_icon=":material/bolt:"),
        Experiment(name="scaling", config=S.ScalingConfig, run_path="scaling:run_scaling",
                   estimate=S.estimate_scaling, presets=S.PRESETS["scaling"],
                   help="width needed to stay near K∞ against κ, with the fitted exponent", what="this scaling run",
                   tables=("widths", "fit", "curve"),
                   probe=lambda: S.ScalingConfig(train=TrainSpec(epochs=30, lr=1e-2), kappas=(2.0, 8.0),
                                                 max_width=1024, seeds=(0, 1)),
                   figure="engine.reporting.export:scaling_figure",
                   figure_help="width needed against κ with the fitted power law (Scaling law page)",
                   page="pages/scaling.py", page_title="Scaling law",
                   page_icon=":material/trending_up:", hint="use fewer κ values, seeds or a smaller max width"),
        Experiment(name="dynamics", config=D.DynamicsConfig, run_path="dynamics:run_dynamics",
                   estimate=D.estimate_dynamics, presets=D.PRESETS["dynamics"],
                   help="real against linearised training (kernel regime or not) across widths, per seed",
                   what="this comparison with the linearised nets", tables=("rows", "summary"),
                   probe=lambda: D.DynamicsConfig(data=syn, train=TrainSpec(epochs=30, optimizer="sgd", lr=1.0,
                                                                            weight_decay=0.0),
                                                  widths=(64, 512, 2048), seeds=(0,)),
                   figure="engine.reporting.export:dynamics_figure",
                   figure_help="distance to the linearised net against width, m^-1/2 reference (Kernel regime page)",
                   page="pages/dynamics.py", page_title="Kernel regime",
                   page_icon=":material/timeline:", aliases=("regime",)),
        Experiment(name="coord-check", config=C.CoordCheckConfig, run_path="coord_check:run_coord_check",
                   estimate=C.estimate_coord_check, presets=C.PRESETS["coord-check"],
                   help="μP's coordinate check: sizes of the first steps' changes against width",
                   what="this coordinate check", tables=("rows", "summary", "fit"),
                   probe=lambda: C.CoordCheckConfig(data=syn)),
        Experiment(name="retrain-loo", config=retrain.RetrainConfig, run_path="retrain:run_retrain_loo",
                   estimate=retrain.estimate_retrain, presets=retrain.PRESETS["retrain-loo"],
                   help="leave-one-out by retraining against the kernels' leave-one-out, per architecture and width",
                   what="this leave-one-out retraining", tables=("rows", "summary"),
                   probe=lambda: retrain.RetrainConfig(data=syn, train=replace(retrain.LAZY_SGD, epochs=5),
                                                       widths=(64, 256), seeds=(0,), k=3),
                   figure="engine.reporting.export:retrain_figure",
                   figure_help="1 − agreement of kernel and retrained influence against width, m^-1/2 reference "
                               "(Influence and Kernel regime pages)",
                   hint="use fewer widths, seeds or epochs, or a smaller k"),
        Experiment(name="alignment", config=alignment.AlignmentConfig, run_path="alignment:run_alignment",
                   estimate=alignment.estimate_alignment, presets=alignment.PRESETS["alignment"],
                   help="kernel–target alignment of K∞ and K_m, C(k) and learning curves against their theory",
                   what="this alignment run", tables=("summary", "verdict", "kinf"),
                   probe=lambda: alignment.AlignmentConfig(data=syn,
                                                           train=TrainSpec(epochs=20, snapshot_epochs=(0, 20)),
                                                           widths=(256, 1024), seeds=(0, 1), curve_ns=(25, 100)),
                   figure="engine.reporting.plots.alignment:alignment_figure",
                   figure_help="centred kernel–target alignment against width (Task alignment page)",
                   view=alignment.alignment_view,
                   page="pages/alignment.py", page_title="Task alignment",
                   page_icon=":material/target:", hint="use fewer widths, seeds, data draws or epochs, or a smaller n"),
    ]
    return recs


_EXPERIMENTS: dict[str, Experiment] = {}
_ALIASES: dict[str, str] = {}
_BY_CONFIG: dict[type, Experiment] = {}
EXPERIMENTS: Mapping[str, Experiment] = MappingProxyType(_EXPERIMENTS)  # read-only views; ``register`` writes
ALIASES: Mapping[str, str] = MappingProxyType(_ALIASES)
BY_CONFIG: Mapping[type, Experiment] = MappingProxyType(_BY_CONFIG)
REQUIRED_PRESETS = ("quick", "paper")  # the dashboard's defaults and the paper's settings, for every experiment


def register(exp: Experiment) -> Experiment:
    """Add ``exp`` to ``EXPERIMENTS`` (with its ``default`` preset, the config's own, and its nested
    config fields) and return the stored record. Refuses, with ``ValueError``, a name, alias or config
    class already taken, a missing ``quick`` or ``paper`` preset, and a page that is not
    ``pages/<name>.py`` with a title and an icon (Streamlit's first request finds a page by its
    file's stem: ``ui.nav.ensure_entry``)."""
    taken = [n for n in (exp.name, *exp.aliases) if n in _EXPERIMENTS or n in _ALIASES]
    if taken or exp.config in _BY_CONFIG:
        raise ValueError(f"experiment {exp.name!r}: {', '.join(taken) or exp.config.__name__} is registered already")
    missing = [p for p in REQUIRED_PRESETS if p not in exp.presets]
    if missing:
        raise ValueError(f"experiment {exp.name!r} needs the presets {', '.join(missing)} too")
    if exp.page is not None and (exp.page != f"pages/{exp.name}.py" or not exp.page_title or not exp.page_icon):
        raise ValueError(f"experiment {exp.name!r}: its page must be pages/{exp.name}.py with a page_title and "
                         f"a page_icon, got {exp.page!r}")
    presets = MappingProxyType({"default": exp.config(), **exp.presets})
    rec = replace(exp, presets=presets, nested=_nested(exp.config))
    _EXPERIMENTS[rec.name] = rec
    _ALIASES.update({a: rec.name for a in rec.aliases})
    _BY_CONFIG[rec.config] = rec
    return rec


def unregister(name: str) -> None:
    """Remove experiment ``name`` (a test's throw-away record) from ``EXPERIMENTS``."""
    rec = _EXPERIMENTS.pop(name)
    for a in rec.aliases:
        _ALIASES.pop(a, None)
    _BY_CONFIG.pop(rec.config, None)


for _rec in _records():
    register(_rec)


def get(name: str) -> Experiment:
    """The record of ``name`` (or of an old spelling); ``BadInput`` naming the allowed names otherwise."""
    if not isinstance(name, str):
        raise BadInput(f"an experiment is named by text, got {name!r}; allowed: {', '.join(EXPERIMENTS)}")
    key = ALIASES.get(name, name)
    if key not in EXPERIMENTS:
        raise BadInput(f"unknown experiment {name!r}; allowed: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[key]


def of(cfg: object) -> Experiment:
    """The record whose config class ``cfg`` is an instance of (exact class)."""
    rec = BY_CONFIG.get(type(cfg))
    if rec is None:
        raise BadInput(f"no experiment takes a {type(cfg).__name__}; known configs: "
                       f"{', '.join(c.__name__ for c in BY_CONFIG)}")
    return rec


def estimate(cfg: object) -> Estimate:
    """Estimated seconds (reference 2-core CPU) and peak bytes of running ``cfg``."""
    return of(cfg).estimate(cfg)


def preset(name: str, which: str = "quick") -> object:
    """A named preset of experiment ``name``; ``BadInput`` naming the allowed ones otherwise."""
    rec = get(name)
    if not isinstance(which, str) or which not in rec.presets:
        raise BadInput(f"unknown preset {which!r} of {rec.name}; allowed: {', '.join(sorted(rec.presets))}")
    return rec.presets[which]
