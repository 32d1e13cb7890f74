"""The malleability claim's one rule, as the reporting layer reads it: ``flip_rule``, its words and the
declared primary live in ``engine.experiments.verdict`` (the run's ``verdict`` frame is computed with
them); this module re-exports them for the Reproduction page, the protocol table
(``engine.reporting.protocols.flip_verdict``) and the README's tables (``engine.reporting.report``).
"""

from __future__ import annotations

from ..experiments.verdict import (  # noqa: F401  (re-exports)
    FLIP_OUTCOMES,
    PRIMARY_WORDS,
    RULE_WORDS,
    Side,
    flip_rule,
    gap_words,
    sensitivity_words,
)

FLIP_FACTOR = 2.0       # "far more": the kernel claim's factor (``engine.reporting.protocols``)
