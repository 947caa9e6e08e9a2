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
        """
        if tensors:
            self._runner.update_constant_buffer(tensors, False, False, True)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self._runner.run(inputs))


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


def upload_constant(blob_path: Path, spec: ConstantSpec, device: torch.device,
                    staging: torch.Tensor | None = None) -> torch.Tensor:
    """Upload exactly one constant from the host blob into a tensor the toolkit owns."""
    if device.type == "cpu":
        return as_constant(read_constant_bytes(blob_path, spec), spec)
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
