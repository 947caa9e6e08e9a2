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

import contextlib
import csv
import html
import io
import math
import numbers
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping, Union

import numpy as np
import pandas as pd

from toolkit.core.errors import OutputError, ReportError
from toolkit.core.model import shown
from toolkit.core.vocab import DataProblem, MethodOutcome, ProgramFormat
from toolkit.display.html import html_table

if TYPE_CHECKING:
    from toolkit.core.model import Program
    from toolkit.engine.session import Session

PathOrHandle = Union[str, "os.PathLike[str]", IO[str]]

# column -> kind; the dict's order IS the CSV's column order.
REPORT_SCHEMA: dict[str, str] = {
    "program": "str",
    "policy": "str",
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
    oracles = {m.method: m.checked_against for m in verdict.methods}
    decisions = session.decisions
    decided = {(r["method"], r["name"]): r for r in decisions.to_dict("records")}
    program, policy = session.program.name, session.policy.name.value
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
        for c in spec.constants:
            d = decided.get((spec.name, c.name))
            row: dict[str, Any] = {
                "program": program,
                "policy": policy,
                "load_order": order,
                "method": spec.name,
                "name": c.name,
                "fqn": c.fqn,
                "constant_kind": _str(c.kind),
                "mutated": bool(c.mutated),
                "nbytes": int(c.nbytes),
                "new_dtype": c.dtype,
                "new_shape": shown(c.shape),
                "new_strides": shown(c.strides),
                "new_digest": c.digest,
                "method_ran": ran,
                "method_ok": pd.NA if ok is pd.NA else bool(ok),
                "max_abs_err": float(err) if ran and err is not None else math.nan,
                "verify_reason": _str(v.get("reason", "")),
                "method_outcome": outcomes.get(spec.name, ""),
                "oracle": oracles.get(spec.name, ""),
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
                has_entry = bool(_str(d["cached_method"]))
                row.update(
                    storage_key=_str(d.get("storage_key", "")),
                    collision=_str(d["lookup"]) == "hit",
                    lookup=_str(d["lookup"]),
                    decision=_str(d["decision"]),
                    reason_code=_str(d["reason_code"]),
                    reason=_str(d["reason"]),
                    origin=_str(d["origin"]),
                    shared_from=_str(d["shared_from"]),
                    cached_method=_str(d["cached_method"]),
                    cached_dtype=_str(d["cached_dtype"]),
                    cached_shape=_str(d["cached_shape"]),
                    cached_strides=_str(d["cached_strides"]),
                    cached_digest=_str(d["cached_digest"]),
                    same_metadata=(
                        _str(d["cached_dtype"]) == c.dtype
                        and _str(d["cached_shape"]) == row["new_shape"]
                        and _str(d["cached_strides"]) == row["new_strides"]
                    )
                    if has_entry
                    else pd.NA,
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
        return report_html(self.frame, self.summary())


HTML_COLUMNS = ("method", "name", "fqn", "lookup", "decision", "reason", "same_metadata", "same_content", "method_ok")


def report_html(frame: pd.DataFrame, caption: str = "", columns=HTML_COLUMNS, max_rows: int = 500) -> str:
    """An HTML table of report (or decision) rows, decision colour-coded, ``method_ok`` False
    red; every cell and the caption escaped (:func:`toolkit.display.html.html_table`)."""
    body = html_table(frame, columns, max_rows=max_rows, caption=caption, empty="no constants")
    if not len(frame) and caption:  # no table to hold the caption
        body = "<p>" + html.escape(caption).replace("\n", "<br>") + "</p>" + body
    return f"<div class='constshare-report'>{body}</div>"


_NATIVE_CODE_NOTICED: list[str] = []  # the program it was given for, once per process


def native_code_notice(program: "Program") -> str | None:
    """What a full load does, said once per process before the first load of a program not
    built here (built here: a program directory in the build cache, which our builder wrote);
    None when it needs no saying."""
    from toolkit.build.samples import cache_root

    root = Path(program.root).resolve() if program.root is not None else None
    if _NATIVE_CODE_NOTICED or (
        program.format is ProgramFormat.DIRECTORY and root is not None and root.is_relative_to(cache_root().resolve())
    ):
        return None
    _NATIVE_CODE_NOTICED.append(str(root))
    return (
        f"loading {program.name!r} from {root} runs the native code compiled into it (its .so files) in this "
        "process: load only programs you trust; a dry run runs none"
    )


# ------------------------------------------------------------------ CSV


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _kind_of(v: Any) -> str:
    """A value's kind (as in :data:`REPORT_SCHEMA`) from its type: text for anything not a number."""
    return (
        "bool"
        if isinstance(v, (bool, np.bool_))
        else "int"
        if isinstance(v, numbers.Integral)
        else "float"
        if isinstance(v, numbers.Real)
        else "str"
    )


def _cell(kind: str | None, v: Any) -> str:
    """One CSV cell; ``kind`` None: taken from the value's type (text for anything not a number)."""
    if _missing(v):
        return ""
    kind = kind or _kind_of(v)
    if kind in ("bool", "optional_bool"):
        return "True" if bool(v) else "False"
    if kind == "int":
        return str(int(v))
    if kind == "float":
        return repr(float(v))
    return neutralize(_str(v))


def write_csv(frame: pd.DataFrame, path_or_handle: PathOrHandle) -> None:
    """Write report rows (:data:`REPORT_COLUMNS`, typed by :data:`REPORT_SCHEMA`): :func:`write_table`."""
    write_table(_report_columns(frame), path_or_handle, REPORT_SCHEMA)


def _report_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s :data:`REPORT_COLUMNS`, in order; a :class:`ReportError` when one is missing."""
    missing = [c for c in REPORT_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportError(f"not a collision report frame: columns {missing} are missing")
    return frame[list(REPORT_COLUMNS)]


def write_table(frame: pd.DataFrame, path_or_handle: PathOrHandle, kinds: Mapping[str, str] | None = None) -> None:
    """Write any frame as CSV, the toolkit's one CSV writer: UTF-8, a header row, RFC 4180
    quoting and CRLF, every text cell neutralised (the module docstring); ``kinds``: column ->
    kind as in :data:`REPORT_SCHEMA` (default: each value's type).  A path is written
    atomically (:func:`write_text_atomically`)."""
    kinds = kinds or {}
    buf = io.StringIO()
    # CRLF as RFC 4180 says; it also makes the writer quote any cell holding a lone CR.
    w = csv.writer(buf, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    columns = [str(c) for c in frame.columns]
    w.writerow([neutralize(c) for c in columns])
    for rec in frame.itertuples(index=False, name=None):
        w.writerow([_cell(kinds.get(c), v) for c, v in zip(columns, rec)])
    if hasattr(path_or_handle, "write"):
        path_or_handle.write(buf.getvalue())  # type: ignore[union-attr]
    else:
        write_text_atomically(path_or_handle, buf.getvalue())  # type: ignore[arg-type]


XLSX_SHEET = "decisions"
XLSX_MIME = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def _xlsx_cell(kind: str | None, v: Any, illegal: Any) -> Any:
    """One Excel cell: a number or a boolean as itself, a missing value empty, text as
    :func:`_cell` writes it (neutralised: a spreadsheet reads no formula in it), the control
    characters Excel cannot hold (``illegal``, openpyxl's pattern) shown as U+FFFD."""
    if _missing(v):
        return None
    kind = kind or _kind_of(v)
    if kind in ("bool", "optional_bool"):
        return bool(v)
    if kind == "int":
        return int(v)
    if kind == "float":
        return float(v)
    return illegal.sub("\ufffd", _cell(kind, v))


def write_xlsx(frame: pd.DataFrame, handle: IO[bytes]) -> None:
    """Write report rows (:data:`REPORT_COLUMNS`) as an Excel workbook to a binary ``handle``: one
    sheet (:data:`XLSX_SHEET`), a header row, cells typed by :data:`REPORT_SCHEMA`, text
    neutralised as in the CSV (the module docstring).  Needs openpyxl (the notebook extra)."""
    try:
        from openpyxl import Workbook
        from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
    except ImportError:
        raise ReportError(
            "an Excel export needs openpyxl: pip install 'constshare-toolkit[notebook]' (or pip install openpyxl)"
        ) from None
    frame = _report_columns(frame)
    book = Workbook(write_only=True)  # rows streamed: 10,000 rows in about a second
    sheet = book.create_sheet(XLSX_SHEET)
    sheet.append([neutralize(c) for c in REPORT_COLUMNS])
    kinds = [REPORT_SCHEMA[c] for c in REPORT_COLUMNS]
    for rec in frame.itertuples(index=False, name=None):
        sheet.append([_xlsx_cell(k, v, ILLEGAL_CHARACTERS_RE) for k, v in zip(kinds, rec)])
    book.save(handle)


def check_output(path: "str | os.PathLike[str]") -> Path:
    """The file ``path`` names (symlinks followed), once it can be written in place of what is
    there: a regular file or nothing, in a folder this process may write; else
    :class:`~toolkit.core.errors.OutputError` naming it."""
    target = Path(os.path.realpath(path))
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"cannot be written: {e.strerror or e}", path=path) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError("is not a regular file (a folder, device, FIFO or socket): give a file path", path=path)
    if not target.parent.is_dir():
        raise OutputError(f"folder {str(target.parent)!r} does not exist", path=path)
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise OutputError(f"folder {str(target.parent)!r} is not writable (read-only or immutable)", path=path)
    return target


def write_text_atomically(path: "str | os.PathLike[str]", text: str) -> None:
    """Write ``text`` (UTF-8, newlines as given) to ``path``: into a temporary file in the same
    folder, then renamed over it, so a failed write (disk full, read-only folder) leaves the old
    file or none, never half a file; the failure is an :class:`~toolkit.core.errors.OutputError`."""
    target = check_output(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for secrets; a report is read by others
        os.replace(tmp, target)
    except BaseException as e:  # an interrupt too: no temporary file is left behind
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"cannot be written: {e.strerror or e}", path=path) from None
        raise


def to_csv(
    session_or_report: "Session | CollisionReport",
    path_or_handle: PathOrHandle,
    verification: pd.DataFrame | None = None,
) -> "CollisionReport":
    """Write the collision report of a session (or an already built report); returns the report."""
    report = (
        session_or_report
        if isinstance(session_or_report, CollisionReport)
        else collision_report(session_or_report, verification)
    )
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
