"""Moving constants' bytes from a host weights blob into device tensors the toolkit owns.

The loader's per-constant uploads (memory-optimal policies) go through one uploader per
CUDA device.  Paths, fastest first:

* :class:`MappedBlobUploader` (the default on CUDA): the blob file is mapped read-only and
  the pages a method needs are page-locked in place (``cudaHostRegister``, read-only) by
  worker threads running ahead of the copies, so the device copies straight out of the
  page cache with no host-side copy at all.  Pages are unlocked when the method's uploads
  are done.
* :class:`HostStager`: parallel ``preadv`` from the file into reusable pinned buffers, each
  chunk's device copy overlapping the next chunk's read.  The mapped uploader falls back to
  it when mapping or locking fails, and ``CONSTSHARE_UPLOAD=staged`` selects it.
* ``upload_constant(..., staging=None)``: a fresh pinned buffer per constant.

On CPU the bytes are simply read into a plain tensor.  Every path returns bytes equal to
the blob's; ``tests/test_upload.py`` checks each one byte for byte.
"""

from __future__ import annotations

import bisect
import mmap
import os
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .manifest import ConstantSpec
from .runtime import dtype_from_name

PATH_MAPPED = "page-locked mapping"
PATH_STAGED = "pinned staging"
PATH_PINNED_EACH = "pinned buffer per constant"
PATH_HOST = "host read"
UPLOAD_ENV = "CONSTSHARE_UPLOAD"  # "mapped" (default) or "staged"


def read_constant_bytes(blob_path: Path, spec: ConstantSpec, *, pin: bool = False) -> torch.Tensor:
    """The bytes of one constant, read from its host blob into a (pinned) uint8 CPU tensor."""
    buf = torch.empty(spec.nbytes, dtype=torch.uint8, pin_memory=pin)
    if spec.nbytes:
        with open(blob_path, "rb", buffering=0) as f:
            f.seek(spec.offset)
            view = memoryview(buf.numpy()).cast("B")
            got = 0
            while got < spec.nbytes:
                n = f.readinto(view[got:])
                if not n:
                    raise EOFError(f"{blob_path}: blob ends before constant {spec.name!r} ({spec.offset}+{spec.nbytes})")
                got += n
    return buf


def as_constant(raw: torch.Tensor, spec: ConstantSpec) -> torch.Tensor:
    """View raw bytes (on any device) as the constant's dtype, shape and strides."""
    dt = dtype_from_name(spec.dtype)
    if spec.nbytes == 0:
        return torch.empty_strided(spec.shape, spec.strides, dtype=dt, device=raw.device)
    typed = raw.view(dt)
    return typed.as_strided(spec.shape, spec.strides, spec.storage_offset)


class HostStager:
    """Reusable pinned staging for per-constant host-to-device uploads straight from a blob file.

    One upload streams the constant's bytes in chunks through ``slots`` pinned buffers:
    while chunk i is copied to the device (asynchronously, on the current stream), chunk i+1
    is read from the file, by several threads at once (``os.preadv`` releases the GIL).  No
    side stream: the first one a process asks torch for creates torch's whole stream pool,
    which measured ~70 MiB of device memory on an H200, and the copies overlap the host
    reads on the current stream just as well.  The
    pinned buffers are allocated once per stager, not per constant: pinning is slow
    (cudaHostAlloc), and a fresh pinned buffer per constant cost more than the copy.
    Created by the loader, one per CUDA device of a session; it holds pinned host memory
    (``slots * chunk_bytes``) until dropped.
    """

    def __init__(self, device: torch.device, *, chunk_bytes: int = 64 << 20, slots: int = 3,
                 read_threads: int | None = None):
        self.device = device
        self.chunk_bytes = int(chunk_bytes)
        self.slots = int(slots)
        # Reading from the page cache is the bottleneck (one core copies a few GB/s; a
        # pinned host-to-device copy runs at ~55 GB/s on an H200): use up to 16 cores.
        self.read_threads = read_threads or max(1, min(16, (os.cpu_count() or 2)))
        self._bufs: list[torch.Tensor] = []
        self._events: list[Any] = []
        self._pool: Any = None
        self.last_path = PATH_STAGED

    def prefetch(self, blob_path: Path, specs: list[ConstantSpec]) -> None:
        """Nothing to prepare ahead: reads happen inside :meth:`upload`."""

    def release(self) -> None:
        """Nothing to let go between methods: the pinned buffers are reused."""

    def _ensure(self) -> None:
        if self._bufs:
            return
        from concurrent.futures import ThreadPoolExecutor

        self._bufs = [torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(self.slots)]
        self._events = [None] * self.slots
        if self.read_threads > 1:
            self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="constshare-read")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._bufs, self._events, self._pool = [], [], None

    @staticmethod
    def _pread(fd: int, view: memoryview, offset: int, what: str) -> None:
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if not n:
                raise EOFError(what)
            got += n

    def _read(self, fd: int, buf: torch.Tensor, offset: int, what: str) -> None:
        view = memoryview(buf.numpy()).cast("B")
        n = len(view)
        parts = self.read_threads if (self._pool is not None and n >= (8 << 20)) else 1
        if parts == 1:
            self._pread(fd, view, offset, what)
            return
        step = -(-n // parts)
        futs = [self._pool.submit(self._pread, fd, view[i: i + step], offset + i, what) for i in range(0, n, step)]
        for f in futs:
            f.result()

    def upload(self, blob_path: Path, spec: ConstantSpec) -> torch.Tensor:
        """The constant's raw bytes as a uint8 tensor on the device (complete when this returns)."""
        self._ensure()
        n = spec.nbytes
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        if n == 0:
            return dev
        what = f"{blob_path}: blob ends before constant {spec.name!r} ({spec.offset}+{n})"
        stream = torch.cuda.current_stream(self.device)
        fd = os.open(blob_path, os.O_RDONLY)
        try:
            for i, start in enumerate(range(0, n, self.chunk_bytes)):
                slot = i % self.slots
                if self._events[slot] is not None:
                    self._events[slot].synchronize()  # the copy out of this slot is done
                m = min(self.chunk_bytes, n - start)
                buf = self._bufs[slot][:m]
                self._read(fd, buf, spec.offset + start, what)
                with torch.cuda.device(self.device):
                    dev[start: start + m].copy_(buf, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                self._events[slot] = ev
            stream.synchronize()
        finally:
            os.close(fd)
            self._events = [None] * self.slots
        return dev


@dataclass
class _MappedBatch:
    """One method's page-locked ranges of one blob: regions sorted by offset, each with the
    future of its ``cudaHostRegister`` (an error code; 0 = locked)."""

    blob_path: Path
    mm: mmap.mmap
    mapped: torch.Tensor | None  # the whole file as uint8, over the mapping
    regions: list[tuple[int, int]]
    starts: list[int]
    futures: list[Future]
    uses: list[int]  # constants still to be copied out of each region
    unlocks: list[Future | None] = None  # type: ignore[assignment]
    base: int = 0  # address of the mapping

    def __post_init__(self) -> None:
        if self.unlocks is None:
            self.unlocks = [None] * len(self.regions)
        if self.mapped is not None:
            self.base = self.mapped.data_ptr()

    def covering(self, start: int, end: int) -> list[int] | None:
        """Indices of the regions that together cover [start, end), or None if some byte is not covered."""
        i = bisect.bisect_right(self.starts, start) - 1
        out, pos = [], start
        while pos < end:
            if i < 0 or i >= len(self.regions) or not (self.regions[i][0] <= pos < self.regions[i][1]):
                return None
            out.append(i)
            pos = self.regions[i][1]
            i += 1
        return out


def page_regions(ranges: list[tuple[int, int]], region_bytes: int, page: int = mmap.PAGESIZE) -> list[tuple[int, int]]:
    """Disjoint page-aligned regions of at most ``region_bytes`` covering every byte range.

    Ranges sharing a page are merged (a page can be locked only once), so every region can
    be registered on its own, by any thread, in any order.
    """
    spans = sorted((s // page * page, -(-e // page) * page) for s, e in ranges if e > s)
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(a, min(a + region_bytes, e)) for s, e in merged for a in range(s, e, region_bytes)]


_REGISTER_PORTABLE = 0x01  # cudaHostRegisterPortable: pinned for every device, not only the caller's
_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly: the mapping is PROT_READ


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def _register(ptr: int, nbytes: int) -> int:
    """Page-lock [ptr, ptr+nbytes); runs on a worker thread, whose CUDA last-error it may set
    (never the loader thread's, whose next kernel launch check would report it)."""
    return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, _REGISTER_PORTABLE | _REGISTER_READ_ONLY))


def _populate(mm: mmap.mmap, start: int, end: int) -> None:
    """Map the page-cache pages of [start, end) into the page table, many at once.

    cudaHostRegister on a fresh mapping faults the pages in itself, one fault at a time,
    under the driver's lock (H200 host: 12 GB/s); populating first lets several workers do
    that part in parallel.  Best effort: an older kernel just leaves it to the register.
    """
    try:
        mm.madvise(_MADV_POPULATE_READ, start, min(end, len(mm)) - start)
    except (OSError, ValueError):
        pass


def _lock(mm: mmap.mmap, base: int, start: int, end: int, populate: bool) -> int:
    if populate:
        _populate(mm, start, end)
    return _register(base + start, end - start)


class MappedBlobUploader:
    """Uploads constants by DMA straight out of the page cache.

    :meth:`prefetch` maps the blob read-only and starts page-locking the byte ranges of the
    constants about to be uploaded, in regions of at most ``region_bytes``, on
    ``register_threads`` worker threads (each region: populate its page-table entries, then
    ``cudaHostRegister`` it read-only); :meth:`upload` waits for each region of its constant
    in turn and copies it asynchronously, so locking region i+1 overlaps copying region i.
    A region is unlocked on a separate thread as soon as the last constant that needs it is
    on the device; :meth:`release` unlocks whatever is left and unmaps, in the background
    (the next :meth:`prefetch` and :meth:`drain` wait for that).

    If mapping or locking fails (a filesystem without mmap, a driver without read-only
    registration), :attr:`disabled_reason` says why and every later upload takes the
    :class:`HostStager` path: slower, never wrong.  Pages are locked only while a method
    loads: the host keeps no second copy of any blob.  ``benchmarks/host_paths.py`` and
    ``benchmarks/upload_throughput.py`` measure each step and the settings.
    """

    def __init__(self, device: torch.device, *, region_bytes: int = 64 << 20, register_threads: int = 4,
                 populate: bool = True, eager_unlock: bool = True):
        if region_bytes <= 0 or region_bytes % mmap.PAGESIZE:
            raise ValueError(f"region_bytes must be a positive multiple of the page size ({mmap.PAGESIZE})")
        if register_threads < 1:
            raise ValueError("register_threads must be >= 1")
        self.device = device
        self.region_bytes = int(region_bytes)
        self.register_threads = int(register_threads)
        self.populate = bool(populate)  # madvise(MADV_POPULATE_READ) each region before locking it
        self.eager_unlock = bool(eager_unlock)  # unlock a region once its last constant is on the device
        self._unlock_pool: ThreadPoolExecutor | None = None
        self.fallback = HostStager(device)  # allocates its pinned buffers on first use only
        self.disabled_reason: str | None = None
        self.last_path = PATH_MAPPED
        self._pool: ThreadPoolExecutor | None = None
        self._batch: _MappedBatch | None = None
        self._pending: list[Future] = []  # background unlock + unmap of released batches

    def _workers(self) -> ThreadPoolExecutor:
        if self._pool is None:
            dev = self.device
            self._pool = ThreadPoolExecutor(self.register_threads, thread_name_prefix="constshare-lock",
                                            initializer=lambda: torch.cuda.set_device(dev))
        return self._pool

    def _unlocker(self) -> ThreadPoolExecutor:
        """One thread for unlocking, so unlocks never queue behind the locks still ahead."""
        if self._unlock_pool is None:
            dev = self.device
            self._unlock_pool = ThreadPoolExecutor(1, thread_name_prefix="constshare-unlock",
                                                   initializer=lambda: torch.cuda.set_device(dev))
        return self._unlock_pool

    def prefetch(self, blob_path: Path, specs: list[ConstantSpec]) -> None:
        """Map ``blob_path`` and start locking the pages of ``specs``, in the order they will be uploaded."""
        self.release()
        self.drain()
        wanted = [c for c in specs if c.nbytes]
        if self.disabled_reason or not wanted:
            return
        size = os.path.getsize(blob_path)
        for c in wanted:
            if c.offset < 0 or c.offset + c.nbytes > size:
                raise EOFError(f"{blob_path}: blob ends before constant {c.name!r} ({c.offset}+{c.nbytes})")
        regions = page_regions([(c.offset, c.offset + c.nbytes) for c in wanted], self.region_bytes)
        try:
            fd = os.open(blob_path, os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        except (OSError, ValueError) as e:
            self.disabled_reason = f"cannot map {blob_path}: {e}"
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only buffers; we never write
            mapped = torch.frombuffer(mm, dtype=torch.uint8)
        base = mapped.data_ptr()
        starts = [s for s, _ in regions]
        batch = _MappedBatch(Path(blob_path), mm, mapped, regions, starts, [None] * len(regions),  # type: ignore[list-item]
                             [0] * len(regions))
        pool = self._workers()
        for c in wanted:  # lock in upload order, so the first copy waits the least
            for i in batch.covering(c.offset, c.offset + c.nbytes) or ():
                batch.uses[i] += 1
                if batch.futures[i] is None:
                    s, e = regions[i]
                    batch.futures[i] = pool.submit(_lock, mm, base, s, e, self.populate)
        self._batch = batch

    def upload(self, blob_path: Path, spec: ConstantSpec) -> torch.Tensor:
        """The constant's raw bytes as a uint8 tensor on the device (complete when this returns)."""
        n, off = spec.nbytes, spec.offset
        if n == 0:
            return torch.empty(0, dtype=torch.uint8, device=self.device)
        batch = self._batch
        idx = batch.covering(off, off + n) if batch is not None and batch.blob_path == Path(blob_path) else None
        if idx is None and not self.disabled_reason:
            self.prefetch(blob_path, [spec])  # a lone upload: lock just its own pages
            batch = self._batch
            idx = batch.covering(off, off + n) if batch is not None else None
        if idx is None or self.disabled_reason:
            return self._fallback(blob_path, spec)
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        with torch.cuda.device(self.device):
            for i in idx:
                err = batch.futures[i].result()
                if err:
                    torch.cuda.current_stream(self.device).synchronize()  # copies already issued
                    self.disabled_reason = f"cudaHostRegister of {blob_path} failed: CUDA error {err}"
                    return self._fallback(blob_path, spec)
                s, e = batch.regions[i]
                a, z = max(s, off), min(e, off + n)
                dev[a - off: z - off].copy_(batch.mapped[a:z], non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
        self.last_path = PATH_MAPPED
        if self.eager_unlock:  # these pages are on the device: unlock the regions nobody else needs
            for i in idx:
                batch.uses[i] -= 1
                if batch.uses[i] == 0 and batch.unlocks[i] is None:
                    batch.unlocks[i] = self._unlocker().submit(self._unlock_region, batch, i)
        return dev

    @staticmethod
    def _unlock_region(batch: "_MappedBatch", i: int) -> None:
        f = batch.futures[i]
        if f is None or f.cancelled():
            return
        try:
            locked = f.result() == 0
        except Exception:
            locked = False
        if locked:
            torch.cuda.cudart().cudaHostUnregister(batch.base + batch.regions[i][0])

    def _fallback(self, blob_path: Path, spec: ConstantSpec) -> torch.Tensor:
        out = self.fallback.upload(blob_path, spec)
        self.last_path = PATH_STAGED
        return out

    def release(self) -> None:
        """Unlock and unmap the current batch in the background (uploads must be complete)."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        for f in batch.futures:
            if f is not None:
                f.cancel()  # a failed load need not lock what it will never copy
        unlocker = self._unlocker()
        for i, f in enumerate(batch.futures):
            if batch.unlocks[i] is None:
                batch.unlocks[i] = unlocker.submit(self._unlock_region, batch, i)

        def unmap() -> None:  # queued after every unlock of this batch on the one unlock thread
            batch.mapped = None  # drop the tensor's export of the mapping before closing it
            try:
                batch.mm.close()
            except BufferError:  # a view is still alive somewhere: the mapping closes when it dies
                pass

        self._pending.append(unlocker.submit(unmap))

    def drain(self) -> None:
        """Wait until every released batch is unlocked and unmapped."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        self.release()
        self.drain()
        for pool in (self._pool, self._unlock_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._unlock_pool = None
        self.fallback.close()


def make_uploader(device: torch.device) -> "MappedBlobUploader | HostStager | None":
    """The loader's uploader for one CUDA device, chosen by ``CONSTSHARE_UPLOAD``:
    ``mapped`` (default), ``staged`` (:class:`HostStager`) or ``unstaged`` (None: a pinned
    buffer per constant; for measurements)."""
    choice = os.environ.get(UPLOAD_ENV, "mapped").strip().lower() or "mapped"
    if choice == "mapped":
        return MappedBlobUploader(device)
    if choice == "staged":
        return HostStager(device)
    if choice == "unstaged":
        return None
    raise ValueError(f"{UPLOAD_ENV}={choice!r}: expected 'mapped', 'staged' or 'unstaged'")


def upload_constant(blob_path: Path, spec: ConstantSpec, device: torch.device,
                    staging: "MappedBlobUploader | HostStager | torch.Tensor | None" = None) -> torch.Tensor:
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
        host = staging[: spec.nbytes]
        with open(blob_path, "rb", buffering=0) as f:
            f.seek(spec.offset)
            f.readinto(memoryview(host.numpy()).cast("B"))
    dev = torch.empty(spec.nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.current_stream(device).synchronize()
    return as_constant(dev, spec)
