"""Runtimes: what the load orchestrator (:mod:`toolkit.engine.loader`) carries a load out against.

Two implementations of one small interface:

* :class:`toolkit.runtimes.aoti.AotiRuntime`: PyTorch's AOTInductor runtime, one model
  container per method, uploads through :mod:`toolkit.upload` (the real load);
* :class:`toolkit.runtimes.dry_run.DryRunRuntime`: the program model alone, no torch and no
  device (the dry run behind :func:`toolkit.dry_run`).

The orchestrator takes every decision and records every event; a runtime only answers what
a compiled method contains and moves bytes.  So a dry run and a real load run the same code,
and the dry run predicts the real load by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Protocol

from toolkit.core.model import ConstantSpec, MethodSpec, Program, TensorMeta, aligned_slot_bytes  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class CompiledConstant:
    """One constant slot as the compiled model itself declares it (its truth, not the program's)."""

    name: str
    fqn: str
    dtype: str
    # the slot's data size as AOTI reports it: what a whole-blob upload reads from the file (aligned_slot_bytes:
    # a 60-byte constant reports 64 on a CPU, a 16-byte one 16 in an all-CUDA model); None when it cannot say
    nbytes: int | None
    blob_offset: int | None  # where in its file a whole-blob upload reads it (absolute); None if not in a blob


@dataclass(frozen=True)
class CompiledMethod:
    """What the compiled model says about its constants, read without uploading anything."""

    constants: Mapping[str, CompiledConstant]
    blob_bytes: int | None  # bytes a whole-blob upload reads; None when the model cannot say
    # the compiled model is the program model itself (the dry run: nothing was compiled), so nothing
    # can disagree with the manifest and the loader does not compare them slot by slot
    is_manifest: bool = False


@dataclass(frozen=True)
class Device:
    """Where a method is placed: ``("cpu", -1)`` or ``("cuda", N)`` (AOTI reports -1 for CPU)."""

    type: str
    index: int = -1

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"{self.type}:{self.index}"


def parse_device(spec: "str | Device | Any", *, default_cuda_index: int = 0) -> Device:
    """'cpu' -> cpu; 'cuda' -> cuda:<default_cuda_index>; 'cuda:N' -> cuda:N (a torch.device is accepted)."""
    if isinstance(spec, Device):
        return spec
    s = str(spec).strip()
    kind, sep, idx = s.partition(":")
    if kind not in ("cpu", "cuda") or (kind == "cpu" and sep) or (idx and not idx.isdigit()):
        raise ValueError(f"unsupported device {spec!r}: the toolkit loads on 'cpu' or 'cuda[:N]'")
    if kind == "cpu":
        return Device("cpu", -1)
    return Device("cuda", int(idx) if idx else default_cuda_index)


class MethodRuntime(Protocol):
    """One method's compiled model (an AOTI container), created without constants."""

    def compiled(self) -> CompiledMethod:
        """Every constant slot the compiled model declares: name, FQN, dtype, bytes, blob layout."""

    def upload_blob(self) -> None:
        """Upload the method's whole weights blob into the model's own allocation."""

    def extract(self) -> Mapping[str, Any]:
        """internal name -> tensor of the uploaded blob (aliases the model's memory)."""

    def upload_constants(self, constants: list[ConstantSpec]) -> Iterator[tuple[ConstantSpec, Any, str]]:
        """Upload each constant on its own; yields (constant, tensor, how the bytes travelled)."""

    def install(self, tensors: Mapping[str, Any]) -> None:
        """Point the named constants at the given tensors, zero-copy (user-managed)."""

    def run(self, inputs: list[Any]) -> list[Any]: ...


class Runtime(Protocol):
    name: str
    can_run: bool  # False for the dry run: nothing can be run or verified
    # its uploads run native code (a crash ends the process): the loader records each as it is done, so a
    # worker streaming its events keeps those before a crash; False (the dry run): recorded as one batch
    native_uploads: bool

    def resolve(self, spec: Any) -> Device:
        """A device spec ('cpu', 'cuda', 'cuda:1', a torch.device) as this runtime places it."""

    def check_available(self, program: Program, device: Device) -> None:
        """Raise a ToolkitError if ``program`` cannot be loaded on ``device`` here."""

    def create(self, program: Program, method: MethodSpec, device: Device) -> MethodRuntime: ...

    def view(self, tensor: Any, constant: ConstantSpec) -> Any:
        """``constant``'s own view (dtype, sizes, strides, storage offset) on the storage of ``tensor``, zero-copy."""

    def facts(self, tensor: Any) -> tuple[TensorMeta, int]:
        """(metadata, bytes readable from its start) of a tensor this runtime produced."""

    def write_initial(self, tensor: Any, program: Program, constant: ConstantSpec) -> None:
        """Put the constant's initial contents (from its file) back into ``tensor`` (state reset)."""

    def checksum(self, tensor: Any) -> Any:
        """A position-sensitive checksum of ``tensor``'s bytes, computed where it lives (state reset)."""

    def same_checksum(self, a: Any, b: Any) -> bool: ...

    def bytes_in_use(self, device: Device, *, sync: bool) -> tuple[int, str] | None:
        """(bytes in use on ``device``, how measured), or None where the loader's accounting is all there is."""

    def close(self) -> None: ...


__all__ = [
    "CompiledConstant",
    "CompiledMethod",
    "Device",
    "MethodRuntime",
    "Runtime",
    "aligned_slot_bytes",
    "parse_device",
]
