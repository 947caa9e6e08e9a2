"""Moving constants' bytes from a host weights blob into device tensors the toolkit owns.

With integrity checking on and a record for the file, the loader's per-constant uploads go
through :func:`stage_pieces` (verified staging: each piece of the record hashed in the process's
own staging slots and copied from there; ``first_load="pipelined"`` runs it unhashed).  Otherwise
they go through one uploader per CUDA device, fastest first: :class:`MappedBlobUploader` (the default on CUDA: a blob's pages
page-locked in place, kept locked between loads by the :class:`HostLockCache`, so a reload
copies straight out of the page cache); :class:`HostStager` (``LoadOptions(upload="staged")``:
parallel ``preadv`` into reusable pinned buffers, nothing ever locked); ``upload_constant(...,
staging=None)``: a fresh pinned buffer per constant.  On CPU the bytes are read into a plain
tensor.  Every path returns bytes equal to the blob's (``tests/test_upload.py``, byte for byte).
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import threading
import warnings
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch

from toolkit.core.errors import IntegrityError
from toolkit.core.model import ConstantSpec, FileRecord
from toolkit.core.options import LoadOptions
from toolkit.core.vocab import FirstLoad, UploadMode, UploadPath, parse
from toolkit.integrity import (
    PiecePlan,
    _mismatch,
    _read_range,
    new_hasher,
    open_checked,
    plan_piece_copies,
    record_piece_plan,
)
from toolkit.integrity import device_digest as digest_on_device


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def _blob_too_short(blob_path: Path, spec: ConstantSpec, detail: str) -> IntegrityError:
    """The error for a blob shorter than the manifest's constants: an IntegrityError (a
    ToolkitError), so a load with ``check_integrity=False`` fails as a recorded failed load,
    as the size check of an integrity-checked load would have made it, not with a bare EOFError."""
    return IntegrityError(
        f"blob ends before constant {spec.name!r} does (offset {spec.offset}, {spec.nbytes} bytes): {detail}",
        path=blob_path,
    )


def _read_exactly(fd: int, view: memoryview, offset: int, blob_path: Path, spec: ConstantSpec) -> None:
    """Fill ``view`` with the file's bytes from ``offset`` on (``view`` is all or part of ``spec``).

    One read may return fewer bytes than asked without being at the end of the file: Linux
    caps a single read at 0x7ffff000 bytes (just under 2 GiB), and signals or network file
    systems cut reads short too.  So read until the view is full; only a read of 0 bytes is
    the end of the file, and that is an error rather than a constant left partly unwritten.
    """
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise _blob_too_short(blob_path, spec, f"nothing to read at byte {offset + got}")
        got += n


def _read_constant_into(blob_path: Path, spec: ConstantSpec, buf: torch.Tensor) -> torch.Tensor:
    """Read the constant's bytes into ``buf`` (a uint8 CPU tensor of exactly ``spec.nbytes``)."""
    if spec.nbytes:
        fd = os.open(blob_path, os.O_RDONLY)
        try:
            _read_exactly(fd, memoryview(buf.numpy()).cast("B"), spec.offset, blob_path, spec)
        finally:
            os.close(fd)
    return buf


def read_constant_bytes(blob_path: Path, spec: ConstantSpec, *, pin: bool = False) -> torch.Tensor:
    """The bytes of one constant, read from its host blob into a (pinned) uint8 CPU tensor."""
    return _read_constant_into(blob_path, spec, torch.empty(spec.nbytes, dtype=torch.uint8, pin_memory=pin))


def as_constant(raw: torch.Tensor, spec: ConstantSpec) -> torch.Tensor:
    """View raw bytes (on any device) as the constant's dtype, shape and strides."""
    dt = dtype_from_name(spec.dtype)
    if spec.nbytes == 0:
        return torch.empty_strided(spec.shape, spec.strides, dtype=dt, device=raw.device)
    typed = raw.view(dt)
    return typed.as_strided(spec.shape, spec.strides, spec.storage_offset)


class HostStager:
    """Reusable pinned staging for per-constant host-to-device uploads straight from a blob file.

    One upload streams the constant's bytes in chunks through ``slots`` pinned buffers: while
    chunk i is copied to the device (asynchronously, on the current stream), chunk i+1 is read
    by several threads at once (``os.preadv`` releases the GIL).  No side stream: the first one
    a process asks torch for creates torch's whole stream pool (~70 MiB of device memory on an
    H200), and the copies overlap the reads on the current stream just as well.  The pinned
    buffers (``slots * chunk_bytes``) are allocated once per stager: pinning (cudaHostAlloc) a
    fresh buffer per constant cost more than the copy.
    """

    def __init__(
        self, device: torch.device, *, chunk_bytes: int = 64 << 20, slots: int = 3, read_threads: int | None = None
    ):
        self.device = device
        self.chunk_bytes = int(chunk_bytes)
        self.slots = int(slots)
        # Reading from the page cache is the bottleneck (one core copies a few GB/s; a
        # pinned host-to-device copy runs at ~55 GB/s on an H200): use up to 16 cores.
        self.read_threads = read_threads or max(1, min(16, (os.cpu_count() or 2)))
        self._bufs: list[torch.Tensor] = []
        self._events: list[Any] = []
        self._pool: Any = None
        self.last_path = UploadPath.STAGED

    def prefetch(self, blob_path: Path, specs: list[ConstantSpec]) -> None:
        """Nothing to prepare ahead: reads happen inside :meth:`upload`."""

    def release(self) -> None:
        """Nothing to let go between methods: the pinned buffers are reused."""

    def _ensure(self) -> None:
        if self._bufs:
            return
        self._bufs = [torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(self.slots)]
        self._events = [None] * self.slots
        if self.read_threads > 1:
            self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="constshare-read")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._bufs, self._events, self._pool = [], [], None

    def _read(self, fd: int, buf: torch.Tensor, offset: int, blob_path: Path, spec: ConstantSpec) -> None:
        view = memoryview(buf.numpy()).cast("B")
        n = len(view)
        parts = self.read_threads if (self._pool is not None and n >= (8 << 20)) else 1
        if parts == 1:
            _read_exactly(fd, view, offset, blob_path, spec)
            return
        step = -(-n // parts)
        futs = [
            self._pool.submit(_read_exactly, fd, view[i : i + step], offset + i, blob_path, spec)
            for i in range(0, n, step)
        ]
        for f in futs:
            f.result()

    def upload(self, blob_path: Path, spec: ConstantSpec) -> torch.Tensor:
        """The constant's raw bytes as a uint8 tensor on the device (complete when this returns)."""
        n = spec.nbytes
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        if n == 0:
            return dev
        fd = os.open(blob_path, os.O_RDONLY)
        try:
            self.copy_range(fd, dev, spec.offset, blob_path, spec)
            torch.cuda.current_stream(self.device).synchronize()
        finally:
            os.close(fd)
        return dev

    def copy_range(self, fd: int, dev: torch.Tensor, file_offset: int, blob_path: Path, spec: ConstantSpec) -> None:
        """Copy the file's bytes at ``file_offset`` into all of ``dev`` (uint8, on the device),
        chunk by chunk through the pinned slots; the last copy may still run on the current
        stream when this returns (synchronize it before using ``dev``)."""
        self._ensure()
        n = dev.numel()
        stream = torch.cuda.current_stream(self.device)
        try:
            for i, start in enumerate(range(0, n, self.chunk_bytes)):
                slot = i % self.slots
                if self._events[slot] is not None:
                    self._events[slot].synchronize()  # the copy out of this slot is done
                m = min(self.chunk_bytes, n - start)
                buf = self._bufs[slot][:m]
                self._read(fd, buf, file_offset + start, blob_path, spec)
                with torch.cuda.device(self.device):
                    dev[start : start + m].copy_(buf, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                self._events[slot] = ev
        finally:
            for ev in self._events:
                if ev is not None:
                    ev.synchronize()  # no slot is reused while a copy out of it may still run
            self._events = [None] * self.slots


def page_spans(ranges: list[tuple[int, int]], page: int = mmap.PAGESIZE) -> list[tuple[int, int]]:
    """The byte ranges widened to whole pages, merged where they share a page, sorted."""
    spans = sorted((s // page * page, -(-e // page) * page) for s, e in ranges if e > s)
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


_END = float("inf")  # sorts after every region end: bisect (pos, _END) finds regions starting <= pos


def regions_to_lock(
    ranges: list[tuple[int, int]], locked: list[tuple[int, int]], region_bytes: int, page: int = mmap.PAGESIZE
) -> list[tuple[int, int]]:
    """Disjoint page-aligned regions of at most ``region_bytes`` that cover every byte of
    ``ranges`` not already inside a ``locked`` region (sorted, disjoint, page-aligned).

    A page can be locked only once: ranges sharing a page are merged, and pages locked by an
    earlier load are left out, so every region can be registered on its own, in any order.
    """
    out: list[tuple[int, int]] = []
    for s, e in page_spans(ranges, page):
        pos = s
        i = max(bisect.bisect_right(locked, (pos, _END)) - 1, 0)  # the last region starting at or before pos
        while pos < e:
            while i < len(locked) and locked[i][1] <= pos:
                i += 1
            gap_end = min(e, locked[i][0]) if i < len(locked) else e
            if pos < gap_end:
                out.extend((a, min(a + region_bytes, gap_end)) for a in range(pos, gap_end, region_bytes))
                pos = gap_end
            else:  # pos is inside locked[i]
                pos = min(e, locked[i][1])
    return out


_REGISTER_PORTABLE = 0x01  # cudaHostRegisterPortable: pinned for every device, not only the caller's
_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly: the mapping is PROT_READ


def _register(ptr: int, nbytes: int) -> int:
    """Page-lock [ptr, ptr+nbytes); runs on a worker thread, whose CUDA last-error it may set
    (never the loader thread's, whose next kernel launch check would report it)."""
    return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, _REGISTER_PORTABLE | _REGISTER_READ_ONLY))


def _lock_failed(f: Future) -> bool:
    """A lock that will never hold: cancelled, raised, or returned a CUDA error."""
    return f.cancelled() or (f.done() and (f.exception() is not None or f.result() != 0))


def _copy_locked(
    lm: "LockedMapping", regions: list[tuple[int, int]], dev: torch.Tensor, dev_at: int, start: int, end: int
) -> None:
    """Queue the device copy of the file's bytes [start, end) out of ``lm``'s locked ``regions``
    (which cover them) into ``dev``, whose byte 0 is the file's byte ``dev_at``: one copy per
    region, since a copy may not span two registrations."""
    for s, e in regions:
        a, z = max(s, start), min(e, end)
        dev[a - dev_at : z - dev_at].copy_(lm.mapped[a:z], non_blocking=True)


def _file_key(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class LockedMapping:
    """One blob file mapped read-only, with the page regions locked in it so far.

    Keyed on the file's identity (device, inode, size, mtime): a rebuilt or rewritten blob
    is a new key, so bytes locked for an old version are never copied for a new one.
    """

    def __init__(self, path: Path, key: tuple[int, int, int, int]):
        self.path, self.key = Path(path), key
        fd = os.open(path, os.O_RDONLY)
        try:
            self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only buffers; we never write
            self.mapped: torch.Tensor | None = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.base = self.mapped.data_ptr()
        self.regions: list[tuple[int, int]] = []  # sorted, disjoint; locked or being locked
        self.futures: dict[tuple[int, int], Future] = {}
        self.users = 0
        self.last_used = 0
        self.guard = threading.Lock()  # regions/futures: two sessions may load the same blob at once

    def lock_missing(self, start: int, end: int, region_bytes: int, pool: ThreadPoolExecutor) -> list[tuple[int, int]]:
        """Start locking the pages of [start, end) that are not locked or being locked yet."""
        with self.guard:
            for region, f in list(self.futures.items()):  # failed or cancelled locks may be tried again
                if _lock_failed(f):
                    del self.futures[region]
                    self.regions.remove(region)
            todo = regions_to_lock([(start, end)], self.regions, region_bytes)
            for region in todo:
                bisect.insort(self.regions, region)
                self.futures[region] = pool.submit(_register, self.base + region[0], region[1] - region[0])
            return todo

    def lock_now(self, region: tuple[int, int]) -> bool | None:
        """Lock one region in the calling thread (a worker thread: see :func:`_register`), unless
        it is locked or being locked already (then wait for that).  True when it holds, False
        when locking failed, None when another load locked part of it differently meanwhile
        (its bytes are then copied from those regions, or staged)."""
        with self.guard:
            f = self.futures.get(region)
            mine = f is None
            if mine:
                if regions_to_lock([region], self.regions, region[1] - region[0]) != [region]:
                    return None  # overlaps a region locked differently: not ours to lock
                f = Future()
                bisect.insort(self.regions, region)
                self.futures[region] = f
        if mine:
            f.set_running_or_notify_cancel()
            f.set_result(_register(self.base + region[0], region[1] - region[0]))
        try:
            return f.result() == 0
        except (CancelledError, Exception):
            return False

    def forget(self, region: tuple[int, int]) -> None:
        """A region whose lock failed or was cancelled: not locked, may be locked again."""
        with self.guard:
            if region in self.futures:
                del self.futures[region]
                self.regions.remove(region)

    def covering(self, start: int, end: int) -> list[tuple[int, int]] | None:
        """The regions that together cover [start, end), or None if some byte is not in one."""
        with self.guard:
            regions = self.regions
            i = bisect.bisect_right(regions, (start, _END)) - 1  # the last region starting at or before start
            out, pos = [], start
            while pos < end:
                if i < 0 or i >= len(regions) or not (regions[i][0] <= pos < regions[i][1]):
                    return None
                out.append(regions[i])
                pos = regions[i][1]
                i += 1
            return out

    def _bytes(self, *, done: bool) -> int:
        with self.guard:
            held = list(self.futures.items())
        return sum(e - s for (s, e), f in held if (f.done() or not done) and not _lock_failed(f))

    locked_bytes = property(lambda self: self._bytes(done=True), doc="Bytes locked now.")
    held_bytes = property(lambda self: self._bytes(done=False), doc="Bytes locked or being locked (the budget's).")

    def unlock_and_unmap(self) -> None:
        """Unlock every locked region (waiting for locks still running), then unmap."""
        with self.guard:
            held = list(self.futures.items())
        for region, f in held:
            f.cancel()
            if f.cancelled():
                continue
            try:
                ok = f.result() == 0
            except Exception:
                ok = False
            if ok:
                torch.cuda.cudart().cudaHostUnregister(self.base + region[0])
        with self.guard:
            self.futures.clear()
            self.regions.clear()
        self.mapped = None  # drop the tensor's export of the mapping before closing it
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere: the mapping closes when it dies
            pass


def lock_budget(budget_bytes: int | None) -> int:
    """A page-lock budget in bytes (:attr:`LoadOptions.host_lock_bytes`); None: a quarter of physical memory."""
    if budget_bytes is not None:
        return max(0, int(budget_bytes))
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):
        return 0


class HostLockCache:
    """Blob mappings whose locked pages outlive one load, up to ``budget_bytes`` in all.

    Loading a blob again (another policy, another session, the explorer) finds its pages still
    locked and copies at the device's full copy speed.  The locked pages are the page cache's
    own: no second host copy of any blob.  Mappings nobody uses are unlocked least recently
    used first once ``budget_bytes`` is exceeded (:func:`lock_budget`; 0: unlock each blob
    once its load is done).
    """

    def __init__(self, budget_bytes: int | None = None):
        self.budget_bytes = lock_budget(budget_bytes)
        self._maps: dict[tuple[int, int, int, int], LockedMapping] = {}
        self._lock = threading.Lock()
        self._clock = 0

    def acquire(self, path: Path) -> LockedMapping:
        key = _file_key(path)
        with self._lock:
            lm = self._maps.get(key)
            if lm is None:
                lm = self._maps[key] = LockedMapping(path, key)
            lm.users += 1
            self._clock += 1
            lm.last_used = self._clock
            return lm

    def release(self, lm: LockedMapping, unlock: "ThreadPoolExecutor") -> list[Future]:
        """One user less; unlock (in ``unlock``) unused mappings over the budget, oldest first."""
        with self._lock:
            lm.users -= 1
            victims = []
            held = {m.key: m.held_bytes for m in self._maps.values()}
            total = sum(held.values())
            for m in sorted(self._maps.values(), key=lambda m: m.last_used):
                if m.users == 0 and (total > self.budget_bytes or not held[m.key]):  # over budget, or nothing held
                    total -= held[m.key]
                    victims.append(m)
                    del self._maps[m.key]
        return [unlock.submit(m.unlock_and_unmap) for m in victims]

    @property
    def locked_bytes(self) -> int:
        with self._lock:
            return sum(m.locked_bytes for m in self._maps.values())

    @property
    def mapped_files(self) -> list[Path]:
        """The blob files mapped now, least recently used first."""
        with self._lock:
            return [m.path for m in sorted(self._maps.values(), key=lambda m: m.last_used)]

    def wait_until_locked(self) -> None:
        """Wait for every lock still running (benchmarks and tests, to measure a true reload)."""
        with self._lock:
            maps = list(self._maps.values())
        for m in maps:
            with m.guard:
                futs = list(m.futures.values())
            for f in futs:
                try:
                    f.exception()
                except CancelledError:  # an eviction cancelled it: nothing to wait for
                    pass

    def clear(self) -> None:
        """Unlock and unmap every mapping nobody is using (now, on this thread)."""
        with self._lock:
            victims = [m for m in self._maps.values() if m.users == 0]
            for m in victims:
                del self._maps[m.key]
        for m in victims:
            m.unlock_and_unmap()


_PROCESS: dict[str, HostLockCache] = {}


def host_locks() -> HostLockCache:
    """The process's locked blob pages, shared by every session; created when first needed (each
    load's uploader sets its budget: :func:`make_uploader`).  ``setdefault``: one, even in a race."""
    return _PROCESS["host_locks"] if "host_locks" in _PROCESS else _PROCESS.setdefault("host_locks", HostLockCache())


def _device_thread(device: torch.device, name: str) -> ThreadPoolExecutor:
    """A one-thread pool whose thread has ``device`` current (the CUDA calls it makes act there)."""
    return ThreadPoolExecutor(1, thread_name_prefix=name, initializer=lambda: torch.cuda.set_device(device))


class MappedBlobUploader:
    """Uploads constants from a blob; a reload copies straight out of the page cache.

    A blob's first load in a process, by ``first_load`` (:class:`~toolkit.core.options.FirstLoad`):

    * ``locked`` (the default): :meth:`_first_load` page-locks the constant's pages in place
      (``cudaHostRegister``, read-only, on a read-only mapping kept in ``locks``, a
      :class:`HostLockCache`, default :func:`host_locks`) piece by piece on one thread, each
      piece's device copy running while the next is locked (``UploadPath.LOCKED_NOW``);
    * ``staged``: through pinned buffers (the :class:`HostStager`, ``UploadPath.STAGED``); when the
      method's uploads are done, :meth:`release` locks those pages in the background;
    * ``hybrid``: ``locked`` from the front of the constant and ``staged`` from its back at once.

    Either way the pages stay locked, and a later load of the same blob copies straight from
    them (``UploadPath.MAPPED_WARM``; ``MAPPED`` if it waited for locking still running).
    Measured on the H200, 2026-12-01 (``benchmarks/upload_throughput.py``, ``peers.py``): a
    first load at 0.49-0.51 of a pinned copy locked, 0.39-0.44 staged (0.20 inside a whole
    load), hybrid 0.57 alone but 0.20 inside a load; a reload at 0.96.

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
            self._pool = _device_thread(self.device, "constshare-lock")
        return self._pool

    def _unlocker(self) -> ThreadPoolExecutor:
        if self._unlock_pool is None:
            self._unlock_pool = _device_thread(self.device, "constshare-unlock")
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
                raise _blob_too_short(blob_path, c, f"the file has {size} bytes")
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
                if regions and all(f is not None and not _lock_failed(f) for f in futs):
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


class _Slots:
    """Staging slots of one device: two buffers per worker (pinned on CUDA), the CUDA events of the
    copies out of them, and the worker threads; allocated once, each worker's buffers on its first
    piece, and reused by every later batch (:func:`_take_slots`)."""

    def __init__(self, device: torch.device, workers: int, nbytes: int):
        self.device, self.workers, self.nbytes = device, workers, nbytes
        self.bufs: list[list[tuple[torch.Tensor, memoryview]]] = [[] for _ in range(workers)]
        self.events: list[list[Any]] = [[None, None] for _ in range(workers)]
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="constshare-stage")

    def worker_bufs(self, w: int) -> list[tuple[torch.Tensor, memoryview]]:
        if not self.bufs[w]:
            block = (
                _pinned_block(2 * self.nbytes)
                if self.device.type == "cuda"
                else torch.empty(2 * self.nbytes, dtype=torch.uint8)
            )
            for i in range(2):
                t = block[i * self.nbytes : (i + 1) * self.nbytes]
                self.bufs[w].append((t, memoryview(t.numpy()).cast("B")))
        return self.bufs[w]


_HUGE_PAGE = 2 << 20
_PINNED_BLOCKS: list[mmap.mmap] = []  # registered for the process's lifetime: never unmapped


def _pinned_block(nbytes: int) -> torch.Tensor:
    """``nbytes`` of pinned host memory, as a uint8 tensor.

    Anonymous memory, aligned to 2 MiB and advised ``MADV_HUGEPAGE``, touched (so its pages exist,
    huge where the kernel grants them) and then page-locked with ``cudaHostRegister``: what
    PyTorch's own ``pinned_use_cuda_host_register`` allocator option does, because
    ``cudaHostAlloc`` allocates, zeroes and maps page by page.  Measured on the H200: ``cudaHostAlloc``
    1.3-3.7 GB/s, ``cudaHostRegister`` of resident memory 37-50 GB/s.  Falls back to
    ``torch.empty(pin_memory=True)`` when registering fails.  Staging slots are kept for the
    process's lifetime, so the block is never unregistered.
    """
    try:
        mm = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    whole = torch.frombuffer(mm, dtype=torch.uint8)
    skip = -whole.data_ptr() % _HUGE_PAGE
    block = whole[skip : skip + nbytes]
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            mm.madvise(mmap.MADV_HUGEPAGE, skip, nbytes)  # skip: a whole number of pages
    block.fill_(0)  # every page resident before it is locked
    if int(torch.cuda.cudart().cudaHostRegister(block.data_ptr(), nbytes, _REGISTER_PORTABLE)) != 0:
        del block, whole  # (a worker thread's CUDA last-error: see _register)
        with contextlib.suppress(BufferError):
            mm.close()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    _PINNED_BLOCKS.append(mm)
    return block


_FREE_SLOTS: dict[tuple[str, int, int, int], list[_Slots]] = {}  # (device, workers, slot bytes) -> sets not in use
_SLOTS_LOCK = threading.Lock()


@contextlib.contextmanager
def _take_slots(device: torch.device, workers: int, nbytes: int):
    """A set of staging slots of the process for one batch (``workers`` workers, whose buffers hold
    ``nbytes`` each): a free one, else a new one (two batches at once, from two sessions' threads,
    never share one); handed back afterwards."""
    key = (device.type, device.index if device.index is not None else -1, workers, nbytes)
    with _SLOTS_LOCK:
        free = _FREE_SLOTS.setdefault(key, [])
        slots = free.pop() if free else None
    if slots is None:
        slots = _Slots(device, workers, nbytes)
    try:
        yield slots
    finally:
        with _SLOTS_LOCK:
            _FREE_SLOTS[key].append(slots)


def unhashed_pieces(specs: list[ConstantSpec], size: int, piece_bytes: int = 64 << 20) -> list[tuple[int, int, None]]:
    """Pieces for an unhashed staging (no record to follow): the constants' pages, merged, cut into
    ``piece_bytes`` regions, the last one ending at the file's end (``size``)."""
    regions = regions_to_lock([(c.offset, c.offset + c.nbytes) for c in specs], [], piece_bytes)
    return [(s, min(e, size) - s, None) for s, e in regions]


def stage_pieces(
    path: Path,
    record: FileRecord | None,
    specs: list[ConstantSpec],
    device: torch.device,
    *,
    threads: int,
    chunk_bytes: int = LoadOptions.staging_chunk_bytes,
    on_hashed=None,
    device_digest: bool | None = LoadOptions.device_digest,
) -> list[torch.Tensor]:
    """The constants' bytes, as uint8 tensors on ``device`` (in ``specs``' order), read from
    ``path`` piece by piece: with ``record``, the record's pieces covering them (:func:`record_piece_plan`),
    each hashed as it is read and compared with its digest; without, their pages unhashed.

    ``threads`` workers each take whole pieces and read a piece in ``chunk_bytes`` sub-chunks
    (:func:`~toolkit.integrity._read_range`: holes read as zeros, a file that ends early is an
    :class:`IntegrityError`) into the process's own staging slots (pinned on CUDA, two per worker,
    reused: :func:`_take_slots`), hashing each sub-chunk into the piece's hasher there and then
    copying its parts into the constants' tensors (on CUDA asynchronously on the caller's current
    stream: no side stream; a slot is refilled only once the copy out of it is done).  So the
    bytes uploaded are exactly the bytes hashed, in private memory.  Returns once every piece is
    hashed and matches and every copy is done; a piece that does not match is an IntegrityError
    naming the file and the piece (:func:`~toolkit.integrity._mismatch`), and no tensor is returned.
    ``on_hashed(nbytes)`` counts the bytes hashed (also those of a batch that failed).

    **Device digest** (``device_digest``; :mod:`toolkit.integrity.device_digest`): a BLAKE3 piece that lands
    whole in one constant (4-byte aligned, a multiple of 64 bytes) is not hashed on the host but
    where it landed, on a stream of its own once its copies are done; the other pieces (shared by
    constants, partly unread, sha256) are hashed on the host as above.  Every digest is compared
    before this returns, so no tensor of a batch with a wrong piece is ever handed out.  ``None``
    decides per batch (:func:`~toolkit.integrity.device_digest.worth_it`); it needs Triton (else the host).
    """
    path = Path(path)
    if record is not None:
        fd, st = open_checked(path, record)
    else:
        fd = os.open(path, os.O_RDONLY)
        st = os.fstat(fd)
    try:
        size = st.st_size
        for c in specs:
            if c.nbytes and (c.offset < 0 or c.offset + c.nbytes > size):
                raise _blob_too_short(path, c, f"the file has {size} bytes")
        spans = [(c.offset, c.nbytes) for c in specs]
        plan = (
            record_piece_plan(record, path, spans)
            if record is not None
            else plan_piece_copies(unhashed_pieces(specs, size), spans)
        )
        outs = [torch.empty(c.nbytes, dtype=torch.uint8, device=device) for c in specs]
        if plan:
            on_device = _device_hashed(record, plan, outs, device, device_digest)
            _run_staging(fd, path, record, plan, outs, device, threads, chunk_bytes, on_hashed, on_device)
        return outs
    finally:
        os.close(fd)


def _in_one_constant(p: PiecePlan, outs: list[torch.Tensor]) -> torch.Tensor | None:
    """The bytes of constant tensor that piece ``p`` fills whole, where the device can hash them in
    place; None for a piece shared, partly unread or misaligned."""
    if len(p.copies) != 1:
        return None
    cp = p.copies[0]
    if cp.in_piece != 0 or cp.nbytes != p.length:
        return None
    view = outs[cp.constant][cp.in_constant : cp.in_constant + cp.nbytes]
    return view if digest_on_device.hashable_in_place(view, p.length) else None


def _device_hashed(
    record: FileRecord | None,
    plan: list[PiecePlan],
    outs: list[torch.Tensor],
    device: torch.device,
    forced: bool | None,
) -> dict[int, torch.Tensor]:
    """For :func:`stage_pieces`: the pieces of ``plan`` (by position) the device hashes, each with the
    bytes it lands in: none without a BLAKE3 piece record, when ``forced`` is False, without Triton, or
    (``forced`` None) when the batch is too small to pay for it (:func:`~toolkit.integrity.device_digest.worth_it`)."""
    if record is None or not record.chunks or record.chunk_digest != "blake3":
        return {}
    where = {i: v for i, p in enumerate(plan) if p.digest is not None and (v := _in_one_constant(p, outs)) is not None}
    if not (
        where
        and digest_on_device.worth_it(device, sum(plan[i].length for i in where), forced)
        and digest_on_device.available(device)
    ):  # last: on the CPU it loads the kernels to see
        return {}
    return where


def _run_staging(
    fd: int,
    path: Path,
    record: FileRecord | None,
    plan: list[PiecePlan],
    outs: list[torch.Tensor],
    device: torch.device,
    threads: int,
    chunk_bytes: int,
    on_hashed,
    on_device: dict[int, torch.Tensor],
) -> None:
    """:func:`stage_pieces`' workers over ``plan``; raises the first error or mismatch (lowest piece).
    The pieces of ``on_device`` (by position in ``plan``) are hashed where they landed instead."""
    cuda = device.type == "cuda"
    stream = torch.cuda.current_stream(device) if cuda else None
    digests = digest_on_device.DeviceDigests(device, len(plan)) if on_device else None
    hash_stream = torch.cuda.Stream(device) if cuda and on_device else None
    if hash_stream is not None:
        hash_stream.wait_stream(stream)  # the digest table's zeros are written before any root
    workers, chunk = max(1, min(threads, len(plan))), chunk_bytes
    todo = enumerate(plan)  # (position in plan, piece)
    claim = threading.Lock()
    stop = threading.Event()
    bad: list[int] = []
    hashed = [0]

    def next_piece() -> tuple[int, PiecePlan] | None:
        with claim:
            return None if stop.is_set() else next(todo, None)

    def piece(slots: _Slots, w: int, k: list[int], pos: int, p: PiecePlan) -> None:
        bufs, events = slots.worker_bufs(w), slots.events[w]
        h = new_hasher(record) if p.digest is not None and pos not in on_device else None
        end = p.start + p.length
        for u in range(p.start, end, chunk):
            m = min(chunk, end - u)
            slot = k[0] % 2
            k[0] += 1
            if events[slot] is not None:
                events[slot].synchronize()  # the copy out of this slot is done: it may be refilled
            buf, view = bufs[slot]
            _read_range(fd, view[:m], u, path, h, zero_holes=True)  # a reused slot: holes written as zeros
            for cp in p.copies:
                fs = p.start + cp.in_piece  # the file's byte the copy starts at
                a, z = max(u, fs), min(u + m, fs + cp.nbytes)
                if a < z:
                    at = cp.in_constant + a - fs
                    outs[cp.constant][at : at + z - a].copy_(buf[a - u : z - u], non_blocking=cuda)
            if cuda:
                if events[slot] is None:
                    events[slot] = torch.cuda.Event()
                events[slot].record(stream)
        if pos in on_device:  # hashed where it landed, once its copies are done
            if cuda:
                done = torch.cuda.Event()
                done.record(stream)
                hash_stream.wait_event(done)
            with torch.cuda.stream(hash_stream) if cuda else contextlib.nullcontext():
                digests.hash(on_device[pos], pos)
        if h is not None:
            with claim:
                hashed[0] += p.length
                if h.hexdigest() != p.digest:
                    bad.append(p.index)
                    stop.set()  # the batch fails: the other workers take no new piece

    def worker(slots: _Slots, w: int) -> None:
        k = [0]
        try:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                while (job := next_piece()) is not None:
                    piece(slots, w, k, *job)
        except BaseException:
            stop.set()
            raise
        finally:
            for ev in slots.events[w]:
                if ev is not None:
                    ev.synchronize()  # no slot is handed on while a copy out of it may still run

    with _take_slots(device, max(1, threads), chunk) as slots:
        futs = [slots.pool.submit(worker, slots, w) for w in range(workers)]
        wait(futs)
    if digests is not None:
        if hash_stream is not None:
            hash_stream.synchronize()  # every kernel done: the digests are final
        for pos, hexdigest in digests.hexdigests().items():
            hashed[0] += plan[pos].length
            if hexdigest != plan[pos].digest:
                bad.append(plan[pos].index)
    if on_hashed is not None and hashed[0]:
        on_hashed(hashed[0])
    for f in futs:
        e = f.exception()
        if isinstance(e, OSError):
            raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None
        if e is not None:
            raise e
    if bad:
        raise _mismatch(record, min(bad), path)


def make_uploader(device: torch.device, options: LoadOptions) -> "MappedBlobUploader | HostStager | None":
    """The loader's uploader for one CUDA device, as ``options.upload`` says: a
    :class:`MappedBlobUploader` over :func:`host_locks` (given ``options.host_lock_bytes`` as
    budget), a :class:`HostStager`, or None (``unstaged``: a pinned buffer per constant)."""
    if options.upload is UploadMode.MAPPED:
        locks = host_locks()
        locks.budget_bytes = lock_budget(options.host_lock_bytes)
        return MappedBlobUploader(device, locks=locks, first_load=options.first_load)
    return HostStager(device) if options.upload is UploadMode.STAGED else None


def upload_constant(
    blob_path: Path,
    spec: ConstantSpec,
    device: torch.device,
    staging: "MappedBlobUploader | HostStager | torch.Tensor | None" = None,
) -> torch.Tensor:
    """Upload exactly one constant from the host blob into a tensor the toolkit owns.

    ``staging`` is the device's uploader (:class:`MappedBlobUploader` or :class:`HostStager`,
    what the loader passes), a pinned uint8 buffer at least as large as the constant, or
    None (a pinned buffer is allocated for this constant alone).
    """
    if device.type == "cpu":
        return as_constant(read_constant_bytes(blob_path, spec), spec)
    if isinstance(staging, (MappedBlobUploader, HostStager)):
        return as_constant(staging.upload(blob_path, spec), spec)
    if staging is None or staging.numel() < spec.nbytes:
        host = read_constant_bytes(blob_path, spec, pin=True)
    else:
        host = _read_constant_into(blob_path, spec, staging[: spec.nbytes])
    dev = torch.empty(spec.nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.current_stream(device).synchronize()
    return as_constant(dev, spec)
