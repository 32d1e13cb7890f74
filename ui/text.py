"""How a value someone else typed (a URL's query parameter, above all) is shown in Markdown.

Streamlit renders warnings, captions and errors as GitHub-flavoured Markdown, which turns
``www.host``, ``http://host`` and ``a@b.c`` in running text into links. Backslash escapes do
not stop that: the autolinker reads the text after escapes are resolved, so ``www\\.host`` is
a link again. Only text inside a code span is never linked, so ``verbatim`` shows a value as
inline code: exactly as typed, on one line, with nothing in it that Markdown acts on.
"""

from __future__ import annotations

import re


def verbatim(value) -> str:
    """``value`` as one Markdown inline code span, on one line: no link, autolink, image, HTML,
    emphasis or formula, whatever it holds. A backtick inside cannot close the span: the fence
    is one backtick longer than the longest run of backticks in the value, and a value that
    starts or ends with a backtick or a space is padded with one space on each side (which
    CommonMark strips again), so the span shows the value as typed."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if not text or text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
