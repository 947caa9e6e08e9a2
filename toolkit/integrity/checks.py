"""The files this process has verified, and the check of a program's files before a load uses them.

Opening a ``.so`` runs its code, so a checked load verifies every file it uses before any ``.so``
is opened or byte uploaded (:func:`check_files`); a weights blob is only opened and its size
checked then, its pieces verified as they are read (:mod:`toolkit.integrity.copies`).

A file verified before in this process is not read again while its identity (device, inode, size,
modification and status-change times) is unchanged and it is asked for under the record it was
verified against: the load uses the copy made then.  That trusts nothing about the file's current
bytes (a change that keeps its identity goes unnoticed, and the load keeps using the bytes that
matched the record); a new identity, or another record, is read and verified again.
Copies cost memory (a second host copy of each file a load reads): they are kept up to
:attr:`VerifiedFiles.budget_bytes` (a quarter of physical memory), least recently used dropped
first; a dropped copy that a load still holds is found again while it lives, so a program larger
than the budget is not read and hashed twice by two loads of it.  :func:`verified_files`
``.clear()`` or ``LoadOptions(rehash=True)`` reads everything again.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Iterable

from toolkit.core.errors import IntegrityError
from toolkit.core.model import FileRecord
from toolkit.core.options import LoadOptions
from toolkit.integrity.copies import VerifiedCopy
from toolkit.integrity.reading import open_checked
from toolkit.integrity.records import hash_threads, mismatch, new_hasher, record_pieces


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What must stay unchanged for a file verified before to be trusted again without reading it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class VerifiedFiles:
    """The files this process has verified: path -> (identity, record, :class:`VerifiedCopy`).

    A copy serves a later reader only for the very record it was verified against (every field:
    size, piece digests, whole-file sha256): another record naming the same file is checked anew.
    """

    def __init__(self, budget_bytes: int | None = None) -> None:
        self._seen: OrderedDict[str, tuple[tuple, FileRecord, VerifiedCopy]] = OrderedDict()
        # copies dropped over the budget that a load still holds (their memory is spent anyway):
        # found again while they live, so a second load of the file makes no second copy
        self._dropped: dict[str, tuple[tuple, FileRecord, weakref.ref]] = {}
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
                in_place = ranges is not None and options.integrity.in_place
                # a sealed copy serves any reader; one in place only readers who accept that
                if (
                    seen is not None
                    and seen[0] == identity
                    and seen[1] == record
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
        self._keep(key, identity, record, copy)
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
        pieces = [(s, n) for s, n, _ in record_pieces(record, path)]
        hashers = [new_hasher(record) for _ in pieces]
        copy = VerifiedCopy.read(fd, path, size, pieces, hashers, options.hash_threads or hash_threads())
        self.count_hashed(size)
        got = [h.hexdigest() for h in hashers]
        if record.chunks:
            bad = next((i for i, (a, b) in enumerate(zip(got, record.chunks)) if a != b), None)
            if bad is not None:
                raise mismatch(record, bad, path)
        elif got[0] != record.sha256:
            raise mismatch(record, None, path)
        return copy

    def _keep(self, key: str, identity: tuple, record: FileRecord, copy: VerifiedCopy) -> None:
        with self._lock:
            self._seen[key] = (identity, record, copy)
            self._seen.move_to_end(key)
            total = sum(c.size for _, _, c in self._seen.values())
            for k in list(self._seen):  # least recently used first; the newest stays
                if total <= self.budget_bytes or k == key:
                    break
                identity_k, record_k, dropped = self._seen.pop(k)
                total -= dropped.size
                self._dropped[k] = (identity_k, record_k, weakref.ref(dropped))
            self._dropped.pop(key, None)
            for k in [k for k, (_, _, ref) in self._dropped.items() if ref() is None]:
                del self._dropped[k]

    def _still_held(self, key: str) -> tuple[tuple, FileRecord, VerifiedCopy] | None:
        """A dropped copy of ``key`` that is still alive (held by a load), as a ``_seen`` entry."""
        entry = self._dropped.get(key)
        copy = entry[2]() if entry else None
        return None if copy is None else (entry[0], entry[1], copy)

    def note(self, path: Path, identity: tuple, sha256: str, copy: VerifiedCopy) -> None:
        """Record that ``path``, at ``identity``, was just read into ``copy`` and hashed to ``sha256``
        by someone else (a source that computed the file's record from its bytes)."""
        self._keep(str(Path(path).resolve()), identity, FileRecord(sha256=sha256, bytes=copy.size), copy)


def _quarter_of_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):
        return 1 << 30


_PROCESS: dict[str, VerifiedFiles] = {}


def verified_files() -> VerifiedFiles:
    """The files this process has verified, shared by every load; created when first needed."""
    return _PROCESS["verified"] if "verified" in _PROCESS else _PROCESS.setdefault("verified", VerifiedFiles())


def check_sha256(copy: VerifiedCopy, record: FileRecord, rel: str) -> str:
    """The sha256 of ``copy``'s bytes (program file ``rel``), once it is the whole-file sha256
    ``record`` claims; else an :class:`IntegrityError` naming the file and the field.

    A record with piece digests (program formats 3 and 4) is verified piece by piece: its
    whole-file sha256 is a claim beside them that no piece check covers.  Wherever that claim
    decides something (a key made of it, the ``.so`` a load opens) it is checked here against the
    bytes the load uses."""
    got = copy.sha256()
    if got != record.sha256:
        raise IntegrityError(
            f"the recorded sha256 {record.sha256} is not the file's ({got}): the record names other bytes",
            path=copy.source,
            field=f"files[{rel!r}].sha256",
        )
    return got


def check_claimed_sha256(
    root: Path, records: dict[str, FileRecord], rels: Iterable[str], options: LoadOptions = LoadOptions()
) -> dict[str, VerifiedCopy]:
    """Verify the named files of a program whole (their pieces, as :func:`check_files`) and their
    recorded whole-file sha256 (:func:`check_sha256`): where a decision is made of that sha256 (a
    program directory's ``.so`` digest, which keys ExecuTorch 1.5.x's lifted constants), before
    it is made.  Reads the files, opens none (a dry run does this too).  Their verified copies by name."""
    out = {}
    for rel in dict.fromkeys(rels):
        copy = verified_files().copy(root / rel, records[rel], options)
        check_sha256(copy, records[rel], rel)
        out[rel] = copy
    return out


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
    verified when a reader asks for them (:meth:`VerifiedCopy.ensure`).  One file at a time: each
    already hashes on every core, and checking several at once as well was slower
    (``benchmarks/RESULTS.md``)."""
    lazy = set(when_read)
    return {
        rel: verified_files().copy(root / rel, records[rel], options, () if rel in lazy else None)
        for rel in dict.fromkeys(rels)
    }
