"""The AOTInductor runtime: :class:`AotiRuntime`, the real implementation of :class:`toolkit.runtimes.Runtime`.

One :class:`AotiMethod` per loaded method: its compiled model's container
(:mod:`toolkit.runtimes.aoti_container`, the one module that talks to ``torch._C._aoti``) and the
uploads into it; :mod:`toolkit.upload` moves constant bytes from a host blob to the device.  The
runtime reads each program file from its verified copy when integrity is checked.

An ExecuTorch ``.pte`` and a torch ``.pt2`` load here too, with no ExecuTorch C++ runtime: the
``.so`` is copied out once into a sealed private copy (torch's libraries made global first: ExecuTorch
links it without libtorch), each constant installed user-managed from its own file, and the
method's inputs and outputs mapped to the ``.so``'s order (:func:`so_inputs`,
:func:`method_outputs`).  Such files record no torch version: only the device kind is checked.

Every compiled model loaded here checks its inputs' dtype, sizes, strides and device when it
runs (AOTInductor's generated ``check_input_N``, on when ``AOTI_RUNTIME_CHECK_INPUTS`` is set,
read once per ``.so`` at its first run): without it a wrongly shaped input is read out of
bounds.  AOTInductor reads it with ``getenv``: :class:`AotiRuntime` sets it in this process's
environment when created, unless the caller set it (the toolkit's one write to its environment).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from toolkit.core.errors import IncompatibleProgramError, IntegrityError, LoadError
from toolkit.core.model import DTYPE_ITEMSIZE, ConstantSpec, MethodSpec, PackedLocation, Program, Region, TensorMeta
from toolkit.core.options import LoadOptions
from toolkit.core.vocab import FirstLoad, ProgramFormat, UploadMode, UploadPath
from toolkit.integrity import VerifiedCopy, check_sha256, hash_threads, keep_for_process, verified_files
from toolkit.runtimes import CompiledConstant, CompiledMethod, Device
from toolkit.runtimes import parse_device as _parse
from toolkit.runtimes.aoti_container import (
    AotiContainer,
    dtype_name,
    extract_so,
    make_torch_global,
    read_compiled,
    to_torch,
)


def parse_device(device: "str | torch.device | Device") -> torch.device:
    """A torch.device; a bare 'cuda' is the current CUDA device."""
    if isinstance(device, Device):
        return torch.device(device.type, device.index) if device.type == "cuda" else torch.device("cpu")
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return to_torch(_parse(device, default_cuda_index=current))


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    """What ExecuTorch compares, read off a live tensor."""
    return TensorMeta(
        dtype=dtype_name(t.dtype),
        shape=tuple(t.shape),
        strides=tuple(t.stride()),
        device_type=t.device.type,
        device_index=t.device.index if t.device.index is not None else -1,
    )


def cuda_in_use_bytes(device: torch.device) -> int:
    """Driver-level bytes in use on a device (sees AOTI's plain cudaMalloc, unlike the caching allocator)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def torch_compatible(built: str, running: str) -> bool:
    """AOTI .so files are tied to the torch release they were compiled against (major.minor)."""

    def mm(v: str) -> tuple[str, ...]:
        return tuple(v.split("+")[0].split(".")[:2])

    return mm(built) == mm(running)


UNKNOWN_TORCH = ("unknown",)


def check_compatible(program: Program, device_type: str, torch_version: str) -> None:
    # our program directories record this in manifest.json; other formats in the program's files
    where = (
        (program.path("manifest.json") if program.format is ProgramFormat.DIRECTORY else program.root)
        if program.root is not None
        else None
    )
    if program.device != device_type:
        raise IncompatibleProgramError(
            f"program was built for {program.device!r} but is being loaded on {device_type!r}; "
            f"rebuild it with device={device_type!r}",
            path=where,
            field="device",
        )
    # a .pte or .pt2 does not record the torch it was built with ("unknown"): only the device kind is checked
    if program.torch_version not in UNKNOWN_TORCH and not torch_compatible(program.torch_version, torch_version):
        raise IncompatibleProgramError(
            f"program was built with torch {program.torch_version}, this process runs torch {torch_version}; "
            "rebuild it",
            path=where,
            field="torch_version",
        )


def _span(c: ConstantSpec) -> tuple[int, int]:
    """The bytes of its file a constant's upload reads."""
    return c.offset, c.offset + c.nbytes


def so_inputs(inputs: list, order: "tuple[int, ...] | None") -> list:
    """The method's inputs in the order its ``.so`` takes them: ``order[i]`` is the method input
    feeding the ``.so``'s input ``i`` (:attr:`~toolkit.core.model.MethodSpec.input_order`); None: as given."""
    if order is None:
        return list(inputs)
    bad = [i for i in order if not 0 <= i < len(inputs)]
    if bad:
        raise LoadError(f"the compiled model takes method inputs {list(order)}, but {len(inputs)} inputs were given")
    return [inputs[i] for i in order]


def method_outputs(outputs: list, order: "tuple[int, ...] | None") -> list:
    """The ``.so``'s outputs in the method's order: ``order[j]`` is the ``.so`` output giving the
    method's output ``j`` (:attr:`~toolkit.core.model.MethodSpec.output_order`); None: as they come.

    The order comes from the ``.pte``'s execution plan, not from the ``.so``'s output names
    (``AOTInductorModelContainerGetOutputName``): AOTInductor names outputs by position
    (``outputs_info_[0].name = "output0"`` in the generated wrapper, torch 2.13), so they say
    nothing about which method output each one is."""
    if order is None:
        return list(outputs)
    bad = [k for k in order if not 0 <= k < len(outputs)]
    if bad:
        raise LoadError(
            f"the method's outputs come from compiled outputs {list(order)}, but the compiled model gave {len(outputs)}"
        )
    return [outputs[k] for k in order]


CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"


class AotiMethod:
    """One method on the AOTInductor runtime: its container and the uploads into it.

    A method whose ``.so`` and weights lie inside larger files (a :class:`~toolkit.core.model.PackedLocation`)
    has its ``.so`` copied out first (:func:`extract_so`), torch's libraries made global
    (:func:`make_torch_global`), and AOTI's whole-blob upload (of a whole file) emulated: each constant
    uploaded from its file and installed user-managed, held as AOTI would hold its blob.
    """

    def __init__(self, runtime: "AotiRuntime", program: Program, method: MethodSpec, device: Device):
        self._runtime = runtime
        self._program = program
        self._spec = method
        self._blob = runtime.source(program, method.blob_file, ranges=())  # pieces verified as they are read
        self._blob_bytes: int | None = method.blob_bytes
        self._blob_tensors: dict[str, torch.Tensor] = {}  # the emulated whole blob (no dense blob)
        self.device = to_torch(device)
        if isinstance(method.location, PackedLocation):
            at = method.location.so
            so = extract_so(runtime.source(program, at.file), at.offset, at.size)
            make_torch_global()
        else:
            so = runtime.source(program, method.so_file, dlopen=True)
        self.container = AotiContainer.create(so, self.device)

    def _path(self, c: ConstantSpec) -> Path:
        return self._runtime.source(self._program, c.file or self._spec.blob_file, ranges=[_span(c)])

    def compiled(self) -> CompiledMethod:
        got = read_compiled(self.container.so_path, self.device)
        if got is not None and isinstance(self._spec.location, PackedLocation):
            # the .so's offsets are its blob's, the program's absolute: shifted, or none without a dense blob
            blob = self._spec.location.weights
            at = blob.offset if isinstance(blob, Region) else None
            return CompiledMethod(
                {
                    n: replace(c, blob_offset=None if at is None or c.blob_offset is None else c.blob_offset + at)
                    for n, c in got.constants.items()
                },
                None if at is None else got.blob_bytes,
            )
        if got is not None:
            if got.blob_bytes is not None:  # what upload_blob will make AOTI read
                self._blob_bytes = max(self._blob_bytes or 0, got.blob_bytes)
            return got
        dtypes = self.container.constant_dtypes()
        return CompiledMethod(
            {
                n: CompiledConstant(n, fqn, dtypes.get(n, "?"), None, None)
                for n, fqn in self.container.constant_fqns().items()
            },
            None,
        )

    def upload_blob(self) -> None:
        if isinstance(self._spec.location, PackedLocation):
            tensors = {c.name: t for c, t, _ in self.upload_constants(list(self._spec.constants))}
            self._blob_tensors = tensors
            self.container.install(tensors)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return
        # AOTI maps the blob and reads what the .so expects: a shorter file would end the
        # process with SIGBUS, so its real size is checked here, right before.  It reads the
        # whole blob: every piece is verified first.
        self._runtime.source(self._program, self._spec.blob_file)
        need = self._blob_bytes
        try:
            have = os.stat(self._blob).st_size
        except OSError as e:
            raise IntegrityError(f"weights blob cannot be read: {e.strerror or e}", path=self._blob) from None
        if need is not None and have < need:
            raise IntegrityError(
                f"weights blob is truncated: {have} bytes, the compiled model reads {need}", path=self._blob
            )
        self.container.upload_blob(self._blob)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def extract(self) -> dict[str, torch.Tensor]:
        if isinstance(self._spec.location, PackedLocation):
            return dict(self._blob_tensors)
        return self.container.extract()

    def upload_constants(self, constants: list[ConstantSpec]) -> Iterator[tuple[ConstantSpec, torch.Tensor, str]]:
        from toolkit.upload import as_constant, upload_constant

        groups: dict[str, list[int]] = {}  # program file -> the constants read from it
        for i, c in enumerate(constants):
            groups.setdefault(c.file or self._spec.blob_file, []).append(i)
        staged: dict[int, tuple[torch.Tensor, UploadPath]] = {}
        for rel, idx in groups.items():
            # every piece these uploads read, verified at once (on every core) first: hashed in staging
            # slots and uploaded from there (the batch's tensors come back only when every piece matched),
            # or verified into the file's private copy
            got = self._runtime.stage_constants(self._program, rel, [constants[i] for i in idx], self.device)
            if got is None:
                self._runtime.source(self._program, rel, ranges=[_span(constants[i]) for i in idx])
            else:
                raws, how = got
                staged.update((i, (raw, how)) for i, raw in zip(idx, raws))
        rest = [c for i, c in enumerate(constants) if i not in staged]  # those the uploader takes
        uploader = self._runtime.uploader(self.device) if rest else None
        try:
            mapped: Path | None = None
            for i, c in enumerate(constants):
                if i in staged:
                    raw, how = staged.pop(i)
                    yield c, as_constant(raw, c), how
                    continue
                path = self._path(c)  # each constant from ITS file
                if uploader is not None and path != mapped:
                    # maps the file: pages an earlier load locked are copied from
                    uploader.prefetch(path, [x for x in rest if self._path(x) == path])
                    mapped = path
                tensor = upload_constant(path, c, self.device, uploader)
                how = (
                    uploader.last_path
                    if uploader
                    else (UploadPath.HOST if self.device.type == "cpu" else UploadPath.PINNED_EACH)
                )
                yield c, tensor, how
        finally:
            if uploader is not None:
                uploader.release()

    def install(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.container.install(dict(tensors))

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        ordered = so_inputs(list(inputs), self._spec.input_order)
        return method_outputs(self.container.run([x.to(self.device) for x in ordered]), self._spec.output_order)


class AotiRuntime:
    """PyTorch's AOTInductor runtime (CUDA or CPU); one per session, holding its uploaders, which
    move bytes as ``options`` say.  Creating one turns the compiled models' input checks on."""

    name = "aoti"
    can_run = True
    native_uploads = True

    def __init__(self, options: LoadOptions | None = None) -> None:
        self.options = options if options is not None else LoadOptions()
        self._uploaders: dict[torch.device, Any] = {}  # upload.make_uploader(), one per CUDA device
        self._copies: dict[Path, VerifiedCopy] = {}  # program file -> the verified copy this session reads
        os.environ.setdefault(CHECK_INPUTS_ENV, "1")  # before any container runs (see the module docstring)

    def resolve(self, spec: Any) -> Device:
        current = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return _parse(spec, default_cuda_index=current)

    def check_available(self, program: Program, device: Device) -> None:
        if program.root is None:
            raise LoadError(
                f"program {program.name!r} exists only in memory (its files were never written): "
                "it can be analysed (toolkit.dry_run), not loaded"
            )
        check_compatible(program, device.type, torch.__version__)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise IncompatibleProgramError(
                f"program was built for {program.device!r} but torch sees no CUDA device here: load it on a "
                "machine with one, or predict its load without one: pass --dry-run, or call toolkit.dry_run(...)",
                path=program.root,
                field="device",
            )

    def create(self, program: Program, method: MethodSpec, device: Device) -> AotiMethod:
        return AotiMethod(self, program, method, device)

    def source(
        self, program: Program, rel: str, *, dlopen: bool = False, ranges: list[tuple[int, int]] | None = None
    ) -> Path:
        """The path this session reads program file ``rel`` from: with integrity checked, its
        verified copy (:meth:`~toolkit.integrity.VerifiedFiles.copy`), the same one for the whole
        session, holding (verified) the pieces covering ``ranges`` ((start, end) byte ranges; None:
        every byte), which are all the caller may read of it; ``dlopen``: a copy kept for the
        process (a path ``dlopen`` saw must keep its bytes), once its bytes are the ones the record's
        whole-file sha256 names (the key ExecuTorch 1.5.x makes of it must name the code that runs)."""
        path, record = program.path(rel), program.files.get(rel)
        if not self.options.integrity.checks or record is None:
            return path
        if path not in self._copies:
            self._copies[path] = verified_files().copy(path, record, self.options, ranges)
        else:
            verified_files().more(self._copies[path], ranges)
        copy = self._copies[path]
        if not dlopen:
            return copy.path
        check_sha256(copy, record, rel)
        return keep_for_process(copy).path

    def stage_constants(
        self, program: Program, rel: str, constants: list[ConstantSpec], device: torch.device
    ) -> tuple[list[torch.Tensor], UploadPath] | None:
        """The raw bytes of ``constants`` (all read from program file ``rel``) on ``device``, and how
        they travelled, through the staging pipeline (:func:`~toolkit.upload.stage_pieces`) where it
        applies; None where they go the other way (the private copy, the uploader).

        Hashed as staged: ``integrity="staged"``, the file has a record, and this session holds no
        complete verified copy of the file (one made for a whole-blob upload or a ``.so`` inside it:
        read from that); on CUDA under ``upload="mapped"`` and ``first_load="locked"`` (the defaults),
        straight out of the file's locked pages where the device hashes every piece
        (``UploadPath.VERIFIED_LOCKED`` when some were).  Nothing kept: a later batch reads and
        hashes its pieces again.  Unhashed: on CUDA under ``upload="mapped"`` and
        ``first_load="pipelined"``, from where the other way would read (:meth:`source`)."""
        o, path, record = self.options, program.path(rel), program.files.get(rel)
        copy = self._copies.get(path)
        if o.integrity.hashes_staging and record is not None and not (copy is not None and copy.complete):
            read_from, how = path, UploadPath.VERIFIED_STAGED if device.type == "cuda" else UploadPath.VERIFIED_HOST
        elif device.type == "cuda" and o.upload is UploadMode.MAPPED and o.first_load is FirstLoad.PIPELINED:
            read_from, how = self.source(program, rel, ranges=[_span(c) for c in constants]), UploadPath.PIECES
            record = None  # unhashed
        else:
            return None
        from toolkit.upload import MappedBlobUploader, stage_pieces

        uploader = self.uploader(device)
        locks = (
            uploader.locks
            if record is not None
            and isinstance(uploader, MappedBlobUploader)
            and o.first_load is FirstLoad.LOCKED
            and not uploader.disabled_reason
            else None
        )
        locked: list[int] = []
        tensors = stage_pieces(
            read_from,
            record,
            constants,
            device,
            threads=o.hash_threads or hash_threads(),
            chunk_bytes=o.staging_chunk_bytes,
            device_digest=o.device_digest,
            on_hashed=verified_files().count_hashed if record is not None else None,
            locks=locks,
            on_locked=locked.append,
        )
        return tensors, UploadPath.VERIFIED_LOCKED if locked else how

    def uploader(self, device: torch.device):
        if device.type != "cuda":
            return None
        if device not in self._uploaders:
            from toolkit.upload import make_uploader

            self._uploaders[device] = make_uploader(device, self.options)
        return self._uploaders[device]

    def write_initial(self, tensor: torch.Tensor, program: Program, constant: ConstantSpec) -> None:
        from toolkit.upload import as_constant, read_constant_bytes

        raw = read_constant_bytes(self.source(program, constant.file, ranges=[_span(constant)]), constant)
        with torch.no_grad():
            tensor.copy_(as_constant(raw, constant))

    def checksum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Row and column sums of the bytes as int32 words in rows of 1024, on the tensor's device: a
        write changes them unless it keeps every row's and column's sum (one read, no host copy)."""
        flat = tensor.detach().reshape(-1).view(torch.uint8)
        words = flat.view(torch.int32) if flat.numel() % 4 == 0 else flat.to(torch.int32)
        if words.numel() < 2048:
            return words.to(torch.int64)
        rows = words.numel() // 1024
        grid = words[: rows * 1024].view(rows, 1024)
        return torch.cat(
            [grid.sum(0, dtype=torch.int64), grid.sum(1, dtype=torch.int64), words[rows * 1024 :].to(torch.int64)]
        )

    def same_checksum(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool(torch.equal(a, b))

    def view(self, t: torch.Tensor, constant: ConstantSpec) -> torch.Tensor:
        """``constant``'s dtype, sizes, strides and storage offset on ``t``'s storage, zero-copy."""
        from toolkit.upload import as_constant

        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        itemsize = DTYPE_ITEMSIZE[constant.dtype]
        return as_constant(raw[: raw.numel() - raw.numel() % itemsize], constant)

    def facts(self, t: torch.Tensor) -> tuple[TensorMeta, int]:
        return tensor_meta(t), t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()

    def bytes_in_use(self, device: Device, *, sync: bool) -> tuple[int, str] | None:
        if device.type != "cuda":
            return None
        d = to_torch(device)
        if sync:
            torch.cuda.synchronize(d)
        return cuda_in_use_bytes(d), "cudaMemGetInfo total-free"

    def close(self) -> None:
        for uploader in self._uploaders.values():
            if uploader is not None:
                uploader.close()
        self._uploaders.clear()
        self._copies.clear()
