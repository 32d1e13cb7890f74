"""Rendering helpers: a chart with its CSV and reading note, downloads, verdict tables."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.maths import gates
from engine.reporting import export, fit

PAGE_WIDTH_PX = 450  # a half-width column at 1280 px (about 400 px): titles wrap and legends stack for it
WIDE_PX = 1000       # a chart across the page
PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}
STATUS_BADGES = {"agrees": ":green-badge[agrees]", "partly": ":orange-badge[partly]",
                 "disagrees": ":red-badge[disagrees]", "not measured": ":gray-badge[not measured]"}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "data"


def chart(fig, data: pd.DataFrame, name: str, how_to_read: str, *, index: bool = False, title: str | None = None,
          config: dict | None = None, wide: bool = False, verdict: str = "") -> None:
    """An interactive Plotly chart, one sentence on how to read it, and its data as CSV (and as
    16:9 PNG, SVG and PDF slides where a Chromium can render them).

    Every chart has a title: ``title``, else the figure's own, else ``name`` capitalised. The
    PNG, SVG and PDF carry a settings line under it (``engine.reporting.export.settings_line`` of ``config``,
    the result's canonical config; else the sidebar's data and n) and are fitted to their
    canvas, so nothing is clipped on a slide. The sentence and the buttons share a row that
    sizes each button to its label and gives the sentence the rest; in a narrow column the
    buttons wrap to a line of their own instead of being squeezed. ``wide``: the chart spans the
    page (its title wraps at ``WIDE_PX``, not at a half column's ``PAGE_WIDTH_PX``). ``verdict``: the
    claim's verdict the chart bears on, added to the exported settings line."""
    slug = _slug(name)
    heading = title or fig.layout.title.text or name[:1].upper() + name[1:]
    fig = export.titled(go.Figure(fig), heading)
    width, height = WIDE_PX if wide else PAGE_WIDTH_PX, int(fig.layout.height or export.HEIGHT_PX)
    on_page = fit.fit(fig, width, height)
    if st.session_state.get("presentation"):  # larger text, and the canvas grows by what its margins took
        fig = export.talk_style(fig)
        talk = fit.fit(fig, width, height)
        grown = sum(max(0.0, float(getattr(talk.layout.margin, k) or 0) - float(getattr(on_page.layout.margin, k) or 0))
                    for k in ("t", "b"))
        on_page = fit.fit(fig, width, height + int(grown)) if grown else talk
    st.plotly_chart(on_page, key=f"chart.{slug}", config=PLOTLY_CONFIG)
    row = st.container(horizontal=True, vertical_alignment="center", gap="medium", wrap=True)
    row.caption(how_to_read, width="stretch")
    row.download_button("CSV", data.to_csv(index=index).encode(), file_name=f"{slug}.csv",
                        mime="text/csv", key=f"csv.{slug}", on_click="ignore", icon=":material/download:",
                        help=f"Download the data of “{name}” as CSV", width="content")
    if export.browser_path() is not None:  # static images for slides, rendered only when clicked
        line = export.settings_line(config, verdict) if config else " · ".join(p for p in (_sidebar_line(), verdict) if p)
        still = export.slide(fig, line)
        for fmt in export.FORMATS:
            row.download_button(fmt.upper(), _image(still, fmt), file_name=f"{slug}.{fmt}", mime=IMAGE_MIME[fmt],
                                key=f"{fmt}.{slug}", on_click="ignore", width="content",
                                help=f"Download “{name}” as a 16:9 {fmt.upper()} slide, with its settings line")


IMAGE_MIME = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf"}


def _sidebar_line() -> str:
    from ui.common import shared

    return shared().describe()


def _image(fig, fmt: str):
    """A 16:9 slide (``export.SLIDE_PX``), rendered only when clicked: kaleido starts Chromium then."""
    return lambda: export.image_bytes(fig, fmt, *export.SLIDE_PX)


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


def first_sentence(text: str) -> str:
    """A verdict's reason as one line: its first sentence (the rest goes in the card's details)."""
    head, dot, _ = str(text).partition(". ")
    return head + ("." if dot and not head.endswith(".") else "")


def verdicts(table: pd.DataFrame) -> None:
    """One bordered card per claim: the verdict badge and the claim, one line of reason; the paper's and
    this run's numbers and the full reasoning in the card's details."""
    cols = st.columns(2)
    for i, row in enumerate(table.itertuples(index=False)):
        with cols[i % 2].container(border=True):
            st.markdown(f"{STATUS_BADGES.get(row.status, row.status)} **{row.claim}**")
            st.caption(first_sentence(row.words))
            with st.expander("Numbers and reasoning"):
                st.markdown(f"Paper: {row.paper}  \nHere: {row.measured}")
                st.caption(row.words)


def cached_note(result) -> None:
    if result is not None and getattr(result, "bundled", False):
        st.caption("Read from the shipped bundle of default results: made by this very code on the same data "
                   "files and settings (`make bundle` remakes it).")
    elif result is not None and getattr(result, "cached", False):
        st.caption("Read from the disk cache.")


# ---------------------------------------------------------------- nets that did not train

GREY = "color: #9e9e9e"  # the numbers of a net at chance: still there, visibly not to be read


def training_gate(rows: pd.DataFrame, n_classes: int, by: tuple[str, ...] = ("arch", "width"),
                  what: str = "numbers") -> pd.DataFrame:
    """A banner naming every net whose worst seed trains to within ``engine.maths.gates.CHANCE_POINTS``
    of chance (``engine.maths.gates.untrained``); returns those groups (empty when every net trained).
    ``rows``: one row per net with ``train_acc``; ``what``: the page's numbers, for the banner."""
    from ui.common import ARCH_LABELS

    bad = gates.untrained(rows, n_classes, by)
    if bad.empty:
        return bad
    chance = float(bad["chance"].iloc[0])
    names = "; ".join(f"{ARCH_LABELS.get(r.arch, r.arch)}" + (f", m = {r.width}" if "width" in bad else "")
                      + f": {100 * r.worst:.0f} %" + (f" (mean {100 * r.mean:.0f} %)" if r.nets > 1 else "")
                      for r in bad.itertuples())
    st.warning(f"**Near chance.** These nets reach a train accuracy within {100 * gates.CHANCE_POINTS:.0f} points of "
               f"chance ({100 * chance:.0f} %), worst seed — {names}. Their {what} describe nets that have not "
               "learned the task and are greyed below; train longer or with a larger learning rate.",
               icon=":material/warning:")
    return bad


def gate_failures(nets: pd.DataFrame) -> None:
    """A warning naming every net (architecture, data draw, seed) that failed the training gate
    (``engine.maths.gates.passes_gate``: test accuracy more than ``TRAIN_GATE`` below its own
    K_m ridge's), with its train, test and K_m numbers, so a "did not train" verdict is explained
    where it is read. ``nets``: one row per net with ``test_acc`` and ``test_acc_kernel``."""
    from ui.common import ARCH_LABELS

    if nets.empty or not {"test_acc", "test_acc_kernel"} <= set(nets):
        return
    passed = (nets["trained"].astype(bool) if "trained" in nets
              else gates.passes_gate(nets["test_acc"], nets["test_acc_kernel"]))
    failed = nets[~np.asarray(passed, dtype=bool)]
    if failed.empty:
        return

    def pct(v) -> str:
        return "—" if pd.isna(v) else f"{100 * float(v):.0f} %"

    lines = [f"{ARCH_LABELS.get(r['arch'], r['arch'])}"
             + (f", data draw {r['data_seed']}" if "data_seed" in r and nets["data_seed"].nunique() > 1 else "")
             + f", seed {r['seed']}: train {pct(r.get('train_acc'))}, test {pct(r['test_acc'])}, "
             f"K_m ridge {pct(r['test_acc_kernel'])}" for _, r in failed.iterrows()]
    st.warning(f"**Training gate failed** ({len(failed)} of {len(nets)} nets; a net passes when its test accuracy is "
               f"within {100 * gates.TRAIN_GATE:.0f} points of ridge regression with its own trained kernel K_m): "
               + "; ".join(lines) + ". Train longer, with another learning rate, or pick a protocol above.",
               icon=":material/warning:")


def greyed(table: pd.DataFrame, bad: pd.DataFrame, by: tuple[str, ...] = ("arch", "width")):
    """``table`` for ``st.dataframe`` with the rows of the ``bad`` groups (``training_gate``) in grey."""
    keys = [k for k in by if k in table and k in bad]
    if bad.empty or not keys:
        return table
    flagged = set(map(tuple, bad[keys].astype(str).to_numpy()))
    mask = [tuple(map(str, r)) in flagged for r in table[keys].to_numpy()]
    return table.style.apply(lambda row: [GREY if mask[row.name] else ""] * len(row), axis=1) \
        if table.index.equals(pd.RangeIndex(len(table))) else table


def accuracy_table(summary: pd.DataFrame, bad: pd.DataFrame, by: tuple[str, ...] = ("arch",)) -> None:
    """Train and test accuracy of every trained net shown (and the K∞ ridge baseline when present),
    greyed where ``training_gate`` flagged the net."""
    from ui.common import ARCH_LABELS

    cols = [c for c in (*by, "seed", "train_acc", "test_acc", "test_acc_ntk") if c in summary]
    shown = summary[cols].reset_index(drop=True)
    labels = {"train_acc": "train accuracy", "test_acc": "test accuracy", "test_acc_ntk": "K∞ ridge test accuracy"}
    config = {c: st.column_config.NumberColumn(label, format="percent") for c, label in labels.items() if c in shown}
    if "arch" in shown:
        config["arch"] = st.column_config.TextColumn("model")
        shown = shown.assign(arch=shown["arch"].map(lambda a: ARCH_LABELS.get(a, a)))
        bad = bad.assign(arch=bad["arch"].map(lambda a: ARCH_LABELS.get(a, a))) if "arch" in bad else bad
    st.dataframe(greyed(shown, bad, by), hide_index=True, column_config=config)


# ---------------------------------------------------------------- the same view from the command line

def command(cfg, figure: str | None = None) -> None:
    """"Copy as CLI command": the ``python -m engine`` line that computes this view's result (the
    same cache key, so it reads the dashboard's cached result), or with ``figure`` the line that
    draws the experiment's main chart to ``figure`` (a file name)."""
    from engine.commands import command_line

    st.code(command_line(cfg, figure=figure), language="bash", wrap_lines=True)
