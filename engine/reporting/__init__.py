"""What a page, the CLI and the README show: the numbers, their verdicts, figures and files.

``tables`` (how the metrics of ``engine.maths.metrics`` are shown: ± sd, percent, the flip table),
``paper`` (the paper's tables and the verdict
rules), ``protocols`` (the protocol variants compared), ``plots`` (Plotly figures),
``export`` (CSV, JSON, PNG/SVG/PDF files with their provenance) and ``report`` (the README's
tables from a grid).
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "rule": ["flip_rule"],
    "report": ["readme_tables"],
})
