"""One AOTInductor compiled model (a ``.so``): the one module that talks to PyTorch's ``torch._C._aoti``.

:class:`AotiContainer` wraps ``AOTIModelContainerRunnerCpu/Cuda`` (one container per method) and
its constants; :func:`read_compiled` asks the ``.so``'s own container C API which constant slots it
declares and how its blob is laid out, :func:`read_constant_table` its whole constant table (what payload
generations 1 and 2 of a ``.pte`` keep only there); :func:`extract_so` and :func:`make_torch_global` make a
``.so`` kept inside a ``.pte`` or ``.pt2`` loadable.  The runtime (:mod:`toolkit.runtimes.aoti`)
and the builder (:mod:`toolkit.build.builder`) use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from toolkit.core.errors import IntegrityError, ProgramError
from toolkit.core.model import SCALAR_TYPES
from toolkit.integrity import copy_region, keep_for_process
from toolkit.runtimes import CompiledConstant, CompiledMethod, Device, parse_device

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


_CONSTANT_TYPE = "AOTInductorModelContainerGetConstantType"  # queried where the .so exports it
_NO_BLOB_SIZE = "constant blob size is only available for mmap'd weights"
_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_stderr_line(expected: str):
    """Run the body with file descriptor 2 captured, then write back what it captured but the lines
    holding ``expected``: a native call's expected complaint stays off the user's terminal, anything
    else written meanwhile (by any thread) still reaches it, late."""
    with _STDERR_LOCK, tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        try:
            os.dup2(captured.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if expected.encode() not in line]
            if kept:
                os.write(2, b"".join(kept))


# AOTInductor's ConstantType (aoti_runtime/constant_type.h): Unknown 0, Parameter 1, Buffer 2, TensorConstant 3,
# FoldedConstant 4 (never in a blob): the table's kind of each (an Unknown one's row says none)
CONSTANT_KINDS = {1: "parameter", 2: "buffer", 3: "lifted_constant"}


@dataclass(frozen=True)
class ConstantSlot:
    """One constant as the ``.so``'s container C API declares it, in its own order."""

    name: str
    fqn: str
    dtype: str
    data_size: int
    from_folded: bool
    type: int  # AOTInductor's ConstantType (0 where the .so does not say)


def query_slots(so_path: Path, device: torch.device) -> tuple[list[ConstantSlot], int | None] | None:
    """Every constant slot of a compiled ``.so`` in its order, and its blob size (None where it cannot
    say), through its own container C API; None when the .so lacks a query.

    The ``.so`` exports ``AOTInductorModelContainerGetNumConstants``, ``...GetConstantName``,
    ``...GetConstantOriginalFQN``, ``...GetConstantDtype``, ``...GetConstantDataSize``,
    ``...GetConstantsBlobSize``, ``...GetConstantFromFolded`` and ``...GetConstantType``
    (torch/csrc/inductor/aoti_runtime/interface.h).  The pybind runner exposes none of the sizes, so a
    second, constant-less container is created for the query and deleted at once (no constant memory:
    the weights are not in the .so).
    """
    try:
        lib = ctypes.CDLL(str(so_path))  # already loaded by the runner: the same handle
        fns = {n: getattr(lib, n) for n in _QUERIES}
    except (OSError, AttributeError) as e:
        log.warning("%s: cannot query its constants' sizes (%s); trusting the program's sizes", so_path, e)
        return None
    get_type = getattr(lib, _CONSTANT_TYPE, None)
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
        with _without_stderr_line(_NO_BLOB_SIZE):  # (its C shim prints the error to stderr as well)
            blob_known = fns["AOTInductorModelContainerGetConstantsBlobSize"](handle, p(blob)) == 0
        slots = []
        for i in range(n.value):
            name, fqn = ctypes.c_char_p(), ctypes.c_char_p()
            dtype, nbytes, folded, kind = ctypes.c_int32(), size_t(), ctypes.c_bool(), ctypes.c_int32(0)
            call("AOTInductorModelContainerGetConstantName", handle, size_t(i), p(name))
            call("AOTInductorModelContainerGetConstantOriginalFQN", handle, size_t(i), p(fqn))
            call("AOTInductorModelContainerGetConstantDtype", handle, size_t(i), p(dtype))
            call("AOTInductorModelContainerGetConstantDataSize", handle, size_t(i), p(nbytes))
            call("AOTInductorModelContainerGetConstantFromFolded", handle, size_t(i), p(folded))
            if get_type is not None and get_type(handle, size_t(i), p(kind)) != 0:
                kind.value = 0
            slots.append(
                ConstantSlot(
                    (name.value or b"").decode("utf-8", "replace"),
                    (fqn.value or b"").decode("utf-8", "replace"),
                    SCALAR_TYPES.get(dtype.value, f"?{dtype.value}"),
                    nbytes.value,
                    bool(folded.value),
                    kind.value,
                )
            )
        return slots, (int(blob.value) if blob_known else None)
    finally:
        fns["AOTInductorModelContainerDelete"](handle)


def read_compiled(so_path: Path, device: torch.device) -> CompiledMethod | None:
    """Every constant slot a compiled ``.so`` declares, through its own container C API (:func:`query_slots`).

    A blob file's layout is derived as AOTI reads it (``load_constants`` in aoti_runtime/model_base.h):
    constants in this order, folded ones skipped, each read from where the previous one's data size ended
    (``bytes_read += data_size``).  Only the device allocation pads every slot to 64 bytes
    (``compute_constant_blob``), so a constant's pointer offset is not its file offset when a data
    size is not a multiple of 64.  The compiler pads the data sizes of a blob holding any CPU
    constant itself (60 -> 64, 68 -> 128, 400 -> 448 bytes); an all-CUDA blob it writes unpadded,
    with unpadded data sizes (a 16-byte counter reports 16, torch 2.11).
    Returns None when the .so lacks a query (then only the runner's names and dtypes are known).
    """
    found = query_slots(so_path, device)
    if found is None:
        return None
    slots, blob_bytes = found
    out: dict[str, CompiledConstant] = {}
    offset = 0
    for s in slots:
        at = None
        if not s.from_folded:
            at = offset
            offset += s.data_size
        out[s.name] = CompiledConstant(s.name, s.fqn, s.dtype, s.data_size, at)
    return CompiledMethod(out, blob_bytes)


def read_constant_table(so_path: Path, device: "torch.device | Device") -> list[dict]:
    """A compiled ``.so``'s constant table, as ``constant_table.json`` holds it: one row per constant in its
    blob, in the ``.so``'s order (folded ones are in no blob), each with its name, FQN, dtype, sizes, strides,
    storage offset, kind (where the ``.so`` says) and data size.

    The container C API gives all but the sizes, strides and storage offset (:func:`query_slots`); those the
    ``.so`` keeps in its constants' info, which it hands out only as the tensors it creates when it loads a
    blob.  So a container on ``device`` loads a blob of zeros (``AOTInductorModelUpdateConstantsFromBlob``,
    as ExecuTorch's runtime loads the real one) and its tensors are read, then it is deleted: for a moment the
    method's constants take their size in ``device`` memory once more.  The ``.so`` does not record which
    buffers a method writes: every buffer is taken as one it may write (``mutated``), so that no policy
    shares state by its content alone.
    """
    device = to_torch(device) if isinstance(device, Device) else device
    make_torch_global()
    container = AotiContainer.create(so_path, device)
    try:
        found = query_slots(so_path, device)
        if found is None:
            raise ProgramError("the compiled model does not declare its constants (no container queries)", path=so_path)
        slots = [s for s in found[0] if not s.from_folded]
        tensors: dict[str, torch.Tensor] = {}
        if slots:
            fd = os.memfd_create("constshare-zero-blob", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, sum(s.data_size for s in slots) or 1)  # a sparse file of zeros: no host memory
                container.upload_blob(Path(f"/proc/self/fd/{fd}"))
                tensors = container.extract()
            finally:
                os.close(fd)
        rows = []
        for s in slots:
            t = tensors.get(s.name)
            if t is None:
                raise ProgramError(
                    f"the compiled model gave no tensor for constant {s.name!r} after loading a blob: it does not "
                    "load its weights from one (AOTInductorModelUpdateConstantsFromBlob), so its sizes and strides "
                    "cannot be read",
                    path=so_path,
                )
            row = {
                "name": s.name,
                "fqn": s.fqn,
                "dtype": s.dtype,
                "shape": list(t.shape),
                "strides": list(t.stride()),
                "storage_offset": int(t.storage_offset()),
            }
            kind = CONSTANT_KINDS.get(s.type)
            if kind is not None:
                row |= {"kind": kind, "mutated": kind == "buffer"}
            rows.append(row | {"data_size": s.data_size})
        return rows
    finally:
        del container


class SoConstantTables:
    """The ``so_table=`` of :func:`~toolkit.sources.open_program` for a real load: each method's constant
    table read from its own ``.so`` (:func:`read_constant_table`) on its device.

    Called with (method, file, offset, size) of the ``.so`` inside the ``.pte``; it copies it out as the
    runtime does (:func:`extract_so`: the same sealed copy, which the load then opens again) and calls
    ``notice()`` once, before the first ``.so`` is opened.  ``read`` keeps each method's rows.
    """

    def __init__(
        self, device: "str | torch.device | Device | Mapping[str, Any] | None" = None, notice: Any = None
    ) -> None:
        self.device, self.notice = device, notice
        self.read: dict[str, list[dict]] = {}

    def device_of(self, method: str) -> torch.device:
        spec = self.device.get(method) if isinstance(self.device, Mapping) else self.device
        if isinstance(spec, torch.device):
            return spec
        current = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return to_torch(parse_device(spec if spec is not None else "cuda", default_cuda_index=current))

    def __call__(self, method: str, path: "str | Path", offset: int, size: int) -> list[dict]:
        if self.notice is not None:
            notice, self.notice = self.notice, None
            notice()
        rows = read_constant_table(extract_so(Path(path), offset, size), self.device_of(method))
        self.read[method] = rows
        return rows
