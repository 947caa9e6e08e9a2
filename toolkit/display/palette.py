"""Every colour the package draws with, and which cell text gets which colour.

The notebook display, the reports, the explorer and the plots all read their colours here, so a
decision or an outcome looks the same everywhere.  Colours of decisions are keyed by
:class:`~toolkit.core.vocab.Decision`, of outcomes by :class:`~toolkit.core.vocab.MethodOutcome`
(both are ``StrEnum``: a plain text looks them up too).  Two families: pastel backgrounds for
table cells and matrix cells, and saturated marks for text, lines, outlines and markers on white.
"""

from __future__ import annotations

import re
from typing import Callable

from toolkit.core.vocab import Decision, EventKind, MethodOutcome

Colourer = Callable[[str], str]  # display text -> CSS colour ("" for none)

# ------------------------------------------------------------------ backgrounds (table and matrix cells)

DECISION_COLOURS: dict[Decision, str] = {
    Decision.LOADED: "#d9ead3",
    Decision.SHARED: "#cfe2f3",
    Decision.DECLINED: "#fff2cc",
    Decision.PRIVATE: "#eeeeee",
    Decision.REFUSED: "#f4cccc",
    Decision.NEVER_FILLED: "#ea9999",
}
OK_COLOUR = "#d9ead3"  # background of a cell whose method reproduced its reference
WRONG_COLOUR = "#f4cccc"  # background of a cell whose method did not (or of any failure a table shows)
NOT_RUN_COLOUR = "#eeeeee"  # background of a cell whose method never ran
CAUGHT_COLOUR = "#fff2cc"  # background of a cell whose content differs, and the share was declined or refused
CULPRIT_FACE = "#ea9999"  # a matrix cell whose method runs on other data for that constant (its data_problem)
PAPER = "#ffffff"  # the ground: an empty matrix cell, a figure's background, a label's box
BAND = "#eeeeee"  # a light band behind other marks: a method's whole load, a group's header row
BAND_EDGE = "#bbbbbb"  # the outline of a band

OUTCOME_COLOURS: dict[MethodOutcome, str] = {
    MethodOutcome.OK: OK_COLOUR,
    MethodOutcome.WRONG: WRONG_COLOUR,
    MethodOutcome.NOT_RUNNABLE: WRONG_COLOUR,
    MethodOutcome.FAILED: WRONG_COLOUR,
    MethodOutcome.REFUSED: NOT_RUN_COLOUR,
    MethodOutcome.NOT_REACHED: NOT_RUN_COLOUR,
    MethodOutcome.NO_REFERENCE: NOT_RUN_COLOUR,
}
# the notebooks' scorecard texts that are no method outcome
SCORECARD_COLOURS: dict[str, str] = {"not run": NOT_RUN_COLOUR, "load refused": NOT_RUN_COLOUR}

# ------------------------------------------------------------------ marks (text, lines, outlines, markers on white)

DECISION_MARKS: dict[Decision, str] = {
    Decision.LOADED: "#6aa84f",
    Decision.SHARED: "#3d85c6",
    Decision.DECLINED: "#f1c232",
    Decision.PRIVATE: "#999999",
    Decision.REFUSED: "#cc0000",
    Decision.NEVER_FILLED: "#660000",
}
WRONG_MARK = "#cc0000"  # a wrong or failed result drawn on white: plot outlines, markers, labels, a status's text
OK_MARK = "#38761d"  # a good status's text on white
ERROR_TEXT = "#a00"  # an error's text in the explorer's status and banners
WARNING_TEXT = "#7f6000"  # a warning's text: a stale result, a note in a report
CORRECT_MARK = "#3d85c6"  # a policy whose program loaded with every method right (the trade-off plot)
NOT_LOADED_MARK = "#999999"  # a policy whose program did not load (the trade-off plot)
CULPRIT_TEXT = "#990000"  # the text of a culprit's table cell
CULPRIT_INK = "#7f0000"  # the letter of a culprit's matrix cell
INK = "#222222"  # text drawn inside a figure
CELL_EDGE = "#888888"  # the outline of a matrix cell or a legend square
DIVIDER = "#999999"  # the line between groups of an interactive matrix's columns
FLOOR_MARK = "#444444"  # the minimum a perfect loader needs, drawn as a dashed line
STEP_COLOURS: dict[EventKind, str] = {
    EventKind.CONTAINER_CREATED: "#8e7cc3",
    EventKind.BLOB_UPLOADED: "#e69138",
    EventKind.CONSTANT_UPLOADED: "#45818e",
}
METHOD_COLOURMAP = "tab10"  # matplotlib colour map of the methods in a stacked bar

# a constant its method runs on other data for (the verdict's data_problem): the suspect of a wrong output
CULPRIT_STYLE = f"background-color: {WRONG_COLOUR}; color: {CULPRIT_TEXT}; font-weight: bold"

# ------------------------------------------------------------------ colour rules: a cell's text -> its background


def decision_colour(text: str) -> str:
    return DECISION_COLOURS.get(text, "")


def verdict_colour(text: str) -> str:
    """Colour of a boolean verification cell: False red, True green, empty / other none."""
    return {"False": WRONG_COLOUR, "True": OK_COLOUR}.get(text, "")


def equal_colour(text: str) -> str:
    """An ``equal`` cell of a field-by-field comparison: unequal (False / NO) red."""
    return WRONG_COLOUR if text in ("False", "NO", "no") else ""


def outcome_colour(text: str) -> str:
    """An outcome text: ``ok`` green, ``wrong`` / ``WRONG ...`` / ``not runnable`` / ``failed`` red,
    ``refused`` / ``no reference`` / ``not run`` grey."""
    if text.startswith("WRONG"):
        return WRONG_COLOUR
    return OUTCOME_COLOURS.get(text) or SCORECARD_COLOURS.get(text, "")


def count_colour(text: str) -> str:
    """A count of failures: 0 green, anything else red."""
    return OK_COLOUR if text == "0" else (WRONG_COLOUR if text else "")


_OUTCOME_RE = re.compile("|".join(re.escape(str(t)) for t in [*OUTCOME_COLOURS, *SCORECARD_COLOURS]) + r"|WRONG\b.*|")


def is_outcome_column(texts: list[str]) -> bool:
    """Whether a column's texts are outcomes (a scorecard's ``ok`` / ``WRONG: decode`` cells), empty ones aside."""
    return any(t in ("ok", "wrong") or t.startswith("WRONG") for t in texts) and all(
        _OUTCOME_RE.fullmatch(t) for t in texts
    )
