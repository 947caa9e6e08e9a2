"""HTML tables for notebooks, reports and the explorer: one renderer, through pandas' Styler.

Everything that shows a frame as HTML (the session's notebook display, the collision
report's, the explorer's tables) goes through :func:`html_table` or
:func:`verification_html`, so all of them

- escape every value that comes from the data: cells, column labels, the caption, the
  "empty" text and the "more rows" hint (constant names and FQNs come from the program,
  which may be untrusted).  Cells are first turned into display text here (see
  :func:`cell_text`) and only then handed to ``Styler.format(escape="html")``, so no value
  reaches the page unescaped, whatever its type;
- switch MathJax off for the table (pandas adds the ``tex2jax_ignore mathjax_ignore``
  classes), so a ``$...$`` in a name is shown as typed, not typeset;
- colour the ``decision`` column by :data:`DECISION_COLOURS` and the boolean verification
  columns (``ok``, ``method_ok``) red when False and green when True;
- show None / NaN / ``pd.NA`` as an empty cell, an Enum member by its ``.value`` and a
  list, tuple or set as comma-joined text.

The output is plain HTML (a ``<style>`` block scoped to the table's id, then the table):
no JavaScript, and the same frame always renders to the same text (the table id is a
digest of what is shown, not random).

This module imports only pandas and the standard library (pandas' Styler needs jinja2,
imported by pandas when a table is first rendered).
"""

from __future__ import annotations

import enum
import hashlib
import html
import math
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

# decision -> background colour; the one palette of the notebook display, reports, explorer and plots.
DECISION_COLOURS: dict[str, str] = {
    "loaded": "#d9ead3", "shared": "#cfe2f3", "declined": "#fff2cc", "private": "#eeeeee", "refused": "#f4cccc",
}
OK_COLOUR = "#d9ead3"      # a method that reproduced its reference
WRONG_COLOUR = "#f4cccc"   # a method that did not
NOT_RUN_COLOUR = "#eeeeee"  # a method that never ran

# columns holding a method's verification outcome (True: matched its eager reference)
VERIFICATION_BOOL_COLUMNS = ("ok", "method_ok")
TABLE_CLASS = "constshare-table"
DEFAULT_MAX_ROWS = 200

Colourer = Callable[[str], str]  # display text -> CSS colour ("" for none)


# ------------------------------------------------------------------ cell text


def _is_missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    try:
        return bool(pd.api.types.is_scalar(v) and pd.isna(v))
    except (TypeError, ValueError):
        return False


def cell_text(v: Any) -> str:
    """The text a cell shows (not yet escaped): '' for None / NaN / NA, an Enum by its
    value, a list / tuple / set as comma-joined text (sets sorted), anything else ``str``."""
    if isinstance(v, enum.Enum):
        return cell_text(v.value)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return ", ".join(cell_text(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return ", ".join(sorted(cell_text(x) for x in v))
    if _is_missing(v):
        return ""
    return str(v)


def _escape(text: Any) -> str:
    return html.escape(cell_text(text), quote=True)


def _note(text: str) -> str:
    """A paragraph of (escaped) text, MathJax off like the tables."""
    return f'<p class="tex2jax_ignore mathjax_ignore"><i>{text}</i></p>'


# ------------------------------------------------------------------ colours


def decision_colour(text: str) -> str:
    return DECISION_COLOURS.get(text, "")


def verdict_colour(text: str) -> str:
    """Colour of a boolean verification cell: False red, True green, empty / other none."""
    return {"False": WRONG_COLOUR, "True": OK_COLOUR}.get(text, "")


def default_colourers(columns: Iterable[Any]) -> dict[Any, Colourer]:
    """The colour rule of each column that has one, among ``columns``."""
    out: dict[Any, Colourer] = {}
    for c in columns:
        if c == "decision":
            out[c] = decision_colour
        elif c in VERIFICATION_BOOL_COLUMNS:
            out[c] = verdict_colour
    return out


# ------------------------------------------------------------------ tables


def _select(frame: pd.DataFrame, columns: Iterable[Any] | None) -> list[int]:
    """Positions of the requested columns that the frame has, in the requested order, each
    once (all columns when None)."""
    labels = list(frame.columns)
    if columns is None:
        return list(range(len(labels)))
    wanted = [columns] if isinstance(columns, str) else list(columns)
    out: list[int] = []
    for c in wanted:
        for j, label in enumerate(labels):
            if label == c and j not in out:
                out.append(j)
    return out


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype)


def _render(display: pd.DataFrame, labels: list[str], *, colours: Mapping[int, Colourer],
            right: Iterable[int], caption: str) -> str:
    """``display`` (text cells only, columns 0..n-1, RangeIndex) through the Styler, with
    ``labels`` (unescaped text) as the column headers."""
    digest = hashlib.blake2b(digest_size=6)
    for part in (repr(labels), caption, *display.to_numpy().ravel().tolist()):
        digest.update(str(part).encode("utf-8", "surrogatepass") + b"\x00")
    headers = [html.escape(t, quote=True) for t in labels]
    styler = display.style
    styler.cell_ids = False  # ids only on the cells a colour rule styles: smaller HTML
    styler = (styler.set_uuid(digest.hexdigest())
              .format(escape="html")
              # headers by position (labels may repeat or not be text); escaped above
              .format_index(lambda i: headers[i], axis=1)
              .hide(axis="index")
              .set_table_attributes(f'class="{TABLE_CLASS}"')
              .set_table_styles([{"selector": "th", "props": "text-align: left"},
                                 {"selector": "td", "props": "text-align: left"}]))
    right = list(right)
    if right:
        styler = styler.set_table_styles({i: [{"selector": "td", "props": "text-align: right"}] for i in right},
                                         overwrite=False)
    for i, colour in colours.items():
        cell_map = getattr(styler, "map", None) or styler.applymap  # Styler.map is pandas >= 2.1
        styler = cell_map(lambda text, colour=colour: (f"background-color: {c}" if (c := colour(text)) else ""),
                          subset=[i])
    if caption:
        # the Styler does not escape the caption: done here; line breaks kept
        styler = styler.set_caption(html.escape(caption, quote=True).replace("\n", "<br>"))
    n_rows, n_cols = display.shape
    with pd.option_context("styler.html.mathjax", False,
                           "styler.render.max_elements", max(n_rows * n_cols, 1) + 1):
        return styler.to_html(max_rows=n_rows + 1, max_columns=n_cols + 1)


def html_table(frame: pd.DataFrame, columns: Iterable[Any] | None = None, *, max_rows: int = DEFAULT_MAX_ROWS,
               caption: str = "", empty: str = "no rows", more_hint: str = "",
               colours: Mapping[Any, Colourer] | None = None) -> str:
    """``frame`` as an HTML table (see the module docstring), every value escaped.

    ``columns``: which columns, in which order (those the frame lacks are skipped; all when
    None).  Rows past ``max_rows`` are cut, with a note "... N more rows" followed by
    ``more_hint`` (plain text, escaped).  A frame with no rows (or none of the columns)
    gives ``<p><i>{empty}</i></p>``.  ``caption`` is plain text (escaped; line breaks kept).
    ``colours`` replaces the default colour rules (column -> function of the cell's text
    giving a CSS colour or '').
    """
    positions = _select(frame, columns)
    if not len(frame) or not positions:
        return _note(_escape(empty))
    max_rows = max(int(max_rows), 0)
    shown = frame.iloc[:max_rows, positions]
    cols = list(shown.columns)
    display = pd.DataFrame({i: [cell_text(v) for v in shown.iloc[:, i].tolist()] for i in range(len(cols))},
                           index=pd.RangeIndex(len(shown)), columns=pd.RangeIndex(len(cols)), dtype=object)
    rules = default_colourers(cols) if colours is None else dict(colours)
    out = _render(display, [cell_text(c) for c in cols],
                  colours={i: rules[c] for i, c in enumerate(cols) if c in rules},
                  right=[i for i in range(len(cols)) if _numeric(shown.iloc[:, i])], caption=caption)
    hidden = len(frame) - len(shown)
    if hidden > 0:
        hint = f": {_escape(more_hint)}" if more_hint else ""
        out += f'<p class="constshare-more tex2jax_ignore mathjax_ignore">... {hidden:,} more rows{hint}</p>'
    return out


def _result(row: Mapping[str, Any]) -> str:
    ok, ran = row.get("ok"), row.get("ran")
    if not _is_missing(ok) and bool(ok):
        return "ok"
    return "WRONG" if (not _is_missing(ran) and bool(ran)) else "not run"


def _number(v: Any, spec: str) -> str:
    if _is_missing(v):
        return ""
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return cell_text(v)


RESULT_COLOURS = {"ok": OK_COLOUR, "WRONG": WRONG_COLOUR, "not run": NOT_RUN_COLOUR}


def verification_html(frame: pd.DataFrame | None, *, empty: str = "no methods") -> str:
    """The verification frame (``Session.verify()``: method, ran, max_abs_err, atol, rtol,
    ok, reason) as a table of method, result (ok green / WRONG red / not run grey), max abs
    err, atol, rtol and reason; every value escaped."""
    if frame is None or not len(frame):
        return _note(_escape(empty))
    rows = []
    for r in frame.to_dict("records"):
        rows.append({"method": cell_text(r.get("method")), "result": _result(r),
                     "max abs err": _number(r.get("max_abs_err"), ".3g"),
                     "atol": _number(r.get("atol"), "g"), "rtol": _number(r.get("rtol"), "g"),
                     "reason": cell_text(r.get("reason"))})
    table = pd.DataFrame(rows, columns=["method", "result", "max abs err", "atol", "rtol", "reason"])
    if "rtol" not in frame.columns:
        table = table.drop(columns="rtol")
    return html_table(table, max_rows=len(table), empty=empty,
                      colours={"result": lambda text: RESULT_COLOURS.get(text, "")})


# ------------------------------------------------------------------ sessions


SESSION_TABLE_COLUMNS = ("method", "name", "fqn", "lookup", "decision", "reason_code", "reason", "shared_from")


def _session_facts(session: Any) -> tuple[pd.DataFrame, dict[str, int], list[Any]]:
    """What a session display reads: its decisions, their counts, and the methods it loaded."""
    d = session.decisions
    counts = {str(k): int(v) for k, v in d["decision"].value_counts().items()} if len(d) else {}
    loaded = [r for r in session.results.values() if cell_text(r.status) in ("loaded", "unloaded")]
    return d, counts, loaded


def session_text(session: Any) -> str:
    """A few lines for a terminal: status, decision counts, bytes per method."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    lines = [f"program {program.name!r} ({len(program.methods)} methods, {program.device}) "
             f"under policy {session.policy.name.value!r}: {cell_text(session.status)}"]
    if session.error:
        lines.append(f"  error in {session.failed_method!r}: {session.error}")
    lines.append("  decisions: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    if loaded:
        blobs = {m.name: m.blob_bytes for m in program.methods}
        unshared = sum(blobs[r.method] for r in loaded)
        lines.append(f"  {session.device_bytes:,} constant bytes on device in all "
                     f"(each of these methods on its own blob: {unshared:,})")
    for r in loaded:
        flag = "" if r.runnable else "  NOT RUNNABLE: " + "; ".join(r.problems)
        lines.append(f"  {r.method}: {r.device_bytes:,} constant bytes on {r.device}{flag}")
    return "\n".join(lines)


def session_html(session: Any, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """The notebook view of a session: summary, decision counts as a colour key, the decision table."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    ok = cell_text(session.status) == "loaded"
    status = (f"<span style=\"color: {'#38761d' if ok else '#cc0000'}; font-weight: bold\">"
              f"{_escape(cell_text(session.status))}</span>")
    parts = [f"<p><b>{_escape(program.name)}</b> ({len(program.methods)} methods, {_escape(program.device)}) "
             f"under policy <b>{_escape(session.policy.name.value)}</b>: {status}</p>"]
    if session.error:
        parts.append(f"<p style=\"color: #cc0000\">error in {_escape(repr(session.failed_method))}: "
                     f"{_escape(session.error)}</p>")
    badges = " ".join(f"<span style=\"background-color: {DECISION_COLOURS.get(k, '#ffffff')}; padding: 1px 6px; "
                      f"border-radius: 3px\">{_escape(k)} {v}</span>" for k, v in sorted(counts.items()))
    parts.append(f"<p>decisions: {badges or 'none'}</p>")
    if loaded:
        per_method = ", ".join(f"{_escape(r.method)} {r.device_bytes:,}" + ("" if r.runnable else
                                                                             " <b>(not runnable)</b>")
                               for r in loaded)
        parts.append(f"<p>constant bytes on device: {session.device_bytes:,} ({per_method})</p>")
    if len(d):
        parts.append(html_table(d, SESSION_TABLE_COLUMNS, max_rows=max_rows, more_hint="see session.decisions"))
    return f"<div>{''.join(parts)}</div>"
