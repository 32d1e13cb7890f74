"""Settings shared by every page, and the server-wide cache and job manager.

``app.py`` draws the sidebar and stores its plain values as a ``Shared`` in
``st.session_state["shared"]``; pages read them with ``shared()``. The engine's disk cache
and the job manager are held once per server process with ``st.cache_resource``.
"""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass, replace

import streamlit as st

from engine.cache import DEFAULT_CACHE_DIR, Cache
from engine.data import DataSpec, available_datasets, resolve_data_dir
from engine.device import resolve_device
from engine.errors import EngineError
from engine.jobs import JobManager

WIDTH_CHOICES = (4, 16, 64, 256, 1024, 4096, 16384)
ARCH_CHOICES = ("relu", "attn")
ARCH_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}
ATTENTION_CHOICES = ("linear", "stacked:2", "truncated:10", "softmax:0.1", "qkv")
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

    def describe(self) -> str:
        return f"{self.dataset}, n = {self.n}, {self.n_test} test points, seed {self.seed}"


def ensure_entry() -> None:
    """Make sure this run goes through app.py (``st.navigation``), not Streamlit's old `pages/` mode.

    Streamlit 1.67 decides once per process, before the first run, whether the app "uses the
    pages directory": it does whenever a ``pages/`` folder sits beside the entry script, and
    then runs that first request as a v1 multipage app. A first request for ``/ntk`` would
    run ``pages/ntk.py`` on its own, without the sidebar, and the flag would never be cleared.
    ``st.navigation`` clears it, so whoever sees it still set clears it and reruns.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


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


def available_names() -> list[str]:
    """Available data sets in preference order: mnist, fashion-mnist, cifar10, synthetic."""
    order = ["mnist", "fashion-mnist", "cifar10", "synthetic"]
    names = [i["name"] for i in dataset_infos(data_dir()) if i["available"]]
    return sorted(names, key=lambda s: order.index(s) if s in order else len(order)) or ["synthetic"]


def fetch_ui(name: str) -> None:
    """A button that downloads (or unpacks) a missing data set; reports the outcome."""
    from engine.data import fetch_dataset

    if not st.button(f"Download {name}", key=f"fetch.{name}",
                     help="Fetches the files through torchvision; needs network access."):
        return
    try:
        with st.spinner(f"Fetching {name}…"):
            folder = fetch_dataset(name, data_dir())
    except EngineError as exc:
        st.error(str(exc))
        return
    dataset_infos.clear()
    st.success(f"{name} is in {folder}.")
    st.rerun()


def uploaded_names() -> list[str]:
    """Paths of the .npz files uploaded in this session (content-addressed, see store_npz)."""
    return list(st.session_state.get("uploads", []))


def upload_ui() -> None:
    """A file uploader for the user's own .npz; stores it next to the cache and lists it."""
    from engine.data import store_npz

    file = st.file_uploader("Your own data (.npz)", type=["npz"], key="upload",
                            help="Arrays X (n × d, n × h × w or n × c × h × w) and integer y; optionally "
                                 "X_test and y_test. Read with allow_pickle=False; at most 200 MB.")
    if file is None:
        return
    try:
        path = str(store_npz(file.getvalue(), file.name, get_cache().directory / "uploads"))
    except EngineError as exc:
        st.error(str(exc))
        return
    uploads = st.session_state.setdefault("uploads", [])
    if path not in uploads:
        uploads.append(path)
        st.rerun()  # the data set list above was drawn without it
    st.caption(f"Added to the data sets as `{Path(path).name}`.")


def default_dataset() -> str:
    return available_names()[0]


@st.cache_resource(show_spinner=False)
def _cache_at(directory: str) -> Cache:
    return Cache(directory)


def get_cache() -> Cache:
    """The engine's disk cache ($ENGINE_CACHE_DIR, else ./cache), one per folder and process."""
    return _cache_at(os.path.abspath(os.environ.get("ENGINE_CACHE_DIR") or DEFAULT_CACHE_DIR))


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
        return f"⚠ {exc}"


def require(ok: bool, message: str) -> None:
    """Stop the page with a warning when a needed setting is empty."""
    if not ok:
        st.warning(message)
        st.stop()
