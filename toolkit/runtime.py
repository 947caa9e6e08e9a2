"""The runtime adapter: the one module that talks to PyTorch's AOTInductor runtime.

Wraps ``torch._C._aoti.AOTIModelContainerRunnerCpu/Cuda`` (one container per method) and
the toolkit's own per-constant upload from a host weights blob.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .manifest import ConstantSpec, TensorMeta


def parse_device(device: str | torch.device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}: the toolkit loads on 'cpu' or 'cuda[:N]'")
    return d


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    """What ExecuTorch compares, read off a live tensor."""
    return TensorMeta(
        dtype=dtype_name(t.dtype), shape=tuple(t.shape), strides=tuple(t.stride()),
        device_type=t.device.type, device_index=t.device.index if t.device.index is not None else -1,
    )


def device_index(d: torch.device) -> int:
    """AOTI reports index -1 for CPU tensors; cuda tensors carry their ordinal."""
    return d.index if d.index is not None else -1


# c10::ScalarType codes, as get_constant_names_to_dtypes() reports them.
SCALAR_TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
    9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn",
}


class AotiContainer:
    """One AOTInductor model container, created without constants."""

    def __init__(self, runner: Any, so_path: Path, device: torch.device):
        self._runner = runner
        self.so_path = so_path
        self.device = device

    @classmethod
    def create(cls, so_path: Path, device: torch.device) -> "AotiContainer":
        so = str(so_path)
        if device.type == "cuda":
            runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, str(device))
        else:
            runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
        return cls(runner, Path(so_path), device)

    def constant_fqns(self) -> dict[str, str]:
        """internal name -> original FQN."""
        return dict(self._runner.get_constant_names_to_original_fqns())

    def constant_dtype_codes(self) -> dict[str, int]:
        return dict(self._runner.get_constant_names_to_dtypes())

    def constant_dtypes(self) -> dict[str, str]:
        """internal name -> dtype name, as compiled into the .so ("?N" for a code not in the table)."""
        return {n: SCALAR_TYPE_NAMES.get(code, f"?{code}") for n, code in self.constant_dtype_codes().items()}

    def upload_blob(self, blob_path: Path) -> None:
        """One allocation for all the method's constants (stays resident even after user-managed swaps)."""
        self._runner.update_constant_buffer_from_blob(str(blob_path))

    def extract(self) -> dict[str, torch.Tensor]:
        """internal name -> tensor aliasing this container's memory (owns nothing)."""
        by_fqn = self._runner.extract_constants_map(False)
        names = {fqn: name for name, fqn in self.constant_fqns().items()}
        return {names.get(fqn, fqn): t for fqn, t in by_fqn.items()}

    def install(self, tensors: dict[str, torch.Tensor]) -> None:
        """Point constants at the given tensors, zero-copy (user_managed=True).

        AOTI checks nothing here: the loader must have checked dtype, device and size.
        The container receives non-owning aliases (:func:`non_owning_alias`): torch <= 2.13
        leaks one reference per tensor installed user-managed (fixed upstream in PR #194480),
        and a leaked reference to a tensor that owns its storage would keep that memory
        allocated for the life of the process.  The caller keeps the owners alive as long as
        any container uses them (the shared cache does).
        """
        if tensors:
            self._runner.update_constant_buffer({k: non_owning_alias(t) for k, t in tensors.items()},
                                                False, False, True)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self._runner.run(inputs))


class _CudaArray:
    """The smallest object exposing ``__cuda_array_interface__`` (v3) for a device pointer."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3, "stream": None}


def non_owning_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s bytes, with ``t``'s dtype/shape/strides, whose storage owns nothing.

    Its storage neither frees nor keeps alive the memory: whoever holds ``t`` owns it.  A
    leaked reference to the alias then leaks a few hundred bytes of bookkeeping, not the
    tensor.  Falls back to ``t`` itself if an alias cannot be made (the leak then stays).
    """
    try:
        st = t.untyped_storage()
        n, ptr = st.nbytes(), st.data_ptr()
        if n == 0 or ptr == 0 or n % t.element_size():
            return t
        if t.device.type == "cuda":
            raw = torch.as_tensor(_CudaArray(ptr, n), device=t.device)
        elif t.device.type == "cpu":
            import ctypes

            import numpy as np

            raw = torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr)))
        else:
            return t
        if raw.data_ptr() != ptr:
            return t
        return raw.view(t.dtype).as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    except Exception:  # never fail a load over an optimisation
        return t


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


def upload_constant(blob_path: Path, spec: ConstantSpec, device: torch.device,
                    staging: "HostStager | torch.Tensor | None" = None) -> torch.Tensor:
    """Upload exactly one constant from the host blob into a tensor the toolkit owns.

    ``staging`` is a :class:`HostStager` for ``device`` (fast path, what the loader
    passes), a pinned uint8 buffer at least as large as the constant, or None (a pinned
    buffer is allocated for this constant alone).
    """
    if device.type == "cpu":
        return as_constant(read_constant_bytes(blob_path, spec), spec)
    if isinstance(staging, HostStager):
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


def cuda_in_use_bytes(device: torch.device) -> int:
    """Driver-level bytes in use on a device (sees AOTI's plain cudaMalloc, unlike the caching allocator)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
