"""Verification: every loaded method run on its oracle's inputs, outputs compared.

A method is checked against its reference (:mod:`.references`: the program's, or one the caller
supplies) or against the differential oracle (:mod:`.oracle`: the same method loaded without
sharing), one row per method (:mod:`.methods`); a sequence step by step, state carried
(:mod:`.sequences`); repeated runs say whether outputs change and why (:mod:`.repeatability`).
How outputs are compared: :mod:`.comparison`; the row they fill: :mod:`.rows`.
"""

from toolkit.engine.verification.comparison import bitwise_equal, compare_outputs, compare_unshared, dtype_tolerance
from toolkit.engine.verification.methods import verify_session
from toolkit.engine.verification.oracle import UNSHARED_POLICY, differential_row, intended_state
from toolkit.engine.verification.references import (
    Reference,
    read_reference,
    read_sequence_reference,
    resolve_references,
)
from toolkit.engine.verification.repeatability import REPEATABILITY_COLUMNS, repeatability
from toolkit.engine.verification.rows import NO_REFERENCE, SEQUENCE_COLUMNS, VERIFY_COLUMNS
from toolkit.engine.verification.sequences import verify_sequence

__all__ = [
    "NO_REFERENCE",
    "REPEATABILITY_COLUMNS",
    "SEQUENCE_COLUMNS",
    "UNSHARED_POLICY",
    "VERIFY_COLUMNS",
    "Reference",
    "bitwise_equal",
    "compare_outputs",
    "compare_unshared",
    "differential_row",
    "dtype_tolerance",
    "intended_state",
    "read_reference",
    "read_sequence_reference",
    "repeatability",
    "resolve_references",
    "verify_sequence",
    "verify_session",
]
