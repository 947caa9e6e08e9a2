"""The toolkit's one CSV writer and its Excel counterpart: typed cells, text neutralised.

Spreadsheet safety: text such as constant names comes from the program, which may be untrusted.
A text cell beginning with ``=``, ``+``, ``-``, ``@``, tab or carriage return would be evaluated
as a formula by spreadsheet applications, so it is written with a leading apostrophe (OWASP
"CSV injection").  A text cell already beginning with an apostrophe gets one more, so
:func:`unneutralize` undoes the escaping exactly and a CSV reads back into the frame it was
written from.

A cell's kind says how it is written: ``str``, ``int``, ``float``, ``bool`` or ``optional_bool``
(a boolean that may be missing); a column without a kind takes it from each value's type.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
import os
from typing import IO, Any, Mapping, Union

import numpy as np
import pandas as pd

from toolkit.core.errors import ReportError
from toolkit.reports.output import write_text_atomically

PathOrHandle = Union[str, "os.PathLike[str]", IO[str]]

# Leading characters that make a spreadsheet evaluate a cell (OWASP CSV injection), plus
# the escape character itself so that escaping stays reversible.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPE = "'"

XLSX_MIME = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def neutralize(value: str) -> str:
    """``value`` made safe to open in a spreadsheet (see the module docstring)."""
    if value.startswith(FORMULA_TRIGGERS) or value.startswith(_ESCAPE):
        return _ESCAPE + value
    return value


def unneutralize(value: str) -> str:
    """The inverse of :func:`neutralize`."""
    return value[1:] if value.startswith(_ESCAPE) else value


def text_of(v: Any) -> str:
    """A value as cell text: empty when missing, an enum member as its value."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v.value) if hasattr(v, "value") and isinstance(v, str) else str(v)


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _kind_of(v: Any) -> str:
    """A value's kind from its type: text for anything not a number."""
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
    """One CSV cell; ``kind`` None: taken from the value's type."""
    if _missing(v):
        return ""
    kind = kind or _kind_of(v)
    if kind in ("bool", "optional_bool"):
        return "True" if bool(v) else "False"
    if kind == "int":
        return str(int(v))
    if kind == "float":
        return repr(float(v))
    return neutralize(text_of(v))


def write_table(frame: pd.DataFrame, path_or_handle: PathOrHandle, kinds: Mapping[str, str] | None = None) -> None:
    """Write any frame as CSV: UTF-8, a header row, RFC 4180 quoting and CRLF, every text cell
    neutralised (the module docstring); ``kinds``: column -> kind (default: each value's type).
    A path is written atomically (:func:`~toolkit.reports.output.write_text_atomically`)."""
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


def write_workbook(
    frame: pd.DataFrame, handle: IO[bytes], sheet_name: str, kinds: Mapping[str, str] | None = None
) -> None:
    """Write any frame as an Excel workbook to a binary ``handle``: one sheet (``sheet_name``), a
    header row, cells typed by ``kinds`` as in :func:`write_table`, text neutralised as in the CSV.
    Needs openpyxl (the notebook extra)."""
    try:
        from openpyxl import Workbook
        from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
    except ImportError:
        raise ReportError(
            "an Excel export needs openpyxl: pip install 'constshare-toolkit[notebook]' (or pip install openpyxl)"
        ) from None
    kinds = kinds or {}
    columns = [str(c) for c in frame.columns]
    book = Workbook(write_only=True)  # rows streamed, not held as cell objects
    sheet = book.create_sheet(sheet_name)
    sheet.append([neutralize(c) for c in columns])
    column_kinds = [kinds.get(c) for c in columns]
    for rec in frame.itertuples(index=False, name=None):
        sheet.append([_xlsx_cell(k, v, ILLEGAL_CHARACTERS_RE) for k, v in zip(column_kinds, rec)])
    book.save(handle)
