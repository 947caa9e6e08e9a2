"""Staging slots: the process's own pinned buffers that verified staging reads, hashes and copies from.

Each batch of :func:`~toolkit.upload.staging.stage_pieces` takes one set of slots (two buffers per
worker, pinned on CUDA) and hands it back afterwards; the sets live for the process, so pinning is
paid once and no two batches ever share a buffer.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from toolkit.upload.locking import REGISTER_PORTABLE


class Slots:
    """Staging slots of one device: two buffers per worker (pinned on CUDA), the CUDA events of the
    copies out of them, and the worker threads; allocated once, each worker's buffers on its first
    piece, and reused by every later batch (:func:`take_slots`)."""

    def __init__(self, device: torch.device, workers: int, nbytes: int):
        self.device, self.workers, self.nbytes = device, workers, nbytes
        self.bufs: list[list[tuple[torch.Tensor, memoryview]]] = [[] for _ in range(workers)]
        self.events: list[list[Any]] = [[None, None] for _ in range(workers)]
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="constshare-stage")
        self._making = [threading.Lock() for _ in range(workers)]

    def worker_bufs(self, w: int) -> list[tuple[torch.Tensor, memoryview]]:
        with self._making[w]:
            if not self.bufs[w]:
                block = (
                    pinned_block(2 * self.nbytes)
                    if self.device.type == "cuda"
                    else torch.empty(2 * self.nbytes, dtype=torch.uint8)
                )
                for i in range(2):
                    t = block[i * self.nbytes : (i + 1) * self.nbytes]
                    self.bufs[w].append((t, memoryview(t.numpy()).cast("B")))
        return self.bufs[w]

    def prepare(self, workers: int) -> list[Future]:
        """Start making the buffers of the first ``workers`` workers, each on the pool's threads (a
        fresh set pins them there, in parallel); the futures of those not yet made."""
        return [self.pool.submit(self.worker_bufs, w) for w in range(min(workers, self.workers)) if not self.bufs[w]]


_HUGE_PAGE = 2 << 20
_PINNED_BLOCKS: list[mmap.mmap] = []  # registered for the process's lifetime: never unmapped


def pinned_block(nbytes: int) -> torch.Tensor:
    """``nbytes`` of pinned host memory, as a uint8 tensor.

    Anonymous memory, aligned to 2 MiB and advised ``MADV_HUGEPAGE``, touched (so its pages exist,
    huge where the kernel grants them) and then page-locked with ``cudaHostRegister``: what
    PyTorch's own ``pinned_use_cuda_host_register`` allocator option does, because
    ``cudaHostAlloc`` allocates, zeroes and maps page by page, several times slower than registering
    memory already resident (``benchmarks/probes/staging_profile.py``).  Falls back to
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
    if int(torch.cuda.cudart().cudaHostRegister(block.data_ptr(), nbytes, REGISTER_PORTABLE)) != 0:
        del block, whole  # (a worker thread's CUDA last-error: see toolkit.upload.locking.register)
        with contextlib.suppress(BufferError):
            mm.close()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    _PINNED_BLOCKS.append(mm)
    return block


_FREE_SLOTS: dict[tuple[str, int, int, int], list[Slots]] = {}  # (device, workers, slot bytes) -> sets not in use
_SLOTS_LOCK = threading.Lock()


@contextlib.contextmanager
def take_slots(device: torch.device, workers: int, nbytes: int):
    """A set of staging slots of the process for one batch (``workers`` workers, whose buffers hold
    ``nbytes`` each): a free one, else a new one (two batches at once, from two sessions' threads,
    never share one); handed back afterwards."""
    key = (device.type, device.index if device.index is not None else -1, workers, nbytes)
    with _SLOTS_LOCK:
        free = _FREE_SLOTS.setdefault(key, [])
        slots = free.pop() if free else None
    if slots is None:
        slots = Slots(device, workers, nbytes)
    try:
        yield slots
    finally:
        with _SLOTS_LOCK:
            _FREE_SLOTS[key].append(slots)
