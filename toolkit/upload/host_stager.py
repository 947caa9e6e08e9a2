"""Per-constant uploads through reusable pinned buffers, read straight from the blob file.

The uploader of ``LoadOptions(upload="staged")``, and the fallback of the mapped uploader for
whatever it cannot copy from page-locked pages: nothing is ever page-locked in the blob.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from toolkit.core.model import ConstantSpec
from toolkit.core.vocab import UploadPath
from toolkit.upload.reading import read_exactly


class HostStager:
    """Reusable pinned staging for per-constant host-to-device uploads straight from a blob file.

    One upload streams the constant's bytes in chunks through ``slots`` pinned buffers: while
    chunk i is copied to the device (asynchronously, on the current stream), chunk i+1 is read
    by several threads at once (``os.preadv`` releases the GIL).  No side stream: the first one
    a process asks torch for creates torch's whole stream pool (device memory of its own), and the
    copies overlap the reads on the current stream just as well.  The pinned buffers
    (``slots * chunk_bytes``) are allocated once per stager: pinning (cudaHostAlloc) a fresh buffer
    per constant costs more than the copy.
    """

    def __init__(
        self, device: torch.device, *, chunk_bytes: int = 64 << 20, slots: int = 3, read_threads: int | None = None
    ):
        self.device = device
        self.chunk_bytes = int(chunk_bytes)
        self.slots = int(slots)
        # reading from the page cache is the bottleneck (one core copies far slower than a pinned
        # host-to-device copy runs): use up to 16 cores
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
            read_exactly(fd, view, offset, blob_path, spec)
            return
        step = -(-n // parts)
        futs = [
            self._pool.submit(read_exactly, fd, view[i : i + step], offset + i, blob_path, spec)
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
