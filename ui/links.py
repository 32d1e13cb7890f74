"""Where a protocol cell lives on the dashboard: its page and the URL query parameters (widget
key → the value as the widget shows it) that reproduce it there.

``engine.reporting.protocols`` decides which cells a claim is checked on; the widget keys are the pages'
business, so they are written here, once, beside the labels the NTK page's metric selectbox
shows. ``of(variant)`` gives the cell's ``Link``: its parameters, its relative URL, and
``unlinked``, the settings the page cannot take from its URL.

A link's page settings (``mall.eps``, ``ntk.lr``, ...) are checked like the sidebar's: a value
the page's widget drops, or the setting's declared limits refuse, gets the same one line
("This link's … = … is not allowed …, so the page uses … instead", ``page_problems``), and the
page then starts no run by itself (``link_refused``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import streamlit as st

from engine.data import DataSpec
from engine.data.spec import DATASETS
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.registry import preset
from engine.maths.specs import AttackSpec, TrainSpec
from engine.reporting.protocols import KERNEL_METRICS, Variant
from engine.runtime.settings import meta
from ui.common import ARCH_LABELS
from ui.text import verbatim

# What "distance to K∞" means on the NTK page: the choice changes the verdict, so it is visible.
# Its `ntk.metric` selectbox shows (and puts in the URL) these labels, the default first: what
# kernel regression with K_m predicts against K∞'s (the paper's claim is about that).
NTK_COLUMNS = {  # the NTK page's metric -> its columns at init and after training (engine.experiments.columns.SweepRow)
    "prediction_gap": ("prediction_gap_init", "prediction_gap_trained"),
    "kernel_dist_whitened": ("kernel_dist_whitened_init", "kernel_dist_whitened_trained"),
    "kernel_dist": ("kernel_dist_init", "kernel_dist_trained"),
}
NTK_METRIC_LABELS = {
    "prediction_gap": "kernel-regression prediction gap ‖f_KRR(K_m) − f_KRR(K∞)‖ / ‖f_KRR(K∞)‖",
    "kernel_dist_whitened": "whitened ‖(K∞+λI)^-½ (K_m − K∞) (K∞+λI)^-½‖₂ (what regression sees)",
    "kernel_dist": "relative Frobenius ‖K_m − K∞‖_F / ‖K∞‖_F (blind to κ: can rank the nets the other way)",
}


@dataclass(frozen=True)
class Link:
    """A cell on its page: ``params`` (widget key -> str or list[str]), ``unlinked`` (settings
    the page cannot take from its URL) and ``url``, e.g. ``malleability?mall.norm=l2``."""

    page: str
    params: dict
    unlinked: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.page}?{urlencode(self.params, doseq=True)}"


def of(variant: Variant) -> Link:
    """The ``Link`` of a protocol cell (``engine.reporting.protocols.flip_variants`` / ``kernel_variants``)."""
    if variant.claim == "flip":
        return Link(variant.page, *_mall_params(variant.config))
    return Link(variant.page, *_ntk_params(variant.config, variant.metric))


def _sidebar(data: DataSpec, archs, attention: str, seeds) -> tuple[dict, dict]:
    """Query parameters of app.py's sidebar for a data spec, and what they cannot express."""
    base, _, classes = data.dataset.partition(":")
    params = {"data": Path(base).name, "classes": classes or "all", "n": str(data.n),
              "n_test": str(data.n_test), "seed": str(data.seed), "archs": [ARCH_LABELS[a] for a in archs],
              "attention": attention}
    unlinked = {}
    if data != DataSpec(dataset=data.dataset, n=data.n, n_test=data.n_test, seed=data.seed):
        unlinked["data"] = "fields beyond data set, n, test points and seed"
    if tuple(seeds) != tuple(range(data.seed, data.seed + len(seeds))):  # pages count up from the seed
        unlinked["seeds"] = list(seeds)
    return params, unlinked


def _mall_params(cfg: MalleabilityConfig) -> tuple[dict, dict]:
    params, unlinked = _sidebar(cfg.data, cfg.archs, cfg.attention, cfg.seeds)
    params.update({"mall.attacks": [a.upper() for a in cfg.attacks], "mall.eps": [str(float(e)) for e in cfg.eps],
                   "mall.norm": cfg.attack.norm, "mall.space": cfg.space, "mall.target": cfg.target,
                   "mall.steps": str(cfg.attack.steps), "mall.epochs": str(cfg.train.epochs),
                   "mall.seeds": str(len(cfg.seeds)), "mall.widths": [str(w) for w in cfg.widths],
                   "mall.readings": list(cfg.readings), "mall.loss": cfg.train.loss, "mall.tau": str(cfg.tau),
                   "mall.perturb": cfg.perturb, "mall.optimizer": cfg.train.optimizer,
                   "mall.lr": str(cfg.train.lr), "mall.decay": str(cfg.train.weight_decay),
                   "mall.ridge": str(cfg.ridge), "mall.kernel": cfg.influence_kernel, "mall.init": cfg.init,
                   **{k: str(v).lower() for k, v in (("mall.retrain", cfg.retrain),
                   ("mall.adv", cfg.adversarial_training), ("mall.interventions", cfg.interventions))}})
    return params, unlinked


def _ntk_params(cfg: SweepConfig, metric: str) -> tuple[dict, dict]:
    params, unlinked = _sidebar(cfg.data, cfg.archs, cfg.attention, cfg.seeds)
    params.update({"widths": [str(w) for w in cfg.widths], "ntk.epochs": str(cfg.train.epochs),
                   "ntk.seeds": str(len(cfg.seeds)), "ntk.ridge": str(cfg.ridge),
                   "ntk.optimizer": cfg.train.optimizer, "ntk.lr": str(cfg.train.lr),
                   "ntk.metric": NTK_METRIC_LABELS[KERNEL_METRICS[metric][1]]})
    q = preset("ntk-sweep").train  # the NTK page has no weight-decay control: it uses the quick preset's
    if cfg.train.weight_decay != q.weight_decay:
        unlinked["train"] = f"weight decay {cfg.train.weight_decay:g}"
    return params, unlinked



# ---------------------------------------------------------------- a link's page settings

ASKED = "link.asked"        # session key: the URL's page parameters as this run found them (app.py)
REFUSED = "link.refused"    # session key: {widget key: (line, value shown then)} kept until changed
SLOT, SHOWN = "link.slot", "link.shown"  # session keys: the container above the page, drawn this run
_TRAIN = {k: (TrainSpec, f) for k, f in (("epochs", "epochs"), ("lr", "lr"), ("optimizer", "optimizer"),
                                           ("decay", "weight_decay"), ("loss", "loss"))}
SETTING_OF = {  # widget key -> the setting it sets (its declared limits name what is allowed)
    **{f"{page}.{k}": v for page in ("mall", "ntk") for k, v in _TRAIN.items()},
    "mall.steps": (AttackSpec, "steps"), "mall.norm": (AttackSpec, "norm"), "ntk.ridge": (SweepConfig, "ridge"),
    **{f"mall.{k}": (MalleabilityConfig, f) for k, f in (
        ("eps", "eps"), ("tau", "tau"), ("space", "space"), ("target", "target"), ("perturb", "perturb"),
        ("init", "init"), ("readings", "readings"), ("attacks", "attacks"), ("widths", "widths"),
        ("ridge", "ridge"), ("kernel", "influence_kernel"))},
}


def split_data_classes(names: list[str]) -> None:
    """A link's ``data=mnist:3-8`` (a two-class task named as the CLI's ``--dataset`` names it) as
    ``data=mnist`` and ``classes=3-8``, before the data set and Classes controls read the URL
    (app.py), where ``mnist`` is a data set the engine knows or one offered here (``names``).
    The Classes control then checks the pair as it checks a typed one; any other ``data`` is
    left as it is (``ui.sidebar.linked_data`` names it)."""
    wanted = st.query_params.get("data")
    if not wanted or ":" not in wanted or wanted in {Path(n).name for n in names}:
        return
    base, _, classes = wanted.partition(":")
    if classes.strip() and (base.strip().lower() in DATASETS or base in {Path(n).name for n in names}):
        st.query_params["data"] = base.strip().lower() if base.strip().lower() in DATASETS else base
        st.query_params["classes"] = st.session_state["classes"] = classes.strip()  # the widget is bound already


def remember_asked() -> None:
    """Before any widget is drawn (app.py): the page parameters (keys with a dot) of the URL."""
    st.session_state[ASKED] = {k: st.query_params.get_all(k) for k in st.query_params if "." in k}


def declared_refusal(key: str, text: str) -> str | None:
    """What the setting behind widget ``key`` allows, when ``text`` is outside it; else None."""
    if key not in SETTING_OF:
        return None
    m = meta(*SETTING_OF[key])
    if m.choices is not None:
        return None if text.lower() in {str(c).lower() for c in m.choices} else m.allowed()
    if m.lo is None and m.hi is None:
        return None
    try:
        v = float(text)
    except ValueError:
        return m.allowed()
    ok = (math.isfinite(v) and (m.lo is None or v > m.lo or (v == m.lo and not m.lo_open))
          and (m.hi is None or v <= m.hi))
    return None if ok else m.allowed()


def _taken(asked: str, now: list[str], value) -> bool:
    """Whether the widget took the link's ``asked``: still in the URL, or its value (a value
    equal to the default leaves the URL; a selectbox may show its option another way)."""
    if asked in now:
        return True
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if str(v).lower() == asked.lower():
            return True
        try:
            if float(v) == float(asked):
                return True
        except (TypeError, ValueError):
            pass
    return False


def _value(key: str) -> str:
    """What the page uses for ``key``, as a person reads it: ``0.3``, ``PGD, FGSM`` (a list without its brackets)."""
    now = st.query_params.get_all(key)
    if now:
        return ", ".join(now)
    value = st.session_state.get(key, "the default")
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) \
        if isinstance(value, (list, tuple)) else (f"{value:g}" if isinstance(value, float) else str(value))


def page_problems() -> list[str]:
    """One line per page parameter of the link that the page did not take as asked.

    Call after the page's widgets are drawn: a bound widget drops a value outside its bounds
    or options from the URL (``mall.eps=0.07``, ``ntk.lr=nan``), so what the URL asked (kept by
    ``remember_asked``) and what it now holds differ. The line names the value, what is
    allowed (the setting's declared limits where it refuses the value, else this page's
    choices) and what the page uses; it stays for the session until that widget changes."""
    refused = st.session_state.setdefault(REFUSED, {})
    for key, asked in st.session_state.get(ASKED, {}).items():
        now, value = st.query_params.get_all(key), st.session_state.get(key)
        bad = [v for v in asked if not _taken(v, now, value)]
        if not bad:
            continue
        allowed = next(filter(None, (declared_refusal(key, v) for v in bad)), None)
        why = f"is not allowed ({allowed})" if allowed else "is not among this page's choices"
        refused[key] = (f"This link's setting {verbatim(key)} = {verbatim(', '.join(bad or asked))} {why}, so the page uses "
                        f"{verbatim(_value(key))} instead.", _value(key))
    for key, (_, shown) in list(refused.items()):
        if _value(key) != shown:  # changed on the page since: the link's value is no longer the question
            refused.pop(key)
    return [line for line, _ in refused.values()]


def page_slot() -> None:
    """app.py, before the page: the place above it where ``show_page_problems`` writes."""
    st.session_state[SLOT] = st.container()
    st.session_state[SHOWN] = False


def show_page_problems() -> list[str]:
    """Write ``page_problems`` above the page, once per run (a page that stops after its run
    call draws nothing after it, so the run call shows them first); returns them."""
    lines = page_problems()
    if not st.session_state.get(SHOWN) and st.session_state.get(SLOT) is not None:
        st.session_state[SHOWN] = True
        with st.session_state[SLOT]:
            for line in lines:
                st.warning(line, icon=":material/link_off:")
    return lines


def link_refused() -> bool:
    """Whether this session's link asked for a value the page or the sidebar did not take: the
    page then shows its settings and waits for a click instead of starting a run by itself."""
    return bool(show_page_problems() or st.session_state.get("link.problems")
                or st.session_state.get("data.link_note"))
