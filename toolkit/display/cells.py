"""The text a table cell shows: any value as display text, byte counts in binary units, digests shortened.

Every renderer (HTML tables, plots, the explorer) turns a value into text here first, so a
missing value, an Enum or a list reads the same everywhere, and escaping happens on text only.
Only pandas and the standard library.
"""

from __future__ import annotations

import enum
import html
import math
import re
from typing import Any

import pandas as pd

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
DIGEST_SHOWN = 12  # characters of a digest shown


def is_missing(v: Any) -> bool:
    """Whether ``v`` is None, NaN, ``pd.NA`` or ``pd.NaT`` (a cell shown empty)."""
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
    if is_missing(v):
        return ""
    return str(v)


def escaped(v: Any) -> str:
    """``v``'s cell text, HTML-escaped (quotes too)."""
    return html.escape(cell_text(v), quote=True)


def format_bytes(n: Any) -> str:
    """``16384`` -> ``"16 KiB"``, ``1536`` -> ``"1.5 KiB"``; ``"?"`` for a missing value."""
    if is_missing(n):
        return "?"
    try:
        n = float(n)
    except (TypeError, ValueError):
        return cell_text(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop always returns


def is_digest(text: str) -> bool:
    """Whether ``text`` is a sha256 hex digest (64 lowercase hex characters)."""
    return bool(DIGEST_RE.fullmatch(text))


def shorten_digests(text: str, width: int = DIGEST_SHOWN) -> str:
    """``text`` with every sha256 digest inside it (a storage key, a blob name) cut to its
    first ``width`` characters and an ellipsis."""
    return DIGEST_RE.sub(lambda m: m.group(0)[:width] + "\u2026", text)


def short_digest(digest: str, other: str | None = None, width: int = DIGEST_SHOWN) -> str:
    """``digest`` shortened to about ``width`` characters, the difference kept visible.

    Alone, or beside an equal digest: its first ``width`` characters and an ellipsis.  Beside
    a different one that shares the first characters, the start, an ellipsis, then the
    characters from the first one that differs: ``'1a2b…7f03c9e1…'``.
    """
    if len(digest) <= width + 1:
        return digest
    if other is None or other == digest:
        return digest[:width] + "\u2026"
    first = next((i for i, (a, b) in enumerate(zip(digest, other)) if a != b), min(len(digest), len(other)))
    if first < width - 2:
        return digest[:width] + "\u2026"
    return digest[:4] + "\u2026" + digest[first : first + width - 4] + "\u2026"
