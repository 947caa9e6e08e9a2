"""One progress bar for builds, loads, dry runs, comparisons and scans: ``tqdm.auto``, so a
widget bar in a notebook and one line on a terminal, and nothing at all when the terminal is
not a TTY (a CI log, a pipe)."""

from __future__ import annotations

from typing import Any, Iterable


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **options: Any):
    """A ``tqdm.auto.tqdm`` over ``iterable`` (or of ``total=``); ``enabled=False`` shows nothing.

    Enabled, it is quiet where the output is not a TTY (tqdm's ``disable=None``); a notebook's
    widget bar always shows.
    """
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=None if enabled else True, **options)
