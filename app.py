"""Dashboard entry: the shared sidebar controls and the page router.

Run with ``make run`` (or ``streamlit run app.py``). Every sidebar control keeps its value
across pages (``persist_state="session"``) and lives in the URL's query parameters
(``bind="query-params"``), so a view can be shared as a link.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from engine.data import DataSpec
from engine.settings import meta

from ui.common import (ARCH_CHOICES, ARCH_LABELS, ATTENTION_CHOICES, DEVICE_CHOICES, PAIR_EXAMPLES,
                       WIDTH_CHOICES, Shared, available_names, data_dir, dataset_infos, device_note,
                       ensure_entry, fetch_ui, upload_ui, uploaded_names)

ensure_entry()  # before anything is drawn; see its docstring

st.set_page_config(page_title="Influence malleability in linearized attention", page_icon="🧲",
                   layout="wide")

BOUND = dict(bind="query-params", persist_state="session")  # every shared control


def sidebar_ui() -> Shared:
    """Draw the shared controls; returns their values."""
    names = available_names() + uploaded_names()
    st.header("Data and models")
    base = st.selectbox("Data set", names, key="data", **BOUND, format_func=lambda v: Path(v).name,
                        help="The first available of mnist, fashion-mnist, cifar10; synthetic needs no files.")
    classes = st.text_input("Classes", "all", key="classes", **BOUND,
                            help=f"`all`, or two classes `a-b` for a binary task, e.g. "
                                 f"`{PAIR_EXAMPLES.get(base, '0-1')}` (indices or names).")
    c1, c2 = st.columns(2)
    n = c1.number_input("Training points n", 10, int(meta(DataSpec, "n").hi), 200, step=50, key="n", **BOUND,
                        help=meta(DataSpec, "n").help + "; each run says before it starts whether it fits "
                             "this machine's memory and time")
    n_test = c2.number_input("Test points", 1, int(meta(DataSpec, "n_test").hi), 100, step=50, key="n_test",
                             **BOUND, help=meta(DataSpec, "n_test").help)
    seed = st.number_input("Seed", 0, int(meta(DataSpec, "seed").hi), 0, key="seed", **BOUND,
                           help="Seeds the data draw; network seeds count up from it.")
    widths = st.multiselect("Widths m", WIDTH_CHOICES, default=[16, 64, 256, 1024], key="widths", **BOUND,
                            help="Hidden units of the two-layer ReLU head.")
    archs = st.multiselect("Architectures", ARCH_CHOICES, default=list(ARCH_CHOICES), key="archs", **BOUND,
                           format_func=lambda a: ARCH_LABELS[a],
                           help="2L-ReLU on the inputs; MLP-Attn: the same net on attention features.")
    attention = st.selectbox("Attention of MLP-Attn", ATTENTION_CHOICES, key="attention", **BOUND,
                             accept_new_options=True,
                             help="linear is the paper's; stacked:k, truncated:r and softmax:T are options; "
                                  "qkv trains W_Q, W_K, W_V (its NTK needs autograd: small n only). "
                                  "Type another, e.g. stacked:3.")
    device = st.selectbox("Device", DEVICE_CHOICES, key="device", **BOUND,
                          help="auto uses a CUDA GPU when one is visible.")
    st.caption(device_note(device))
    s = Shared(base=base, classes=classes or "all", n=int(n), n_test=int(n_test), seed=int(seed),
               widths=tuple(sorted(int(w) for w in widths)), archs=tuple(a for a in ARCH_CHOICES if a in archs),
               attention=(attention or "linear").strip(), device=device)
    st.caption(f"Task: **{s.dataset}**")
    with st.expander("Your own data"):
        upload_ui()
    with st.expander("Data sets here"):
        for info in dataset_infos(data_dir()):
            mark = "✅" if info["available"] else "⛔"
            st.markdown(f"{mark} **{info['name']}** — {info['reason']}  \n`{info['where']}`")
            if not info["available"] and info["name"] != "synthetic":
                fetch_ui(info["name"])
    return s


with st.sidebar:
    st.session_state["shared"] = sidebar_ui()

PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("pages/spectrum.py", title="Spectrum", icon=":material/bar_chart:", url_path="spectrum"),
    st.Page("pages/ntk.py", title="NTK convergence", icon=":material/show_chart:", url_path="ntk"),
    st.Page("pages/influence.py", title="Influence", icon=":material/image_search:", url_path="influence"),
    st.Page("pages/malleability.py", title="Malleability", icon=":material/bolt:", url_path="malleability"),
    st.Page("pages/scaling.py", title="Scaling law", icon=":material/trending_up:", url_path="scaling"),
    st.Page("pages/reproduction.py", title="Reproduction", icon=":material/fact_check:",
            url_path="reproduction"),
]
st.navigation(PAGES, position="sidebar").run()
