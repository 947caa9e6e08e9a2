"""The HTML pieces of the explorer's panels: boxes and banners of escaped text, bounded tables,
the policy comparison as shown, and a download link that holds a small export.

The explorer's own colours of the Policies table and of a constant's detail live here too.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import pandas as pd

from toolkit.core.vocab import BlameStatus
from toolkit.display.cells import cell_text, shorten_digests
from toolkit.display.palette import CAUGHT_COLOUR, WRONG_COLOUR, outcome_colour
from toolkit.display.tables import html_table
from toolkit.explorer.state import BANNER_HEAD
from toolkit.reports.tabular import XLSX_MIME

MAX_TABLE_ROWS = 300  # rows a panel's table shows; it says how many more there are
MAX_INLINE_EXPORT = 512 * 1024  # bytes: a larger export is linked by its path, not embedded in the page
COMPARISON_COLUMNS = [
    "policy",
    "outcome",
    "stage",
    "wrong_methods",
    "not_runnable",
    "shared",
    "declined",
    "device_bytes",
    "error",
]


def _wrong_colour(text: str) -> str:
    return WRONG_COLOUR if text else ""


# the Policies table: the outcome by the verdict, the methods a policy gets wrong or cannot run red
COMPARISON_COLOURS = {
    "outcome": outcome_colour,
    "wrong_methods": _wrong_colour,
    "not_runnable": _wrong_colour,
    "error": _wrong_colour,
}
# a constant's detail, by blame's status
FINDING_COLOURS = {
    BlameStatus.CULPRIT: WRONG_COLOUR,
    BlameStatus.NOT_TESTED: WRONG_COLOUR,
    BlameStatus.HARMLESS: CAUGHT_COLOUR,
}


def comparison_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The policy comparison as shown: storage keys and blob names in errors cut to their first
    characters (a 64-hex key is no message)."""
    if "error" not in frame.columns:
        return frame
    return frame.assign(error=[shorten_digests(cell_text(e)) for e in frame["error"]])


def table_html(frame: pd.DataFrame, columns, empty: str, **options: Any) -> str:
    """A table of ``frame``'s ``columns`` (``empty`` when it has no rows), at most :data:`MAX_TABLE_ROWS` rows."""
    return html_table(
        frame, columns, max_rows=MAX_TABLE_ROWS, empty=empty, more_hint="narrow the filters to see them", **options
    )


def banner(text: str) -> str:
    """The dry-run banner: its first sentence bold, the rest plain; '' for no text."""
    if not text:
        return ""
    head, rest = (BANNER_HEAD, text[len(BANNER_HEAD) :]) if text.startswith(BANNER_HEAD) else ("", text)
    return f"<div class='constshare-dry-banner'><b>{html.escape(head)}</b>{html.escape(rest)}</div>"


def download_link(target: Path) -> str:
    """`` · download`` as a link holding the file, for a small one; a large one is only named (its
    bytes are not put in the page: it is on disk, open it from the file browser)."""
    size = target.stat().st_size
    if size > MAX_INLINE_EXPORT:
        return " · too large to put in the page: open it from the file browser"
    data = base64.b64encode(target.read_bytes()).decode("ascii")
    mime = XLSX_MIME if target.suffix.lower() == ".xlsx" else "text/csv"
    return (
        f' · <a class="constshare-download" download="{html.escape(target.name, quote=True)}" '
        f'href="data:{mime};base64,{data}">download</a>'
    )


def box(cls: str, text: str) -> str:
    """A line of (escaped) text in a styled box; '' for no text."""
    return f"<div class='{cls}'>{html.escape(text)}</div>" if text else ""
