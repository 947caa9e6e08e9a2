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
    """A few lines for a terminal: status, decision counts, bytes per method."""
    d = decisions_frame(session.log)
    counts = decision_counts(d) if len(d) else {}
    lines = [
        f"program {session.program.name!r} ({len(session.program.methods)} methods, {session.program.device}) "
        f"under policy {session.policy.name.value!r}: {session.status}",
    ]
    if session.error:
        lines.append(f"  error in {session.failed_method!r}: {session.error}")
    lines.append("  decisions: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    if session.methods:
        unshared = sum(lm.spec.blob_bytes for lm in session.methods.values())
        lines.append(f"  {session.device_bytes:,} constant bytes on device in all "
                     f"(each of these methods on its own blob: {unshared:,})")
    for name, lm in session.methods.items():
        flag = "" if lm.runnable else "  NOT RUNNABLE: " + "; ".join(lm.problems)
        lines.append(f"  {name}: {lm.device_bytes:,} constant bytes on {lm.device}{flag}")
    return "\n".join(lines)


# Background colours of decisions in HTML tables and plots (pastel, so text on them stays readable).
DECISION_COLOURS = {
    "loaded": "#d9ead3", "shared": "#cfe2f3", "declined": "#fff2cc", "private": "#eeeeee", "refused": "#f4cccc",
}
_HTML_MAX_ROWS = 200


def session_html(session: "Session") -> str:
    """The notebook view of a session: summary, decision counts as a colour key, and the
    decision table with the decision column colour-coded.  Every value is escaped (constant
    names come from the program, which may be untrusted)."""
    import html

    d = decisions_frame(session.log)
    counts = decision_counts(d) if len(d) else {}
    ok = session.status == "loaded"
    status = (f"<span style=\"color: {'#38761d' if ok else '#cc0000'}; font-weight: bold\">"
              f"{html.escape(session.status)}</span>")
    title = (f"<b>{html.escape(session.program.name)}</b> ({len(session.program.methods)} methods, "
             f"{html.escape(session.program.device)}) under policy <b>{html.escape(session.policy.name.value)}</b>: "
             f"{status}")
    parts = [f"<p>{title}</p>"]
    if session.error:
        parts.append(f"<p style=\"color: #cc0000\">error in {html.escape(repr(session.failed_method))}: "
                     f"{html.escape(session.error)}</p>")
    badges = " ".join(
        f"<span style=\"background-color: {DECISION_COLOURS.get(k, '#ffffff')}; padding: 1px 6px; "
        f"border-radius: 3px\">{html.escape(k)} {v}</span>" for k, v in sorted(counts.items()))
    parts.append(f"<p>decisions: {badges or 'none'}</p>")
    if session.methods:
        per_method = ", ".join(
            f"{html.escape(name)} {lm.device_bytes:,}" + ("" if lm.runnable else " <b>(not runnable)</b>")
            for name, lm in session.methods.items())
        parts.append(f"<p>constant bytes on device: {session.device_bytes:,} ({per_method})</p>")
    if len(d):
        cols = ["method", "name", "fqn", "lookup", "decision", "reason_code", "reason", "shared_from"]
        out = ["<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr></thead><tbody>"]
        for row in d[cols].head(_HTML_MAX_ROWS).itertuples(index=False):
            cells = []
            for c, v in zip(cols, row):
                text = str(getattr(v, "value", v))
                style = f' style="background-color: {DECISION_COLOURS.get(text, "")}"' if c == "decision" else ""
                cells.append(f"<td{style}>{html.escape(text)}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</tbody></table>")
        if len(d) > _HTML_MAX_ROWS:
            out.append(f"<p>… {len(d) - _HTML_MAX_ROWS} more rows: see <code>session.decisions</code></p>")
        parts.append("".join(out))
    return f"<div>{''.join(parts)}</div>"


def event_kinds(log: EventLog) -> list[EventKind]:
    return [e.kind for e in log]
