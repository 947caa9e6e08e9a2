"""The collision report: one row per (method, constant) of one load, and its CSV round trip.

A report says, for every constant of every method, what the policy decided and why, the
metadata and content digest on both sides of the cache lookup, what the verdict says of the
constant and its method, and how the method's verification went.  The columns, their types
and meanings, in their fixed order (:data:`REPORT_COLUMNS`): ``docs/report_columns.md``.

The CSV and Excel files are written by :mod:`toolkit.reports.tabular`, text cells escaped (what
nobody can see, look-alike names) and neutralised against formula injection; :func:`read_report`
undoes the escaping exactly, so
``read_report(to_csv(...))`` gives back the frame :func:`collision_report` built.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from toolkit.core.errors import ReportError
from toolkit.core.model import shown
from toolkit.core.policies.releases import executorch_releases
from toolkit.core.vocab import DataProblem, MethodOutcome
from toolkit.display.tables import html_table
from toolkit.reports.tabular import (
    BinaryPathOrHandle,
    PathOrHandle,
    text_of,
    unescape_cell,
    write_table,
    write_workbook,
)

if TYPE_CHECKING:
    from toolkit.engine.session import Session

# column -> kind; the dict's order IS the CSV's column order.
REPORT_SCHEMA: dict[str, str] = {
    "program": "str",
    "policy": "str",
    "executorch": "str",
    "load_order": "int",
    "method": "str",
    "name": "str",
    "fqn": "str",
    "storage_key": "str",
    "constant_kind": "str",
    "mutated": "bool",
    "collision": "bool",
    "lookup": "str",
    "decision": "str",
    "reason_code": "str",
    "reason": "str",
    "origin": "str",
    "shared_from": "str",
    "nbytes": "int",
    "new_dtype": "str",
    "new_shape": "str",
    "new_strides": "str",
    "new_digest": "str",
    "cached_method": "str",
    "cached_dtype": "str",
    "cached_shape": "str",
    "cached_strides": "str",
    "cached_digest": "str",
    "same_metadata": "optional_bool",
    "same_content": "optional_bool",
    "data_problem": "str",
    "method_outcome": "str",
    "oracle": "str",
    "method_ran": "bool",
    "method_ok": "optional_bool",
    "max_abs_err": "float",
    "verify_reason": "str",
    "culprit": "str",
    "not_checked": "str",
}
REPORT_COLUMNS: tuple[str, ...] = tuple(REPORT_SCHEMA)


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
    oracles = {m.method: m.checked_against for m in verdict.methods}
    decisions = session.decisions
    decided = {(r["method"], r["name"]): r for r in decisions.to_dict("records")}
    program, policy = session.program.name, session.policy.name.value
    releases = executorch_releases(policy)
    gaps: dict[str, str] = {}
    not_reached = (
        f"not decided: the load failed in method {session.failed_method!r}"
        if session.failed_method
        else "not decided: the method was not loaded"
    )
    rows = []
    for order, spec in enumerate(session.program.methods):
        v = ver.get(spec.name, {})
        ran = bool(v.get("ran", False))
        ok = v.get("ok", pd.NA)  # missing (None / NA): nothing compared
        ok = pd.NA if ok is None or ok is pd.NA else ok
        err = v.get("max_abs_err", math.nan)
        gaps.setdefault(spec.name, verdict.gaps(spec.name))
        for c in spec.constants:
            d = decided.get((spec.name, c.name))
            row: dict[str, Any] = {
                "program": program,
                "policy": policy,
                "executorch": releases,
                "load_order": order,
                "method": spec.name,
                "name": c.name,
                "fqn": c.fqn,
                "constant_kind": text_of(c.kind),
                "mutated": bool(c.mutated),
                "nbytes": int(c.nbytes),
                "new_dtype": c.dtype,
                "new_shape": shown(c.shape),
                "new_strides": shown(c.strides),
                "new_digest": c.digest,
                "method_ran": ran,
                "method_ok": pd.NA if ok is pd.NA else bool(ok),
                "max_abs_err": float(err) if ran and err is not None else math.nan,
                "verify_reason": text_of(v.get("reason", "")),
                "method_outcome": outcomes.get(spec.name, ""),
                "oracle": oracles.get(spec.name, ""),
                "not_checked": gaps[spec.name],
            }
            if d is None:
                row.update(
                    storage_key="",
                    collision=False,
                    lookup="",
                    decision="",
                    reason_code="",
                    reason=not_reached,
                    origin="",
                    shared_from="",
                    cached_method="",
                    cached_dtype="",
                    cached_shape="",
                    cached_strides="",
                    cached_digest="",
                    same_metadata=pd.NA,
                    same_content=pd.NA,
                    data_problem="",
                    culprit="",
                )
            else:
                has_entry = bool(text_of(d["cached_method"]))
                row.update(
                    storage_key=text_of(d.get("storage_key", "")),
                    collision=text_of(d["lookup"]) == "hit",
                    lookup=text_of(d["lookup"]),
                    decision=text_of(d["decision"]),
                    reason_code=text_of(d["reason_code"]),
                    reason=text_of(d["reason"]),
                    origin=text_of(d["origin"]),
                    shared_from=text_of(d["shared_from"]),
                    cached_method=text_of(d["cached_method"]),
                    cached_dtype=text_of(d["cached_dtype"]),
                    cached_shape=text_of(d["cached_shape"]),
                    cached_strides=text_of(d["cached_strides"]),
                    cached_digest=text_of(d["cached_digest"]),
                    same_metadata=(
                        text_of(d["cached_dtype"]) == c.dtype
                        and text_of(d["cached_shape"]) == row["new_shape"]
                        and text_of(d["cached_strides"]) == row["new_strides"]
                    )
                    if has_entry
                    else pd.NA,
                    same_content=(text_of(d["cached_digest"]) == c.digest) if has_entry else pd.NA,
                    data_problem=text_of(d["data_problem"]),
                    culprit=text_of(d.get("culprit", "")),
                )
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(REPORT_COLUMNS))
    return CollisionReport(typed_frame(frame))


def typed_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (report rows) with the column dtypes :data:`REPORT_SCHEMA` says, sorted by load order and name
    (also for an empty frame)."""
    out = frame.copy()
    for col, kind in REPORT_SCHEMA.items():
        if kind == "str":
            out[col] = out[col].map(text_of).astype(object)
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

    def to_csv(self, path_or_handle: PathOrHandle, *, overwrite: bool = True, follow_links: bool = False) -> None:
        """Write the rows as :func:`write_csv` does."""
        write_csv(self.frame, path_or_handle, overwrite=overwrite, follow_links=follow_links)

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
            lines.append(
                f"  {len(silent)} shared despite different content: "
                + ", ".join(f"{m}/{n}" for m, n in zip(silent["method"], silent["name"]))
            )
        wrong = self.wrong_methods
        lines.append("  wrong outputs: " + (", ".join(wrong) if wrong else "none"))
        unverified = self.unverified_methods
        if unverified:
            lines.append("  no reference (not verified, neither ok nor wrong): " + ", ".join(unverified))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return collision_table_html(self.frame, self.summary())


HTML_COLUMNS = ("method", "name", "fqn", "lookup", "decision", "reason", "same_metadata", "same_content", "method_ok")


def collision_table_html(frame: pd.DataFrame, caption: str = "", columns=HTML_COLUMNS, max_rows: int = 500) -> str:
    """An HTML table of report (or decision) rows, decision colour-coded, ``method_ok`` False
    red; every cell and the caption escaped (:func:`toolkit.display.tables.html_table`)."""
    body = html_table(frame, columns, max_rows=max_rows, caption=caption, empty="no constants")
    if not len(frame) and caption:  # no table to hold the caption
        body = "<p>" + html.escape(caption).replace("\n", "<br>") + "</p>" + body
    return f"<div class='constshare-report'>{body}</div>"


XLSX_SHEET = "decisions"


def _report_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s :data:`REPORT_COLUMNS`, in order; a :class:`ReportError` when one is missing."""
    missing = [c for c in REPORT_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportError(f"not a collision report frame: columns {missing} are missing")
    return frame[list(REPORT_COLUMNS)]


def write_csv(
    frame: pd.DataFrame, path_or_handle: PathOrHandle, *, overwrite: bool = True, follow_links: bool = False
) -> None:
    """Write report rows (:data:`REPORT_COLUMNS`, typed by :data:`REPORT_SCHEMA`):
    :func:`~toolkit.reports.tabular.write_table` (a path: an existing file replaced only with
    ``overwrite``, a symbolic link written through only with ``follow_links``)."""
    write_table(_report_columns(frame), path_or_handle, REPORT_SCHEMA, overwrite=overwrite, follow_links=follow_links)


def write_xlsx(
    frame: pd.DataFrame, handle: BinaryPathOrHandle, *, overwrite: bool = True, follow_links: bool = False
) -> None:
    """Write report rows (:data:`REPORT_COLUMNS`) as an Excel workbook to a binary ``handle`` or a
    path (as :func:`write_csv` writes one): one sheet (:data:`XLSX_SHEET`), cells typed by
    :data:`REPORT_SCHEMA` (:func:`~toolkit.reports.tabular.write_workbook`).  Needs openpyxl (the
    notebook extra)."""
    write_workbook(
        _report_columns(frame), handle, XLSX_SHEET, REPORT_SCHEMA, overwrite=overwrite, follow_links=follow_links
    )


def to_csv(
    session_or_report: "Session | CollisionReport",
    path_or_handle: PathOrHandle,
    verification: pd.DataFrame | None = None,
    *,
    overwrite: bool = True,
    follow_links: bool = False,
) -> "CollisionReport":
    """Write the collision report of a session (or an already built report); returns the report.
    A path is written atomically: an existing file replaced only with ``overwrite`` (keeping its
    mode), a symbolic link at the path written through only with ``follow_links``."""
    report = (
        session_or_report
        if isinstance(session_or_report, CollisionReport)
        else collision_report(session_or_report, verification)
    )
    report.to_csv(path_or_handle, overwrite=overwrite, follow_links=follow_links)
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
                out[col] = s.map(unescape_cell).astype(object)
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
