"""Output files: checked before any work, written whole or not at all.

A command that writes a report checks its path first (:func:`check_output`), so a bad path is
refused before a long load; the file is then written into a temporary file beside it and
renamed over it (:func:`write_text_atomically`), so a failed write never leaves half a report.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from toolkit.core.errors import OutputError


def check_output(path: "str | os.PathLike[str]") -> Path:
    """The file ``path`` names (symlinks followed), once it can be written in place of what is
    there: a regular file or nothing, in a folder this process may write; else
    :class:`~toolkit.core.errors.OutputError` naming it."""
    target = Path(os.path.realpath(path))
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"cannot be written: {e.strerror or e}", path=path) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError("is not a regular file (a folder, device, FIFO or socket): give a file path", path=path)
    if not target.parent.is_dir():
        raise OutputError(f"folder {str(target.parent)!r} does not exist", path=path)
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise OutputError(f"folder {str(target.parent)!r} is not writable (read-only or immutable)", path=path)
    return target


def write_text_atomically(path: "str | os.PathLike[str]", text: str) -> None:
    """Write ``text`` (UTF-8, newlines as given) to ``path``: into a temporary file in the same
    folder, then renamed over it, so a failed write (disk full, read-only folder) leaves the old
    file or none, never half a file; the failure is an :class:`~toolkit.core.errors.OutputError`."""
    target = check_output(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for secrets; a report is read by others
        os.replace(tmp, target)
    except BaseException as e:  # an interrupt too: no temporary file is left behind
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"cannot be written: {e.strerror or e}", path=path) from None
        raise
