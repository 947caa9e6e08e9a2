"""Integrity checking: every file a load uses against the size and sha256 its program records.

Opening a ``.so`` runs its code, so this runs before any ``.so`` is opened or byte uploaded.

Each file is hashed once per load.  A file already verified in this process is not hashed
again while its identity is unchanged: device, inode, size, modification time and
status-change time (``st_ctime_ns``).  What that trusts: every write to a file through the
kernel (``write``, ``truncate``, a rename over it, a new copy) changes its mtime and ctime,
and ctime cannot be set back by a user (``touch -d`` and ``os.utime`` set mtime and
atime, and themselves change ctime).  It does not catch a change that bypasses the
file system (writing the raw block device) or a file on a file system with coarse or no
timestamps; :data:`VERIFIED` ``.clear()`` (or ``CONSTSHARE_REHASH=1``) hashes everything again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Iterable

from .errors import IntegrityError
from .model import FileRecord

_CHUNK = 1 << 22


def sha256_file(path: Path, chunk: int = _CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class VerifiedFiles:
    """Files whose content this process has checked: (path, identity) -> sha256 seen."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, tuple], str] = {}
        self._lock = threading.Lock()
        self.hashes = 0  # files hashed so far (tests count them)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, path: Path, record: FileRecord) -> bool:
        """Raise :class:`IntegrityError` unless ``path`` has ``record``'s size and sha256.

        Returns True when the file was hashed now, False when its identity was already verified.
        """
        try:
            if not path.is_file():
                raise IntegrityError("file is missing", path=path)
            st = path.stat()
            if st.st_size != record.bytes:
                kind = "truncated" if st.st_size < record.bytes else "oversized"
                raise IntegrityError(f"file is {kind}: {st.st_size} bytes, the program records {record.bytes}",
                                     path=path)
            key = (str(path.resolve()), file_identity(st))
            if os.environ.get("CONSTSHARE_REHASH", "") not in ("1", "true", "yes"):
                with self._lock:
                    if self._seen.get(key) == record.sha256:
                        return False
            digest = sha256_file(path)
            with self._lock:
                self.hashes += 1
            # the file changed while it was read: its new identity was never verified
            if file_identity(path.stat()) != key[1]:
                raise IntegrityError("file changed while it was being verified", path=path)
        except OSError as e:  # unreadable, or a name the OS refuses (ENAMETOOLONG)
            raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None
        if digest != record.sha256:
            raise IntegrityError("sha256 does not match the program's record: the file was modified", path=path)
        with self._lock:
            self._seen[key] = digest
        return True


VERIFIED = VerifiedFiles()


def check_files(root: Path, records: dict[str, FileRecord], rels: Iterable[str]) -> None:
    """Check the named files of a program (relative to ``root``) against their records."""
    for rel in rels:
        VERIFIED.check(root / rel, records[rel])
