"""The toolkit's one CSV writer and its Excel counterpart: typed cells, text neutralised.

Spreadsheet safety: text such as constant names comes from the program, which may be untrusted.
A text cell beginning with ``=``, ``+``, ``-``, ``@``, tab or carriage return would be evaluated
as a formula by spreadsheet applications, so it is written with a leading apostrophe (OWASP
"CSV injection").  A text cell already beginning with an apostrophe gets one more, so
:func:`unneutralize` undoes the escaping exactly and a CSV reads back into the frame it was
written from.

Hostile text: a text cell is written as :func:`~toolkit.display.cells.escape_text` shows it, tabs and
line breaks kept (a quoted CSV cell holds them; an Excel cell a tab and a newline): a character nobody
can see (a zero-width space, a bidi control, a control character) or that UTF-8 cannot hold (a lone
surrogate: a file name that is not UTF-8) as a ``\\u200b``-style escape, and a name that looks like
another one of the table (NFC/NFD, homoglyphs) with every non-ASCII character escaped, so two names that
differ only there read apart in a spreadsheet.  The escaping is reversible (:func:`unescape_cell`, which
:func:`~toolkit.reports.collision.read_report` uses), so the data columns keep the exact names for a
consumer that needs them, one fixed set of columns, no second "raw" column.  An Excel cell holds at most
:data:`XLSX_CELL_MAX` characters: a longer text is cut visibly (a marker saying how much) and listed on
a sheet of its own (:data:`XLSX_NOTES_SHEET`).

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
from toolkit.display.cells import escape_text, lookalikes, unescape_text
from toolkit.reports.output import write_bytes_atomically, write_text_atomically

PathOrHandle = Union[str, "os.PathLike[str]", IO[str]]
BinaryPathOrHandle = Union[str, "os.PathLike[str]", IO[bytes]]

# Leading characters that make a spreadsheet evaluate a cell (OWASP CSV injection), plus
# the escape character itself so that escaping stays reversible.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPE = "'"

XLSX_MIME = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
CSV_KEEP = "\t\n\r"  # what a quoted CSV cell holds as it is (and a spreadsheet shows as a line break)
XLSX_CELL_MAX = 32_767  # characters an Excel cell holds
XLSX_KEEP = "\t\n"  # a carriage return is escaped too: the XML of a workbook reads one back as a newline
XLSX_NOTES_SHEET = "notes"  # where the cells cut to XLSX_CELL_MAX are listed
_CUT_MARK = " [... {n:,} more characters cut: an Excel cell holds {max:,}; the CSV holds the whole text]"


def neutralize(value: str) -> str:
    """``value`` made safe to open in a spreadsheet (see the module docstring)."""
    if value.startswith(FORMULA_TRIGGERS) or value.startswith(_ESCAPE):
        return _ESCAPE + value
    return value


def unneutralize(value: str) -> str:
    """The inverse of :func:`neutralize`."""
    return value[1:] if value.startswith(_ESCAPE) else value


def text_cell(text: str, looks: frozenset[str] | set[str] = frozenset(), keep: str = CSV_KEEP) -> str:
    """A text cell as written: escaped (hidden characters but ``keep``; ``looks``: the look-alikes spelled
    out, the module docstring), then neutralised."""
    return neutralize(escape_text(text, keep=keep, spell_out=text in looks))


def unescape_cell(value: str) -> str:
    """The inverse of :func:`text_cell`: the exact text a cell was written from."""
    return unescape_text(unneutralize(value))


def table_lookalikes(frame: pd.DataFrame, kinds: Mapping[str, str] | None = None) -> set[str]:
    """The column labels and text cells of ``frame`` that look like another of them (spelled out)."""
    kinds = kinds or {}
    columns = [str(c) for c in frame.columns]
    texts = list(columns)
    for i, c in enumerate(columns):
        if kinds.get(c, "str") == "str" and not pd.api.types.is_numeric_dtype(frame.iloc[:, i].dtype):
            texts += [text_of(v) for v in frame.iloc[:, i].tolist() if isinstance(v, str)]
    return lookalikes(texts)


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


def _cell(kind: str | None, v: Any, looks: frozenset[str] | set[str] = frozenset(), keep: str = CSV_KEEP) -> str:
    """One CSV cell; ``kind`` None: taken from the value's type; ``looks``: texts to spell out."""
    if _missing(v):
        return ""
    kind = kind or _kind_of(v)
    if kind in ("bool", "optional_bool"):
        return "True" if bool(v) else "False"
    if kind == "int":
        return str(int(v))
    if kind == "float":
        return repr(float(v))
    return text_cell(text_of(v), looks, keep)


def write_table(
    frame: pd.DataFrame,
    path_or_handle: PathOrHandle,
    kinds: Mapping[str, str] | None = None,
    *,
    overwrite: bool = True,
    follow_links: bool = False,
) -> None:
    """Write any frame as CSV: UTF-8, a header row, RFC 4180 quoting and CRLF, every text cell
    escaped and neutralised (the module docstring); ``kinds``: column -> kind (default: each value's type).
    A path is written atomically (:func:`~toolkit.reports.output.write_text_atomically`): an
    existing file is replaced only with ``overwrite``, a symbolic link written through only with
    ``follow_links``."""
    kinds = kinds or {}
    buf = io.StringIO()
    # CRLF as RFC 4180 says; it also makes the writer quote any cell holding a lone CR.
    w = csv.writer(buf, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    columns = [str(c) for c in frame.columns]
    looks = table_lookalikes(frame, kinds)
    w.writerow([text_cell(c, looks) for c in columns])
    for rec in frame.itertuples(index=False, name=None):
        w.writerow([_cell(kinds.get(c), v, looks) for c, v in zip(columns, rec)])
    if hasattr(path_or_handle, "write"):
        path_or_handle.write(buf.getvalue())  # type: ignore[union-attr]
    else:
        write_text_atomically(
            path_or_handle,  # type: ignore[arg-type]
            buf.getvalue(),
            overwrite=overwrite,
            follow_links=follow_links,
        )


def _xlsx_cell(kind: str | None, v: Any, illegal: Any, looks: frozenset[str] | set[str] = frozenset()) -> Any:
    """One Excel cell: a number or a boolean as itself, a missing value empty, text as
    :func:`_cell` writes it (escaped and neutralised: a spreadsheet reads no formula in it; a control
    character Excel cannot hold, ``illegal``, openpyxl's pattern, is escaped already, U+FFFD else)."""
    if _missing(v):
        return None
    kind = kind or _kind_of(v)
    if kind in ("bool", "optional_bool"):
        return bool(v)
    if kind == "int":
        return int(v)
    if kind == "float":
        return float(v)
    return illegal.sub("\ufffd", _cell(kind, v, looks, XLSX_KEEP))


def cut_cell(text: str) -> tuple[str, int]:
    """``text`` cut to :data:`XLSX_CELL_MAX` characters with a marker saying how many were cut, and that
    number (0: it fits, unchanged).  Never inside an escape, which would then read as text."""
    if len(text) <= XLSX_CELL_MAX:
        return text, 0
    keep = XLSX_CELL_MAX
    for _ in range(3):  # the marker's length depends on the count it names: settles in two rounds
        keep = XLSX_CELL_MAX - len(_CUT_MARK.format(n=len(text) - keep, max=XLSX_CELL_MAX))
    backslash = text.rfind("\\", keep - 9, keep)  # an escape is at most 10 characters long
    keep = backslash if backslash > 0 else keep
    return text[:keep] + _CUT_MARK.format(n=len(text) - keep, max=XLSX_CELL_MAX), len(text) - keep


def write_workbook(
    frame: pd.DataFrame,
    handle: BinaryPathOrHandle,
    sheet_name: str,
    kinds: Mapping[str, str] | None = None,
    *,
    overwrite: bool = True,
    follow_links: bool = False,
) -> None:
    """Write any frame as an Excel workbook to a binary ``handle`` or a path (written as
    :func:`write_table` writes one): one sheet (``sheet_name``), a header row, cells typed by
    ``kinds`` as in :func:`write_table`, text neutralised as in the CSV. Needs openpyxl (the
    notebook extra)."""
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
    looks = table_lookalikes(frame, kinds)
    header = [text_cell(c, looks, XLSX_KEEP) for c in columns]
    sheet.append([cut_cell(c)[0] for c in header])
    column_kinds = [kinds.get(c) for c in columns]
    cuts = []  # (row, column, characters cut) of each cell cut to XLSX_CELL_MAX
    for row, rec in enumerate(frame.itertuples(index=False, name=None), start=2):
        cells = [_xlsx_cell(k, v, ILLEGAL_CHARACTERS_RE, looks) for k, v in zip(column_kinds, rec)]
        for i, cell in enumerate(cells):
            if isinstance(cell, str) and len(cell) > XLSX_CELL_MAX:
                cells[i], n = cut_cell(cell)
                cuts.append((row, header[i], n))
        sheet.append(cells)
    if cuts:
        notes = book.create_sheet(XLSX_NOTES_SHEET)
        notes.append(["sheet", "row", "column", "characters cut", "why"])
        for row, column, n in cuts:
            notes.append(
                [
                    sheet_name,
                    row,
                    cut_cell(column)[0],
                    n,
                    f"an Excel cell holds at most {XLSX_CELL_MAX:,} characters; the cell ends with a marker, "
                    "the CSV holds the whole text",
                ]
            )
    if hasattr(handle, "write"):
        book.save(handle)
        return
    buf = io.BytesIO()
    book.save(buf)
    write_bytes_atomically(handle, buf.getvalue(), overwrite=overwrite, follow_links=follow_links)  # type: ignore[arg-type]
