"""What a page, the CLI and the README show: the numbers, their verdicts, figures and files.

``tables`` (one function per number: seed averages, flip rate, rank correlation, slopes),
``gates`` (the training gate against chance), ``paper`` (the paper's tables and the verdict
rules), ``protocols`` (the protocol variants compared), ``plots`` (Plotly figures),
``export`` (CSV, JSON, PNG/SVG/PDF files with their provenance) and ``report`` (the README's
tables from a grid).
"""

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "tables": ["excess_interval", "flip_rate", "rank_correlation", "summarize"],
    "paper": ["flip_rule"],
    "gates": ["TRAIN_GATE", "passes_gate"],
    "report": ["readme_tables"],
})
