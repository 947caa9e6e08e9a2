"""Plain-text wording shared by the explorer's state and view: an error in one line, a counted noun.

An error is shown as its first line only (a traceback is kept apart, for unexpected errors), so
the status line and the error box stay one sentence.
"""

from __future__ import annotations

from toolkit.core.errors import ToolkitError


def one_line(e: BaseException) -> str:
    """The first line of an error; for an unexpected one (not a :class:`ToolkitError`), its type first."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(e, ToolkitError):
        return first or type(e).__name__
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def plural(n: int, word: str) -> str:
    """``n`` (with thousands separators) and ``word``, an ``s`` added unless ``n`` is 1."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"
