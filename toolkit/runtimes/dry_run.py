"""The dry-run runtime: a load carried out on the program model alone (no torch, no device).

Where the real runtime reads the metadata of freshly extracted tensors (ExecuTorch
policies, after a whole-blob upload), the dry run uses the program model's metadata of the
same constants: the builder recorded it from exactly those extracted tensors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from toolkit.core.model import DTYPE_ITEMSIZE, ConstantSpec, MethodSpec, Program, TensorMeta
from toolkit.runtimes import CompiledConstant, CompiledMethod, Device, aligned_slot_bytes, parse_device

PATH_NONE = "dry run"


@dataclass(slots=True, eq=False)
class PlannedTensor:
    """What stands for a device tensor in a dry run: its metadata and its readable bytes (compared and
    hashed by identity, as a tensor is hashed; not frozen: a frozen one took twice as long to make, and a
    dry run makes one per constant uploaded or extracted)."""

    meta: TensorMeta
    nbytes: int  # readable from its first element
    storage_bytes: int  # of the storage it is a view of


def planned(c: ConstantSpec, device: Device, storage_bytes: int) -> PlannedTensor:
    """``c``'s view on a storage of ``storage_bytes`` on ``device``."""
    start = c.storage_offset * DTYPE_ITEMSIZE[c.dtype] if c.nbytes else 0
    return PlannedTensor(c.meta(device.type, device.index), storage_bytes - start, storage_bytes)


class _ManifestSlots(Mapping[str, CompiledConstant]):
    """A method's constants as the compiled model's slots, each made when it is read."""

    def __init__(self, method: MethodSpec):
        self._method = method

    @functools.cached_property
    def _by_name(self) -> dict[str, ConstantSpec]:
        return {c.name: c for c in self._method.constants}

    def __getitem__(self, name: str) -> CompiledConstant:
        c = self._by_name[name]
        return CompiledConstant(c.name, c.fqn, c.dtype, aligned_slot_bytes(c.nbytes), c.offset)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


class DryRunMethod:
    def __init__(self, method: MethodSpec, device: Device):
        self.method = method
        self.device = device

    def _tensor(self, c: ConstantSpec) -> PlannedTensor:
        return planned(c, self.device, c.nbytes)

    def compiled(self) -> CompiledMethod:
        """The program model stands in for the compiled model (a dry run trusts it); its slots are made when read."""
        return CompiledMethod(_ManifestSlots(self.method), self.method.blob_bytes, is_manifest=True)

    def upload_blob(self) -> None:
        pass

    def extract(self) -> Mapping[str, PlannedTensor]:
        return {c.name: self._tensor(c) for c in self.method.constants}

    def upload_constants(self, constants: list[ConstantSpec]) -> Iterator[tuple[ConstantSpec, Any, str]]:
        for c in constants:
            yield c, self._tensor(c), PATH_NONE

    def install(self, tensors: Mapping[str, Any]) -> None:
        pass

    def run(self, inputs: list[Any]) -> list[Any]:
        raise RuntimeError("a dry run has no compiled model to run")


class DryRunRuntime:
    name = "dry run"
    can_run = False
    native_uploads = False

    def resolve(self, spec: Any) -> Device:
        return parse_device(spec)  # a bare 'cuda' is cuda:0, as in a fresh process

    def check_available(self, program: Program, device: Device) -> None:
        pass  # a prediction can be made for any placement

    def create(self, program: Program, method: MethodSpec, device: Device) -> DryRunMethod:
        return DryRunMethod(method, device)

    def view(self, tensor: PlannedTensor, constant: ConstantSpec) -> PlannedTensor:
        return planned(constant, Device(tensor.meta.device_type, tensor.meta.device_index), tensor.storage_bytes)

    def facts(self, tensor: PlannedTensor) -> tuple[TensorMeta, int]:
        return tensor.meta, tensor.nbytes

    def write_initial(self, tensor: PlannedTensor, program: Program, constant: ConstantSpec) -> None:
        pass  # nothing ran, so nothing to reset

    def checksum(self, tensor: PlannedTensor) -> None:
        return None

    def same_checksum(self, a: None, b: None) -> bool:
        return True

    def bytes_in_use(self, device: Device, *, sync: bool) -> None:
        return None

    def close(self) -> None:
        pass
