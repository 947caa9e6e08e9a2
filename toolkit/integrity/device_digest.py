"""BLAKE3 of a weights blob's pieces on the device they were uploaded to (verified staging's
device digest, :func:`toolkit.upload.stage_pieces`).

Device memory is private to the process: a piece hashed where it landed, or in a device scratch
copy its constants' bytes are then copied from, is exactly what the load uses, so the host only reads
and copies, and the device hashes far faster than the host's cores.
The kernels (:mod:`toolkit.integrity.blake3_kernels`) are Triton's, which PyTorch's CUDA wheels
depend on: one lane per 1 KiB chunk (its chaining value), then one kernel per tree level pairing
neighbours (an odd level's last node carried up: BLAKE3's left-complete tree).  Each piece's root
goes into one device table (:class:`DeviceDigests`), read back once per batch and compared on the
host.  Exact against the ``blake3`` package (``tests/test_device_digest.py``: the Triton
interpreter on the CPU, the device on a GPU).

Where the device's architecture has the kernels precompiled (:mod:`toolkit.integrity.blake3_cubins`:
sm90, the H100 and H200) they load through the CUDA driver in milliseconds, without Triton, so by
default (:func:`mode`) every batch hashes there from the first of the process.  Elsewhere Triton
compiles them, and its first use costs a fresh process about half a second that a warm-up in a
thread cannot hide: the import holds the GIL in long calls (a 500 MB shared library, large modules),
stalling the staging threads for about its whole length (``benchmarks/probes/warm_up_stall.py``).
There a batch hashes on the device once Triton's kernels are warm; a cold batch large enough to pay
for the stall (:data:`MIN_BYTES`) starts :func:`warm_up_in_background` and hashes on the host each
piece it takes before they are warm, on the device each after; a smaller one stays on the host.
:func:`warm_up` pays the delay ahead of a load.  Launches are serialised by one lock (they come
from the staging workers' threads).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import threading

import torch

from toolkit.integrity import blake3_cubins

_BLOCK = blake3_cubins.BLOCK  # lanes per program, as the precompiled kernels have it
_LOCK = threading.Lock()
_kernels = None  # toolkit.integrity.blake3_kernels, once imported
_WARM: dict[tuple[str, int], threading.Event] = {}  # per device: set once the kernels have run there
_WARM_FAILED: dict[tuple[str, int], BaseException] = {}  # per device: why a background warm-up failed
_WARM_STARTED: set[tuple[str, int]] = set()  # devices whose background warm-up was started
_WARM_LOCK = threading.Lock()
# a cold batch hashing at least this many bytes starts the warm-up: where the device's speed over the
# host's hashing wins back the stall (benchmarks/RESULTS.md, the device digest in the loader)
MIN_BYTES = 16 << 30


_PRECOMPILED: dict[int, object] = {}  # CUDA device index -> its precompiled kernels (blake3_cubins.Loaded) or None
_PRECOMPILED_FAILED: dict[int, BaseException] = {}  # why a device's cubins did not load
_PRECOMPILED_LOCK = threading.RLock()  # re-entered by the self-test's own DeviceDigests


def precompiled(device: torch.device):
    """The kernels compiled ahead of time for ``device``'s architecture, loaded there through the CUDA
    driver (no Triton: :mod:`toolkit.integrity.blake3_cubins`), or None: not a CUDA device, no cubins
    for its architecture, or they failed to load (the reason in :func:`precompiled_error`)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = _device_key(device)[1]
    with _PRECOMPILED_LOCK:
        if index not in _PRECOMPILED:
            major, minor = torch.cuda.get_device_capability(index)
            try:
                _PRECOMPILED[index] = blake3_cubins.load(index, major * 10 + minor)
                if _PRECOMPILED[index] is not None:
                    _self_test(torch.device("cuda", index))
            except (OSError, blake3_cubins.DriverError, ValueError) as e:  # an older driver, no libcuda: Triton
                _PRECOMPILED[index], _PRECOMPILED_FAILED[index] = None, e
    return _PRECOMPILED[index]


def _self_test(device: torch.device) -> None:
    """Hash 2 KiB of zeros with the freshly loaded kernels (two chunks and their parent) and compare
    with the ``blake3`` package: a module that computes anything else is never used."""
    import blake3

    d = DeviceDigests(device, 1)
    d.hash(torch.zeros(2048, dtype=torch.uint8, device=device), 0)
    torch.cuda.current_stream(device).synchronize()
    got, want = d.hexdigests()[0], blake3.blake3(bytes(2048)).hexdigest()
    if got != want:
        raise ValueError(f"the precompiled kernels hash 2 KiB of zeros to {got}, not {want}")


def precompiled_error(device: torch.device) -> BaseException | None:
    """Why ``device``'s precompiled kernels are not used, where they failed to load or their self-test."""
    return _PRECOMPILED_FAILED.get(_device_key(device)[1])


def available(device: torch.device) -> bool:
    """Whether pieces uploaded to ``device`` can be hashed there: a CUDA device with our precompiled
    kernels or Triton installed; on the CPU only when Triton's interpreter runs the kernels
    (``TRITON_INTERPRET=1`` as Triton was first imported: the tests; this loads the kernels to see)."""
    if precompiled(device) is not None:
        return True
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and type(_loaded().chunks_kernel).__name__ == "InterpretedFunction"


def mode(device: torch.device, nbytes: int, forced: bool | None) -> str:
    """Where a batch staged onto ``device`` that hashes ``nbytes`` hashes its whole pieces: ``"device"``,
    ``"host"``, or ``"when warm"`` (each piece on the device once the kernels are warm there, on the
    host before).  ``forced`` True or False (``LoadOptions.device_digest``) says device or host;
    ``None`` (auto) is the device on a CUDA device whose kernels are warm, "when warm" on a cold one
    for ``nbytes >= MIN_BYTES`` (Triton installed), else the host (never the interpreter unless forced)."""
    if forced is not None:
        return "device" if forced else "host"
    if device.type != "cuda":
        return "host"
    if ready(device):
        return "device"
    if importlib.util.find_spec("triton") is None:
        return "host"
    return "when warm" if nbytes >= MIN_BYTES else "host"


def _device_key(device: torch.device) -> tuple[str, int]:
    if device.index is not None or device.type != "cuda":
        return device.type, -1 if device.index is None else device.index
    return device.type, torch.cuda.current_device()


def _warm_event(device: torch.device) -> threading.Event:
    with _WARM_LOCK:
        return _WARM.setdefault(_device_key(device), threading.Event())


def ready(device: torch.device) -> bool:
    """Whether hashing on ``device`` waits for no import or compile: its precompiled kernels load
    (milliseconds, :func:`precompiled`), or Triton's have run there in this process (:func:`warm_up`)."""
    event = _WARM.get(_device_key(device))
    return (event is not None and event.is_set()) or precompiled(device) is not None


def warm_up_in_background(device: torch.device) -> threading.Thread | None:
    """Start :func:`warm_up` on ``device`` in a thread of its own and return at once: once per device
    and process (None when it was started before).  A warm-up that fails leaves the device never
    :func:`ready` (its error in :func:`warm_up_error`): the loads go on hashing on the host."""
    key = _device_key(device)
    with _WARM_LOCK:
        if key in _WARM_STARTED:
            return None
        _WARM_STARTED.add(key)

    def run() -> None:
        try:
            warm_up(device)
        except BaseException as e:  # noqa: BLE001 - a load must never fail for want of a faster hash
            _WARM_FAILED[key] = e

    thread = threading.Thread(target=run, name="constshare-digest-warm-up", daemon=True)
    thread.start()
    return thread


def warm_up_error(device: torch.device) -> BaseException | None:
    """Why the background warm-up on ``device`` failed, if it did."""
    return _WARM_FAILED.get(_device_key(device))


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
    """Import Triton and run the kernels once on ``device`` (a CUDA device): later batches of this
    process then hash their whole pieces there by default (:func:`ready`).  A no-op where
    :func:`available` is False."""
    if available(device):
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            d = DeviceDigests(device, 1)
            d.hash(torch.zeros(2048, dtype=torch.uint8, device=device), 0)  # both kernels: 2 chunks, 1 parent
            d.hexdigests()
        _warm_event(device).set()


class DeviceDigests:
    """BLAKE3 roots of ``count`` pieces, computed on ``device`` into one table of 8 words each."""

    def __init__(self, device: torch.device, count: int):
        self.precompiled = precompiled(device)
        self.kernels = None if self.precompiled is not None else _loaded()
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
        words, root = data.view(torch.int32), self.table[slot * 8 : slot * 8 + 8]
        nchunks = max(1, -(-n // 1024))
        with _LOCK:
            cvs = root if nchunks == 1 else torch.empty(nchunks * 8, dtype=torch.int32, device=data.device)
            self._launch("chunks_kernel", nchunks, words, n, nchunks, cvs)
            nodes = nchunks
            while nodes > 1:
                up = (nodes + 1) // 2
                nxt = root if up == 1 else torch.empty(up * 8, dtype=torch.int32, device=data.device)
                self._launch("parents_kernel", up, cvs, nodes, nxt, int(nodes == 2))
                cvs, nodes = nxt, up
        self.used.add(slot)

    def _launch(self, kernel: str, lanes: int, *args) -> None:
        """``kernel`` over ``lanes`` lanes on the current stream: the precompiled one through the driver
        where the device has it, else Triton's."""
        programs = -(-lanes // _BLOCK)
        if self.precompiled is not None:
            stream = torch.cuda.current_stream(self.table.device).cuda_stream
            values = (a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
            self.precompiled.launch(kernel, programs, stream, *values)
        else:
            getattr(self.kernels, kernel)[(programs,)](*args, BLOCK=_BLOCK)

    def hexdigests(self) -> dict[int, str]:
        """Each hashed slot's digest, as ``blake3``'s hexdigest spells it (one copy to the host; the
        caller has waited for the kernels' stream)."""
        words = self.table.cpu().numpy().astype("<u4")
        return {s: words[s * 8 : s * 8 + 8].tobytes().hex() for s in sorted(self.used)}
