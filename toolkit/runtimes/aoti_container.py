"""One AOTInductor compiled model (a ``.so``): the one module that talks to PyTorch's ``torch._C._aoti``.

:class:`AotiContainer` wraps ``AOTIModelContainerRunnerCpu/Cuda`` (one container per method) and
its constants; :func:`read_compiled` asks the ``.so``'s own container C API which constant slots it
declares and how its blob is laid out; :func:`extract_so` and :func:`make_torch_global` make a
``.so`` kept inside a ``.pte`` or ``.pt2`` loadable.  The runtime (:mod:`toolkit.runtimes.aoti`)
and the builder (:mod:`toolkit.build.builder`) use it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

from toolkit.core.errors import IntegrityError, ProgramError
from toolkit.core.model import SCALAR_TYPES
from toolkit.integrity import copy_region, keep_for_process
from toolkit.runtimes import CompiledConstant, CompiledMethod, Device

log = logging.getLogger(__name__)


def to_torch(d: Device) -> torch.device:
    return torch.device("cuda", d.index) if d.type == "cuda" else torch.device("cpu")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class AotiContainer:
    """One AOTInductor model container, created without constants."""

    def __init__(self, runner: Any, so_path: Path, device: torch.device):
        self._runner = runner
        self.so_path = so_path
        self.device = device

    @classmethod
    def create(cls, so_path: Path, device: torch.device) -> "AotiContainer":
        device = to_torch(device) if isinstance(device, Device) else device
        so = str(so_path)
        if device.type == "cuda":
            runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, str(device))
        else:
            runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
        return cls(runner, Path(so_path), device)

    def constant_fqns(self) -> dict[str, str]:
        """internal name -> original FQN."""
        return dict(self._runner.get_constant_names_to_original_fqns())

    def constant_dtypes(self) -> dict[str, str]:
        """internal name -> dtype name, as compiled into the .so ("?N" for a code not in the table)."""
        return {
            n: SCALAR_TYPES.get(code, f"?{code}")
            for n, code in dict(self._runner.get_constant_names_to_dtypes()).items()
        }

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
            # the runner's binding takes its flags positionally: named here
            use_inactive, validate_full_updates, user_managed = False, False, True
            self._runner.update_constant_buffer(
                {k: non_owning_alias(t) for k, t in tensors.items()}, use_inactive, validate_full_updates, user_managed
            )

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self._runner.run(inputs))


class _CudaArray:
    """The smallest object exposing ``__cuda_array_interface__`` (v3) for a device pointer."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }


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
            import numpy as np

            raw = torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr)))
        else:
            return t
        if raw.data_ptr() != ptr:
            return t
        return raw.view(t.dtype).as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    except Exception:  # never fail a load over an optimisation
        return t


_GLOBAL_LOCK = threading.Lock()


def extract_so(path: Path, offset: int, nbytes: int) -> Path:
    """The bytes ``[offset, offset + nbytes)`` of ``path`` (a ``.so`` kept inside a ``.pte`` or
    ``.pt2``, read from its verified copy when integrity is checked) as a file of their own for
    ``dlopen``: a sealed private copy (:func:`~toolkit.integrity.copy_region`), one per content
    for the process (:func:`~toolkit.integrity.keep_for_process`), never written to disk."""
    try:
        copy, _ = copy_region(path, offset, nbytes)
    except OSError as e:
        raise IntegrityError(f"the compiled model cannot be read: {e.strerror or e}", path=path) from None
    except IntegrityError:
        raise IntegrityError(
            f"the compiled model at byte {offset} should have {nbytes} bytes, the file has "
            f"{max(0, os.path.getsize(path) - offset)} there",
            path=path,
        ) from None
    return keep_for_process(copy).path


_TORCH_GLOBAL: list[str] = []  # the torch libraries made global in this process (done once)


def make_torch_global() -> list[str]:
    """Load torch's own libraries with RTLD_GLOBAL, once per process.

    ExecuTorch builds its ``.so`` with ``link_libtorch=False``: without torch's symbols in
    the global namespace ``dlopen`` fails (``undefined symbol: aoti_torch_layout_strided``).
    """
    with _GLOBAL_LOCK:
        if not _TORCH_GLOBAL:
            lib = Path(torch.__file__).resolve().parent / "lib"
            for name in ("libtorch_cpu.so", "libtorch_cuda.so", "libtorch.so"):
                f = lib / name
                if f.is_file():
                    ctypes.CDLL(str(f), mode=ctypes.RTLD_GLOBAL)
                    _TORCH_GLOBAL.append(str(f))
            if not _TORCH_GLOBAL:
                _TORCH_GLOBAL.append("")  # nothing found (not a Linux build): tried once
        return [x for x in _TORCH_GLOBAL if x]


_QUERIES = (
    "AOTInductorModelContainerCreateWithDevice",
    "AOTInductorModelContainerDelete",
    "AOTInductorModelContainerGetNumConstants",
    "AOTInductorModelContainerGetConstantName",
    "AOTInductorModelContainerGetConstantOriginalFQN",
    "AOTInductorModelContainerGetConstantDtype",
    "AOTInductorModelContainerGetConstantDataSize",
    "AOTInductorModelContainerGetConstantsBlobSize",
    "AOTInductorModelContainerGetConstantFromFolded",
)


def read_compiled(so_path: Path, device: torch.device) -> CompiledMethod | None:
    """Every constant slot a compiled ``.so`` declares, through its own container C API.

    The ``.so`` exports ``AOTInductorModelContainerGetNumConstants``, ``...GetConstantName``,
    ``...GetConstantOriginalFQN``, ``...GetConstantDtype``, ``...GetConstantDataSize``,
    ``...GetConstantsBlobSize`` and ``...GetConstantFromFolded`` (torch/csrc/inductor/
    aoti_runtime/interface.h; exported by every .so of torch 2.9 to 2.13).  The pybind runner exposes
    none of the sizes, so a second, constant-less container is created for the query and deleted at
    once (no constant memory: the weights are not in the .so).  A blob file's layout is derived as
    AOTI reads it (``load_constants`` in aoti_runtime/model_base.h): constants in this order, folded
    ones skipped, each read from where the previous one's data size ended (``bytes_read +=
    data_size``).  Only the device allocation pads every slot to 64 bytes
    (``compute_constant_blob``), so a constant's pointer offset is not its file offset when a data
    size is not a multiple of 64.  The compiler pads the data sizes of a blob holding any CPU
    constant itself (60 -> 64, 68 -> 128, 400 -> 448 bytes); an all-CUDA blob it writes unpadded,
    with unpadded data sizes (a 16-byte counter reports 16, torch 2.11).
    Returns None when the .so lacks a query (then only the runner's names and dtypes are known).
    """
    try:
        lib = ctypes.CDLL(str(so_path))  # already loaded by the runner: the same handle
        fns = {n: getattr(lib, n) for n in _QUERIES}
    except (OSError, AttributeError) as e:
        log.warning("%s: cannot query its constants' sizes (%s); trusting the program's sizes", so_path, e)
        return None
    size_t, p = ctypes.c_size_t, ctypes.byref
    handle = ctypes.c_void_p()
    dev = (f"cuda:{device.index}" if device.index is not None else "cuda") if device.type == "cuda" else "cpu"

    def call(name: str, *args) -> None:
        if fns[name](*args) != 0:
            raise ProgramError(f"the compiled model's {name} failed", path=so_path)

    call("AOTInductorModelContainerCreateWithDevice", p(handle), size_t(1), dev.encode(), None)
    try:
        n = size_t()
        call("AOTInductorModelContainerGetNumConstants", handle, p(n))
        blob = ctypes.c_uint64()
        # a .so built without mmap'd weights (ExecuTorch's: package_constants_on_disk) has no blob size:
        # it answers an error ("constant blob size is only available for mmap'd weights"); then unknown
        blob_known = fns["AOTInductorModelContainerGetConstantsBlobSize"](handle, p(blob)) == 0
        out: dict[str, CompiledConstant] = {}
        offset = 0
        for i in range(n.value):
            name, fqn = ctypes.c_char_p(), ctypes.c_char_p()
            dtype, nbytes, folded = ctypes.c_int32(), size_t(), ctypes.c_bool()
            call("AOTInductorModelContainerGetConstantName", handle, size_t(i), p(name))
            call("AOTInductorModelContainerGetConstantOriginalFQN", handle, size_t(i), p(fqn))
            call("AOTInductorModelContainerGetConstantDtype", handle, size_t(i), p(dtype))
            call("AOTInductorModelContainerGetConstantDataSize", handle, size_t(i), p(nbytes))
            call("AOTInductorModelContainerGetConstantFromFolded", handle, size_t(i), p(folded))
            key = (name.value or b"").decode("utf-8", "replace")
            at = None
            if not folded.value:
                at = offset
                offset += nbytes.value
            out[key] = CompiledConstant(
                key,
                (fqn.value or b"").decode("utf-8", "replace"),
                SCALAR_TYPES.get(dtype.value, f"?{dtype.value}"),
                nbytes.value,
                at,
            )
        return CompiledMethod(out, int(blob.value) if blob_known else None)
    finally:
        fns["AOTInductorModelContainerDelete"](handle)
