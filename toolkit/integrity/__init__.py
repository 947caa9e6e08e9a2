"""Integrity checking: every file a load uses against the size and sha256 its program records.

Opening a ``.so`` runs its code, so this runs before any ``.so`` is opened or byte uploaded.

**What the load uses is what was verified.**  A file is read once, through a descriptor held
open, into a private copy (:class:`VerifiedCopy`: a ``memfd`` no other process can open, sealed
once written so that nothing, this process included, can change, shrink or grow it); its
pieces are hashed from that copy as they arrive, and every later reader of the load (the
``.so``'s ``dlopen``, AOTInductor's whole-blob upload, the per-constant uploads, a ``.pte``'s
parsers) reads the copy's path, never the program's file.  A writer through a shared mapping,
a writer swapping the file during the load, or a shrink during the load therefore changes
nothing the load uses: a file that ends early while it is read is an :class:`IntegrityError`
naming it, never a signal.

A file verified before in this process is not read again while its identity (device, inode,
size, modification and status-change times) is unchanged: the load uses the copy made then.
That trusts nothing about the file's current bytes (a change that keeps its identity goes
unnoticed, and the load keeps using the bytes that matched the record); a new identity is read
and verified again.  Copies cost memory (a second host copy of each file a load reads): they
are kept up to :data:`VerifiedFiles.budget_bytes` (a quarter of physical memory), least
recently used dropped first (a dropped copy that a load still holds is found again while it lives:
the H200's 16.5 GiB-per-method program holds 33 GiB of blobs against a 32 GiB budget, and its
differential oracle's unshared load would read and hash each blob again); :func:`verified_files` ``.clear()`` or ``LoadOptions(rehash=True)``
reads everything again.

Speed (``benchmarks/digest_rates.py``): one sha256 stream runs at about 1.4 GB/s (the H200's
host, 2026-12-01), BLAKE3 at about 2.3 times that per core (2-core CPU, 2026-12-02), and the
copy itself costs about as much as a sha256 stream (new shared-memory pages, each faulted in).
So our builder also records a digest of every :data:`CHUNK_BYTES` piece: BLAKE3 (program format
4) or sha256 (format 3); such a file is read and hashed piece by piece on every core at once
(``LoadOptions.hash_threads`` caps the threads); a piece passes when its digest matches, which
trusts the piece digest (BLAKE3's or sha256's collision resistance) as much as a whole-file
digest would.  A record without pieces (formats 1-2, files of other formats) is hashed whole.

**Only the pieces a load reads** (``ranges``): a weights blob's copy is made lazily
(:meth:`VerifiedCopy.ensure`): a piece is copied and hashed when a reader asks for a byte range
it covers (the per-constant uploads ask for their constants' ranges, the whole-blob upload and
every other reader for the whole file), before that reader reads it; a piece that does not
match is an :class:`IntegrityError` naming the file, and nothing of it is used.  Pieces no one
asks for are neither read nor hashed and stay holes of the copy.  Until every piece is in, the
copy is sealed against growing, shrinking and every *new* writable mapping or ``write``
(``F_SEAL_FUTURE_WRITE``): only the copy's own mapping, held by this module, fills it; once
complete it is sealed like any other.  The program file is read through a descriptor held open
from the first check, so a file swapped (renamed over) later is never read; a write into the
same file after the check changes a piece not yet copied, which its digest then refuses.

**Verified staging** (the default for per-constant uploads, ``LoadOptions.integrity_staging``):
those do not read the copy; :func:`record_piece_plan` plans which pieces a batch of constants
reads and which copies each feeds, and :func:`toolkit.upload.stage_pieces` hashes each piece in
the process's own staging buffers and uploads from them (no copy is filled, nothing is kept).
"""

from __future__ import annotations

import bisect
import fcntl
import hashlib
import mmap
import os
import stat
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import blake3

from toolkit.core.errors import IntegrityError
from toolkit.core.model import FileRecord
from toolkit.core.options import LoadOptions

_CHUNK = 1 << 22
CHUNK_BYTES = 64 << 20  # the piece size our builder records digests for
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
# a copy still being filled: no growing, shrinking, new writable mapping or write() (Linux 5.1)
_SEALS_WHILE_FILLING = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a piece's pages in at once, not one by one


def _blake3():
    return blake3.blake3(max_threads=1)  # one thread per piece: the pieces run on every core


DIGESTS = {"sha256": hashlib.sha256, "blake3": _blake3}  # a record's chunk_digest -> a new hasher
DIGEST_NAMES = {"sha256": "sha256", "blake3": "BLAKE3"}


def hash_threads() -> int:
    """Threads for hashing pieces unless told otherwise: every core (at most 32)."""
    return max(1, min(32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def sha256_file(path: Path, chunk: int = _CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_ZEROS = bytes(_CHUNK)


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


def _read_range(fd: int, view: memoryview, start: int, path: Path, h=None, *, zero_holes: bool = False) -> None:
    """Fill ``view`` with the file's bytes from ``start`` on, block by block, each block hashed
    into ``h`` (when given) while it is still in the cache; where the file has holes ``view`` is
    left as it is (a new copy's zeros, never written) unless ``zero_holes`` (a reused buffer);
    a file that ends first is an :class:`IntegrityError`."""
    for s, e, data in _segments(fd, start, start + len(view)):
        at = s
        while at < e:
            n = min(e - at, _CHUNK)
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


def _hash_range(fd: int, start: int, n: int, path: Path, h) -> None:
    """Hash the file's bytes [start, start + n) into ``h``, read (:func:`_read_range`) through one
    small buffer."""
    view = memoryview(bytearray(min(max(n, 1), _CHUNK)))
    for at in range(start, start + n, len(view)):
        _read_range(fd, view[: min(len(view), start + n - at)], at, path, h)


def _record_pieces(record: FileRecord, path: Path) -> list[tuple[int, int, str]]:
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


@dataclass(frozen=True)
class PieceCopy:
    """Bytes of one piece that one constant holds: ``nbytes`` bytes from ``in_piece`` in the piece
    to ``in_constant`` in constant ``constant`` (its index in the batch)."""

    constant: int
    in_constant: int
    in_piece: int
    nbytes: int


@dataclass(frozen=True)
class PiecePlan:
    """One piece a batch of uploads reads: its number in the file's piece table, its bytes
    ``[start, start + length)``, the digest it must have (None: not hashed) and the copies it feeds."""

    index: int
    start: int
    length: int
    digest: str | None
    copies: tuple[PieceCopy, ...]


def plan_piece_copies(
    pieces: Sequence[tuple[int, int, str | None]], spans: Sequence[tuple[int, int]]
) -> list[PiecePlan]:
    """For byte ranges ``spans`` ((file offset, length) of each constant of a batch), the pieces
    (sorted, disjoint (start, length, digest) spans of the file) that cover them, each with the
    copies it feeds; pieces no range touches are left out.  ValueError for a byte of a range
    that lies in no piece."""
    starts = [s for s, _, _ in pieces]
    feeds: dict[int, list[PieceCopy]] = {}
    for k, (off, n) in enumerate(spans):
        pos, end = off, off + n
        i = bisect.bisect_right(starts, pos) - 1
        while pos < end:
            if not (0 <= i < len(pieces) and pieces[i][0] <= pos < pieces[i][0] + pieces[i][1]):
                raise ValueError(f"bytes [{pos}, {end}) of constant {k} lie in no piece")
            s, length, _ = pieces[i]
            z = min(end, s + length)
            feeds.setdefault(i, []).append(PieceCopy(k, pos - off, pos - s, z - pos))
            pos, i = z, i + 1
    return [PiecePlan(i, pieces[i][0], pieces[i][1], pieces[i][2], tuple(feeds[i])) for i in sorted(feeds)]


def record_piece_plan(record: FileRecord, path: Path, spans: Sequence[tuple[int, int]]) -> list[PiecePlan]:
    """:func:`plan_piece_copies` over the pieces of ``record`` (:func:`_record_pieces`: a record
    without piece digests is one piece, the whole file under its sha256)."""
    return plan_piece_copies(_record_pieces(record, path), spans)


def new_hasher(record: FileRecord):
    """A new hasher for one of ``record``'s pieces (the whole file's sha256 when it records none)."""
    return (DIGESTS[record.chunk_digest] if record.chunks else hashlib.sha256)()


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
            _read_range(fd, memoryview(buf), start, path, h)
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


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _run_pieces(view: memoryview, read, pieces: list[tuple[int, int]], hashers: list, threads: int) -> None:
    """Run ``read(view, start, length, hasher)`` for every piece (on ``threads`` threads at once)."""
    jobs = list(zip(pieces, hashers))
    if len(jobs) <= 1 or threads <= 1:
        for (s, n), h in jobs:
            read(view, s, n, h)
    else:
        with ThreadPoolExecutor(min(threads, len(jobs)), thread_name_prefix="constshare-hash") as pool:
            for f in [pool.submit(read, view, s, n, h) for (s, n), h in jobs]:
                f.result()


def _unmap(view: memoryview, mm: mmap.mmap) -> None:
    view.release()
    try:
        mm.close()
    except BufferError:  # a slice still held by an error's traceback: unmapped when it goes
        pass


def _fill(fd: int, size: int, read, pieces: list[tuple[int, int]], hashers: list, threads: int) -> None:
    """:func:`_run_pieces` into a writable mapping of ``fd``, then unmap it (the seals need no
    writable mapping left)."""
    mm = mmap.mmap(fd, size)
    view = memoryview(mm)
    try:
        _run_pieces(view, read, pieces, hashers, threads)
    finally:
        _unmap(view, mm)


class _Pending:
    """What a lazily filled copy still lacks: its pieces not yet read (index -> start, length,
    expected digest), the program file's descriptor they are read from, and the copy's one
    writable mapping."""

    def __init__(self, src_fd: int, record: FileRecord, threads: int, on_hashed, mm: mmap.mmap | None, path: Path):
        size = record.bytes
        # one digest for the whole file when it records no pieces: any byte read needs all of it
        self.step = record.chunk_bytes if record.chunks else max(size, 1)
        self.pieces = {i: piece for i, piece in enumerate(_record_pieces(record, path)) if piece[1]}
        self.src = os.dup(src_fd)
        self.record, self.threads, self.on_hashed = record, threads, on_hashed
        self.mm = mm
        self.view = memoryview(mm) if mm is not None else None
        self.lock = threading.Lock()

    def wanted(self, ranges) -> list[int]:
        if ranges is None:
            return sorted(self.pieces)
        out: set[int] = set()
        for start, end in ranges:
            if end > start:
                out.update(i for i in range(start // self.step, (end - 1) // self.step + 1) if i in self.pieces)
        return sorted(out)

    def close(self) -> None:
        if self.view is not None:
            _unmap(self.view, self.mm)
            self.view = self.mm = None
        if self.src is not None:
            os.close(self.src)
            self.src = None


class VerifiedCopy:
    """A file's bytes as read (and hashed) once: a sealed ``memfd``, read through :attr:`path`.

    Closed when the last reference goes; a path handed to ``dlopen`` must stay valid for the
    process (its number must never name another file): :func:`keep_for_process`.
    """

    def __init__(self, fd: int, size: int, source: Path):
        self.fd, self.size, self.source = fd, size, Path(source)
        self.path = Path(f"/proc/self/fd/{fd}")
        self._pending: _Pending | None = None  # a lazy copy's missing pieces (None: complete)

    in_place = False  # True: no copy; :attr:`path` is the program's file, its pieces hashed where they lie

    @classmethod
    def lazy(
        cls, src_fd: int, source: Path, record: FileRecord, threads: int, on_hashed=None, *, in_place: bool = False
    ) -> "VerifiedCopy | None":
        """An empty copy of the file ``src_fd`` (whose record is ``record``) that :meth:`ensure`
        fills piece by piece, each piece hashed as it is read; None where the kernel cannot seal a
        copy while it is filled (no ``F_SEAL_FUTURE_WRITE``: before Linux 5.1).  ``in_place``: no
        copy at all: :meth:`ensure` hashes the pieces from the file and :attr:`path` is the file
        itself (``LoadOptions(integrity_copy=False)``: trusts that nothing writes it between a
        piece's check and its use)."""
        size = record.bytes
        if in_place:
            copy = cls.__new__(cls)
            copy.fd, copy.size, copy.source, copy.path, copy.in_place = None, size, Path(source), Path(source), True
            copy._pending = _Pending(src_fd, record, threads, on_hashed, None, source)
            copy._finish_if_complete()
            return copy
        fd = os.memfd_create(f"constshare:{source.name}"[:240], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size) if size else None  # the one writable mapping, made before the seal
            try:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS_WHILE_FILLING)
            except OSError:
                if mm is not None:
                    mm.close()
                os.close(fd)
                return None
            if mm is not None and hasattr(mmap, "MADV_HUGEPAGE"):
                mm.madvise(mmap.MADV_HUGEPAGE)  # fewer faults where shared memory may use huge pages
        except BaseException:
            os.close(fd)
            raise
        copy = cls(fd, size, source)
        copy._pending = _Pending(src_fd, record, threads, on_hashed, mm, source)
        copy._finish_if_complete()
        return copy

    @property
    def complete(self) -> bool:
        """Every byte read and verified (and the copy sealed for good)."""
        return self._pending is None

    def ensure(self, ranges: Iterable[tuple[int, int]] | None = None) -> int:
        """Read and verify, before anyone reads them, the pieces covering ``ranges`` ((start, end)
        byte ranges; None: the whole file) not read yet; the bytes hashed now.
        :class:`IntegrityError` naming the file when a piece's digest differs from its record."""
        p = self._pending
        if p is None:
            return 0
        with p.lock:
            if self._pending is None:
                return 0
            todo = p.wanted(None if ranges is None else list(ranges))
            if not todo:
                return 0
            spans = [(p.pieces[i][0], p.pieces[i][1]) for i in todo]
            hashers = [new_hasher(p.record) for _ in todo]
            for s, n in spans if p.mm is not None else ():  # fault each piece's pages in at once
                try:
                    p.mm.madvise(_MADV_POPULATE_WRITE, s, n)
                except OSError:  # (before Linux 5.14: they fault one by one)
                    break
            if p.view is None:  # in place: hashed from the file through a small buffer
                _run_pieces(
                    None, lambda _, s, n, h: _hash_range(p.src, s, n, self.source, h), spans, hashers, p.threads
                )
            else:
                _run_pieces(
                    p.view,
                    lambda view, s, n, h: _read_range(p.src, view[s : s + n], s, self.source, h),
                    spans,
                    hashers,
                    p.threads,
                )
            nbytes = sum(n for _, n in spans)
            if p.on_hashed is not None:
                p.on_hashed(nbytes)
            bad = None
            for i, h in zip(todo, hashers):
                if h.hexdigest() == p.pieces[i][2]:
                    del p.pieces[i]
                elif bad is None:
                    bad = i
            if bad is not None:  # its bytes stay unverified: a later ensure reads them again
                raise _mismatch(p.record, bad, self.source)
            self._finish_if_complete()
            return nbytes

    def _finish_if_complete(self) -> None:
        p = self._pending
        if p is not None and not p.pieces:
            p.close()  # the writable mapping goes first: F_SEAL_WRITE needs none left
            if self.fd is not None:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            self._pending = None

    @classmethod
    def read(
        cls,
        src_fd: int,
        source: Path,
        size: int,
        pieces: list[tuple[int, int]],
        hashers: list,
        threads: int,
        *,
        base: int = 0,
    ) -> "VerifiedCopy":
        """Copy the ``size`` bytes of ``src_fd`` from byte ``base`` on into a new sealed copy, piece
        ``i`` (start, length in the copy) hashed into ``hashers[i]`` (None: not hashed), the pieces
        on ``threads`` threads at once."""
        fd = os.memfd_create(f"constshare:{source.name}"[:240], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            if size:
                _fill(
                    fd,
                    size,
                    lambda view, s, n, h: _read_range(src_fd, view[s : s + n], base + s, source, h),
                    pieces,
                    hashers,
                    threads,
                )
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, source)

    def __del__(self) -> None:
        if getattr(self, "_pending", None) is not None:
            self._pending.close()
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None


def _mismatch(record: FileRecord, piece: int | None, path: Path) -> IntegrityError:
    """The error for a piece (None: the whole file) whose digest differs from ``record``'s."""
    if piece is None or not record.chunks:
        return IntegrityError("sha256 does not match the program's record: the file was modified", path=path)
    return IntegrityError(
        f"{DIGEST_NAMES[record.chunk_digest]} does not match the program's record (the "
        f"{record.chunk_bytes}-byte piece at byte {piece * record.chunk_bytes}): the file was "
        "modified",
        path=path,
    )


_KEPT: dict[str, VerifiedCopy] = {}  # sha256 -> copy: .so files dlopen'ed, open for the process


def keep_for_process(copy: VerifiedCopy, sha256: str) -> VerifiedCopy:
    """The process's one copy of the bytes whose sha256 is ``sha256`` (``copy`` unless one is kept
    already), never closed: ``dlopen`` matches a library by its path's name, so a path once
    ``dlopen``'ed must never name other bytes."""
    return _KEPT.setdefault(sha256, copy)


def copy_region(path: Path, offset: int, nbytes: int) -> tuple[VerifiedCopy, str]:
    """The bytes ``[offset, offset + nbytes)`` of ``path`` as a sealed copy, and their sha256."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        return VerifiedCopy.read(fd, path, nbytes, [(0, nbytes)], [h], 1, base=offset), h.hexdigest()
    finally:
        os.close(fd)


class VerifiedFiles:
    """The files this process has verified: path -> (identity, sha256, :class:`VerifiedCopy`)."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self._seen: OrderedDict[str, tuple[tuple, str, VerifiedCopy]] = OrderedDict()
        # copies dropped over the budget that a load still holds (their memory is spent anyway):
        # found again while they live, so a second load of the file makes no second copy
        self._dropped: dict[str, tuple[tuple, str, weakref.ref]] = {}
        self._lock = threading.Lock()
        self.budget_bytes = _quarter_of_memory() if budget_bytes is None else budget_bytes
        self.hashes = 0  # files (or a lazy copy's pieces) hashed so far, one per read (tests count them)
        self.hashed_bytes = 0  # bytes hashed so far

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._dropped.clear()

    def __len__(self) -> int:
        return len(self._seen)

    def copy(
        self,
        path: Path,
        record: FileRecord,
        options: LoadOptions = LoadOptions(),
        ranges: Iterable[tuple[int, int]] | None = None,
    ) -> VerifiedCopy:
        """The verified copy of ``path``: made now unless one of the file at its current identity
        exists; :class:`IntegrityError` unless the file has ``record``'s size and the bytes read
        match its digests (every piece's, when it records pieces).  ``ranges`` None: every byte is
        read and verified now; else ((start, end) byte ranges, maybe none) only the pieces
        covering them, the rest when asked for (:meth:`VerifiedCopy.ensure`)."""
        path = Path(path)
        fd, st = open_checked(path, record)
        try:
            key, identity = str(path.resolve()), file_identity(st)
            with self._lock:
                seen = self._seen.get(key) or self._still_held(key)
                in_place = ranges is not None and not options.integrity_copy
                # a sealed copy serves any reader; one in place only readers who accept that
                if (
                    seen is not None
                    and seen[0] == identity
                    and seen[1] == record.sha256
                    and not options.rehash
                    and seen[2].in_place <= in_place
                ):
                    if key in self._seen:
                        self._seen.move_to_end(key)
                    copy = seen[2]
                else:
                    copy = None
            if copy is not None:
                self._ensure(copy, ranges)
                return copy
            threads = options.hash_threads or hash_threads()
            copy = (
                None
                if ranges is None
                else VerifiedCopy.lazy(fd, path, record, threads, self.count_hashed, in_place=in_place)
            )
            if copy is None:
                copy = self._read(fd, path, record, options)
            else:
                self._ensure(copy, ranges)
        except OSError as e:  # unreadable
            raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None
        finally:
            os.close(fd)
        self._keep(key, identity, record.sha256, copy)
        return copy

    def check(
        self,
        path: Path,
        record: FileRecord,
        options: LoadOptions = LoadOptions(),
        ranges: Iterable[tuple[int, int]] | None = None,
    ) -> bool:
        """:meth:`copy`; True when bytes of the file were read and hashed now, False when its copy
        held them already."""
        before = self.hashes
        self.copy(path, record, options, ranges)
        return self.hashes != before

    def more(self, copy: VerifiedCopy, ranges: Iterable[tuple[int, int]] | None = None) -> VerifiedCopy:
        """``copy`` (one :meth:`copy` made) holding, verified, the pieces covering ``ranges`` too
        (None: every byte)."""
        self._ensure(copy, ranges)
        return copy

    def count_hashed(self, nbytes: int) -> None:
        """Count one read of ``nbytes`` hashed bytes (a file, a lazy copy's pieces, a staged batch)."""
        with self._lock:
            self.hashes += 1
            self.hashed_bytes += nbytes

    @staticmethod
    def _ensure(copy: VerifiedCopy, ranges) -> None:
        try:
            copy.ensure(ranges)
        except OSError as e:
            raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=copy.source) from None

    def _read(self, fd: int, path: Path, record: FileRecord, options: LoadOptions) -> VerifiedCopy:
        size = record.bytes
        pieces = [(s, n) for s, n, _ in _record_pieces(record, path)]
        hashers = [new_hasher(record) for _ in pieces]
        copy = VerifiedCopy.read(fd, path, size, pieces, hashers, options.hash_threads or hash_threads())
        self.count_hashed(size)
        got = [h.hexdigest() for h in hashers]
        if record.chunks:
            bad = next((i for i, (a, b) in enumerate(zip(got, record.chunks)) if a != b), None)
            if bad is not None:
                raise _mismatch(record, bad, path)
        elif got[0] != record.sha256:
            raise _mismatch(record, None, path)
        return copy

    def _keep(self, key: str, identity: tuple, sha256: str, copy: VerifiedCopy) -> None:
        with self._lock:
            self._seen[key] = (identity, sha256, copy)
            self._seen.move_to_end(key)
            total = sum(c.size for _, _, c in self._seen.values())
            for k in list(self._seen):  # least recently used first; the newest stays
                if total <= self.budget_bytes or k == key:
                    break
                identity_k, sha_k, dropped = self._seen.pop(k)
                total -= dropped.size
                self._dropped[k] = (identity_k, sha_k, weakref.ref(dropped))
            self._dropped.pop(key, None)
            for k in [k for k, (_, _, ref) in self._dropped.items() if ref() is None]:
                del self._dropped[k]

    def _still_held(self, key: str) -> tuple[tuple, str, VerifiedCopy] | None:
        """A dropped copy of ``key`` that is still alive (held by a load), as a ``_seen`` entry."""
        entry = self._dropped.get(key)
        copy = entry[2]() if entry else None
        return None if copy is None else (entry[0], entry[1], copy)

    def note(self, path: Path, identity: tuple, sha256: str, copy: VerifiedCopy) -> None:
        """Record that ``path``, at ``identity``, was just read into ``copy`` and hashed to ``sha256``
        by someone else (a source that computed the file's record from its bytes)."""
        self._keep(str(Path(path).resolve()), identity, sha256, copy)


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
        if not _is_regular(st):
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


def _is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


def _quarter_of_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):
        return 1 << 30


_PROCESS: dict[str, VerifiedFiles] = {}


def verified_files() -> VerifiedFiles:
    """The files this process has verified, shared by every load; created when first needed."""
    return _PROCESS["verified"] if "verified" in _PROCESS else _PROCESS.setdefault("verified", VerifiedFiles())


def check_files(
    root: Path,
    records: dict[str, FileRecord],
    rels: Iterable[str],
    options: LoadOptions = LoadOptions(),
    *,
    when_read: Iterable[str] = (),
) -> dict[str, VerifiedCopy]:
    """Verify the named files of a program (relative to ``root``) against their records, one after
    another (each file's pieces on every core at once), as :meth:`VerifiedFiles.copy` does with
    ``options``, in :func:`verified_files`: their verified copies by name.  Those also named in
    ``when_read`` (weights blobs) are only opened and their size checked now: their pieces are
    verified when a reader asks for them (:meth:`VerifiedCopy.ensure`).  Checking several
    files at once as well was slower on the H200's 16-core host (2026-12-01: 0.61 s against
    0.44 s for the 4.3 GB benchmark program), so it is not done."""
    lazy = set(when_read)
    return {
        rel: verified_files().copy(root / rel, records[rel], options, () if rel in lazy else None)
        for rel in dict.fromkeys(rels)
    }
