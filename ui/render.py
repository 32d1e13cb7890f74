"""Rendering helpers: a chart with its CSV and reading note, downloads, verdict tables."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pandas as pd
import streamlit as st

from engine import export

PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}
STATUS_BADGES = {"agrees": ":green-badge[agrees]", "partly": ":orange-badge[partly]",
                 "disagrees": ":red-badge[disagrees]", "not measured": ":gray-badge[not measured]"}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "data"


def chart(fig, data: pd.DataFrame, name: str, how_to_read: str, index: bool = False) -> None:
    """An interactive Plotly chart, one sentence on how to read it, and its data as CSV (and as
    PNG and SVG where a Chromium can render them).

    The sentence and the buttons share a row that sizes each button to its label and gives
    the sentence the rest; in a narrow column the buttons wrap to a line of their own instead
    of being squeezed (fixed column ratios cut a button to "C…" in half-width columns)."""
    slug = _slug(name)
    if st.session_state.get("presentation"):
        fig = export.talk_style(fig)
    st.plotly_chart(fig, key=f"chart.{slug}", config=PLOTLY_CONFIG)
    row = st.container(horizontal=True, vertical_alignment="center", gap="medium", wrap=True)
    row.caption(how_to_read, width="stretch")
    row.download_button("CSV", data.to_csv(index=index).encode(), file_name=f"{slug}.csv",
                        mime="text/csv", key=f"csv.{slug}", on_click="ignore", icon=":material/download:",
                        help=f"Download the data of “{name}” as CSV", width="content")
    if export.browser_path() is not None:  # static images for slides, rendered only when clicked
        for fmt in ("png", "svg"):
            row.download_button(fmt.upper(), _image(fig, fmt), file_name=f"{slug}.{fmt}", mime=IMAGE_MIME[fmt],
                                key=f"{fmt}.{slug}", on_click="ignore", width="content",
                                help=f"Download “{name}” as {fmt.upper()} (for slides)")


IMAGE_MIME = {"png": "image/png", "svg": "image/svg+xml"}


def _image(fig, fmt: str):
    return lambda: export.image_bytes(fig, fmt)  # kaleido starts Chromium only when the button is clicked


def metric_slots(k: int) -> list:
    """``k`` places for ``st.metric`` in one row that wraps instead of cutting long labels
    (equal columns truncate a label such as "κ of attention Gram (measured)" at 1280 px)."""
    row = st.container(horizontal=True, gap="medium")
    return [row.container(width="content") for _ in range(k)]


def npy_button(label: str, array: np.ndarray, file_name: str) -> None:
    """Download a full array as .npy (built only when clicked)."""
    def payload() -> bytes:
        buf = io.BytesIO()
        np.save(buf, np.asarray(array), allow_pickle=False)
        return buf.getvalue()

    st.download_button(label, payload, file_name=file_name, mime="application/octet-stream",
                       key=f"npy.{_slug(file_name)}", on_click="ignore", icon=":material/download:")


def settings(config: dict, title: str = "Settings used") -> None:
    """The canonical config stored with a result (what the cache key is made of)."""
    with st.expander(title):
        st.code(json.dumps(config, indent=1, sort_keys=True, default=str), language="json")


def verdicts(table: pd.DataFrame) -> None:
    """One bordered card per claim: verdict badge, claim, the two numbers, plain words."""
    cols = st.columns(2)
    for i, row in enumerate(table.itertuples(index=False)):
        with cols[i % 2].container(border=True):
            st.markdown(f"{STATUS_BADGES.get(row.status, row.status)} **{row.claim}**")
            st.markdown(f"Paper: {row.paper}  \nHere: {row.measured}")
            st.caption(row.words)


def cached_note(result) -> None:
    if result is not None and getattr(result, "cached", False):
        st.caption("Read from the disk cache.")
