"""Sealed private copies of verified bytes: what a checked load reads instead of the program's files.

**What the load uses is what was verified.**  A file is read once, through a descriptor held open,
into a private copy (:class:`VerifiedCopy`: a ``memfd`` no other process can open, sealed once
written so that nothing, this process included, can change, shrink or grow it); its pieces are
hashed from that copy as they arrive, and every later reader of the load (the ``.so``'s
``dlopen``, AOTInductor's whole-blob upload, the per-constant uploads, a ``.pte``'s parsers) reads
the copy's path, never the program's file.  A writer through a shared mapping, a writer swapping
the file during the load, or a shrink during the load therefore changes nothing the load uses.

**Only the pieces a load reads**: a weights blob's copy is made lazily (:meth:`VerifiedCopy.ensure`):
a piece is copied and hashed when a reader asks for a byte range it covers, before that reader
reads it; a piece that does not match is an :class:`IntegrityError` naming the file, and nothing
of it is used.  Pieces no one asks for are neither read nor hashed and stay holes of the copy.
Until every piece is in, the copy is sealed against growing, shrinking and every *new* writable
mapping or ``write`` (``F_SEAL_FUTURE_WRITE``): only the copy's own mapping, held by this module,
fills it; once complete it is sealed like any other.  A write into the program file after the
check changes a piece not yet copied, which its digest then refuses.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from toolkit.core.model import FileRecord
from toolkit.integrity.reading import BLOCK_BYTES, hash_range, read_range
from toolkit.integrity.records import mismatch, new_hasher, record_pieces

_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
# a copy still being filled: no growing, shrinking, new writable mapping or write() (Linux 5.1)
_SEALS_WHILE_FILLING = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a piece's pages in at once, not one by one


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
        self.pieces = {i: piece for i, piece in enumerate(record_pieces(record, path)) if piece[1]}
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
        self._sha256: str | None = None  # the sha256 of the copy's bytes, once known (:meth:`sha256`)

    in_place = False  # True: no copy; :attr:`path` is the program's file, its pieces hashed where they lie

    @classmethod
    def lazy(
        cls, src_fd: int, source: Path, record: FileRecord, threads: int, on_hashed=None, *, in_place: bool = False
    ) -> "VerifiedCopy | None":
        """An empty copy of the file ``src_fd`` (whose record is ``record``) that :meth:`ensure`
        fills piece by piece, each piece hashed as it is read; None where the kernel cannot seal a
        copy while it is filled (no ``F_SEAL_FUTURE_WRITE``: before Linux 5.1).  ``in_place``: no
        copy at all: :meth:`ensure` hashes the pieces from the file and :attr:`path` is the file
        itself (``LoadOptions(integrity="in-place")``: trusts that nothing writes it between a
        piece's check and its use)."""
        size = record.bytes
        if in_place:
            copy = cls.__new__(cls)
            copy.fd, copy.size, copy.source, copy.path, copy.in_place = None, size, Path(source), Path(source), True
            copy._sha256 = None
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
                _run_pieces(None, lambda _, s, n, h: hash_range(p.src, s, n, self.source, h), spans, hashers, p.threads)
            else:
                _run_pieces(
                    p.view,
                    lambda view, s, n, h: read_range(p.src, view[s : s + n], s, self.source, h),
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
                raise mismatch(p.record, bad, self.source)
            self._finish_if_complete()
            return nbytes

    def sha256(self) -> str:
        """The sha256 of the copy's bytes, hashed from the sealed copy itself (every piece verified
        first), once: a digest of the bytes this copy holds, whatever a record claims.
        :class:`ValueError` for a copy in place, whose bytes are the program's file and may change."""
        if self._sha256 is None:
            if self.in_place or self.fd is None:
                raise ValueError(f"{self.source}: a copy in place has no sha256 of its own (its file may change)")
            self.ensure(None)
            h = hashlib.sha256()
            at = 0
            while at < self.size:
                block = os.pread(self.fd, min(BLOCK_BYTES, self.size - at), at)
                if not block:  # a sealed copy cannot shrink: this cannot happen
                    raise OSError(f"{self.source}: its sealed copy ended at byte {at} of {self.size}")
                h.update(block)
                at += len(block)
            self._sha256 = h.hexdigest()
        return self._sha256

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
                    lambda view, s, n, h: read_range(src_fd, view[s : s + n], base + s, source, h),
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


_KEPT: dict[str, VerifiedCopy] = {}  # sha256 of a copy's own bytes -> copy: .so files dlopen'ed, open for the process


def keep_for_process(copy: VerifiedCopy) -> VerifiedCopy:
    """The process's one copy of ``copy``'s bytes (``copy`` unless one with the same bytes is kept
    already), never closed: ``dlopen`` matches a library by its path's name, so a path once
    ``dlopen``'ed must never name other bytes.  Keyed by the sha256 of the copy's own bytes
    (:meth:`VerifiedCopy.sha256`), never by a digest a record claims: a claim that names another
    program's ``.so`` must not hand this load that program's code."""
    return _KEPT.setdefault(copy.sha256(), copy)


def copy_region(path: Path, offset: int, nbytes: int) -> tuple[VerifiedCopy, str]:
    """The bytes ``[offset, offset + nbytes)`` of ``path`` as a sealed copy, and their sha256."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        copy = VerifiedCopy.read(fd, path, nbytes, [(0, nbytes)], [h], 1, base=offset)
    finally:
        os.close(fd)
    copy._sha256 = h.hexdigest()  # hashed from the very bytes copied, as they were copied
    return copy, copy._sha256
