"""Integrity checking: every file a load uses against the size and sha256 its program records.

Opening a ``.so`` runs its code, so this runs before any ``.so`` is opened or byte uploaded.

Each file is hashed once per load.  A file already verified in this process is not hashed
again while its identity is unchanged: device, inode, size, modification time and
status-change time (``st_ctime_ns``).  What that trusts: every write to a file through the
kernel (``write``, ``truncate``, a rename over it, a new copy) changes its mtime and ctime,
and ctime cannot be set back by a user (``touch -d`` and ``os.utime`` set mtime and
atime, and themselves change ctime).  It does not catch a change that bypasses the
file system (writing the raw block device) or a file on a file system with coarse or no
timestamps; :func:`verified_files` ``.clear()`` (or ``LoadOptions(rehash=True)``) hashes everything again.

Speed: one sha256 stream runs at about 1.4 GB/s (the H200's host, 2026-12-01), so our builder
also records the sha256 of every :data:`CHUNK_BYTES` piece (program format 3), hashed on every
core at once (:func:`chunk_sha256s`; ``LoadOptions.hash_threads`` caps the threads); a file
passes when every piece matches, which trusts sha256 as much as the whole-file digest does.  A
record without pieces (formats 1-2, files of other formats) is hashed whole.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from .errors import IntegrityError
from .model import FileRecord
from .options import LoadOptions

_CHUNK = 1 << 22
CHUNK_BYTES = 64 << 20  # the piece size our builder records digests for


def hash_threads() -> int:
    """Threads for hashing pieces unless told otherwise: every core (at most 32)."""
    return max(1, min(32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def sha256_file(path: Path, chunk: int = _CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sha256_range(fd: int, start: int, length: int, path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(min(_CHUNK, max(length, 1)))
    view = memoryview(buf)
    at, end = start, start + length
    while at < end:
        n = os.preadv(fd, [view[: min(len(buf), end - at)]], at)
        if n == 0:
            raise IntegrityError(f"file ends at byte {at}, before the {length}-byte piece at {start} does", path=path)
        h.update(view[:n])
        at += n
    return h.hexdigest()


def chunk_sha256s(path: Path, chunk_bytes: int = CHUNK_BYTES, *, size: int | None = None,
                  threads: int | None = None) -> tuple[str, ...]:
    """The sha256 of each ``chunk_bytes`` piece of ``path`` (the last may be shorter), hashed
    by ``threads`` threads at once (default :func:`hash_threads`)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size if size is None else size
        starts = range(0, size, chunk_bytes)
        if len(starts) <= 1:
            return tuple(_sha256_range(fd, s, min(chunk_bytes, size - s), path) for s in starts)
        with ThreadPoolExecutor(min(threads or hash_threads(), len(starts)), thread_name_prefix="constshare-hash") as pool:
            return tuple(pool.map(lambda s: _sha256_range(fd, s, min(chunk_bytes, size - s), path), starts))
    finally:
        os.close(fd)


def file_record(path: Path, chunk_bytes: int = CHUNK_BYTES) -> FileRecord:
    """A file's record as our builder writes it: size, whole-file sha256, and the sha256 of each
    piece (the whole-file stream runs in its own thread, beside the pieces)."""
    with ThreadPoolExecutor(1, thread_name_prefix="constshare-hash-whole") as one:
        whole = one.submit(sha256_file, path)
        chunks = chunk_sha256s(path, chunk_bytes)
        digest = whole.result()
    return FileRecord(sha256=digest, bytes=Path(path).stat().st_size, chunk_bytes=chunk_bytes, chunks=chunks)


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

    def check(self, path: Path, record: FileRecord, options: LoadOptions = LoadOptions()) -> bool:
        """Raise :class:`IntegrityError` unless ``path`` has ``record``'s size and sha256.

        Returns True when the file was hashed now, False when its identity was already verified
        (never with ``options.rehash``); ``options.hash_threads`` hash its pieces.
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
            if not options.rehash:
                with self._lock:
                    if self._seen.get(key) == record.sha256:
                        return False
            if record.chunks:
                got = chunk_sha256s(path, record.chunk_bytes, size=record.bytes, threads=options.hash_threads)
            else:
                digest = sha256_file(path)
            with self._lock:
                self.hashes += 1
            # the file changed while it was read: its new identity was never verified
            if file_identity(path.stat()) != key[1]:
                raise IntegrityError("file changed while it was being verified", path=path)
        except OSError as e:  # unreadable, or a name the OS refuses (ENAMETOOLONG)
            raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None
        if record.chunks:
            bad = next((i for i, (a, b) in enumerate(zip(got, record.chunks)) if a != b), None)
            if bad is not None or len(got) != len(record.chunks):
                at = (bad if bad is not None else min(len(got), len(record.chunks))) * record.chunk_bytes
                raise IntegrityError(f"sha256 does not match the program's record (the {record.chunk_bytes}-byte "
                                     f"piece at byte {at}): the file was modified", path=path)
        elif digest != record.sha256:
            raise IntegrityError("sha256 does not match the program's record: the file was modified", path=path)
        with self._lock:
            self._seen[key] = record.sha256
        return True

    def note(self, path: Path, identity: tuple, sha256: str) -> None:
        """Record that ``path``, at ``identity``, was just hashed to ``sha256`` by someone else (a
        source that computed the file's record from its bytes): no second hash in this load."""
        with self._lock:
            self._seen[(str(Path(path).resolve()), identity)] = sha256


_PROCESS: dict[str, VerifiedFiles] = {}


def verified_files() -> VerifiedFiles:
    """The files this process has verified, shared by every load; created when first needed."""
    return _PROCESS["verified"] if "verified" in _PROCESS else _PROCESS.setdefault("verified", VerifiedFiles())


def check_files(root: Path, records: dict[str, FileRecord], rels: Iterable[str],
                options: LoadOptions = LoadOptions()) -> None:
    """Check the named files of a program (relative to ``root``) against their records, one after
    another (each file's pieces on every core at once), as :meth:`VerifiedFiles.check` does
    with ``options``, in :func:`verified_files`.  Checking several files at once as well
    was slower on the H200's 16-core host (2026-12-01: 0.61 s against 0.44 s for the 4.3 GB
    benchmark program), so it is not done."""
    for rel in dict.fromkeys(rels):
        verified_files().check(root / rel, records[rel], options)
