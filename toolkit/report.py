"""CSV collision reports: one row per (method, constant) of one load.

A report says, for every constant of every method, what the policy decided and why, the
metadata and content digest on both sides of the cache lookup, what the verdict says of the
constant and its method, and how the method's verification went.  The columns, their types
and meanings, in their fixed order (:data:`REPORT_COLUMNS`): ``docs/report_columns.md``.

Spreadsheet safety: constant names come from the program, which may be untrusted.  A text
cell beginning with ``=``, ``+``, ``-``, ``@``, tab or carriage return would be evaluated as
a formula by spreadsheet applications, so it is written with a leading apostrophe (OWASP
"CSV injection").  A text cell already beginning with an apostrophe gets one more, so
:func:`read_report` can undo the escaping exactly: ``read_report(to_csv(...))`` gives back
the frame :func:`collision_report` built.
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Union

import pandas as pd

from .errors import ReportError
from .model import shown
from .rendering import html_table
from .verdict import DataProblem, MethodOutcome

if TYPE_CHECKING:
    from .session import Session

PathOrHandle = Union[str, "os.PathLike[str]", IO[str]]

# column -> kind; the dict's order IS the CSV's column order.
REPORT_SCHEMA: dict[str, str] = {
    "program": "str", "policy": "str", "load_order": "int", "method": "str", "name": "str", "fqn": "str",
    "storage_key": "str", "constant_kind": "str", "mutated": "bool", "collision": "bool", "lookup": "str", "decision": "str",
    "reason_code": "str", "reason": "str", "origin": "str", "shared_from": "str", "nbytes": "int",
    "new_dtype": "str", "new_shape": "str", "new_strides": "str", "new_digest": "str",
    "cached_method": "str", "cached_dtype": "str", "cached_shape": "str", "cached_strides": "str",
    "cached_digest": "str", "same_metadata": "optional_bool", "same_content": "optional_bool",
    "data_problem": "str", "method_outcome": "str", "method_ran": "bool", "method_ok": "optional_bool", "max_abs_err": "float", "verify_reason": "str",
    "culprit": "str",
}
REPORT_COLUMNS: tuple[str, ...] = tuple(REPORT_SCHEMA)

# Leading characters that make a spreadsheet evaluate a cell (OWASP CSV injection), plus
# the escape character itself so that escaping stays reversible.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPE = "'"


def neutralize(value: str) -> str:
    """``value`` made safe to open in a spreadsheet (see the module docstring)."""
    if value.startswith(FORMULA_TRIGGERS) or value.startswith(_ESCAPE):
        return _ESCAPE + value
    return value


def unneutralize(value: str) -> str:
    """The inverse of :func:`neutralize`."""
    return value[1:] if value.startswith(_ESCAPE) else value


def _str(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v.value) if hasattr(v, "value") and isinstance(v, str) else str(v)


def collision_report(session: "Session", verification: pd.DataFrame | None = None) -> "CollisionReport":
    """The report of one load.

    ``verification`` is ``session.verify()``'s frame; when omitted, verification is run here
    (it runs every loaded method once on its reference inputs); a dry run runs nothing.
    """
    verdict = session.verdict()
    if verification is None and not verdict.predicted:
        verification = session.verify()
    ver = {r["method"]: r for r in verification.to_dict("records")} if verification is not None else {}
    outcomes = {m.method: m.outcome.value for m in verdict.methods}
    decisions = session.decisions
    decided = {(r["method"], r["name"]): r for r in decisions.to_dict("records")}
    program, policy = session.program.name, session.policy.name.value
    not_reached = (f"not decided: the load failed in method {session.failed_method!r}"
                   if session.failed_method else "not decided: the method was not loaded")
    rows = []
    for order, spec in enumerate(session.program.methods):
        v = ver.get(spec.name, {})
        ran = bool(v.get("ran", False))
        ok = v.get("ok", pd.NA)  # missing (None / NA): nothing compared
        ok = pd.NA if ok is None or ok is pd.NA else ok
        err = v.get("max_abs_err", math.nan)
        for c in spec.constants:
            d = decided.get((spec.name, c.name))
            row: dict[str, Any] = {
                "program": program, "policy": policy, "load_order": order, "method": spec.name, "name": c.name,
                "fqn": c.fqn, "constant_kind": _str(c.kind), "mutated": bool(c.mutated), "nbytes": int(c.nbytes),
                "new_dtype": c.dtype, "new_shape": shown(c.shape), "new_strides": shown(c.strides),
                "new_digest": c.digest,
                "method_ran": ran, "method_ok": pd.NA if ok is pd.NA else bool(ok),
                "max_abs_err": float(err) if ran and err is not None else math.nan,
                "verify_reason": _str(v.get("reason", "")), "method_outcome": outcomes.get(spec.name, ""),
            }
            if d is None:
                row.update(storage_key="", collision=False, lookup="", decision="", reason_code="", reason=not_reached,
                           origin="",
                           shared_from="", cached_method="", cached_dtype="", cached_shape="", cached_strides="",
                           cached_digest="", same_metadata=pd.NA, same_content=pd.NA, data_problem="", culprit="")
            else:
                has_entry = bool(_str(d["cached_method"]))
                row.update(
                    storage_key=_str(d.get("storage_key", "")),
                    collision=_str(d["lookup"]) == "hit", lookup=_str(d["lookup"]), decision=_str(d["decision"]),
                    reason_code=_str(d["reason_code"]), reason=_str(d["reason"]), origin=_str(d["origin"]),
                    shared_from=_str(d["shared_from"]), cached_method=_str(d["cached_method"]),
                    cached_dtype=_str(d["cached_dtype"]), cached_shape=_str(d["cached_shape"]),
                    cached_strides=_str(d["cached_strides"]), cached_digest=_str(d["cached_digest"]),
                    same_metadata=(_str(d["cached_dtype"]) == c.dtype
                                   and _str(d["cached_shape"]) == row["new_shape"]
                                   and _str(d["cached_strides"]) == row["new_strides"]) if has_entry else pd.NA,
                    same_content=(_str(d["cached_digest"]) == c.digest) if has_entry else pd.NA,
                    data_problem=_str(d["data_problem"]),
                    culprit=_str(d.get("culprit", "")),
                )
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(REPORT_COLUMNS))
    return CollisionReport(_typed(frame))


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Column dtypes as the schema says (also for an empty frame)."""
    out = frame.copy()
    for col, kind in REPORT_SCHEMA.items():
        if kind == "str":
            out[col] = out[col].map(_str).astype(object)
        elif kind == "int":
            out[col] = out[col].astype("int64")
        elif kind == "float":
            out[col] = out[col].astype("float64")
        elif kind == "bool":
            out[col] = out[col].astype(bool)
        else:
            out[col] = out[col].astype("boolean")
    return out.sort_values(["load_order", "name"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class CollisionReport:
    """A collision report: :attr:`frame` holds the rows, in :data:`REPORT_COLUMNS` order.

    Its repr is a short text summary; in a notebook it renders as an HTML table with the
    decision column colour-coded.
    """

    frame: pd.DataFrame

    @property
    def collisions(self) -> pd.DataFrame:
        """Only the rows whose FQN was already cached (a copy)."""
        return self.frame[self.frame["collision"]].reset_index(drop=True)

    @property
    def wrong_methods(self) -> list[str]:
        f = self.frame
        return sorted(set(f[f["method_outcome"] == MethodOutcome.WRONG.value]["method"]))

    @property
    def unverified_methods(self) -> list[str]:
        """Methods with no reference to check against."""
        f = self.frame
        return sorted(set(f[f["method_outcome"] == MethodOutcome.NO_REFERENCE.value]["method"]))

    def to_csv(self, path_or_handle: PathOrHandle) -> None:
        write_csv(self.frame, path_or_handle)

    def summary(self) -> str:
        f = self.frame
        if not len(f):
            return "collision report: no constants"
        head = f"collision report of {f['program'].iloc[0]!r} under {f['policy'].iloc[0]!r}: "
        counts = f["decision"].replace("", "undecided").value_counts()
        parts = [
            f"{len(f)} constants in {f['method'].nunique()} methods",
            f"{int(f['collision'].sum())} collisions",
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        ]
        silent = f[f["data_problem"] == DataProblem.CONTENT_DIFFERS.value]
        lines = [head + "; ".join(parts)]
        if len(silent):
            lines.append(f"  {len(silent)} shared despite different content: "
                         + ", ".join(f"{m}/{n}" for m, n in zip(silent["method"], silent["name"])))
        wrong = self.wrong_methods
        lines.append("  wrong outputs: " + (", ".join(wrong) if wrong else "none"))
        unverified = self.unverified_methods
        if unverified:
            lines.append("  no reference (not verified, neither ok nor wrong): " + ", ".join(unverified))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return report_html(self.frame, self.summary())


HTML_COLUMNS = ("method", "name", "fqn", "lookup", "decision", "reason", "same_metadata", "same_content", "method_ok")


def report_html(frame: pd.DataFrame, caption: str = "", columns=HTML_COLUMNS, max_rows: int = 500) -> str:
    """An HTML table of report (or decision) rows, decision colour-coded, ``method_ok`` False
    red; every cell and the caption escaped (:func:`toolkit.rendering.html_table`)."""
    body = html_table(frame, columns, max_rows=max_rows, caption=caption, empty="no constants")
    if not len(frame) and caption:  # no table to hold the caption
        body = "<p>" + html.escape(caption).replace("\n", "<br>") + "</p>" + body
    return f"<div class='constshare-report'>{body}</div>"


# ------------------------------------------------------------------ CSV


def _cell(kind: str, v: Any) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    if kind in ("bool", "optional_bool"):
        return "True" if bool(v) else "False"
    if kind == "int":
        return str(int(v))
    if kind == "float":
        return repr(float(v))
    return neutralize(_str(v))


def write_csv(frame: pd.DataFrame, path_or_handle: PathOrHandle) -> None:
    """Write report rows: UTF-8, a header row, RFC 4180 quoting and CRLF, text cells neutralised."""
    missing = [c for c in REPORT_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportError(f"not a collision report frame: columns {missing} are missing")
    buf = io.StringIO()
    # CRLF as RFC 4180 says; it also makes the writer quote any cell holding a lone CR.
    w = csv.writer(buf, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    w.writerow(REPORT_COLUMNS)
    records = frame[list(REPORT_COLUMNS)].itertuples(index=False, name=None)
    for rec in records:
        w.writerow([_cell(REPORT_SCHEMA[c], v) for c, v in zip(REPORT_COLUMNS, rec)])
    text = buf.getvalue()
    if hasattr(path_or_handle, "write"):
        path_or_handle.write(text)  # type: ignore[union-attr]
    else:
        Path(path_or_handle).write_text(text, encoding="utf-8", newline="")  # type: ignore[arg-type]


def to_csv(session_or_report: "Session | CollisionReport", path_or_handle: PathOrHandle,
           verification: pd.DataFrame | None = None) -> "CollisionReport":
    """Write the collision report of a session (or an already built report); returns the report."""
    report = (session_or_report if isinstance(session_or_report, CollisionReport)
              else collision_report(session_or_report, verification))
    report.to_csv(path_or_handle)
    return report


def read_report(path_or_handle: PathOrHandle) -> CollisionReport:
    """Read a CSV written by :func:`to_csv` back into the report it was written from."""
    try:
        raw = pd.read_csv(path_or_handle, dtype=str, keep_default_na=False, na_filter=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ReportError(f"not a readable CSV: {e}") from None
    if tuple(raw.columns) != REPORT_COLUMNS:
        raise ReportError(f"not a collision report: expected columns {list(REPORT_COLUMNS)}, got {list(raw.columns)}")
    out = pd.DataFrame(index=raw.index)
    for col, kind in REPORT_SCHEMA.items():
        s = raw[col]
        try:
            if kind == "str":
                out[col] = s.map(unneutralize).astype(object)
            elif kind == "int":
                out[col] = s.astype("int64")
            elif kind == "float":
                out[col] = s.map(lambda x: math.nan if x == "" else float(x)).astype("float64")
            elif kind == "bool":
                out[col] = s.map(_parse_bool).astype(bool)
            else:
                out[col] = pd.array([pd.NA if x == "" else _parse_bool(x) for x in s], dtype="boolean")
        except (ValueError, TypeError, OverflowError) as e:  # OverflowError: an integer past int64
            raise ReportError(f"column {col!r}: {str(e)[:300]}") from None
    return CollisionReport(out.reset_index(drop=True))


def _parse_bool(x: str) -> bool:
    if x in ("True", "true", "1"):
        return True
    if x in ("False", "false", "0"):
        return False
    raise ValueError(f"{x!r} is not a boolean")
