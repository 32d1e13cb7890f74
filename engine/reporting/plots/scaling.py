"""Charts of the scaling law: the width each model needs against κ."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import ARCH_COLORS, arch_label, styled

__all__ = ["model_label", "scaling_data", "scaling_fig"]

# ---------------------------------------------------------------- scaling law

def model_label(arch: str, attention: object) -> str:
    if arch == "attn" and isinstance(attention, str):
        return f"{arch_label(arch)} ({attention})"
    return arch_label(arch)


def scaling_data(widths: pd.DataFrame, fit: pd.DataFrame) -> pd.DataFrame:
    """Width needed per (model, κ), with the fitted and the theory line's value at each κ.

    Censored points (no width up to the maximum met the target) keep ``width_needed`` NaN.
    """
    rows = []
    for _, w in widths.iterrows():
        att = w["attention"] if isinstance(w["attention"], str) else None
        f = fit[(fit["arch"] == w["arch"]) & (fit["attention"].fillna("") == (att or ""))].iloc[0]
        fitted = (math.exp(f["intercept"]) * w["kappa"] ** f["exponent"]
                  if pd.notna(f["exponent"]) else np.nan)
        rows.append({"model": model_label(w["arch"], att), "arch": w["arch"], "attention": att,
                     "kappa": w["kappa"], "width_needed": w["width_needed"], "censored": bool(w["censored"]),
                     "fitted_width": fitted, "exponent": f["exponent"],
                     "exponent_low": f.get("exponent_low"), "exponent_high": f.get("exponent_high"),
                     "resolution": f.get("resolution"),
                     "monotone": bool(w.get("monotone", True)), "theory_exponent": f["theory_exponent"]})
    return pd.DataFrame(rows)


def scaling_fig(data: pd.DataFrame, max_width: int) -> go.Figure:
    """Width needed against κ on log-log axes: measured points, the fitted power law, and
    censored κ values drawn as open triangles at the maximum width tried."""
    fig = go.Figure()
    extra = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]  # further attention variants of MLP-Attn
    used: set[str] = set()
    for i, (model, d) in enumerate(data.groupby("model", sort=False)):
        arch = d["arch"].iloc[0]  # an architecture's first model keeps its colour on every chart, whatever the order
        color = ARCH_COLORS.get(arch, extra[i % len(extra)]) if arch not in used else extra[i % len(extra)]
        used.add(arch)
        ok, cens = d[~d["censored"]], d[d["censored"]]
        p, theory = d["exponent"].iloc[0], d["theory_exponent"].iloc[0]
        lo, hi = d["exponent_low"].iloc[0], d["exponent_high"].iloc[0]
        res = d["resolution"].iloc[0] if "resolution" in d else None
        interval = f" [{lo:.2f}, {hi:.2f}] 95 %" if pd.notna(lo) and pd.notna(hi) else ""
        if interval and res is not None and pd.notna(res):  # the grid cannot resolve the exponent finer than this
            interval += f", grid step ± {res:.2f}"
        label = f"{model}: fitted p = {p:.2f}{interval}" if pd.notna(p) else f"{model}: too few points to fit"
        fig.add_trace(go.Scatter(x=ok["kappa"], y=ok["width_needed"], mode="markers", name=label,
                                 marker=dict(color=color, size=9,
                                             symbol=["circle" if m else "x" for m in ok["monotone"]]),
                                 hovertemplate=f"{model}<br>κ = %{{x:g}}<br>width %{{y:.0f}}<extra></extra>"))
        if pd.notna(p):
            fig.add_trace(go.Scatter(x=d["kappa"], y=d["fitted_width"], mode="lines", showlegend=False,
                                     line=dict(color=color), hoverinfo="skip"))
        if pd.notna(theory) and len(ok):
            anchor = ok.iloc[0]
            fig.add_trace(go.Scatter(
                x=d["kappa"], y=anchor["width_needed"] * (d["kappa"] / anchor["kappa"]) ** theory,
                mode="lines", line=dict(color=color, dash="dot"), name=f"{model}: theory p = {theory:g}",
                hoverinfo="skip"))
        if len(cens):
            fig.add_trace(go.Scatter(x=cens["kappa"], y=[max_width] * len(cens), mode="markers",
                                     marker=dict(color=color, symbol="triangle-up-open", size=11),
                                     name=f"{model}: above {max_width}",
                                     hovertemplate=f"{model}<br>κ = %{{x:g}}<br>needs more than {max_width}"
                                                   "<extra></extra>"))
    styled(fig, "κ(G), condition number of the data's Gram (log scale; a tick at every κ tried)",
           "smallest width within the target (hidden units, log scale)", logx=True, logy=True)
    kappas = sorted({float(k) for k in data["kappa"]})
    fig.update_xaxes(tickvals=kappas, ticktext=[f"{k:g}" for k in kappas],
                     range=[math.log10(kappas[0]) - 0.08, math.log10(kappas[-1]) + 0.08] if kappas else None)
    top = np.nanmax(np.r_[data["width_needed"].astype(float), max_width])
    bottom = max(1.0, np.nanmin(data["width_needed"].astype(float).fillna(top)) / 2)
    fig.update_yaxes(range=[math.log10(bottom), math.log10(top * 4)])
    powers = [2.0 ** e for e in range(math.floor(math.log2(bottom)), math.ceil(math.log2(top * 4)) + 1)]
    step = max(1, math.ceil(len(powers) / 8))  # at most about 8 labels: widths are powers of two
    ticks = powers[::step]
    fig.update_yaxes(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    return fig
