"""Constant digests a program directory's manifest claims, checked where a decision rests on them.

A manifest's ``constants[...].digest`` is a claim beside the file records: no piece check covers it.
A share is taken (and judged right or wrong) on two constants' digests being equal or not, and an
export refused on their differing, so before such a decision stands the two constants' bytes must
be equal exactly when their digests are (:func:`check_content_claims`).  What is compared is never
a digest the manifest states of a constant:

* **derived** from the piece records, reading nothing: equal sizes at the same place of one file,
  or ranges that lie at the same place of pieces whose recorded digests are all equal (equal bytes),
  or that hold a whole piece each at the same place with different digests (other bytes).  Piece
  records are what every byte a load uses is verified against: the shared constant runs on the
  cached constant's bytes, verified when they were uploaded, and its own pieces, like every piece
  no load reads, are not read (``integrity="files-first"`` reads and verifies them all first);
* **read** otherwise, in one pass: each piece covering either range is read once through a small
  buffer, on every core, and hashed against its record; the same bytes feed the BLAKE3 of each
  segment of the ranges it holds (the ranges cut where either side's pieces are), and the two
  ranges' segment digests are compared.  No copy is made: the bytes are evidence, never used.

Only where the bytes contradict the digests is a sha256 computed, to name the claim at fault.
A pair found true by reading is remembered for the process while both files keep their identity.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import blake3

from toolkit.core.errors import IntegrityError
from toolkit.core.model import FileRecord
from toolkit.core.options import LoadOptions
from toolkit.integrity.checks import file_identity, verified_files
from toolkit.integrity.copies import VerifiedCopy
from toolkit.integrity.reading import BLOCK_BYTES, open_checked, read_range
from toolkit.integrity.records import hash_threads, mismatch, new_hasher, record_pieces


@dataclass(frozen=True)
class ClaimedConstant:
    """One constant as the manifest claims it: bytes ``[offset, offset + nbytes)`` of program file
    ``file``, whose sha256 is ``digest``."""

    method: str
    name: str
    file: str
    offset: int
    nbytes: int
    digest: str

    @property
    def field(self) -> str:
        return f"constants[{self.name}].digest"


@dataclass(frozen=True)
class ContentClaim:
    """What a decision between ``constant`` and the cached (or stored) ``held`` rests on: their bytes
    are equal exactly when their digests are."""

    constant: ClaimedConstant
    held: ClaimedConstant

    @property
    def claims_equal(self) -> bool:
        return self.constant.digest == self.held.digest


def derived_equal(records: dict[str, FileRecord], claim: ContentClaim) -> bool | None:
    """Whether the two constants' bytes are equal, derived from the piece records alone (module
    docstring); None when the records cannot tell and the bytes must be read."""
    a, b = claim.constant, claim.held
    if a.nbytes != b.nbytes:
        return False
    if a.nbytes == 0 or (a.file == b.file and a.offset == b.offset):
        return True
    ra, rb = records.get(a.file), records.get(b.file)
    if ra is None or rb is None or not ra.chunks or not rb.chunks:
        return None
    step = ra.chunk_bytes
    if (rb.chunk_bytes, rb.chunk_digest) != (step, ra.chunk_digest) or (b.offset - a.offset) % step:
        return None
    shift = (b.offset - a.offset) // step
    first, last = a.offset // step, (a.offset + a.nbytes - 1) // step
    if not (0 <= first + shift and last + shift < len(rb.chunks) and last < len(ra.chunks)):
        return None
    pairs = [(i, ra.chunks[i], rb.chunks[i + shift]) for i in range(first, last + 1)]
    if all(x == y for _, x, y in pairs):
        return True

    # a whole piece inside both ranges with another digest: other bytes (a piece partly outside proves nothing)
    def inside(c: ClaimedConstant, record: FileRecord, i: int) -> bool:
        return c.offset <= i * step and min((i + 1) * step, record.bytes) <= c.offset + c.nbytes

    if any(x != y and inside(a, ra, i) and inside(b, rb, i + shift) for i, x, y in pairs):
        return False
    return None


_FOUND: set[tuple] = set()  # pairs read and found true in this process: (path, identity, offset, nbytes, digest) x 2
_LOCK = threading.Lock()


def _range_digest(copy: VerifiedCopy, offset: int, nbytes: int, new) -> str:
    """The digest (``new()``: a hasher) of bytes ``[offset, offset + nbytes)`` of a verified copy whose
    pieces covering them are verified: read from the sealed copy, or (a copy in place) its file."""
    fd = copy.fd if copy.fd is not None else os.open(copy.source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(fd, offset + nbytes - start, prot=mmap.PROT_READ, offset=start) as mm:
            view = memoryview(mm)
            try:
                h = new()
                h.update(view[offset - start :])
                return h.hexdigest()
            finally:
                view.release()
    finally:
        if copy.fd is None:
            os.close(fd)


def _copy(root: Path, records: dict[str, FileRecord], c: ClaimedConstant, options: LoadOptions) -> VerifiedCopy:
    """The verified copy of ``c``'s file holding, verified, the pieces covering ``c``."""
    return verified_files().copy(Path(root) / c.file, records[c.file], options, [(c.offset, c.offset + c.nbytes)])


def _identity(root: Path, c: ClaimedConstant) -> tuple:
    path = Path(root) / c.file
    try:
        return (str(path.resolve()), file_identity(os.stat(path)), c.offset, c.nbytes, c.digest)
    except OSError as e:
        raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None


def _refuse(root: Path, records: dict[str, FileRecord], claim: ContentClaim, options: LoadOptions) -> IntegrityError:
    """The error naming the claim the bytes contradict: the first of the two whose bytes have another
    sha256 (the constant's first)."""
    equal = "equal" if claim.claims_equal else "different"
    for c, other in ((claim.constant, claim.held), (claim.held, claim.constant)):
        copy = _copy(root, records, c, options)
        got = _range_digest(copy, c.offset, c.nbytes, hashlib.sha256) if c.nbytes else hashlib.sha256().hexdigest()
        if got != c.digest:
            return IntegrityError(
                f"method {c.method!r}: the digest recorded for constant {c.name!r} ({c.digest}) is not the "
                f"sha256 of its bytes [{c.offset}, {c.offset + c.nbytes}) ({got}), and a decision against "
                f"{other.method!r}/{other.name!r} rests on the two digests being {equal}",
                path=Path(root) / c.file,
                field=c.field,
            )
    c = claim.constant  # unreachable short of a sha256 collision: blamed on the constant
    return IntegrityError(
        f"method {c.method!r}: the digests of constant {c.name!r} and {claim.held.method!r}/{claim.held.name!r} "
        f"are {equal}, their bytes are not",
        path=Path(root) / c.file,
        field=c.field,
    )


def _cuts(claim: ContentClaim, records: dict[str, FileRecord]) -> list[int]:
    """Where the two ranges are cut, relative to their starts: at either side's piece boundaries, so
    each segment lies in one piece of each file."""
    n, out = claim.constant.nbytes, {0, claim.constant.nbytes}
    for c in (claim.constant, claim.held):
        step = records[c.file].chunk_bytes if records[c.file].chunks else 0
        if step:
            out.update(range(step - c.offset % step, n, step))
    return sorted(out)


def _segments(claim: ContentClaim, records: dict[str, FileRecord]) -> tuple[list[tuple], list[tuple]]:
    """Each side's segments as (file, start, end) in its file."""
    cuts = _cuts(claim, records)
    return tuple(
        [(c.file, c.offset + s, c.offset + e) for s, e in zip(cuts, cuts[1:])] for c in (claim.constant, claim.held)
    )


def _hash_segments(
    root: Path, records: dict[str, FileRecord], wanted: set[tuple[str, int, int]], options: LoadOptions
) -> dict[tuple[str, int, int], str]:
    """The BLAKE3 of each wanted (file, start, end) segment, every piece covering one read once
    (through one buffer per piece, the pieces on every core at once) and verified against its record."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for rel, s, e in wanted:
        by_file.setdefault(rel, []).append((s, e))
    fds, jobs = {}, []
    try:
        for rel, segs in by_file.items():
            path, record = Path(root) / rel, records[rel]
            fds[rel] = open_checked(path, record)[0]
            for index, (start, length, digest) in enumerate(record_pieces(record, path)):
                inside = [(s, e) for s, e in segs if start <= s and e <= start + length]
                if inside:
                    jobs.append((rel, path, record, index, start, length, digest, inside))
        out: dict[tuple[str, int, int], str] = {}

        def piece(job) -> None:
            rel, path, record, index, start, length, digest, inside = job
            h, seg = new_hasher(record), {se: blake3.blake3(max_threads=1) for se in inside}
            buf = memoryview(bytearray(min(max(length, 1), BLOCK_BYTES)))
            for at in range(start, start + length, len(buf)):
                n = min(len(buf), start + length - at)
                read_range(fds[rel], buf[:n], at, path, h, zero_holes=True)
                for (s, e), sh in seg.items():
                    if s < at + n and at < e:
                        sh.update(buf[max(s, at) - at : min(e, at + n) - at])
            verified_files().count_hashed(length)
            if h.hexdigest() != digest:
                raise mismatch(record, index if record.chunks else None, path)
            out.update({(rel, s, e): sh.hexdigest() for (s, e), sh in seg.items()})

        threads = max(1, min(options.hash_threads or hash_threads(), len(jobs)))
        with ThreadPoolExecutor(threads, thread_name_prefix="constshare-claims") as pool:
            for f in [pool.submit(piece, job) for job in jobs]:
                f.result()
        return out
    except OSError as e:
        raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=Path(root)) from None
    finally:
        for fd in fds.values():
            os.close(fd)


def check_content_claims(
    root: Path, records: dict[str, FileRecord], claims: Iterable[ContentClaim], options: LoadOptions = LoadOptions()
) -> int:
    """Verify that each claim's two constants have equal bytes exactly when their digests are equal:
    derived from the piece records where they tell (:func:`derived_equal`), else read in one pass
    over the pieces covering them, each verified against its record (module docstring).
    :class:`IntegrityError` naming the file and the field ``constants[<name>].digest`` of the claim
    the bytes contradict (or a piece that does not match its record).  Returns the number of
    claims whose bytes were read now."""
    known: dict[ContentClaim, bool] = {}
    pending: dict[ContentClaim, tuple] = {}  # claim -> (process key, its segments on each side)
    for claim in dict.fromkeys(claims):
        equal = derived_equal(records, claim)
        if equal is not None:
            known[claim] = equal
            continue
        key = (_identity(root, claim.constant), _identity(root, claim.held))
        with _LOCK:
            if key in _FOUND and not options.rehash:
                continue
        pending[claim] = (key, _segments(claim, records))
    if pending:
        digests = _hash_segments(
            root, records, {seg for _, sides in pending.values() for side in sides for seg in side}, options
        )
        for claim, (_, (a, b)) in pending.items():
            known[claim] = [digests[x] for x in a] == [digests[y] for y in b]
    for claim, equal in known.items():
        if equal != claim.claims_equal:
            raise _refuse(root, records, claim, options)
    with _LOCK:
        _FOUND.update(key for key, _ in pending.values())
    return len(pending)
