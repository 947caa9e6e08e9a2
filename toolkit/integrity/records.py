"""Digests and file records: what our builder records of every file, and what a load compares with.

A record holds the file's size and whole-file sha256 (what other tools check, and what a ``.so``'s
key is made of) and, from our builder, the digest of every :data:`CHUNK_BYTES` piece: BLAKE3
(program format 4) or sha256 (format 3).  A load verifies a recorded file piece by piece, the
pieces on every core at once (BLAKE3 also hashes faster per core than sha256:
``benchmarks/digest_rates.py``); a piece
passes when its digest matches, which trusts the piece digest's collision resistance as much as a
whole-file digest would.  A record without pieces (formats 1-2, files of other formats) is one
piece: the whole file under its sha256.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

from toolkit.core.errors import IntegrityError
from toolkit.core.model import FileRecord
from toolkit.integrity.reading import BLOCK_BYTES, read_range

CHUNK_BYTES = 64 << 20  # the piece size our builder records digests for


def _blake3():
    return blake3.blake3(max_threads=1)  # one thread per piece: the pieces run on every core


DIGESTS = {"sha256": hashlib.sha256, "blake3": _blake3}  # a record's chunk_digest -> a new hasher
DIGEST_NAMES = {"sha256": "sha256", "blake3": "BLAKE3"}


def hash_threads() -> int:
    """Threads for hashing pieces unless told otherwise: every core (at most 32)."""
    return max(1, min(32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def sha256_file(path: Path, chunk: int = BLOCK_BYTES) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def chunk_sha256s(
    path: Path, chunk_bytes: int = CHUNK_BYTES, *, size: int | None = None, threads: int | None = None
) -> tuple[str, ...]:
    """The sha256 of each ``chunk_bytes`` piece of ``path`` (program format 3's piece digests)."""
    return chunk_digests(path, chunk_bytes, size=size, threads=threads, digest="sha256")


def chunk_digests(
    path: Path,
    chunk_bytes: int = CHUNK_BYTES,
    *,
    size: int | None = None,
    threads: int | None = None,
    digest: str = "blake3",
) -> tuple[str, ...]:
    """The ``digest`` (a :data:`DIGESTS` name) of each ``chunk_bytes`` piece of ``path`` (the
    last may be shorter), hashed by ``threads`` threads at once (default :func:`hash_threads`)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    new = DIGESTS[digest]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size if size is None else size

        def piece(start: int) -> str:
            h, buf = new(), bytearray(min(chunk_bytes, size - start))
            read_range(fd, memoryview(buf), start, path, h)
            return h.hexdigest()

        with ThreadPoolExecutor(
            max(1, min(threads or hash_threads(), -(-size // chunk_bytes))), thread_name_prefix="constshare-hash"
        ) as pool:
            return tuple(pool.map(piece, range(0, size, chunk_bytes)))
    finally:
        os.close(fd)


def file_record(path: Path, chunk_bytes: int = CHUNK_BYTES, digest: str = "blake3") -> FileRecord:
    """A file's record as our builder writes it: size, whole-file sha256 (what other tools check,
    and what a ``.so``'s key is made of), and the ``digest`` of each piece (BLAKE3: format 4;
    ``"sha256"``: format 3's), which is what a load verifies; the whole-file stream runs in its
    own thread, beside the pieces."""
    with ThreadPoolExecutor(1, thread_name_prefix="constshare-hash-whole") as one:
        whole = one.submit(sha256_file, path)
        chunks = chunk_digests(path, chunk_bytes, digest=digest)
        sha = whole.result()
    return FileRecord(
        sha256=sha, bytes=Path(path).stat().st_size, chunk_bytes=chunk_bytes, chunks=chunks, chunk_digest=digest
    )


def record_pieces(record: FileRecord, path: Path) -> list[tuple[int, int, str]]:
    """(start, length, expected digest) of each piece a load verifies of the file ``record``
    describes: its recorded pieces, else the whole file under its sha256; an
    :class:`IntegrityError` naming ``path`` when the record's piece count does not fit its size."""
    size = record.bytes
    if not record.chunks:
        return [(0, size, record.sha256)]
    starts = range(0, size, record.chunk_bytes)
    if len(starts) != len(record.chunks):
        raise IntegrityError(
            f"{len(record.chunks)} piece digests recorded for {size} bytes in pieces of {record.chunk_bytes}", path=path
        )
    return [(s, min(record.chunk_bytes, size - s), d) for s, d in zip(starts, record.chunks)]


def new_hasher(record: FileRecord):
    """A new hasher for one of ``record``'s pieces (the whole file's sha256 when it records none)."""
    return (DIGESTS[record.chunk_digest] if record.chunks else hashlib.sha256)()


def mismatch(record: FileRecord, piece: int | None, path: Path) -> IntegrityError:
    """The error for a piece (None: the whole file) whose digest differs from ``record``'s."""
    if piece is None or not record.chunks:
        return IntegrityError("sha256 does not match the program's record: the file was modified", path=path)
    return IntegrityError(
        f"{DIGEST_NAMES[record.chunk_digest]} does not match the program's record (the "
        f"{record.chunk_bytes}-byte piece at byte {piece * record.chunk_bytes}): the file was "
        "modified",
        path=path,
    )
