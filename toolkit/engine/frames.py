"""The one place where events and load results become pandas DataFrames.

Imports nothing from the loader: it reads an :class:`~toolkit.core.events.EventLog` and plain
result records (anything with the attributes of :class:`toolkit.engine.loader.MethodResult`).
Enum members become their string values, so frames hold what CSV files and tables show.
"""

from __future__ import annotations

import enum
from dataclasses import fields
from typing import Any, Iterable

import pandas as pd

from toolkit.core.events import (
    CacheLookup,
    CulpritTried,
    Decided,
    DigestCompared,
    Event,
    EventLog,
    FieldCompared,
    MemorySampled,
)
from toolkit.core.verdict import CheckRow, ConstantFinding, MethodVerdict, Verdict, ran_wrong

LOOKUP_COLUMNS = ["seq", "method", "name", "fqn", "storage_key", "result", "cached_owner"]
COMPARISON_COLUMNS = ["seq", "method", "name", "fqn", "field", "cached", "new", "equal"]
DECISION_COLUMNS = [
    "seq",
    "method",
    "device",
    "name",
    "fqn",
    "storage_key",
    "constant_kind",
    "mutated",
    "lookup",
    "decision",
    "reason_code",
    "reason",
    "origin",
    "shared_from",
    "nbytes",
    "dtype",
    "shape",
    "strides",
    "digest",
    "cached_method",
    "cached_dtype",
    "cached_shape",
    "cached_strides",
    "cached_digest",
    "slot_problem",
    "data_problem",
    "upstream_keeps",
    "culprit",
]
MEMORY_COLUMNS = ["seq", "time_s", "method", "device", "phase", "bytes_in_use", "measure"]
METHOD_RESULT_COLUMNS = [
    "policy",
    "method",
    "device",
    "status",
    "whole_blob",
    "blob_bytes",
    "own_upload_bytes",
    "device_bytes",
    "runnable",
    "problems",
    "error",
]
# A dry run's decisions (toolkit.dry_run): the decision table without its event sequence
# number, plus the policy and what the method as a whole would do.
DRY_RUN_COLUMNS = ["policy"] + DECISION_COLUMNS[1:] + ["whole_blob", "method_status"]


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


def _enum_values(values: list[Any]) -> list[Any]:
    """A column's enum members as their values (others as they are), as :func:`_plain` does one by one."""
    if not values or not isinstance(values[0], enum.Enum):
        return values
    by_member = {m: m.value for m in type(values[0])}
    try:
        return [by_member[v] if isinstance(v, enum.Enum) else v for v in values]
    except KeyError:  # a member of another enum
        return [_plain(v) for v in values]


def _columns(log: EventLog, event_type: type[Event], columns: list[str]) -> pd.DataFrame:
    """A frame of one event type, built column by column (far less memory and time than a dict per row).

    Each column becomes its array before the next one is read, and the frame takes the
    arrays without copying them: at most one column of Python values is alive at a time.
    """
    data = {}
    for c in columns:
        values = _enum_values(log.column(event_type, c))
        if not values:
            return pd.DataFrame({c: [] for c in columns}, columns=columns)
        data[c] = pd.Series(values, name=c, copy=False)
        del values
    return pd.DataFrame(data, columns=columns, copy=False)


_NAN = float("nan")  # what a row-dict frame holds where an event has no such field
_ROW_KEYS: dict[type, tuple[str, ...]] = {}


def _row_keys(event_type: type[Event]) -> tuple[str, ...]:
    """The keys of ``Event.row()`` for one event type, in its order."""
    keys = _ROW_KEYS.get(event_type)
    if keys is None:
        keys = _ROW_KEYS[event_type] = ("seq", "time_s", "kind") + tuple(
            f.name for f in fields(event_type) if f.name not in ("seq", "time_s")
        )
    return keys


def _row_values(values: list[Any]) -> list[Any]:
    """``Event.row()``'s rule on a column of values: a str enum member becomes its value."""
    if any(isinstance(v, str) and type(v) is not str for v in values):
        return [v.value if hasattr(v, "value") and isinstance(v, str) else v for v in values]
    return values


def rows_frame(
    rows: list[dict[str, Any]], *, kind: str | None = None, columns: list[str] | None = None
) -> pd.DataFrame:
    """Event rows (``Event.row()`` dicts, e.g. streamed by an isolated worker) as a frame.

    ``kind`` keeps one kind of event; without ``columns`` the columns are the union of fields.
    """
    if kind is not None:
        rows = [r for r in rows if r.get("kind") == kind]
    if columns is None:
        cols: list[str] = []
        seen: set[str] = set()
        for r in rows:
            for k in r:
                if k not in seen:
                    seen.add(k)
                    cols.append(k)
        columns = cols or ["seq", "time_s", "kind", "method"]
    return pd.DataFrame(rows, columns=columns)


def events_frame(log: EventLog) -> pd.DataFrame:
    """Every event, in order; columns are the union of all event fields.

    The frame ``rows_frame([e.row() for e in log])`` gives (same columns, order, values and
    dtypes; NaN where an event has no such field), built column by column: no dict per
    event and no two-dimensional object array, which would dominate the time and peak memory
    of a dry run of hundreds of thousands of constants.
    """
    events = list(log)
    if not events:
        return rows_frame([])
    positions: dict[type[Event], list[int]] = {}  # event type -> its rows; types in order of first appearance
    for i, e in enumerate(events):
        p = positions.get(type(e))
        if p is None:
            p = positions[type(e)] = []
        p.append(i)
    columns: list[str] = []
    seen: set[str] = set()
    for t in positions:
        for k in _row_keys(t):
            if k not in seen:
                seen.add(k)
                columns.append(k)
    n = len(events)
    data = {}
    for c in columns:
        owners = [t for t in positions if c in _row_keys(t)]
        if len(owners) == len(positions):  # every event has it
            col = [e.kind.value for e in events] if c == "kind" else _row_values([getattr(e, c) for e in events])
        else:
            col = [_NAN] * n
            for t in owners:
                pos = positions[t]
                vals = [t.kind.value] * len(pos) if c == "kind" else _row_values([getattr(events[i], c) for i in pos])
                for i, v in zip(pos, vals):
                    col[i] = v
        data[c] = pd.Series(col, name=c, copy=False)  # one column of Python values alive at a time
        del col
    return pd.DataFrame(data, columns=columns, copy=False)


def lookups_frame(log: EventLog) -> pd.DataFrame:
    return _columns(log, CacheLookup, LOOKUP_COLUMNS)


def comparisons_frame(log: EventLog) -> pd.DataFrame:
    """Field-by-field metadata comparisons, plus digest comparisons as field ``digest``, in log order."""
    seq_f, seq_d = log.column(FieldCompared, "seq"), log.column(DigestCompared, "seq")
    if not seq_f and not seq_d:
        return pd.DataFrame([], columns=COMPARISON_COLUMNS)
    seqs = seq_f + seq_d
    order = None if not seq_f or not seq_d or seq_f[-1] < seq_d[0] else sorted(range(len(seqs)), key=seqs.__getitem__)
    data = {}
    for c in COMPARISON_COLUMNS:  # column by column, as events_frame (no dict per row)
        if c == "seq":
            values = seqs
        elif c == "field":
            values = log.column(FieldCompared, c) + ["digest"] * len(seq_d)
        else:
            values = log.column(FieldCompared, c) + log.column(DigestCompared, c)
        if order is not None:
            values = [values[i] for i in order]
        data[c] = pd.Series(_row_values(values), name=c, copy=False)
    return pd.DataFrame(data, columns=COMPARISON_COLUMNS, copy=False)


def _with_culprits(frame: pd.DataFrame, blamed: Iterable[tuple[str, str, str]]) -> pd.DataFrame:
    """Add ``culprit``: per (method, name), the verifications blame found it to break."""
    found: dict[tuple[str, str], list[str]] = {}
    for method, name, verification in blamed:
        found.setdefault((method, name), []).append(verification)
    if not found:
        frame["culprit"] = [""] * len(frame)
        return frame
    frame["culprit"] = [", ".join(dict.fromkeys(found.get((m, n), []))) for m, n in zip(frame["method"], frame["name"])]
    return frame


def decisions_frame(log: EventLog) -> pd.DataFrame:
    """One row per decision; ``culprit`` names the verifications (``standalone`` or a sequence)
    that blame (``session.blame()``) found this decision to break, "" otherwise."""
    return _with_culprits(
        _columns(log, Decided, DECISION_COLUMNS[:-1]),
        ((e.method, e.name, e.verification) for e in log.of_type(CulpritTried) if e.fixes),
    )


def decisions_from_rows(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The decisions frame from streamed event rows (an isolated worker's), culprits included."""
    return _with_culprits(
        rows_frame(rows, kind="decided", columns=DECISION_COLUMNS[:-1]),
        (
            (r.get("method"), r.get("name"), str(r.get("verification", "")))
            for r in rows
            if r.get("kind") == "culprit_tried" and r.get("fixes")
        ),
    )


def memory_frame(log: EventLog) -> pd.DataFrame:
    return _columns(log, MemorySampled, MEMORY_COLUMNS)


def method_results_frame(results: Iterable[Any], *, policy: str) -> pd.DataFrame:
    """One row per method of a load: status, whole blob or not, bytes put on the device."""
    rows = [
        {
            "policy": policy,
            "method": r.method,
            "device": r.device,
            "status": _plain(r.status),
            "whole_blob": r.whole_blob,
            "blob_bytes": r.blob_bytes,
            "own_upload_bytes": r.own_upload_bytes,
            "device_bytes": r.device_bytes,
            "runnable": r.runnable,
            "problems": "; ".join(r.problems),
            "error": r.error,
        }
        for r in results
    ]
    return pd.DataFrame(rows, columns=METHOD_RESULT_COLUMNS)


def dry_run_frame(log: EventLog, results: Iterable[Any], *, policy: str) -> pd.DataFrame:
    """The decisions of a (dry-run) load with each row's policy, whole_blob and method status."""
    d = decisions_frame(log)
    del d["seq"]  # in place: the other columns are not copied, and they are in DRY_RUN_COLUMNS' order
    per_method = {r.method: (r.whole_blob, _plain(r.status)) for r in results}
    methods = d["method"].tolist()
    d.insert(0, "policy", policy)
    d["whole_blob"] = [per_method[m][0] for m in methods]
    d["method_status"] = [per_method[m][1] for m in methods]
    return d


def memory_by_policy_frame(sessions: Iterable[Any]) -> pd.DataFrame:
    """One row per (policy, method) over several loads: constant bytes that method put on its device."""
    frames = [s.method_results for s in sessions]
    cols = ["policy", "method", "device_bytes", "loaded"]
    if not frames:
        return pd.DataFrame(columns=cols)
    f = pd.concat(frames, ignore_index=True)
    f["loaded"] = f["status"].isin(["loaded", "unloaded"])
    return f[cols]


def decision_counts(decisions: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in decisions["decision"].value_counts().items()} if len(decisions) else {}


def verdict_frames(verdict: Verdict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A verdict as two frames: one row per method (its outcome), one per constant it runs on other data for."""

    def frame(items, kind) -> pd.DataFrame:
        names = [f.name for f in fields(kind)]
        return pd.DataFrame(
            [{"policy": verdict.policy, **{n: _plain(getattr(x, n)) for n in names}} for x in items],
            columns=["policy", *names],
        )

    return frame(verdict.methods, MethodVerdict), frame(verdict.constants, ConstantFinding)


def check_rows(verification: "pd.DataFrame") -> list[CheckRow]:
    """A verification frame (``Session.verify()``, of methods alone or of a sequence) as the verdict's rows."""
    return [
        CheckRow(
            str(r["method"]),
            bool(r["ran"]),
            None if pd.isna(r["ok"]) else bool(r["ok"]),
            str(r.get("reason", "")),
            int(r["step"]) if "step" in r else None,
            str(r.get("oracle") or ""),
            str(r.get("oracle_detail") or ""),
        )
        for r in verification.to_dict("records")
    ]


def wrong_methods(verification: "pd.DataFrame | None") -> list[str]:
    """Methods a verification frame says ran wrong (:func:`toolkit.core.verdict.ran_wrong`), in its order, once each."""
    if verification is None or not len(verification):
        return []
    return list(dict.fromkeys(r.method for r in check_rows(verification) if ran_wrong(r)))
