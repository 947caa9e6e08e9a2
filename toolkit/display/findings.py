"""The verification as a notebook shows it: each method's outcome, what it was checked against, and
the constants it runs on other data for, culprits first, with what blame found.

Read from the verdict (:class:`toolkit.core.verdict.Verdict`), never decided again here; rendered
through :func:`~toolkit.display.tables.html_table`, so every value is escaped.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from toolkit.display.cells import cell_text, escaped, is_missing
from toolkit.display.palette import CAUGHT_COLOUR, WRONG_COLOUR, outcome_colour
from toolkit.display.tables import html_table
from toolkit.display.text import Html, note_html

FINDINGS_COLUMN = "runs on other data"
MAX_NAMED = 8  # constants named in one verification cell; the rest counted (every one is in the decisions)


def _named(items: list[str], limit: int = MAX_NAMED, sep: str = ", ") -> str:
    """Up to ``limit`` items, joined, then "... and N more" (a cell stays readable however many
    constants there are; every one is in the decisions)."""
    if len(items) <= limit:
        return sep.join(items)
    return sep.join(items[:limit]) + f" ... and {len(items) - limit:,} more"


def findings_text(verdict: Any, method: str) -> str:
    """A method's constants that run on other data, culprits first, with what blame found said once
    for every constant it was found for: ``"a, b (content differs; culprit: breaks standalone)"``."""
    found = sorted(verdict.findings(method), key=lambda c: list(type(c.blame)).index(c.blame))  # culprits first
    groups: dict[str, list[str]] = {}
    for c in found:
        groups.setdefault(
            f"{c.problem.value if c.problem else 'no known difference'}"
            + (f"; {c.blame.value}: {c.blame_note}" if c.blame_note else ""),
            [],
        ).append(c.name)
    return "; ".join(f"{_named(names)} ({why})" for why, names in groups.items())


def verification_html(frame: pd.DataFrame | None, verdict: Any, *, empty: str = "no methods") -> str:
    """The verification frame (``Session.verify()``) as a table of method, result (the verdict's
    outcome: ok green, wrong / not runnable / failed red, others grey), what it was checked
    against (the verdict's oracle), max abs err, atol, rtol,
    reason, and the constants each method runs on other data for, culprits first, with blame's
    confirmation (culprit, harmless and why, not tested); every value escaped."""
    if frame is None or not len(frame):
        return note_html(escaped(empty))
    outcomes = {m.method: m.outcome.value for m in verdict.methods}
    oracles = {m.method: m.checked_against for m in verdict.methods}
    rows = [
        {
            "method": cell_text(r.get("method")),
            "result": outcomes.get(cell_text(r.get("method")), ""),
            "checked against": oracles.get(cell_text(r.get("method")), ""),
            "max abs err": _number(r.get("max_abs_err"), ".3g"),
            "atol": _number(r.get("atol"), "g"),
            "rtol": _number(r.get("rtol"), "g"),
            "reason": cell_text(r.get("reason")),
            FINDINGS_COLUMN: findings_text(verdict, cell_text(r.get("method"))),
        }
        for r in frame.to_dict("records")
    ]
    table = pd.DataFrame(
        rows, columns=["method", "result", "checked against", "max abs err", "atol", "rtol", "reason", FINDINGS_COLUMN]
    )
    drop = [c for c in ("checked against", "atol", "rtol", "max abs err") if (table[c] == "").all()]
    if not verdict.constants:
        drop.append(FINDINGS_COLUMN)
    return html_table(
        table.drop(columns=drop),
        max_rows=len(table),
        empty=empty,
        colours={
            "result": outcome_colour,
            FINDINGS_COLUMN: lambda text: WRONG_COLOUR if "culprit" in text else (CAUGHT_COLOUR if text else ""),
        },
    )


def verification_table(frame: pd.DataFrame, verdict: Any) -> Html:
    """``session.verify()`` for a notebook, its results read from ``verdict`` (:func:`verification_html`)."""
    return Html(verification_html(frame, verdict), frame.to_string(index=False) if frame is not None else "no methods")


def _number(v: Any, spec: str) -> str:
    if is_missing(v):
        return ""
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return cell_text(v)
