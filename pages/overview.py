"""Overview: the paper's claim, headline numbers here beside the paper's, data and cache."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from engine.experiments.malleability import run_malleability
from engine.experiments.spectrum import run_spectrum
from engine.experiments.sweep import run_ntk_sweep
from engine.reporting import alignment as alignment_words, paper, plots, rule
from engine.reporting.plots.nulls import nulls_data
from engine.runtime import bundle
from engine.runtime.errors import EngineError
from ui import configs, render
from ui.common import cache_summary, data_dir, dataset_infos, plain, shared
from ui.findings import findings_ui, readme_results
from ui.runner import obtain_together, peek

PAGE_BLURBS = {"spectrum": "κ, κ³ and the width needed", "ntk-sweep": "distance to K∞ against width",
               "influence": "the images that decide a prediction", "malleability": "influence under attacks",
               "scaling": "width needed against κ", "dynamics": "real against linearised training",
               "grid": "many settings, cached cell by cell", "reproduction": "the paper's claims, here",
               "alignment": "does the kernel align with the labels?"}

s = shared()
st.title("Influence malleability in linearized attention")
st.markdown(f"**The paper claims** (*{paper.PAPER}*): " + " ".join(paper.CLAIM)
            + " What this tool measures of it is below, each number beside its nulls, and on the Reproduction page.")
st.caption("This dashboard recomputes the paper's quantities from scratch with the settings in the sidebar; "
           "every result is cached on disk, and every chart offers its data as CSV.")

st.header("What we found")
readme_found, readme_power = readme_results()  # the README grid's cells, read once for the card and the protocols
findings_ui(readme_found, readme_power)

st.header("Headline numbers: here and in the paper")
# The landing page starts nothing by itself: numbers measured before (in the cache) are shown,
# the rest wait for one click, with the engine's estimate beside the button.
spec_cfg = configs.spectrum_config(s)
sweep_cfg = configs.sweep_config(s, n_seeds=3, widths=configs.PAPER_WIDTHS)
mall_cfg = configs.malleability_config(s, eps=(paper.FLIP_EPS,))
spec, sweep, mall = obtain_together(
    [(run_spectrum, spec_cfg, f"the spectrum at n = {s.n}"),
     (run_ntk_sweep, sweep_cfg, "the NTK distance at the paper's widths"),
     (run_malleability, mall_cfg, f"the flip rates at ε = {paper.FLIP_EPS:g}")],
    button="Measure them here", why="Not measured here yet, so the table shows the paper's numbers only:")

def _gap(v: dict) -> str:
    """A verdict's number in one cell: MLP-Attn's excess minus 2L-ReLU's in points with its interval (the
    reasons and the per-net numbers sit on the Malleability and Reproduction pages)."""
    g, lo, hi = (v.get(k, float("nan")) for k in ("gap", "gap_low", "gap_high"))
    if not math.isfinite(g):
        return "—"
    return f"{100 * g:+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}] points" if math.isfinite(lo) else f"{100 * g:+.0f} points"


key = paper.paper_key(s.dataset) or "mnist"
rows = []
NOT_YET = "—"  # not measured here yet: the button above measures it
sm = spec.meta["summary"] if spec is not None else {}
thr = sm.get("width_threshold_log10") or {}
v = thr["attn_v2"] if thr.get("attn_v2") is not None else thr.get("attn_v1")
att, formula = sm.get("attention", spec_cfg.attention), plots.pretty_formula(sm.get("kappa_attention_formula"))
theory = f" = {sm['kappa_attention_theory']:.3g} here" if sm.get("kappa_attention_theory") else ""
rows += [
    {"quantity": "κ(G), condition number of the data's Gram", "here": f"{sm['kappa']:.3g}" if sm else NOT_YET,
     "paper": ", ".join(f"≈ {v:.2g} ({k})" for k, v in paper.KAPPA_G.items())},
    {"quantity": f"κ of the attention features' Gram ({att} attention)",
     "here": f"{sm['kappa_attention']:.3g}" if sm else NOT_YET,
     "paper": f"= κ(G)³{theory}" if att == "linear"
              else f"κ(G)³ for linear attention; for {att}: {(formula or 'no closed form') if sm else 'see the Spectrum page'}{theory}"},
    {"quantity": "log10 width MLP-Attn needs for the NTK regime"
                 + ("" if att == "linear" else " (the paper's bound for linear attention)"),
     "here": f"{v:.1f}" if v is not None else NOT_YET,
     "paper": ", ".join(f"≫ {w:g} ({k})" for k, w in paper.WIDTH_LOG10_V2.items())},
]
if key in paper.NTK_DISTANCE:
    d = plots.distance_data(sweep.frames["rows"], "function_dist") if sweep is not None else None
    for arch in ("relu", "attn"):
        da = d[d["arch"] == arch] if d is not None else None
        measured = da is not None and not da.empty
        widths = da["width"] if measured else paper.NTK_DISTANCE[key][arch]
        rows.append({"quantity": f"‖f_m − f_NTK‖, {plots.arch_label(arch, sweep_cfg.attention)}, m = "
                                 + " / ".join(str(w) for w in widths),
                     "here": " / ".join(f"{x:.3g}" for x in da["mean"]) if measured else NOT_YET,
                     "paper": " / ".join(f"{x:g}" for x in paper.NTK_DISTANCE[key][arch].values())
                              + f" ({key})"})
flips = paper.FLIP_RATE.get(key, paper.FLIP_RATE["mnist"])
here = NOT_YET
if mall is not None:
    rules = [(a, rule.flip_rule(mall.frames["summary"], a, paper.FLIP_EPS)) for a in mall_cfg.attacks]
    here = "; ".join(f"{a.upper()}: {v['outcome']}, gap {_gap(v)}" for a, v in rules)
rows.append({"quantity": f"flip excess over the larger null (seed, random) at ε = 0.3, "
                         f"{' / '.join(a.upper() for a in mall_cfg.attacks)}, 2L-ReLU vs "
                         f"{plots.arch_label('attn', mall_cfg.attention)}, with the verdict rule",
             "here": here,
             "paper": "raw flip rates (no nulls) FGSM / PGD / MIM " + " / ".join(f"{v:g}" for v in flips["relu"].values())
                      + " % vs " + " / ".join(f"{v:g}" for v in flips["attn"].values()) + " %"})
net_cfg = configs.network_config(s)
net = peek("malleability", net_cfg)  # minutes of retraining: shown when measured (Reproduction page), never started here
readings = []
for reading in ("retrain", "flow", "ridge"):
    here = NOT_YET
    if net is not None:
        d = net.frames["summary"]
        d = d[(d["reading"] == reading) & (d["width"] == d["width"].max())]
        v = rule.flip_rule(d, net_cfg.attacks[0], net_cfg.eps[0])
        here = f"m = {int(d['width'].max())}, {v['role']}: {v['outcome']}, gap {_gap(v)}"
    readings.append({"influence read by": plots.READING_LABELS[reading], "here": here,
                     "paper": "not measured (the paper reads ridge on the eNTK only)" if reading != "ridge"
                     else f"{paper.MALLEABILITY_GAP[0]:g}–{paper.MALLEABILITY_GAP[1]:g}× in raw flip rates"})
st.table(pd.DataFrame(rows), hide_index=True)  # a static table: long cells wrap instead of being cut
if mall is not None:  # the flip rates measured here, each beside its nulls (the sidebar's data, one draw)
    msum = mall.frames["summary"]
    msum = msum[(msum["reading"] == msum["reading"].iloc[0]) & (msum["width"] == msum["width"].max())]
    label = plots.eps_label(mall_cfg.attack.norm, mall_cfg.space)
    render.chart(plots.nulls_fig(msum, paper.FLIP_EPS, label, mall_cfg.attention),
                 nulls_data(msum, paper.FLIP_EPS), "flip rates and nulls here", config=mall.config,
                 how_to_read="Per net and attack, the attack's flip rate beside the seed null (another network seed, "
                             "no attack) and the random null (a random perturbation of the same size), means over "
                             "seeds on one data draw: a flip rate no higher than its nulls says nothing about the "
                             "attack.")
st.subheader("The two halves of the claim")
try:
    align = peek("alignment", configs.alignment_config(s))  # seconds of work, measured on its own page
except EngineError:  # qkv attention: no fixed kernel to align
    align = None
st.markdown(plain(alignment_words.power_sentence(align.frames["verdict"] if align is not None else None, s.dataset))
            + " (the Task alignment and Reproduction pages measure it)")
if align is not None and "flips_training_summary" in align.frames:  # both halves at the same snapshots
    st.markdown(plain(alignment_words.along_sentence(align.frames["flips_training"])))
st.markdown("Vulnerability: is MLP-Attn more malleable? The same attack read three ways:")
st.table(pd.DataFrame(readings), hide_index=True)
st.markdown("**The README's protocols**, each read with the same rule from this machine's cache (`python -m engine "
            "grid grids/readme.toml` computes them, resumably; `python -m engine report grids/readme.toml` prints the "
            "README's tables from them):")
from engine.reporting.report import protocol_lines

spec_lines = protocol_lines(readme_found) or ["the README's grid cannot be read here"]
st.markdown("\n".join(f"- {plain(line)}" for line in spec_lines))
st.caption(f"The network's own leave-one-out (retraining without each tracked point) beside the kernel's readings of "
           f"the same attack: lazy SGD on MSE, {net_cfg.attention} attention, ℓ2 PGD at ε = {net_cfg.eps[0]:g} on "
           f"the normalised rows, {len(net_cfg.seeds)} seeds, the verdict rule of every flip table. Measured on the "
           "Reproduction page (minutes of retraining); — until then.")
st.caption(f"Measured on {plain(s.describe())}; networks trained {sweep_cfg.train.epochs} epochs (the paper: 500), "
           f"mean ± sd over {len(mall_cfg.seeds)} seeds; flip rates with {mall_cfg.attack.steps} attack steps "
           f"({mall_cfg.attack.norm}, {mall_cfg.space} pixels, influence on the {mall_cfg.target} class). Absolute "
           "distances depend on the number of test points: compare the trends. The Reproduction page gives a "
           "verdict per claim.")

st.header("Pages")
# the navigation's own list (app.py), so a new page shows here without a second list to keep in step
pages = [p for p in st.session_state.get("nav.pages", ()) if p.url_path]  # the default (this page) has none
cols = st.columns(2)
for i, page in enumerate(pages):
    what = PAGE_BLURBS.get(page.url_path)
    cols[i % 2].page_link(page, label=f"{page.title}: {what}" if what else page.title, icon=page.icon)

st.header("Data sets")  # full width: the reasons and folders are long
infos = pd.DataFrame(dataset_infos(data_dir()))[["name", "available", "reason", "where"]]
infos["available"] = infos["available"].map({True: "yes", False: "no"})
infos["where"] = "`" + infos["where"].astype(str) + "`"
st.table(infos, hide_index=True)
st.caption(f"Data folder: `{data_dir()}` (set ENGINE_DATA_DIR to change it).")
st.header("Cache")
cs = cache_summary()
st.markdown(f"Results are cached in `{cs['folder']}` ({cs['megabytes']:.1f} MB). Set ENGINE_CACHE_DIR "
            "to move it; delete the folder to start afresh. A result is keyed by its full settings, "
            "a fingerprint of the data files it read and a fingerprint of the engine's code, so a "
            "changed file or a new engine version never returns a stale number.")
st.caption(plain(f"Shipped defaults: {bundle.state().line}. A shipped result is served only to the run that made "
                 "it (same code, settings and data files); every page then opens on its chart."))
