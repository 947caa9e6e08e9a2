"""Page-locking a blob file in place: its pages widened and merged into regions, each registered
with CUDA (``cudaHostRegister``, read-only) on a read-only mapping of the file.

Locked pages are the page cache's own, so a device copy runs straight out of them at the device's
full copy speed with no second host copy.  A page can be registered only once, so the regions
locked so far are tracked per mapping (:class:`LockedMapping`) and a new lock covers only what no
earlier one did.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
import warnings
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path

import torch


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


REGISTER_PORTABLE = 0x01  # cudaHostRegisterPortable: pinned for every device, not only the caller's
REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly: the mapping is PROT_READ


def register(ptr: int, nbytes: int) -> int:
    """Page-lock [ptr, ptr+nbytes); runs on a worker thread, whose CUDA last-error it may set
    (never the loader thread's, whose next kernel launch check would report it)."""
    return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, REGISTER_PORTABLE | REGISTER_READ_ONLY))


def device_thread(device: torch.device, name: str) -> ThreadPoolExecutor:
    """A one-thread pool whose thread has ``device`` current (the CUDA calls it makes act there); a
    device without an index is the caller's current one."""
    index = torch.cuda.current_device() if device.index is None else device.index
    return ThreadPoolExecutor(1, thread_name_prefix=name, initializer=lambda: torch.cuda.set_device(index))


def lock_failed(f: Future) -> bool:
    """A lock that will never hold: cancelled, raised, or returned a CUDA error."""
    return f.cancelled() or (f.done() and (f.exception() is not None or f.result() != 0))


def file_key(path: Path) -> tuple[int, int, int, int]:
    """The blob file's identity (device, inode, size, mtime): what its locked pages are kept under."""
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
                if lock_failed(f):
                    del self.futures[region]
                    self.regions.remove(region)
            todo = regions_to_lock([(start, end)], self.regions, region_bytes)
            for region in todo:
                bisect.insort(self.regions, region)
                self.futures[region] = pool.submit(register, self.base + region[0], region[1] - region[0])
            return todo

    def lock_now(self, region: tuple[int, int]) -> bool | None:
        """Lock one region in the calling thread (a worker thread: see :func:`register`), unless
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
            f.set_result(register(self.base + region[0], region[1] - region[0]))
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
        return sum(e - s for (s, e), f in held if (f.done() or not done) and not lock_failed(f))

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
