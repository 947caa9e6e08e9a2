"""What every layer above shows: cell text, one palette, HTML tables, the verification and session views,
short markdown, progress bars.  No torch.

The notebooks import from here; the package's own modules import from the module that defines a name.
"""

from toolkit.display.cells import cell_text, format_bytes, shorten_digests
from toolkit.display.content import content_check, culprit_mask
from toolkit.display.findings import findings_text, verification_html, verification_table
from toolkit.display.palette import (
    CAUGHT_COLOUR,
    DECISION_COLOURS,
    OK_COLOUR,
    WRONG_COLOUR,
    count_colour,
    outcome_colour,
)
from toolkit.display.session import session_html, session_text
from toolkit.display.tables import Table, html_table, table
from toolkit.display.text import Html, markdown_html, markdown_text

__all__ = [
    "CAUGHT_COLOUR",
    "DECISION_COLOURS",
    "OK_COLOUR",
    "WRONG_COLOUR",
    "Html",
    "Table",
    "cell_text",
    "content_check",
    "count_colour",
    "culprit_mask",
    "findings_text",
    "format_bytes",
    "html_table",
    "markdown_html",
    "markdown_text",
    "outcome_colour",
    "session_html",
    "session_text",
    "shorten_digests",
    "table",
    "verification_html",
    "verification_table",
]
