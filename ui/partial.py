"""What a running job has finished so far, drawn while it runs (``engine.runtime.stream``).

A run hands out each finished unit's rows as it lands (a net and its attack for the malleability
experiment); the progress fragment draws them here at every refresh, labelled with how many nets of
how many they hold, and the page's full chart (nulls, intervals, verdict) replaces them when the run
ends. Where the rows hold a flip excess, the chart is its mean per architecture, attack and reading
over the nets so far; otherwise one line counts the units.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.reporting.plots.style import ARCH_COLORS, arch_label
from engine.runtime.jobs import Job

NET = ["data_seed", "arch", "width", "seed"]  # one trained net: a row's identity without its attack and reading


def expected_nets(cfg) -> int | None:
    """How many nets a config trains (draws × architectures × widths × seeds), where it says."""
    try:
        return (max(1, len(getattr(cfg, "data_seeds", ()) or ())) * len(cfg.archs) * len(cfg.widths)
                * len(cfg.seeds))
    except (AttributeError, TypeError):
        return None


def partial_data(landed: list) -> pd.DataFrame:
    """Mean flip excess (in points) per (arch, attack, ε, reading) over the landed rows, with the nets
    it averages; empty where the rows hold no flip excess."""
    rows = pd.DataFrame([r for _, rs in landed for r in rs])
    if rows.empty or "flip_excess" not in rows or not set(NET) <= set(rows):
        return pd.DataFrame(columns=["arch", "attack", "eps", "reading", "excess_points", "nets"])
    cell = ["arch", "attack", "eps", "reading"]
    out = rows.groupby(cell, sort=False)["flip_excess"].mean().mul(100).rename("excess_points").to_frame()
    out["nets"] = rows[list(dict.fromkeys(cell + NET))].drop_duplicates().groupby(cell, sort=False).size()
    return out.reset_index()


def partial_ui(job: Job, total: int | None) -> None:
    """The landed units of ``job`` as a chart (or a count), labelled "k of N nets so far"."""
    landed = list(job.landed)  # a prefix: the run appends while we read
    if not landed:
        return
    data = partial_data(landed)
    if data.empty:
        st.caption(f"{len(landed)} unit(s) finished so far; the chart appears when the run ends.")
        return
    nets = pd.DataFrame([r for _, rs in landed for r in rs])[NET].drop_duplicates().shape[0]
    of = f" of {total}" if total else ""
    fig = go.Figure()
    for arch, d in data.groupby("arch", sort=False):
        fig.add_trace(go.Bar(x=[f"{a.upper()} ε={e:g}, {r}" for a, e, r in zip(d["attack"], d["eps"], d["reading"],
                                                                              strict=True)],
                             y=d["excess_points"], name=arch_label(arch), marker_color=ARCH_COLORS.get(arch),
                             text=[f"{v:+.0f}" for v in d["excess_points"]], textposition="outside"))
    fig.update_layout(barmode="group", height=300, margin=dict(t=40, b=10, l=10, r=10),
                      title=f"So far: {nets}{of} nets — flip excess over the larger null (points)",
                      yaxis_title="flip excess (points)")
    st.plotly_chart(fig, key=f"partial.{job.key[:16]}", config={"displaylogo": False})
    st.caption(f"Partial: the mean over the {nets}{of} nets finished, without intervals; the page's chart, with "
               "the nulls, the intervals over data draws and the verdict, replaces it when the run ends.")
