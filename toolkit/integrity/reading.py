"""Reading a program file's bytes for checking: opened once and checked against its record's size,
read block by block through the descriptor held open.

Every reader of a checked load goes through here, so a file that is missing, not a regular file, of
the wrong size, or that ends while it is read is an :class:`IntegrityError` naming it, never an
``EOFError`` or a signal.  Holes of a sparse file read as zeros without being read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from toolkit.core.errors import IntegrityError
from toolkit.core.model import FileRecord

BLOCK_BYTES = 1 << 22  # one read (and hasher update), small enough to still be in the CPU cache when hashed
_ZEROS = bytes(BLOCK_BYTES)


def open_checked(path: Path, record: FileRecord) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its status, once it is a regular file of ``record``'s
    size; else an :class:`IntegrityError` naming it (missing, unreadable, not regular, truncated or
    oversized)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except OSError as e:
        raise IntegrityError(
            "file is missing" if isinstance(e, FileNotFoundError) else f"file cannot be read: {e.strerror or e}",
            path=path,
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IntegrityError("not a regular file", path=path)
        if st.st_size != record.bytes:
            kind = "truncated" if st.st_size < record.bytes else "oversized"
            raise IntegrityError(f"file is {kind}: {st.st_size} bytes, the program records {record.bytes}", path=path)
    except OSError as e:
        os.close(fd)
        raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _segments(fd: int, start: int, end: int):
    """(start, end, holds data) spans of the file's bytes [start, end): a hole (of a sparse file)
    reads as zeros and is never read."""
    pos = start
    while pos < end:
        try:
            data = min(os.lseek(fd, pos, os.SEEK_DATA), end)
        except OSError:  # ENXIO: no data from pos on (a hole to the end, or the file ends first)
            data = end
        if data > pos:
            yield pos, data, False
        if data >= end:
            return
        try:
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        except OSError:
            hole = end
        yield data, hole, True
        pos = hole


def read_range(fd: int, view: memoryview, start: int, path: Path, h=None, *, zero_holes: bool = False) -> None:
    """Fill ``view`` with the file's bytes from ``start`` on, block by block, each block hashed
    into ``h`` (when given) while it is still in the cache; where the file has holes ``view`` is
    left as it is (a new copy's zeros, never written) unless ``zero_holes`` (a reused buffer);
    a file that ends first is an :class:`IntegrityError`."""
    for s, e, data in _segments(fd, start, start + len(view)):
        at = s
        while at < e:
            n = min(e - at, BLOCK_BYTES)
            if data:
                n = os.preadv(fd, [view[at - start : at - start + n]], at)
                if n == 0:
                    break
                if h is not None:
                    h.update(view[at - start : at - start + n])
            else:
                if zero_holes:
                    view[at - start : at - start + n] = _ZEROS[:n]
                if h is not None:
                    h.update(_ZEROS[:n])
            at += n
    if os.fstat(fd).st_size < start + len(view):
        raise IntegrityError(
            f"file ended while it was read: it is shorter than the {start + len(view)} bytes "
            "expected (shrunk while loading?)",
            path=path,
        )


def hash_range(fd: int, start: int, n: int, path: Path, h) -> None:
    """Hash the file's bytes [start, start + n) into ``h``, read (:func:`read_range`) through one
    small buffer."""
    view = memoryview(bytearray(min(max(n, 1), BLOCK_BYTES)))
    for at in range(start, start + n, len(view)):
        read_range(fd, view[: min(len(view), start + n - at)], at, path, h)
