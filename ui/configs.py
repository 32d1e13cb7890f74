"""Page settings -> engine configs, built from the engine's own presets and estimates.

The dashboard's defaults are the ``quick`` presets of the engine's config dataclasses, its
widgets take their bounds and help text from the dataclass fields (``engine.runtime.settings``),
and whether a run starts by itself comes from the engine's ``estimate``; nothing here is a
second copy of a default, a bound or a cost formula. The same settings give the same cache
key on every page, so a result computed on one page is reused by the others.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, TypeVar

import streamlit as st

from engine.experiments.configs.influence import InfluenceConfig
from engine.experiments.configs.kernels import KernelConfig
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.spectrum import SpectrumConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.registry import EXPERIMENTS, estimate, of
from engine.maths.specs import SGD_LINEAR_NOTE, SUGGESTED_LR, TrainSpec
from engine.runtime import budget
from engine.runtime.device import device_type, resolve_device
from engine.runtime.errors import EngineError
from engine.runtime.settings import default, meta
from ui.common import Shared, plain

T = TypeVar("T")

QUICK = {name: exp.presets["quick"] for name, exp in EXPERIMENTS.items()}  # the dashboard's defaults
PAPER_WIDTHS = EXPERIMENTS["ntk-sweep"].presets["paper"].widths
BOUND = dict(bind="query-params", persist_state="session")


def page_url(page: str, fallback: str | None = None) -> str:
    """The URL path of ``page`` (``pages/ntk-sweep.py``): the name of the experiment it leads with
    (``engine.experiments.registry``), or ``fallback`` for pages that lead with none (Grid, Reproduction)."""
    for name, exp in EXPERIMENTS.items():
        if exp.page == page:
            return name
    if fallback is None:
        raise KeyError(f"{page} leads with no experiment; give its URL path")
    return fallback


def float_input(container, label: str, cls, name: str, key: str, value: float):
    """A float input shown with %g (1e-3 stays readable); bounds and help from the setting ``cls.name``."""
    m = meta(cls, name)
    lo = None if m.lo is None else (1e-6 if m.lo_open and m.lo == 0 else float(m.lo))
    return container.number_input(label, min_value=lo, max_value=None if m.hi is None else float(m.hi),
                                  value=float(value), format="%g", key=key, help=help_of(cls, name), **BOUND)


def optimizer_ui(container, key: str, lr_key: str) -> str:
    """The optimiser select of a page; picking one sets the page's learning rate (``lr_key``) to
    that optimiser's ``SUGGESTED_LR``, which stays editable."""
    def follow():
        st.session_state[lr_key] = SUGGESTED_LR[st.session_state[key]]

    picked = container.selectbox("Optimiser", choices_of(TrainSpec, "optimizer"), key=key, on_change=follow,
                                 help=help_of(TrainSpec, "optimizer") + ". Picking one sets the learning rate to "
                                 "one it trains with here (" + ", ".join(f"{o} {v:g}" for o, v in SUGGESTED_LR.items())
                                 + f"); {SGD_LINEAR_NOTE}", **BOUND)
    from ui.common import shared  # the sidebar's attention (ui.common imports this module's neighbours)

    if picked == "sgd" and shared().attention.split(":")[0] == "linear":
        container.caption(SGD_LINEAR_NOTE[0].upper() + SGD_LINEAR_NOTE[1:] + ".")
    return picked


def number(container, label: str, cls, name: str, key: str, value=None, step=None, hi=None):
    """A number input whose bounds and help come from the setting ``cls.name``; bound to the URL.

    ``hi`` lowers the declared upper bound for the browser (e.g. epochs a talk can wait for)."""
    m = meta(cls, name)
    value = default(cls, name) if value is None else value
    is_int = isinstance(value, int)
    cast = int if is_int else float
    lo = None if m.lo is None else cast(m.lo)
    top = m.hi if hi is None else min(hi, m.hi if m.hi is not None else hi)
    unit = f" ({m.unit})" if m.unit else ""
    return container.number_input(label, min_value=lo, max_value=None if top is None else cast(top),
                                  value=value, step=step, key=key, help=m.help[0].upper() + m.help[1:] + unit,
                                  **BOUND)


def help_of(cls, name: str) -> str:
    m = meta(cls, name)
    return m.help[0].upper() + m.help[1:] + (f" ({m.unit})" if m.unit else "")


def choices_of(cls, name: str) -> tuple:
    return meta(cls, name).choices


@dataclass(frozen=True)
class Plan:
    seconds: float
    gib: float
    auto: bool     # starts without a click
    allowed: bool  # may start at all from the dashboard
    note: str      # one line for the user


def _memory_limit(device: str) -> int:
    """80 % of the free memory where runs with this device setting go (GPU memory on CUDA)."""
    try:
        where = resolve_device(device)
    except EngineError:  # cuda asked for without a GPU: the run itself says so in one line
        where = None
    return budget.Budget().limit_bytes(where)


def speed(device: str = "cpu") -> float:
    """This machine's speed factor now on the device runs go to (``engine.runtime.speed.speed_factor``)."""
    from engine.runtime.speed import speed_factor

    try:
        kind = device_type(device)
    except EngineError:
        kind = "cpu"
    return speed_factor(kind)


def plan(cfg, device: str = "cpu") -> Plan:
    """Whether a config runs at once, on a click, or not from the browser, from the engine's
    estimate times this machine's speed now (``speed``), with memory counted on the device
    the runs go to (the sidebar's ``device``). ``Plan.seconds`` is the scaled time."""
    est = estimate(cfg)
    seconds = est.seconds * speed(device)
    limit = _memory_limit(device)
    fits = est.bytes <= limit
    allowed = fits and seconds <= budget.DASHBOARD_SECONDS
    auto = allowed and seconds <= budget.QUICK_SECONDS
    if not fits:
        note = (f"These settings need about {est.bytes / budget.GIB:.1f} GiB, more than the "
                f"{limit / budget.GIB:.1f} GiB that fit here; use a smaller n or width.")
        command = of(cfg).name
        if getattr(cfg, "storage", None) == "float64":
            small = estimate(replace(cfg, storage="float32")).bytes
            if small <= limit:
                note += (f" With kernels stored in float32 (`python -m engine {command} --storage float32`) "
                         f"they would need {small / budget.GIB:.1f} GiB; see the README on its accuracy cost.")
    elif not allowed:
        note = (f"These settings would take about {budget.duration(seconds)} here now, over the dashboard's limit of "
                f"{budget.duration(budget.DASHBOARD_SECONDS)}; run them with `python -m engine` instead.")
    else:
        note = (f"These settings take about {budget.duration(seconds)} at this machine's speed now; they run in "
                "the background once started.")
    return Plan(seconds, est.bytes / budget.GIB, auto, allowed, note)


def dashboard_budget() -> budget.Budget:
    return budget.Budget(seconds=budget.DASHBOARD_SECONDS * 1.5)


def _view(name: str, cfg: T) -> T:
    """``cfg`` with the settings the page derives from the others (``Experiment.view``), as
    ``python -m engine figure`` applies them: the chart it writes is the page's."""
    view = EXPERIMENTS[name].view
    return cfg if view is None else view(cfg)


def spectrum_config(s: Shared, rtol: float | None = None, eps: float | None = None) -> SpectrumConfig:
    q = QUICK["spectrum"]
    return _view("spectrum", replace(q, data=s.data(), attention=s.attention, rtol=rtol,
                                     eps=q.eps if eps is None else float(eps)))


def sweep_config(s: Shared, epochs: int | None = None, n_seeds: int = 3, ridge: float | None = None,
                 widths: tuple[int, ...] | None = None, optimizer: str | None = None,
                 lr: float | None = None) -> SweepConfig:
    q = QUICK["ntk-sweep"]
    epochs = q.train.epochs if epochs is None else int(epochs)
    seeds = tuple(int(s.seed) + i for i in range(int(n_seeds)))
    train = replace(q.train, epochs=epochs, snapshot_epochs=(), optimizer=optimizer or q.train.optimizer,
                    lr=q.train.lr if lr is None else float(lr))
    return _view("ntk-sweep", replace(q, data=s.data(), widths=tuple(sorted(widths or s.widths)), archs=tuple(s.archs),
                                      attention=s.attention, seeds=seeds, train=train,
                                      ridge=q.ridge if ridge is None else ridge))


def kernel_config(s: Shared, arch: str, width: int, epochs: int | None = None) -> KernelConfig:
    q = QUICK["kernels"]
    return replace(q, data=s.data(), arch=arch, width=int(width), attention=s.attention, seed=int(s.seed),
                   train=replace(q.train, epochs=q.train.epochs if epochs is None else int(epochs)))


def influence_config(s: Shared, width: int | None = None, epochs: int | None = None,
                     ridge: float | None = None, target: str | None = None,
                     readings: tuple[str, ...] | None = None, read_points: int | None = None) -> InfluenceConfig:
    q = QUICK["influence"]
    return replace(q, data=s.data(), archs=tuple(s.archs), width=int(width or q.width), attention=s.attention,
                   seeds=(int(s.seed),), train=replace(q.train, epochs=q.train.epochs if epochs is None else int(epochs)),
                   ridge=q.ridge if ridge is None else ridge, target=target or q.target,
                   readings=q.readings if readings is None else tuple(readings),
                   read_points=q.read_points if read_points is None else int(read_points))


def malleability_config(s: Shared, *, epochs: int | None = None, steps: int | None = None, norm: str | None = None,
                        n_seeds: int | None = None, optimizer: str | None = None, lr: float | None = None,
                        weight_decay: float | None = None, loss: str | None = None,
                        **options) -> MalleabilityConfig:
    """The quick preset with the sidebar's data, the training settings given (all at once: the
    config checks them together, e.g. the flow reading needs SGD on MSE) and any
    MalleabilityConfig field in ``options``. Raises what the config raises (``BadInput``)."""
    q = QUICK["malleability"]
    seeds = q.seeds if n_seeds is None else tuple(int(s.seed) + i for i in range(int(n_seeds)))
    train = replace(q.train, epochs=q.train.epochs if epochs is None else int(epochs),
                    optimizer=optimizer or q.train.optimizer, lr=q.train.lr if lr is None else float(lr),
                    weight_decay=q.train.weight_decay if weight_decay is None else float(weight_decay),
                    loss=loss or q.train.loss)
    attack = replace(q.attack, steps=q.attack.steps if steps is None else int(steps), norm=norm or q.attack.norm)
    if "eps" in options:
        options["eps"] = tuple(float(e) for e in options["eps"])
    return replace(q, data=s.data(), archs=tuple(s.archs), attention=s.attention, seeds=seeds, train=train,
                   attack=attack, **options)


def or_stop(make: Callable[..., T], *args, **kwargs) -> T:
    """``make(*args, **kwargs)``, a page's config from its controls and its link; or, where the
    config refuses the combination (the flow reading with Adam, from ``?mall.readings=flow`` or a
    click), the page stopped under its controls with the refusal in one line, never a traceback."""
    try:
        return make(*args, **kwargs)
    except EngineError as exc:
        st.error(plain(exc))
        st.stop()
        raise  # st.stop() raises; this line is never reached


def network_config(s: Shared) -> MalleabilityConfig:
    """The ``network`` preset (every influence reading, three widths, the lazy protocol) on the
    sidebar's data and architectures; its attention stays the preset's centred one, which trains."""
    return replace(EXPERIMENTS["malleability"].presets["network"], data=s.data(), archs=tuple(s.archs))


def alignment_config(s: Shared, epochs: int | None = None, draws: int | None = None):
    """The alignment quick preset on the sidebar's data, architectures and attention: learning-curve
    sizes following the sidebar's n (``AlignmentConfig.curve_sizes``), snapshots at each quarter of training,
    ``draws`` data draws from its seed."""
    q = QUICK["alignment"]
    epochs = q.train.epochs if epochs is None else int(epochs)
    draws = len(q.data_seeds) if draws is None else int(draws)
    return _view("alignment", replace(q, data=s.data(), archs=tuple(s.archs), attention=s.attention,
                                      train=replace(q.train, epochs=epochs, snapshot_epochs=()),
                                      data_seeds=tuple(int(s.seed) + i for i in range(draws))))


def scaling_config(**options):
    """The quick scaling preset with any ScalingConfig field replaced (train fields: epochs, lr)."""
    q = QUICK["scaling"]
    epochs, lr = options.pop("epochs", None), options.pop("lr", None)
    train = replace(q.train, epochs=q.train.epochs if epochs is None else int(epochs),
                    lr=q.train.lr if lr is None else float(lr))
    for k in ("kappas", "archs", "attentions"):
        if k in options:
            options[k] = tuple(options[k])
    return replace(q, train=train, **options)
