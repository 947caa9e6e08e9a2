"""BLAKE3 of a weights blob's pieces on the device they were uploaded to (verified staging's
device digest, :func:`toolkit.upload.stage_pieces`).

Device memory is private to the process: a piece hashed where it landed is exactly what the load
uses, so the host only reads and copies, and the device hashes far faster than the host's cores.
The kernels (:mod:`toolkit.integrity.blake3_kernels`) are Triton's, which PyTorch's CUDA wheels
depend on: one lane per 1 KiB chunk (its chaining value), then one kernel per tree level pairing
neighbours (an odd level's last node carried up: BLAKE3's left-complete tree).  Each piece's root
goes into one device table (:class:`DeviceDigests`), read back once per batch and compared on the
host.  Exact against the ``blake3`` package (``tests/test_device_digest.py``: the Triton
interpreter on the CPU, the device on a GPU).

Triton is imported on first use, and importing it and loading the kernels cost a fresh process a
fixed delay, so by default a batch hashes on the device only once that is paid or when the batch is
large enough to win it back (:data:`MIN_BYTES`, :func:`worth_it`); :func:`warm_up` pays it ahead of
a load.  Launches are serialised by one lock (they come from the staging workers' threads).
"""

from __future__ import annotations

import importlib
import importlib.util
import threading

import torch

_BLOCK = 128  # lanes per Triton program
_LOCK = threading.Lock()
_kernels = None  # toolkit.integrity.blake3_kernels, once imported
# by default a batch hashes on the device once the kernels are loaded or when it hashes at least this many
# bytes: where the time the device saves per byte pays for a fresh process's first use of Triton
# (benchmarks/RESULTS.md, the device digest in the loader)
MIN_BYTES = 16 << 30


def available(device: torch.device) -> bool:
    """Whether pieces uploaded to ``device`` can be hashed there: a CUDA device and Triton installed;
    on the CPU only when Triton's interpreter runs the kernels (``TRITON_INTERPRET=1`` as Triton
    was first imported: the tests; this loads the kernels to see)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and type(_loaded().chunks_kernel).__name__ == "InterpretedFunction"


def worth_it(device: torch.device, nbytes: int, forced: bool | None) -> bool:
    """Whether a batch that hashes ``nbytes`` should hash them on ``device``: ``forced`` when it is
    True or False (``LoadOptions.device_digest``), else on a CUDA device when the kernels are already
    loaded in this process or ``nbytes >= MIN_BYTES`` (never the interpreter unless forced)."""
    if forced is not None:
        return forced
    return device.type == "cuda" and (_kernels is not None or nbytes >= MIN_BYTES)


def _whole_blocks(t: torch.Tensor, n: int) -> bool:
    """Whether the kernels can read the first ``n`` bytes of uint8 tensor ``t`` as whole 64-byte blocks
    of 32-bit words: contiguous, 4-byte aligned, a multiple of 64 bytes and at least 64, ``n`` of them."""
    return t.is_contiguous() and t.numel() % 64 == 0 and t.numel() >= max(64, n) and n >= 0 and t.data_ptr() % 4 == 0


def hashable_in_place(t: torch.Tensor, n: int) -> bool:
    """Whether the kernels can hash the ``n`` bytes of uint8 tensor ``t`` where they are: all of it,
    ``n`` a positive multiple of 64 (whole 64-byte blocks: nothing past ``n`` is read)."""
    return t.numel() == n and n > 0 and _whole_blocks(t, n)


def _loaded():
    global _kernels
    with _LOCK:
        if _kernels is None:
            _kernels = importlib.import_module("toolkit.integrity.blake3_kernels")
        return _kernels


def warm_up(device: torch.device) -> None:
    """Import Triton and run the kernels once on ``device`` (a CUDA device): later loads of this
    process then hash their whole pieces there by default.  A no-op where :func:`available` is False."""
    if available(device):
        d = DeviceDigests(device, 1)
        d.hash(torch.zeros(2048, dtype=torch.uint8, device=device), 0)
        d.hexdigests()


class DeviceDigests:
    """BLAKE3 roots of ``count`` pieces, computed on ``device`` into one table of 8 words each."""

    def __init__(self, device: torch.device, count: int):
        self.kernels = _loaded()
        self.table = torch.zeros(max(1, count) * 8, dtype=torch.int32, device=device)
        self.used: set[int] = set()

    def hash(self, data: torch.Tensor, slot: int, n: int | None = None) -> None:
        """Hash the first ``n`` bytes (default all) of uint8 tensor ``data`` into ``slot``, on the
        current stream (no wait).  ``data``: contiguous, 4-byte aligned, a multiple of 64 bytes and
        at least 64, zeros past ``n`` (:func:`hashable_in_place` holds for ``n`` = its length)."""
        n = data.numel() if n is None else n
        if not _whole_blocks(data, n):
            raise ValueError(
                f"{data.numel()} bytes at {data.data_ptr():#x} cannot be hashed as {n} bytes: "
                "expected contiguous, 4-byte aligned whole 64-byte blocks"
            )
        k, words, root = self.kernels, data.view(torch.int32), self.table[slot * 8 : slot * 8 + 8]
        nchunks = max(1, -(-n // 1024))
        with _LOCK:
            cvs = root if nchunks == 1 else torch.empty(nchunks * 8, dtype=torch.int32, device=data.device)
            k.chunks_kernel[(k.triton.cdiv(nchunks, _BLOCK),)](words, n, nchunks, cvs, BLOCK=_BLOCK)
            nodes = nchunks
            while nodes > 1:
                up = (nodes + 1) // 2
                nxt = root if up == 1 else torch.empty(up * 8, dtype=torch.int32, device=data.device)
                k.parents_kernel[(k.triton.cdiv(up, _BLOCK),)](cvs, nodes, nxt, int(nodes == 2), BLOCK=_BLOCK)
                cvs, nodes = nxt, up
        self.used.add(slot)

    def hexdigests(self) -> dict[int, str]:
        """Each hashed slot's digest, as ``blake3``'s hexdigest spells it (one copy to the host; the
        caller has waited for the kernels' stream)."""
        words = self.table.cpu().numpy().astype("<u4")
        return {s: words[s * 8 : s * 8 + 8].tobytes().hex() for s in sorted(self.used)}
