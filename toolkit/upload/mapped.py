"""The default CUDA uploader: constants copied straight out of a blob's page-locked pages.

A blob's first load in a process locks the pages it copies (or stages them and locks them
afterwards), and the locks outlive the load in the process's :class:`~toolkit.upload.lock_cache.HostLockCache`,
so a reload copies at the device's full copy speed with no second host copy.  Whatever cannot be
locked is staged through pinned buffers (:class:`~toolkit.upload.host_stager.HostStager`): slower,
never wrong.
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import torch

from toolkit.core.model import ConstantSpec
from toolkit.core.vocab import FirstLoad, UploadPath, parse
from toolkit.upload.host_stager import HostStager
from toolkit.upload.lock_cache import HostLockCache, host_locks
from toolkit.upload.locking import LockedMapping, device_thread, lock_failed, page_spans, regions_to_lock
from toolkit.upload.reading import blob_too_short


def _copy_locked(
    lm: LockedMapping, regions: list[tuple[int, int]], dev: torch.Tensor, dev_at: int, start: int, end: int
) -> None:
    """Queue the device copy of the file's bytes [start, end) out of ``lm``'s locked ``regions``
    (which cover them) into ``dev``, whose byte 0 is the file's byte ``dev_at``: one copy per
    region, since a copy may not span two registrations."""
    for s, e in regions:
        a, z = max(s, start), min(e, end)
        dev[a - dev_at : z - dev_at].copy_(lm.mapped[a:z], non_blocking=True)


class MappedBlobUploader:
    """Uploads constants from a blob; a reload copies straight out of the page cache.

    A blob's first load in a process, by ``first_load`` (:class:`~toolkit.core.vocab.FirstLoad`):

    * ``locked`` (the default): :meth:`_first_load` page-locks the constant's pages in place
      (``cudaHostRegister``, read-only, on a read-only mapping kept in ``locks``, a
      :class:`HostLockCache`, default :func:`host_locks`) piece by piece on one thread, each
      piece's device copy running while the next is locked (``UploadPath.LOCKED_NOW``);
    * ``staged``: through pinned buffers (the :class:`HostStager`, ``UploadPath.STAGED``); when the
      method's uploads are done, :meth:`release` locks those pages in the background;
    * ``hybrid``: ``locked`` from the front of the constant and ``staged`` from its back at once.

    Either way the pages stay locked, and a later load of the same blob copies straight from
    them (``UploadPath.MAPPED_WARM``; ``MAPPED`` if it waited for locking still running).  The
    rates of each first load against a pinned copy: ``benchmarks/upload_throughput.py`` and
    ``benchmarks/RESULTS.md``.

    Budget 0 (``LoadOptions(host_lock_bytes=0)``) locks nothing: every load stages.  If mapping
    or locking fails (a filesystem without mmap, a driver without read-only registration),
    :attr:`disabled_reason` says why and this uploader stops trying: slower, never wrong.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        region_bytes: int = 256 << 20,
        locks: HostLockCache | None = None,
        first_load: FirstLoad | str = FirstLoad.LOCKED,
        piece_bytes: int = 64 << 20,
    ):
        for what, n in (("region_bytes", region_bytes), ("piece_bytes", piece_bytes)):
            if n <= 0 or n % mmap.PAGESIZE:
                raise ValueError(f"{what} must be a positive multiple of the page size ({mmap.PAGESIZE})")
        self.first_load = parse(FirstLoad, first_load, what="first load")
        self.piece_bytes = int(piece_bytes)
        self.device = device
        self.region_bytes = int(region_bytes)
        self.locks = host_locks() if locks is None else locks
        self.fallback = HostStager(device)  # allocates its pinned buffers on first use only
        self.disabled_reason: str | None = None
        self.last_path = UploadPath.STAGED
        self._pool: ThreadPoolExecutor | None = None
        self._unlock_pool: ThreadPoolExecutor | None = None
        self._current: LockedMapping | None = None
        self._ranges: dict[tuple[int, int], None] = {}  # byte ranges of this batch, in order; locked at release
        self._pending: list[Future] = []  # background unlocks

    def _workers(self) -> ThreadPoolExecutor:
        """One locking thread: the driver serialises locking anyway."""
        if self._pool is None:
            self._pool = device_thread(self.device, "constshare-lock")
        return self._pool

    def _unlocker(self) -> ThreadPoolExecutor:
        if self._unlock_pool is None:
            self._unlock_pool = device_thread(self.device, "constshare-unlock")
        return self._unlock_pool

    def prefetch(self, blob_path: Path, specs: list[ConstantSpec]) -> None:
        """Map ``blob_path`` (or find its mapping in the lock cache) for the uploads of ``specs``."""
        self.release()
        self._wait_unlocks()
        wanted = [c for c in specs if c.nbytes]
        if not wanted:
            return
        size = os.path.getsize(blob_path)
        for c in wanted:
            if c.offset < 0 or c.offset + c.nbytes > size:
                raise blob_too_short(blob_path, c, f"the file has {size} bytes")
        if self.disabled_reason or self.locks.budget_bytes == 0:
            return
        try:
            self._current = self.locks.acquire(Path(blob_path))
        except (OSError, ValueError) as e:
            self.disabled_reason = f"cannot map {blob_path}: {e}"
            return
        self._ranges = dict.fromkeys((c.offset, c.offset + c.nbytes) for c in wanted)

    def upload(self, blob_path: Path, spec: ConstantSpec) -> torch.Tensor:
        """The constant's raw bytes as a uint8 tensor on the device (complete when this returns)."""
        n, off = spec.nbytes, spec.offset
        if n == 0:
            return torch.empty(0, dtype=torch.uint8, device=self.device)
        lm = self._current if self._current is not None and self._current.path == Path(blob_path) else None
        if (lm is None or (off, off + n) not in self._ranges) and self.locks.budget_bytes and not self.disabled_reason:
            self.prefetch(blob_path, [spec])  # a lone upload: this constant alone
            lm = self._current
        regions = lm.covering(off, off + n) if lm is not None else None
        if regions:
            with lm.guard:
                futs = [lm.futures[r] for r in regions]
            waited = not all(f.done() for f in futs)
            errs = [f.result() for f in futs]
            if not any(errs):
                dev = torch.empty(n, dtype=torch.uint8, device=self.device)
                with torch.cuda.device(self.device):
                    _copy_locked(lm, regions, dev, off, off, off + n)
                    torch.cuda.current_stream(self.device).synchronize()
                self.last_path = UploadPath.MAPPED if waited else UploadPath.MAPPED_WARM
                return dev
            for r, err in zip(regions, errs):
                if err:
                    lm.forget(r)
            self.disabled_reason = f"cudaHostRegister of {blob_path} failed: CUDA error {max(errs)}"
        elif lm is not None and self.first_load is not FirstLoad.STAGED and not self.disabled_reason:
            out = self._first_load(lm, blob_path, spec)
            if out is not None:
                return out
        out = self.fallback.upload(blob_path, spec)
        self.last_path = UploadPath.STAGED
        return out

    def _first_load(self, lm: LockedMapping, blob_path: Path, spec: ConstantSpec) -> torch.Tensor | None:
        """A first load that locks pages while it copies (``first_load`` "locked" or "hybrid").

        The constant's pages are cut into ``piece_bytes`` pieces.  The locking thread takes
        pieces from the front: it locks one and issues its device copy straight from the
        locked pages, then locks the next while that copy runs.  Under "hybrid" this thread
        takes pieces from the back at the same time and stages them through pinned buffers
        (the :class:`HostStager`), so the driver's locking and the host's copying both feed
        the device.  None (the caller stages it all) when part of the constant is locked or
        being locked already, or locking it would exceed the lock budget.
        """
        n, off = spec.nbytes, spec.offset
        with lm.guard:
            pieces = regions_to_lock([(off, off + n)], lm.regions, self.piece_bytes)
        if not pieces or self.locks.locked_bytes + sum(e - s for s, e in pieces) > self.locks.budget_bytes:
            return None
        # bytes of the constant outside every piece lie in pages locked (or being locked) before:
        # typically its first page, shared with the constant before it
        rest, pos = [], off
        for s_, e_ in pieces:
            if max(s_, off) > pos:
                rest.append((pos, max(s_, off)))
            pos = max(pos, min(e_, off + n))
        if pos < off + n:
            rest.append((pos, off + n))
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        claim = threading.Lock()
        bounds = [0, len(pieces)]  # pieces[bounds[0]:bounds[1]] are unclaimed
        failed: list[tuple[int, int]] = []

        def take(front: bool) -> tuple[int, int] | None:
            with claim:
                if bounds[0] >= bounds[1]:
                    return None
                if front:
                    bounds[0] += 1
                    return pieces[bounds[0] - 1]
                bounds[1] -= 1
                return pieces[bounds[1]]

        def part(piece: tuple[int, int]) -> tuple[int, int]:
            return max(piece[0], off), min(piece[1], off + n)

        def locker() -> int:
            done = 0
            while (piece := take(True)) is not None:
                a, z = part(piece)
                held = lm.lock_now(piece)
                if held is None:  # another load locked it differently meanwhile: copied as the rest is
                    rest.append((a, z))
                    continue
                if not held:
                    failed.append(piece)
                    continue
                dev[a - off : z - off].copy_(lm.mapped[a:z], non_blocking=True)
                done += z - a
            torch.cuda.current_stream(self.device).synchronize()
            return done

        lock_thread = self._workers().submit(locker)
        staged = 0
        fd = os.open(blob_path, os.O_RDONLY)
        try:
            if self.first_load is FirstLoad.HYBRID:
                while (piece := take(False)) is not None:
                    a, z = part(piece)
                    self.fallback.copy_range(fd, dev[a - off : z - off], a, blob_path, spec)
                    staged += z - a
            lock_thread.result()
            for piece in failed:  # a lock that failed: those bytes are staged instead
                lm.forget(piece)
                a, z = part(piece)
                self.fallback.copy_range(fd, dev[a - off : z - off], a, blob_path, spec)
            for a, z in rest:  # pages locked earlier: copied from them, or staged if their lock failed
                regions = lm.covering(a, z)
                with lm.guard:
                    futs = [lm.futures.get(r) for r in regions or ()]
                wait([f for f in futs if f is not None])
                if regions and all(f is not None and not lock_failed(f) for f in futs):
                    _copy_locked(lm, regions, dev, off, a, z)
                else:
                    self.fallback.copy_range(fd, dev[a - off : z - off], a, blob_path, spec)
            torch.cuda.current_stream(self.device).synchronize()
        finally:
            os.close(fd)
        if failed:
            self.disabled_reason = f"cudaHostRegister of {blob_path} failed during a first load"
        self.last_path = UploadPath.HYBRID if staged else UploadPath.LOCKED_NOW
        return dev

    def release(self) -> None:
        """The method's uploads are done: lock their pages in the background for the next load
        of this blob (within the lock budget), and hand the mapping back to the lock cache."""
        lm, self._current = self._current, None
        ranges, self._ranges = list(self._ranges), {}
        if lm is None:
            return
        wanted = sum(e - s for s, e in page_spans(ranges))
        if ranges and not self.disabled_reason and wanted <= self.locks.budget_bytes:
            pool = self._workers()
            for s, e in ranges:
                lm.lock_missing(s, e, self.region_bytes, pool)
        self._pending.extend(self.locks.release(lm, self._unlocker()))

    def _wait_unlocks(self) -> None:
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def drain(self) -> None:
        """Wait until every lock and unlock this uploader started is done (tests, benchmarks)."""
        if self._pool is not None:
            self._pool.submit(lambda: None).result()  # the one locking thread is past its queue
        self._wait_unlocks()

    def close(self) -> None:
        """Release; locking already started carries on in the background for the next load."""
        self.release()
        self._wait_unlocks()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self._unlock_pool is not None:
            self._unlock_pool.shutdown(wait=True)
        self._pool = self._unlock_pool = None
        self.fallback.close()
