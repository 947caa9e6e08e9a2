"""The one place where event logs become pandas DataFrames, and sessions become text/HTML."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import pandas as pd

from .events import (
    CacheLookup, Decided, DigestCompared, Event, EventLog, FieldCompared, MemorySampled,
)
from .vocab import EventKind

if TYPE_CHECKING:
    from .loader import Session

LOOKUP_COLUMNS = ["seq", "method", "name", "fqn", "result", "cached_owner"]
COMPARISON_COLUMNS = ["seq", "method", "name", "fqn", "field", "cached", "new", "equal"]
DECISION_COLUMNS = [
    "seq", "method", "name", "fqn", "constant_kind", "mutated", "lookup", "decision", "reason_code", "reason",
    "source", "shared_from", "nbytes", "dtype", "shape", "strides", "digest", "cached_method", "cached_dtype",
    "cached_shape", "cached_strides", "cached_digest",
]
MEMORY_COLUMNS = ["seq", "time_s", "method", "device", "phase", "bytes_in_use", "measure"]


def _frame(events: Iterable[Event], columns: list[str] | None = None) -> pd.DataFrame:
    rows = [e.row() for e in events]
    if columns is None:
        cols: list[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        columns = cols or ["seq", "time_s", "kind", "method"]
    return pd.DataFrame(rows, columns=columns).reset_index(drop=True)


def events_frame(log: EventLog) -> pd.DataFrame:
    """Every event, in order; columns are the union of all event fields."""
    return _frame(log)


def _of(log: EventLog, etype: type[Event], columns: list[str]) -> pd.DataFrame:
    return _frame((e for e in log if isinstance(e, etype)), columns)


def lookups_frame(log: EventLog) -> pd.DataFrame:
    return _of(log, CacheLookup, LOOKUP_COLUMNS)


def comparisons_frame(log: EventLog) -> pd.DataFrame:
    """Field-by-field metadata comparisons, plus digest comparisons as field ``digest``."""
    rows = []
    for e in log:
        if isinstance(e, FieldCompared):
            rows.append(e.row())
        elif isinstance(e, DigestCompared):
            r = e.row()
            r["field"] = "digest"
            rows.append(r)
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def decisions_frame(log: EventLog) -> pd.DataFrame:
    return _of(log, Decided, DECISION_COLUMNS)


def memory_frame(log: EventLog) -> pd.DataFrame:
    return _of(log, MemorySampled, MEMORY_COLUMNS)


def decision_counts(decisions: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in decisions["decision"].value_counts().items()}


def session_summary(session: "Session") -> str:
    d = decisions_frame(session.log)
    counts = decision_counts(d) if len(d) else {}
    lines = [
        f"program {session.program.name!r} ({len(session.program.methods)} methods, {session.program.device}) "
        f"under policy {session.policy.name.value!r}: {session.status}",
    ]
    if session.error:
        lines.append(f"  error in {session.failed_method!r}: {session.error}")
    lines.append("  decisions: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    for name, lm in session.methods.items():
        flag = "" if lm.runnable else "  NOT RUNNABLE: " + "; ".join(lm.problems)
        lines.append(f"  {name}: {lm.device_bytes:,} constant bytes on {lm.device}{flag}")
    return "\n".join(lines)


DECISION_COLOURS = {
    "loaded": "#d9ead3", "shared": "#cfe2f3", "declined": "#fff2cc", "private": "#eeeeee", "refused": "#f4cccc",
}


def session_html(session: "Session") -> str:
    import html

    d = decisions_frame(session.log)
    head = html.escape(session_summary(session)).replace("\n", "<br>")
    if not len(d):
        return f"<div><p>{head}</p></div>"
    cols = ["method", "name", "fqn", "lookup", "decision", "reason"]
    out = ["<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr></thead><tbody>"]
    for row in d[cols].itertuples(index=False):
        cells = []
        for c, v in zip(cols, row):
            style = f' style="background-color: {DECISION_COLOURS.get(v, "")}"' if c == "decision" else ""
            cells.append(f"<td{style}>{html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return f"<div><p>{head}</p>{''.join(out)}</div>"


def event_kinds(log: EventLog) -> list[EventKind]:
    return [e.kind for e in log]
