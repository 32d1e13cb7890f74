"""Dashboard entry: the shared sidebar controls and the page router.

Run with ``make run`` (or ``streamlit run app.py``). Every sidebar control keeps its value
across pages (``persist_state="session"``) and lives in the URL's query parameters
(``bind="query-params"``; the data set by hand, see ``_data_from_link``), so a view can be
shared as a link.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import streamlit as st

st.set_page_config(page_title="Influence malleability in linearized attention", page_icon="🧲",
                   layout="wide")
with st.spinner("Loading the engine…"):  # only the first run after a server start waits here (torch)
    from engine.data import DataSpec
    from engine.experiments.options import ATTENTION_HELP
    from engine.runtime.budget import duration
    from engine.runtime.memory import keep_freed_blocks
    from engine.runtime.settings import meta
    from ui import configs, links, nav
    from ui.common import (
        ARCH_CHOICES,
        ARCH_LABELS,
        ATTENTION_CHOICES,
        DEVICE_CHOICES,
        PAIR_EXAMPLES,
        WIDTH_CHOICES,
        Shared,
        available_names,
        data_dir,
        dataset_infos,
        device_note,
        machine_speed,
        plain,
    )
    from ui.sidebar import (
        data_label,
        default_missing,
        fetch_ui,
        link_problems,
        linked_data,
        synthetic_note,
        upload_ui,
        uploaded_names,
        usable,
    )

nav.ensure_entry()  # before the sidebar is drawn; see its docstring
keep_freed_blocks()  # this server runs experiments: glibc reuses their freed blocks (ENGINE_MALLOC_KEEP=0: not)
links.remember_asked()  # the link's page settings before any widget takes (or drops) them
machine_speed()  # once per server: the first estimate's GEMM timing (later ones re-time it; engine.runtime.speed)

BOUND = dict(bind="query-params", persist_state="session")  # every shared control
QKV_SMALL_N = (200, 150, 100, 80, 60, 40, 20)  # sizes tried for the qkv advice
N_MIN, N_TEST_MIN = 10, 1  # the sidebar's smallest n and number of test points
# Presentation: the page's text read from the back of a room (the charts restyle themselves, ui.render.chart).
# Labels of metrics and widgets are markdown too, so their own rules come after, more specific. A table of
# st.dataframe is a canvas that only CSS zoom enlarges (its pointer maths follows the zoom); its inner box has a
# width in pixels measured before the zoom, held to the column so that the zoomed table scrolls inside it.
PRESENTATION_CSS = """<style>
[data-testid="stMain"] [data-testid="stMarkdownContainer"] :is(p, li, td, th) { font-size: 1.3rem; }
[data-testid="stMain"] [data-testid="stCaptionContainer"] :is(p, li) { font-size: 1.15rem; }
[data-testid="stMain"] [data-testid="stTable"] :is(td, th) { font-size: 1.2rem; }
[data-testid="stMain"] [data-testid="stDataFrame"] { zoom: 1.25; max-width: 100%; }
[data-testid="stMain"] [data-testid="stDataFrameResizable"] { max-width: 100% !important; }
[data-testid="stMain"] [data-testid="stMetricValue"] { font-size: 2.8rem; }
[data-testid="stMain"] [data-testid="stMetricValue"] [data-testid="stMarkdownContainer"] p { font-size: inherit; }
[data-testid="stMain"] [data-testid="stMetricLabel"] [data-testid="stMarkdownContainer"] p { font-size: 1.15rem; }
[data-testid="stMain"] [data-testid="stWidgetLabel"] [data-testid="stMarkdownContainer"] p { font-size: 1.1rem; }
</style>"""


def qkv_note(s: Shared) -> str:
    """Why qkv needs a small n, with this machine's estimate for the current settings."""
    sweep = configs.plan(configs.sweep_config(s))
    width = max(s.widths or (1024,))
    quick = [k for k in QKV_SMALL_N if k <= s.n and configs.plan(configs.kernel_config(replace(s, n=k), "attn", width)).auto]
    text = (f"**qkv** trains W_Q, W_K and W_V, so its NTK needs autograd Jacobians, whose time and memory grow "
            f"fast with n: keep n small. At n = {s.n} the NTK sweep needs about {duration(sweep.seconds)} and "
            f"{sweep.gib:.2g} GiB here")
    text += f"; from n = {quick[0]} down, the kernels start at once." if quick and quick[0] < s.n else "."
    return text if sweep.allowed else f"{text} {sweep.note}"


def _trainable(attention: str) -> bool:
    """Whether the typed attention variant trains its own parameters (its record says; a typo is not)."""
    from engine.maths.specs import parse_attention
    from engine.runtime.errors import BadInput

    try:
        return parse_attention(attention).variant.trainable
    except BadInput:
        return False


def _link_seen() -> None:
    """A changed control: the link's refused values are no longer what the page shows."""
    st.session_state.pop("link.problems", None)


def _data_picked() -> None:
    """A data set picked in the sidebar: neither the link's nor the default's absence is news now."""
    st.session_state.pop("data.link_note", None)
    st.session_state["data.asked"] = True


def _data_from_link(names: list[str]) -> None:
    """On the session's first run, select the data set the link's ``data`` names (an upload by
    its stored name, ``mine-0123456789abcdef.npz``). The data set list is not bound to the URL
    like the other controls: it shows an upload by the name it was uploaded under, and a bound
    widget puts what it shows in the URL, which would lose the content hash that identifies it."""
    wanted = st.query_params.get("data")
    if "data" in st.session_state or not wanted:
        return
    st.session_state["data.asked"] = True  # the default's absence is not this link's business
    match = next((v for v in names if Path(v).name == wanted), None)
    if match is not None:
        st.session_state["data"] = match


def _data_to_link(base: str, names: list[str]) -> None:
    """Keep the URL's ``data`` at the data set shown (an upload's stored name); none for the
    first one offered, as a bound control leaves out its default."""
    want = None if base == names[0] else Path(base).name
    if st.query_params.get("data") != want:
        if want is None:
            del st.query_params["data"]
        else:
            st.query_params["data"] = want


def _sizes_before_widgets(base: str) -> None:
    """Set n and the test points before their widgets are drawn: to what ``_fit_sizes_to_data``
    asked for on the previous run, or back to what was asked before that once another data set
    is picked (while they still read what they were lowered to)."""
    fitted = st.session_state.get("data.fitted")
    if "data.sizes" in st.session_state:
        st.session_state["n"], st.session_state["n_test"] = st.session_state.pop("data.sizes")
    elif fitted and fitted["base"] != base:
        if (st.session_state.get("n"), st.session_state.get("n_test")) == fitted["used"]:
            st.session_state["n"], st.session_state["n_test"] = fitted["asked"]
        st.session_state.pop("data.fitted")


def _fit_sizes_to_data(base: str, asked: tuple[int, int], used: Shared, note: str | None) -> str | None:
    """Lower the n and test-point widgets to what an uploaded file lets runs use (``usable``), so
    the sidebar shows the n the runs use; returns the line that says so while they read that."""
    fitted = st.session_state.get("data.fitted")
    if fitted and (fitted["base"], fitted["used"]) != (base, asked):
        st.session_state.pop("data.fitted")  # n or the data set changed since: the line is old
        fitted = None
    widgets = (max(used.n, N_MIN), max(used.n_test, N_TEST_MIN))  # a file of a few rows: the note says the rest
    if widgets != asked:
        st.session_state["data.sizes"] = widgets
        st.session_state["data.fitted"] = dict(base=base, asked=asked, used=widgets, note=note)
        st.rerun()  # the widgets are drawn already; _sizes_before_widgets sets them on the rerun
    return note or (fitted or {}).get("note")


def sidebar_ui() -> tuple[Shared, str | None]:
    """Draw the shared controls; returns their values and a warning about the link, if any."""
    names = available_names() + uploaded_names()
    links.split_data_classes(names)  # ?data=mnist:3-8 as the CLI writes a two-class task: data and classes
    link_note = linked_data(names)
    if link_note:
        st.session_state["data.link_note"] = link_note
    names = available_names() + uploaded_names()  # with a linked upload kept on this server
    problems = link_problems({"n": ("training points n", (N_MIN, int(meta(DataSpec, "n").hi)), 200),
                              "n_test": ("test points", (N_TEST_MIN, int(meta(DataSpec, "n_test").hi)), 100),
                              "seed": ("seed", (0, int(meta(DataSpec, "seed").hi)), 0),
                              "widths": ("widths", WIDTH_CHOICES, [16, 64, 256, 1024]),
                              # the URL carries the labels the widget shows (2L-ReLU), not the raw options
                              "archs": ("architectures", tuple(ARCH_LABELS[a] for a in ARCH_CHOICES),
                                        [ARCH_LABELS[a] for a in ARCH_CHOICES]),
                              "device": ("device", DEVICE_CHOICES, "auto")})
    if problems:  # kept for this session: the widgets drop the values, so the next run would not see them
        st.session_state["link.problems"] = problems
    st.header("Data and models")
    _data_from_link(names)
    if st.session_state.get("data.select") in names:  # a file just uploaded (ui.sidebar.upload_ui)
        st.session_state["data"] = st.session_state.pop("data.select")
        _data_picked()
    labels = {v: data_label(v) for v in names}  # worked out here: the widget may format values after the run
    base = st.selectbox("Data set", names, key="data", persist_state="session", format_func=lambda v: labels.get(v, v),
                        on_change=_data_picked,
                        help="The first available of mnist, fashion-mnist, cifar10; synthetic needs no files.")
    _data_to_link(base, names)
    _sizes_before_widgets(base)
    classes = st.text_input("Classes", "all", key="classes", **BOUND,
                            help=f"`all`, or two classes `a-b` for a binary task, e.g. "
                                 f"`{PAIR_EXAMPLES.get(base, '0-1')}` (indices or names).")
    c1, c2 = st.columns(2)
    n = c1.number_input("Training points n", N_MIN, int(meta(DataSpec, "n").hi), 200, step=50, key="n", **BOUND,
                        on_change=_link_seen,
                        help=meta(DataSpec, "n").help + "; each run says before it starts whether it fits "
                             "this machine's memory and time")
    n_test = c2.number_input("Test points", N_TEST_MIN, int(meta(DataSpec, "n_test").hi), 100, step=50, key="n_test",
                             **BOUND, on_change=_link_seen, help=meta(DataSpec, "n_test").help)
    sizes_slot = st.empty()  # says so when an uploaded file holds fewer points
    seed = st.number_input("Seed", 0, int(meta(DataSpec, "seed").hi), 0, key="seed", **BOUND,
                           on_change=_link_seen,
                           help="Seeds the data draw; network seeds count up from it.")
    widths = st.multiselect("Widths m", WIDTH_CHOICES, default=[16, 64, 256, 1024], key="widths", **BOUND,
                            on_change=_link_seen,
                            help="Hidden units of the two-layer ReLU head.")
    archs = st.multiselect("Architectures", ARCH_CHOICES, default=list(ARCH_CHOICES), key="archs", **BOUND,
                           on_change=_link_seen,
                           format_func=lambda a: ARCH_LABELS[a],
                           help="2L-ReLU on the inputs; MLP-Attn: the same net on attention features.")
    attention = st.selectbox("Attention of MLP-Attn", ATTENTION_CHOICES, key="attention", **BOUND,
                             accept_new_options=True,
                             help=f"{ATTENTION_HELP[:1].upper()}{ATTENTION_HELP[1:]}. A "
                                  "trainable one's NTK needs autograd: small n only. Type another, e.g. stacked:3.")
    qkv_slot = st.empty()
    device = st.selectbox("Device", DEVICE_CHOICES, key="device", **BOUND, on_change=_link_seen,
                          help="auto uses a CUDA GPU when one is visible.")
    st.toggle("Presentation", key="presentation", **BOUND,
              help="Larger fonts, thicker lines and a colour-blind-safe palette on every chart, for slides.")
    st.caption(device_note(device))
    s = Shared(base=base, classes=classes or "all", n=int(n), n_test=int(n_test), seed=int(seed),
               widths=tuple(sorted(int(w) for w in widths)), archs=tuple(a for a in ARCH_CHOICES if a in archs),
               attention=(attention or "linear").strip(), device=device)
    s, error, note = usable(s)
    note = _fit_sizes_to_data(base, (int(n), int(n_test)), s, note)
    if note:
        sizes_slot.info(note, icon=":material/info:")
    if _trainable(s.attention) and "attn" in s.archs:
        qkv_slot.caption(qkv_note(s))
    task = s.label if not s.uploaded else data_label(s.base)
    st.caption(f"Task: **{plain(task)}**")  # the URL's classes and file names are shown as typed
    with st.expander("Your own data"):
        upload_ui()
    with st.expander("Data sets here"):
        for info in dataset_infos(data_dir()):
            mark = "✅" if info["available"] else "⛔"
            st.markdown(f"{mark} **{plain(info['name'])}** — {plain(info['reason'])}  \n{plain(info['where'])}")
            if not info["available"] and info["name"] != "synthetic":
                fetch_ui(info["name"])
    return s, error


# every page from ui.nav: the Overview, each experiment's page from the registry (at its name), Grid, Reproduction
PAGES = [st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path or None, default=not p.url_path)
         for p in nav.pages()]
page = st.navigation(PAGES, position="hidden")  # listed by page_nav: see ui.nav.ensure_entry
st.session_state["nav.pages"] = PAGES  # the Overview lists the pages from here
with st.sidebar:
    nav.page_nav(PAGES)
    st.session_state["shared"], data_error = sidebar_ui()
if st.session_state.get("presentation"):  # once per run, before the page: text-only pages get it too
    st.html(PRESENTATION_CSS)
if st.session_state.get("data.link_note"):
    st.warning(st.session_state["data.link_note"], icon=":material/link_off:")
default_note = default_missing(data_label(st.session_state["shared"].base))  # on every page until one is picked
if default_note:
    st.warning(default_note, icon=":material/folder_off:")
for problem in st.session_state.get("link.problems", ()):
    st.warning(problem, icon=":material/link_off:")
if synthetic_note(st.session_state["shared"].base):
    st.info(synthetic_note(st.session_state["shared"].base), icon=":material/science:")
if data_error:  # once here, not once per run on the page
    st.error(data_error)
if st.session_state.get("link.page") != page.url_path:  # another page: its link's refusals are not this one's
    st.session_state.pop(links.REFUSED, None)
    st.session_state["link.page"] = page.url_path
links.page_slot()  # above the page: its settings the link asked for and the page did not take
page.run()
links.show_page_problems()  # after the page's widgets, unless a run call showed them (a page may stop after it)
