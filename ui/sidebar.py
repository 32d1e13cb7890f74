"""What the shared sidebar checks before the pages read its values (``ui.common.Shared``).

Which data sets are missing and how to get them, the user's own uploads (stored by content hash
next to the engine's cache), a link's data set and the values its widgets would drop, and the
settings made usable (a Classes value the data set cannot take, an upload's sizes): each check
returns one line for the page to show, so nothing is silently replaced.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import streamlit as st

from engine.data import check_npz_sizes, parse_dataset
from engine.runtime.errors import EngineError
from ui.common import PREFERRED, Shared, available_names, data_dir, dataset_infos, display_name, get_cache, plain
from ui.text import verbatim


def missing_note(asked: str, shown: str, who: str) -> str | None:
    """One line for a data set with files that is not here: which files are missing from which
    folder (``engine.data.available_datasets``), what the pages show instead, how to get it.
    None when ``asked`` is here or is no data set with files. ``who`` starts the line ("The
    default data set"); ``shown`` is the sidebar's label of what is shown instead."""
    info = next((i for i in dataset_infos(data_dir()) if i["name"] == asked), None)
    if info is None or info["available"]:
        return None
    missing = info["reason"].split(";")[0].removeprefix("missing ")  # "missing a, b; downloaded …"
    return (f"{who}, {plain(asked)}, is not here: {plain(missing)} missing from {plain(info['where'])}, so the "
            f"pages show {plain(shown)} instead. Get it under “Data sets here” in the sidebar, or with "
            f"`python -m engine datasets --fetch {plain(asked)}`, or point ENGINE_DATA_DIR at a folder that holds it.")


def default_missing(shown: str) -> str | None:
    """``missing_note`` for the default data set while this session asked for none (no ``data``
    in its link, none picked or uploaded: app.py sets ``data.asked``), where the sidebar opens on
    the next one available (``available_names``)."""
    if st.session_state.get("data.asked"):  # set by app.py: a link's data set, or one picked
        return None
    return missing_note(PREFERRED[0], shown, "The default data set")


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
        st.error(plain(exc))
        return
    dataset_infos.clear()
    st.success(f"{name} is in {plain(folder)}.")
    st.rerun()


def uploaded_names() -> list[str]:
    """Paths of the .npz files uploaded in this session (content-addressed, see store_npz)."""
    return list(st.session_state.get("uploads", []))


def data_label(base: str) -> str:
    """How the sidebar names a data set: an upload by the file name it was uploaded under (its
    stored name, ``mine-0123456789abcdef.npz``, stays its identity), a second file of that name
    as ``mine.npz (2)``; a named data set as itself."""
    given = st.session_state.get("upload.names", {})
    count: dict[str, int] = {}
    for path in uploaded_names():
        name = given.get(path) or display_name(path)
        count[name] = count.get(name, 0) + 1
        if path == base:
            return name if count[name] == 1 else f"{name} ({count[name]})"
    return display_name(base) if base.lower().endswith(".npz") else base


UPLOAD_EXPECTED = "expected an .npz file with arrays X (one row per sample) and y (integer labels), as numpy.savez writes"


def upload_problem(name: str, exc: Exception | None = None) -> str:
    """One line for an upload that cannot be used: the file's name, why, and what is expected.

    Engine messages name the stored copy (a path inside the cache folder) and give advice for
    programmers; neither helps someone who dropped a file on the page, so both are replaced."""
    if exc is None:
        return f"“{plain(name)}” is not an .npz file; {UPLOAD_EXPECTED}."
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    why = re.sub(r"[^\s'\"]*?[\w-]+-[0-9a-f]{16}\.npz", name, why)  # the stored copy → the user's name
    why = re.sub(r"[;,]?\s*save X and y with numpy\.savez\s*$", "", why)
    why = why.removeprefix(name).lstrip(" :")
    if "not a zip file" in why:
        return f"“{plain(name)}” is not a valid .npz file (it is not a zip archive); {UPLOAD_EXPECTED}."
    return f"“{plain(name)}” cannot be used: {plain(why)}; {UPLOAD_EXPECTED}."


def upload_dir() -> Path:
    """Where uploads are kept on this server (by content hash, next to the engine's cache)."""
    return get_cache().directory / "uploads"


def upload_ui() -> None:
    """A file uploader for the user's own .npz; stores it next to the cache and lists it."""
    from engine.data import store_npz

    # no type filter: a wrong file gets the message below (what is expected), not the browser's refusal
    file = st.file_uploader("Your own data (.npz)", key="upload",
                            help="An .npz file with arrays X (n × d, n × h × w or n × c × h × w) and integer "
                                 "labels y, optionally X_test and y_test, e.g. `numpy.savez('mine.npz', X=X, y=y)`; "
                                 "at most 200 MB.")
    if file is None:
        return
    if not file.name.lower().endswith(".npz"):
        st.error(upload_problem(file.name))
        return
    try:
        path = str(store_npz(file.getvalue(), file.name, upload_dir()))
    except EngineError as exc:
        st.error(upload_problem(file.name, exc))
        return
    uploads = st.session_state.setdefault("uploads", [])
    if path not in uploads:
        uploads.append(path)
        st.session_state.setdefault("upload.names", {})[path] = file.name
    if st.session_state.get("upload.seen") != file.file_id:  # just uploaded (the widget keeps the file)
        st.session_state["upload.seen"] = file.file_id
        st.session_state["data.select"] = path  # taken by the data set list, which is drawn above
        st.rerun()
    st.caption(f"Added to the data sets as “{plain(data_label(path))}” (stored as {plain(Path(path).name)}, "
               "the name a link to this view carries).")


def linked_data(names: list[str]) -> str | None:
    """Check a link's ``data`` query parameter before the data selectbox reads it.

    The selectbox silently drops a value it does not offer, so a link to someone's upload
    would open the default data set as if nothing were wrong. An upload kept on this server
    (same content-hash name in ``upload_dir()``) is added to this session's data sets;
    anything else returns a one-line warning for the page. ``names``: the data sets offered.
    """
    wanted = st.query_params.get("data")
    if not wanted or wanted in {Path(n).name for n in names}:
        return None
    if wanted.lower().endswith(".npz"):
        path = upload_dir() / Path(wanted).name
        if Path(wanted).name == wanted and path.is_file():
            st.session_state.setdefault("uploads", []).append(str(path))
            return None
        return (f"This link opens uploaded data, {verbatim(display_name(wanted))}, that is not on this server, so "
                f"the page shows {plain(names[0])} instead; upload the file under “Your own data” in the sidebar to see "
                "the linked view.")
    return (missing_note(wanted, names[0], "This link's data set")
            or f"This link asks for the data set {verbatim(wanted)}, which is not available here, so the page shows "
               f"{plain(names[0])} instead.")


def _shown(value) -> str:
    return plain(", ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value))


def link_problems(spec: dict) -> list[str]:
    """One visible line per query parameter of a link that its widget will not take.

    A bound widget silently drops a value outside its bounds or options (n = 999999 opens
    with the default n and only a red "!"), so the page says what was asked, what is allowed
    and what is used instead. ``spec``: key -> (label, allowed, default) with ``allowed`` a
    ``(lo, hi)`` pair of integers or a tuple of options (a list-valued widget keeps the
    allowed entries of a list).
    """
    out = []
    for key, (label, allowed, default) in spec.items():
        values = st.query_params.get_all(key)
        if not values:
            continue
        used = st.session_state.get(key, default)
        if isinstance(allowed, tuple) and len(allowed) == 2 and all(isinstance(a, int) for a in allowed) \
                and not isinstance(default, (list, tuple)):
            lo, hi = allowed
            text = values[-1]
            try:
                ok = lo <= int(text) <= hi
            except ValueError:
                ok = False
            if not ok:
                out.append(f"This link's {label} = {verbatim(text)} is not allowed (a whole number from {lo} to {hi}), so the "
                           f"page uses {_shown(used)} instead.")
            continue
        options = {str(o) for o in allowed}
        bad = [v for v in values if v not in options]
        if bad:
            kept = [v for v in values if v in options]
            out.append(f"This link's {label} {verbatim(', '.join(bad))} {'is' if len(bad) == 1 else 'are'} not among the options "
                       f"({_shown(allowed)}), so the page uses {_shown(kept) if kept else _shown(used)} instead.")
    return out


def synthetic_note(base: str) -> str | None:
    """One line when the pages run on synthetic data: their numbers are not the paper's, and
    how to get MNIST where it is missing."""
    if base != "synthetic":
        return None
    text = "The pages run on **synthetic data**, so their numbers are not comparable with the paper's MNIST ones. "
    if "mnist" in available_names():
        return text + "MNIST is here: pick it under “Data set” in the sidebar."
    return text + ("Get MNIST with `python -m engine datasets --fetch mnist` (or under “Data sets here” in the "
                   "sidebar), or point ENGINE_DATA_DIR at a folder that holds it.")


@st.cache_data(show_spinner=False, max_entries=32)
def npz_rows(path: str) -> tuple[int, int | None]:
    """Rows of X and of X_test (None without one) in an .npz, read from the array headers only."""
    shapes = check_npz_sizes(path, display_name(path))
    X, T = shapes.get("X"), shapes.get("X_test")
    return (int(X[0][0]) if X and X[0] else 0), (int(T[0][0]) if T and T[0] else None)


def fit_sizes(n: int, n_test: int, rows: int, test_rows: int | None) -> tuple[int, int]:
    """``n`` and ``n_test`` lowered to what an .npz holds (the limits of engine.data.npz).

    With X_test, n ≤ rows of X and n_test ≤ rows of X_test. Without, n_test rows of X are held
    out (at most rows − 2) and n ≤ rows − n_test; a shortfall is shared in proportion to the
    request, so 200 + 100 asked of 80 rows gives 53 + 27.
    """
    if test_rows is not None:
        return min(n, rows), min(n_test, test_rows)
    if n + n_test <= rows:
        return n, n_test
    n_test = max(1, min(n_test, rows - 2, round(rows * n_test / (n + n_test))))
    return max(2, min(n, rows - n_test)), n_test


def class_problem(s: Shared) -> str | None:
    """Why the Classes setting cannot be used with this data set (one line), or None."""
    if s.classes.strip().lower() in ("", "all"):
        return None
    if s.uploaded:
        return "classes can be picked for mnist, fashion-mnist, cifar10 and synthetic; an uploaded file uses all of its classes"
    try:
        parse_dataset(s.dataset)
    except EngineError as exc:
        text, out, at = str(exc).splitlines()[0], [], 0
        for quoted in re.finditer(r"'[^']*'|\"[^\"]*\"", text):  # the engine quotes what was typed: shown as code
            out += [plain(text[at:quoted.start()]), verbatim(quoted[0][1:-1])]
            at = quoted.end()
        return "".join(out) + plain(text[at:])
    return None


def usable(s: Shared) -> tuple[Shared, str | None, str | None]:
    """The sidebar's settings as the pages can run them, with what was changed and why.

    Returns (settings, error, note). A Classes value that cannot be used becomes ``all`` and
    ``error`` says so once for the whole page, instead of one error box per run on it; an
    uploaded file's n and n_test are lowered to what it holds (``fit_sizes``) and ``note``
    says so.
    """
    error = note = None
    problem = class_problem(s)
    if problem:
        error = f"Classes {verbatim(s.classes.strip())}: {problem}. The pages below use all classes until this is changed."
        s = replace(s, classes="all")
    if s.uploaded:
        try:
            rows, test_rows = npz_rows(s.base)
        except EngineError:
            return s, error, note  # the runs say what is wrong with the file
        n, n_test = fit_sizes(s.n, s.n_test, rows, test_rows)
        if (n, n_test) != (s.n, s.n_test):
            held = f"{test_rows} test rows" if test_rows is not None else "no X_test, so test points are held out of X"
            note = (f"{plain(data_label(s.base))} has {rows} rows ({held}): runs use n = {n} and {n_test} test points "
                    f"instead of {s.n} and {s.n_test}.")
            s = replace(s, n=n, n_test=n_test)
    return s, error, note
