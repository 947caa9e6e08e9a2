"""A session as a notebook and a terminal show it: status, decision counts, the content check,
memory per method, the collisions (culprits first) and every decision in a collapsed box.

:meth:`toolkit.engine.session.Session.__repr__` and ``_repr_html_`` call :func:`session_text` and
:func:`session_html`; the explorer shows :func:`session_facts_html`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from toolkit.display.cells import cell_text, escaped, format_bytes, one_line
from toolkit.display.content import caught_mask, content_check, content_summary, culprit_mask
from toolkit.display.palette import CULPRIT_STYLE, DECISION_COLOURS, OK_MARK, PAPER, WRONG_COLOUR, WRONG_MARK
from toolkit.display.tables import CAPPED_EM, DEFAULT_MAX_ROWS, html_table
from toolkit.display.text import note_html

SESSION_TABLE_COLUMNS = (
    "method",
    "name",
    "fqn",
    "lookup",
    "decision",
    "same_content",
    "reason_code",
    "reason",
    "shared_from",
)
# names and FQNs at a capped width, whole on hover, so the tables fit a notebook's width: the collisions
# (where the share came from narrower), and every decision (two more columns, so all narrower)
SESSION_CAPPED = {"name": CAPPED_EM, "fqn": CAPPED_EM, "shared_from": 16}
SESSION_ALL_CAPPED = {"name": 16, "fqn": 16, "shared_from": 16}
SESSION_ALL_ROWS = 2000  # rows inside the "every decision" box; past that, session.decisions


def _session_facts(session: Any) -> tuple[pd.DataFrame, dict[str, int], list[Any]]:
    """What a session display reads: its decisions, their counts, and the methods it loaded."""
    d = session.decisions
    counts = {str(k): int(v) for k, v in d["decision"].value_counts().items()} if len(d) else {}
    loaded = [r for r in session.results.values() if cell_text(r.status) in ("loaded", "unloaded")]
    return d, counts, loaded


def _collisions(d: pd.DataFrame) -> pd.DataFrame:
    """The decisions whose name was already in the cache, culprits first (then caught
    collisions, then the rest, each in load order), with ``same_content``."""
    checked = content_check(d)
    if "lookup" not in checked.columns:
        return checked.iloc[:0]
    hits = checked[checked["lookup"].map(cell_text) == "hit"]
    rank = culprit_mask(hits).map({True: 0, False: 2}) - caught_mask(hits).astype(int)
    return hits.assign(_rank=rank.to_numpy()).sort_values("_rank", kind="stable").drop(columns="_rank")


def session_text(session: Any) -> str:
    """A few lines for a terminal: status, decision counts, content check, bytes per method."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    lines = [
        f"program {program.name!r} ({len(program.methods)} methods, {program.device}) "
        f"under policy {session.policy.name.value!r}: {cell_text(session.status)}"
    ]
    if session.error:
        lines.append(f"  error in {session.failed_method!r}: {session.error}")
    lines.append("  decisions: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    culprits, caught = content_summary(d)
    if culprits or caught:
        lines.append(
            f"  content check: {culprits} run on other data than their own, {caught} collisions of "
            f"different content caught"
        )
    if loaded:
        blobs = {m.name: m.blob_bytes for m in program.methods}
        unshared = sum(blobs[r.method] for r in loaded)
        lines.append(
            f"  {session.device_bytes:,} constant bytes on device in all "
            f"(each of these methods on its own blob: {unshared:,})"
        )
    for r in loaded:
        flag = "" if r.runnable else "  NOT RUNNABLE: " + "; ".join(r.problems)
        lines.append(f"  {r.method}: {r.device_bytes:,} constant bytes on {r.device}{flag}")
    return "\n".join(one_line(line) for line in lines)  # a line break in a name or an error forges no line


def session_facts_html(session: Any, *, predicted: bool = False, name: str | None = None) -> str:
    """A session's summary as a small table of facts (program, policy, status, decisions, memory
    in binary units, the exact count on hover); ``predicted``: a dry run, its status "predicted"."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    devices = ", ".join(sorted({cell_text(x) for x in session.devices.values()})) or cell_text(program.device)
    status = "predicted (dry run: nothing loaded or run)" if predicted else cell_text(session.status)
    facts = [
        ("program", f"{name or program.name} ({len(program.methods)} methods, on {devices})"),
        ("policy", session.policy.name.value),
        ("status", status),
        ("decisions", f"{len(d):,}: " + (", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) or "none")),
    ]
    if session.error:
        facts.append(("error", f"in {session.failed_method!r}: {session.error}"))
    if loaded:
        blobs = {m.name: m.blob_bytes for m in program.methods}
        unshared = sum(blobs[r.method] for r in loaded)
        on = "would be" if predicted else "are"
        facts.append(
            (
                "constant bytes",
                f"{format_bytes(session.device_bytes)} {on} on the device; "
                f"{format_bytes(unshared)} with each method on its own blob",
            )
        )
        facts += [
            (
                f"  {r.method}",
                format_bytes(r.device_bytes) + ("" if r.runnable else " (NOT RUNNABLE: " + "; ".join(r.problems) + ")"),
            )
            for r in loaded
        ]
    frame = pd.DataFrame(facts, columns=["fact", "value"])
    return html_table(
        frame,
        max_rows=len(frame),
        colours={"value": lambda text: WRONG_COLOUR if "NOT RUNNABLE" in text or text.startswith("in '") else ""},
    )


def session_html(session: Any, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """The notebook view of a session: a summary with the decision counts as a colour key,
    the content check, the collisions (names already cached; the culprits first), and every
    decision inside a collapsed, scrolling box."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    verdict = session.known_verdict() if hasattr(session, "known_verdict") else None
    loaded_ok = cell_text(session.status) == "loaded"
    # green only for what is known good: a loaded session whose verdict is ok (or not yet verified: no colour)
    colour = WRONG_MARK if not loaded_ok else (None if verdict is None else _verdict_mark(verdict))
    shown = cell_text(session.status) + (f"; {verdict.outcome.value}" if verdict is not None and loaded_ok else "")
    status = f'<span style="color: {colour}; font-weight: bold">{escaped(shown)}</span>' if colour else escaped(shown)
    parts = [
        f"<p><b>{escaped(program.name)}</b> ({len(program.methods)} methods, {escaped(program.device)}) "
        f"under policy <b>{escaped(session.policy.name.value)}</b>: {status}</p>"
    ]
    if session.error:
        parts.append(
            f'<p style="color: {WRONG_MARK}">error in {escaped(repr(session.failed_method))}: '
            f"{escaped(session.error)}</p>"
        )
    badges = " ".join(
        f'<span style="background-color: {DECISION_COLOURS.get(k, PAPER)}; padding: 1px 6px; '
        f'border-radius: 3px">{escaped(k)} {v}</span>'
        for k, v in sorted(counts.items())
    )
    parts.append(f"<p>{len(d):,} decisions: {badges or 'none'}</p>")
    if loaded:
        per_method = ", ".join(
            f"{escaped(r.method)} {format_bytes(r.device_bytes)}" + ("" if r.runnable else " <b>(not runnable)</b>")
            for r in loaded
        )
        parts.append(
            f"<p>constant bytes on device: {format_bytes(session.device_bytes)} "
            f"({session.device_bytes:,}; {per_method})</p>"
        )
    if len(d):
        culprits, caught = content_summary(d)
        if culprits:
            parts.append(
                f'<p><span style="{CULPRIT_STYLE}; padding: 1px 6px">{culprits} constant'
                f"{'s' if culprits != 1 else ''} run on other data than their own</span> (the content "
                f"differs, the state is another buffer's, or the tensor cannot fill the slot)"
                + (f"; {caught} collision{'s' if caught != 1 else ''} of different content caught" if caught else "")
                + "</p>"
            )
        elif caught:
            parts.append(
                f"<p>{caught} collision{'s' if caught != 1 else ''} of different content caught "
                f"(declined or refused); nothing was shared across different content</p>"
            )
        hits = _collisions(d)
        if len(hits):
            parts.append(
                f"<p><b>collisions</b>: {len(hits):,} name{'s' if len(hits) != 1 else ''} already in the "
                f"cache when {'their' if len(hits) != 1 else 'its'} method loaded</p>"
            )
            blamed = "culprit" in hits.columns and bool((hits["culprit"].map(cell_text) != "").any())
            # every one of them is a cache hit (no lookup column); the reason is on hover over its
            # code, so the table fits a notebook's width
            parts.append(
                html_table(
                    hits,
                    [c for c in SESSION_TABLE_COLUMNS if c not in ("lookup", "reason")]
                    + (["culprit"] if blamed else []),
                    max_rows=max_rows,
                    capped=SESSION_CAPPED,
                    more_hint="see session.decisions (the full reason is on hover over its code)",
                )
            )
        else:
            parts.append(note_html("no collisions: no name was already in the cache when its method loaded"))
        # as the collisions: the reason on hover over its code, long names cut (whole on hover)
        every = html_table(
            content_check(d),
            [c for c in SESSION_TABLE_COLUMNS if c != "reason"],
            max_rows=SESSION_ALL_ROWS,
            capped=SESSION_ALL_CAPPED,
            more_hint="see session.decisions (the full reason is on hover over its code)",
        )
        parts.append(
            f'<details class="constshare-all"><summary>show all {len(d):,} decisions</summary>'
            f'<div style="max-height: 32em; overflow: auto">{every}</div></details>'
        )
    return f'<div class="constshare-session">{"".join(parts)}</div>'


def _verdict_mark(verdict: Any) -> str | None:
    """The status's colour from the verdict: green ok, red wrong or failed, none for not verified."""
    outcome = verdict.outcome.value
    if outcome == "ok":
        return OK_MARK
    return None if outcome == "no reference" else WRONG_MARK
