"""The command line, ``constshare`` (``python -m toolkit``): it parses arguments, calls workflows and prints."""

from toolkit.cli.main import main
from toolkit.cli.terminal import EXIT_INTERRUPTED, printable

__all__ = ["EXIT_INTERRUPTED", "main", "printable"]
