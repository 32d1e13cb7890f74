"""Settings shared by every page, and the server-wide cache and job manager.

``app.py`` draws the sidebar and stores its plain values as a ``Shared`` in
``st.session_state["shared"]``; pages read them with ``shared()``. The engine's disk cache
and the job manager are held once per server process with ``st.cache_resource``. What the
sidebar checks before it stores them (data sets here or missing, uploads, a link's values) is
``ui.sidebar``; the page list and the entry's routing are ``ui.nav``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st

from engine.data import DataSpec, available_datasets, resolve_data_dir
from engine.maths.specs import VARIANTS
from engine.runtime.cache import DEFAULT_CACHE_DIR, Cache
from engine.runtime.device import resolve_device
from engine.runtime.errors import EngineError
from engine.runtime.jobs import JobManager
from ui.nav import ensure_entry

WIDTH_CHOICES = (4, 16, 64, 256, 1024, 4096, 16384)
ARCH_CHOICES = ("relu", "attn")
ARCH_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}
ATTENTION_CHOICES = tuple(v.example for v in VARIANTS.values())  # one example of each attention variant
DEVICE_CHOICES = ("auto", "cpu", "cuda")
PAIR_EXAMPLES = {"mnist": "3-8", "fashion-mnist": "0-6", "cifar10": "automobile-airplane",
                 "synthetic": "0-1"}


@dataclass(frozen=True)
class Shared:
    """The sidebar's values (plain Python); defaults are the dashboard's quick settings."""

    base: str = "synthetic"          # data set name
    classes: str = "all"             # "all" or "a-b"
    n: int = 200                     # training points
    n_test: int = 100                # test points
    seed: int = 0                    # data draw seed; network seeds start here too
    widths: tuple[int, ...] = (16, 64, 256, 1024)
    archs: tuple[str, ...] = ARCH_CHOICES
    attention: str = "linear"
    device: str = "auto"

    @property
    def dataset(self) -> str:
        """The engine's data set string, e.g. ``mnist`` or ``mnist:3-8``."""
        c = self.classes.strip().lower()
        return self.base if c in ("", "all") else f"{self.base}:{self.classes.strip()}"

    def data(self, **changes) -> DataSpec:
        spec = DataSpec(dataset=self.dataset, n=int(self.n), n_test=int(self.n_test), seed=int(self.seed))
        return replace(spec, **changes) if changes else spec

    @property
    def uploaded(self) -> bool:
        """Whether the data set is a user's .npz file (a path), not a named data set."""
        return self.base.lower().endswith(".npz")

    @property
    def label(self) -> str:
        """The data set as the sidebar lists it: ``mnist:3-8``, or an upload's stored file name
        (``mine-0123456789abcdef.npz``, no folder)."""
        return Path(self.base).name if self.uploaded else self.dataset

    def describe(self) -> str:
        return f"{self.label}, n = {self.n}, {self.n_test} test points, seed {self.seed}"


def display_name(path: str) -> str:
    """An uploaded file's name as the user gave it: ``…/mine-0123456789abcdef.npz`` → ``mine.npz``."""
    return re.sub(r"-[0-9a-f]{16}(\.npz)$", r"\1", Path(str(path)).name)


_MARKDOWN = re.compile(r"([\\`*_\[\]<>#!|~$&@])|(?<=www)\.|:(?=//)", re.IGNORECASE)


def plain(text) -> str:
    """``text`` as typed in Streamlit's Markdown, on one line: no link, image, HTML, emphasis, code,
    table, formula or :color[…]. It does not stop autolinks (the autolinker reads the text after the
    escapes are removed, so ``www.`` or ``http://`` still becomes a link): a value from a URL, a file
    name or an upload is shown with ``ui.text.verbatim`` (inline code) instead; this is for the
    engine's own words and a spec's labels."""
    return _MARKDOWN.sub(lambda m: "\\" + m.group(0), " ".join(str(text).splitlines()))


def shared() -> Shared:
    """The current sidebar values (defaults when a page runs without app.py, as in unit tests)."""
    ensure_entry()
    value = st.session_state.get("shared")
    return value if isinstance(value, Shared) else Shared(base=default_dataset())


@st.cache_data(ttl=30, show_spinner=False)
def dataset_infos(data_dir: str) -> list[dict]:
    """Which data sets can be read here; re-checked every 30 s."""
    return [dict(vars(i)) for i in available_datasets(data_dir or None)]


def data_dir() -> str:
    return str(resolve_data_dir(None))


PREFERRED = ("mnist", "fashion-mnist", "cifar10", "synthetic")  # the default is the first one here (the paper's)


def available_names() -> list[str]:
    """Available data sets in preference order: mnist, fashion-mnist, cifar10, synthetic."""
    order = list(PREFERRED)
    names = [i["name"] for i in dataset_infos(data_dir()) if i["available"]]
    return sorted(names, key=lambda s: order.index(s) if s in order else len(order)) or ["synthetic"]


def default_dataset() -> str:
    return available_names()[0]


@st.cache_resource(show_spinner=False)
def _cache_at(directory: str) -> Cache:
    return Cache(directory)


def get_cache() -> Cache:
    """The engine's disk cache ($ENGINE_CACHE_DIR, else ./cache), one per folder and process."""
    return _cache_at(os.path.abspath(os.environ.get("ENGINE_CACHE_DIR") or DEFAULT_CACHE_DIR))


@st.cache_resource(show_spinner=False)
def machine_speed() -> float:
    """Warm the speed model once per server: a float32 GEMM timed for a fraction of a second
    (``engine.runtime.speed.calibrate``), so the first page's estimate costs no timing. Every
    estimate later re-times the GEMM when its timing is older than ``SPEED_FRESH_S`` and is
    corrected by finished runs (``engine.runtime.speed``)."""
    from engine.runtime.speed import calibrate

    return calibrate()


@st.cache_resource(show_spinner=False)
def get_manager() -> JobManager:
    """One job manager per server process, so runs survive reruns, page switches and tabs."""
    return JobManager(max_workers=2)


def cache_summary() -> dict:
    """Folder and size on disk of the engine's cache."""
    c = get_cache()
    size = sum(p.stat().st_size for p in c.directory.rglob("*") if p.is_file())
    return {"folder": str(c.directory), "megabytes": size / 2**20}


@st.cache_data(show_spinner=False)
def device_note(name: str) -> str:
    """Where runs with this device setting go, in a few words."""
    try:
        return f"Runs on **{resolve_device(name)}** here."
    except EngineError as exc:
        return f"⚠ {plain(exc)}"


def require(ok: bool, message: str) -> None:
    """Stop the page with a warning when a needed setting is empty."""
    if not ok:
        st.warning(message)
        st.stop()
