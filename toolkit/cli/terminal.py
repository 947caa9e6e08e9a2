"""What the command line prints: hidden characters escaped, one line where one is meant, frames sized
for a terminal.

Names, paths and errors come from programs and folders, which may be hostile: a name holding ESC [ ...
could rewrite the terminal, a newline could print a forged line (``'prog' under 'name-only'
(predicted): ok``), a bidi control could reorder one, a zero-width space or a homoglyph could make two
names look the same, a lone surrogate (a file name that is not UTF-8) could end the command.  So a text
is printed through :func:`printable` (its own newlines and tabs kept), a line that stands for one line
through :func:`say_line` (every line break escaped), and a value in a frame or a line through
:func:`toolkit.display.cells.escape_text`, look-alikes spelled out (:func:`shown_names`).
"""

from __future__ import annotations

import signal
import sys
from typing import Callable, Iterable

import pandas as pd

from toolkit.display.cells import escape_text, lookalikes, one_line

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a command a Ctrl-C stopped
# 141, as a shell reports a command SIGPIPE stopped: stdout closed early (``| head``), output cut short.
# Not 0 (the verdict was never printed in full) and not 1 (which says "wrong data").
EXIT_STDOUT_CLOSED = 128 + 13  # signal.SIGPIPE, which Windows lacks


def printable(text: object) -> str:
    """``text`` with every hidden character but newline and tab (ESC, NUL, bidi controls, zero-width
    spaces, U+2028, lone surrogates, ...) shown as ``\\xNN``/``\\uNNNN``."""
    return one_line(text, keep="\n\t")


def printable_line(text: object) -> str:
    """``text`` as one line: every hidden character escaped, line breaks too (an error naming a path)."""
    return one_line(text)


def say(text: object = "") -> None:
    print(printable(text))


def say_line(text: object) -> None:
    """``text``, one line by meaning (a headline, a finding): every line break in it escaped too."""
    print(printable_line(text))


def shown(value: object) -> str:
    """A name or path as one line, every hidden character escaped (:func:`~toolkit.display.cells.escape_text`)."""
    return escape_text(str(value))


def shown_names(names: Iterable[str]) -> Callable[[object], str]:
    """A function showing each of ``names`` (and any other text) as :func:`escape_text` does, those that
    look like another of ``names`` with every non-ASCII character escaped."""
    looks = lookalikes(n for n in names if isinstance(n, str))
    return lambda v: escape_text(str(v), spell_out=isinstance(v, str) and v in looks)


def shown_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every text cell and column label escaped (look-alikes spelled out): one row a line."""
    texts = [c for c in df.columns if isinstance(c, str)]
    cells = {
        i: df.iloc[:, i].tolist() for i in range(df.shape[1]) if not pd.api.types.is_numeric_dtype(df.dtypes.iloc[i])
    }
    for values in cells.values():
        texts += [v for v in values if isinstance(v, str)]
    show = shown_names(texts)
    out = df.copy()
    for i, values in cells.items():
        out.isetitem(i, [show(v) if isinstance(v, str) else v for v in values])
    out.columns = [show(c) if isinstance(c, str) else c for c in df.columns]
    return out


def print_frame(df: pd.DataFrame) -> None:
    with pd.option_context(
        "display.width", 200, "display.max_columns", 30, "display.max_colwidth", 70, "display.max_rows", 500
    ):
        say(shown_frame(df).to_string(index=False))


def say_native_code(program) -> None:
    """Before a full load: that it runs the program's native code (once per process, on stderr)."""
    from toolkit.reports.native_code import native_code_notice

    notice = native_code_notice(program)
    if notice:
        print(f"constshare: {printable(notice)}", file=sys.stderr)
