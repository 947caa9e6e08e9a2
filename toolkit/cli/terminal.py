"""What the command line prints: control characters escaped, frames sized for a terminal."""

from __future__ import annotations

import signal
import sys

import pandas as pd

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a command a Ctrl-C stopped

# C0 controls (but newline and tab) and C1 controls: a name holding ESC [ ... could
# rewrite the terminal; they are printed escaped.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}


def printable(text: object) -> str:
    """``text`` with terminal control characters (ESC, NUL, ...) shown as ``\\xNN``."""
    return str(text).translate(_CONTROL)


def say(text: object = "") -> None:
    print(printable(text))


def print_frame(df: pd.DataFrame) -> None:
    with pd.option_context(
        "display.width", 200, "display.max_columns", 30, "display.max_colwidth", 70, "display.max_rows", 500
    ):
        say(df.to_string(index=False))


def say_native_code(program) -> None:
    """Before a full load: that it runs the program's native code (once per process, on stderr)."""
    from toolkit.reports.native_code import native_code_notice

    notice = native_code_notice(program)
    if notice:
        print(f"constshare: {printable(notice)}", file=sys.stderr)
