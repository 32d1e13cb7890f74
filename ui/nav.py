"""The dashboard's pages and its entry's routing (``app.py``).

``pages()`` lists every page: the Overview, then each experiment's page in the order of the registry
(``engine.experiments.registry``: its ``page``, ``page_title`` and ``page_icon``, at the
experiment's name as URL path), then the pages that lead with no experiment. A new experiment's
page needs no line here or in ``app.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st


@dataclass(frozen=True)
class PageSpec:
    """One page of the dashboard, as ``st.Page`` takes it."""

    path: str      # pages/<url_path>.py (Streamlit's first request finds a page by its file's stem)
    title: str     # its name in the sidebar's page list
    icon: str      # a material icon, ":material/…:"
    url_path: str  # its URL path; "" for the Overview, the default page at /


FIRST = (PageSpec("pages/overview.py", "Overview", ":material/home:", ""),)
LAST = (PageSpec("pages/grid.py", "Grid", ":material/grid_view:", "grid"),  # the pages that lead with no experiment
        PageSpec("pages/reproduction.py", "Reproduction", ":material/fact_check:", "reproduction"))


def pages() -> list[PageSpec]:
    """Every page in the sidebar's order: the Overview, the experiments' pages in the registry's order
    (each at its experiment's name), then Grid and Reproduction. Read from the registry when called."""
    from engine.experiments.registry import EXPERIMENTS

    led = [PageSpec(e.page, e.page_title, e.page_icon, e.name) for e in EXPERIMENTS.values() if e.page]
    return [*FIRST, *led, *LAST]


def ensure_entry() -> None:
    """Make sure this run goes through app.py (``st.navigation``), not Streamlit's old `pages/` mode.

    Streamlit 1.67 decides once per process, before the first run, whether the app "uses the
    pages directory": it does whenever a ``pages/`` folder sits beside the entry script, and
    then runs that first request as a v1 multipage app. A first request for ``/ntk-sweep`` runs
    ``pages/ntk-sweep.py`` on its own, without the sidebar, and the flag would never be cleared.
    ``st.navigation`` clears it, so whoever sees it still set clears it and reruns. v1 finds a
    page by its file's stem, so each page's file is named after its URL path (tests/test_registry.py):
    otherwise v1 answers "Page not found" and the rerun lands on the Overview.

    That first v1 run also sends its raw page list (``app, influence, ntk, …``) to the browser
    before any of our code runs; ``client.showSidebarNavigation = false`` in
    .streamlit/config.toml hides it, and ``page_nav`` draws the real list instead.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def page_nav(pages: list) -> None:
    """The page list at the top of the sidebar: one link per ``st.Page``, the current one
    highlighted (Streamlit's own list is hidden by the config; see ``ensure_entry``)."""
    with st.container(key="page_nav", gap="xxsmall"):
        for page in pages:
            st.page_link(page, width="stretch")
