"""The program model: what every source of programs turns its files into.

Plain frozen data, no I/O and no torch.  A source (:mod:`toolkit.sources`) reads a program
directory, an ExecuTorch ``.pte``/``.ptd`` or a torch ``.pt2`` into a
:class:`Program`; the load orchestrator, the dry run, the policies and the presentation see
only this model, never a file format.

A :class:`Program` lists its methods in load order.  Each :class:`ConstantSpec` says what the
compiled method calls the constant (internal name), what the export called it (FQN), what it
is (kind, mutated), its layout (dtype, shape, strides, storage offset, bytes a slot reads),
where its bytes are (a file of the program and the offset in it) and a digest of those bytes.
A :class:`MethodSpec`'s :class:`Location` says where its ``.so`` and weights lie.  Every file
has a :class:`FileRecord` (size, sha256).  Every byte offset is absolute in the file it names.
"""

from __future__ import annotations

import functools
import html
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Iterable, Mapping

from toolkit.core.vocab import ConstantKind, ProgramFormat

METHOD_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

# dtype name -> bytes per element; names are torch's (str(torch.float32) without "torch.")
# c10::ScalarType codes (ExecuTorch's ScalarType numbers them the same) -> torch dtype name
SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    9: "complex64",
    10: "complex128",
    11: "bool",
    15: "bfloat16",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
}
DTYPE_ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def shown(v: object) -> str:
    """A metadata value as tables, comparisons and reports show it: ``(64, 64)``; None as ''.

    The one formatter of shapes, strides and other fields (memoised: shapes repeat across
    constants, and a dry run of a million constants formats each of them several times).
    """
    try:
        return _shown(v)
    except TypeError:  # unhashable (a list)
        return _shown(tuple(v))  # type: ignore[arg-type]


@functools.lru_cache(maxsize=65536)
def _shown(v: object) -> str:
    if v is None:
        return ""
    return str(tuple(v)) if isinstance(v, (tuple, list)) else str(v)


def quick_init(cls: type) -> type:
    """A frozen dataclass made faster to construct: its ``__init__`` (same parameters and defaults)
    writes the instance's dict directly, where the generated one calls ``object.__setattr__`` once
    per field, a cost a dry run pays once per constant for its policy decision.  Still frozen:
    assignment raises; equality, hash and repr are the dataclass's.
    For dataclasses without slots, ``__post_init__``, keyword-only fields or default factories."""
    fs = [f for f in fields(cls) if f.init]
    if (
        hasattr(cls, "__slots__")
        or hasattr(cls, "__post_init__")
        or not cls.__dataclass_params__.frozen
        or any(f.kw_only or f.default_factory is not MISSING for f in fs)
    ):
        raise TypeError(f"quick_init does not apply to {cls.__name__}")
    params = ", ".join(f.name if f.default is MISSING else f"{f.name}=_default_{f.name}" for f in fs)
    body = "".join(f"\n    d[{f.name!r}] = {f.name}" for f in fs)
    namespace = {f"_default_{f.name}": f.default for f in fs if f.default is not MISSING}
    exec(f"def __init__(self, {params}):\n    d = self.__dict__{body}\n", namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return cls


@quick_init
@dataclass(frozen=True)
class TensorMeta:
    """The metadata ExecuTorch compares (cuda_backend.cpp), read off a tensor or a constant."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    device_type: str
    device_index: int

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __hash__(self) -> int:
        """The dataclass's hash (of its fields), computed once: a metadata is a key of the memoised comparison
        and of the cache's content index, and hashing its shape and strides again each time cost a dry run
        a quarter of a microsecond per use."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(
                (self.dtype, self.shape, self.strides, self.device_type, self.device_index)
            )
        return h

    def __getstate__(self) -> dict:
        """Its fields without the memoised hash: a string's hash differs between processes."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


AOTI_CONST_ALIGNMENT = 64  # of every slot of a blob's device allocation (aoti_runtime/model_base.h)


def aligned_slot_bytes(nbytes: int, *, all_cuda: bool = False) -> int:
    """The bytes a constant of ``nbytes`` takes in an AOTInductor blob: rounded up to AOTI_CONST_ALIGNMENT in
    the device allocation, and in a blob file holding any CPU constant (and in the sizes its .so reports);
    ``all_cuda``: in a blob file of CUDA constants only, unpadded (a 16-byte constant takes 16)."""
    return nbytes if all_cuda else -(-nbytes // AOTI_CONST_ALIGNMENT) * AOTI_CONST_ALIGNMENT


def required_nbytes(dtype: str, shape: Iterable[int], strides: Iterable[int], storage_offset: int = 0) -> int:
    """Bytes of storage a tensor view of this layout reads (0 for an empty tensor)."""
    shape, strides = tuple(shape), tuple(strides)
    if any(s == 0 for s in shape):
        return 0
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    return (storage_offset + extent) * DTYPE_ITEMSIZE[dtype]


@dataclass(frozen=True)
class ConstantSpec:
    """One constant of one method, as the build saw it."""

    name: str  # AOTInductor internal name, e.g. "layers_0_weight" or "_tensor_constant0"
    fqn: str  # original FQN, e.g. "layers.0.weight"; "" when AOTI reports none
    kind: ConstantKind
    mutated: bool  # the graph writes it (ExportedProgram.graph_signature.buffers_to_mutate)
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int
    nbytes: int  # bytes of storage the slot reads
    offset: int  # byte offset of that storage inside ``file``
    digest: str  # sha256 of those bytes
    file: str = ""  # the program file holding the bytes (relative to the program's root)
    # Optional, for formats that key their data (ExecuTorch .pte/.ptd, torch .pt2):
    storage_key: str = ""  # the key its bytes are stored under: a 1.5.x .ptd key, a .pt2 weights member; "" if none
    # key of its method's .so (ExecuTorch's so_blob_key), set at least where it matters: ExecuTorch 1.5.x
    # namespaces `_tensor_constant*` FQNs by it.  Derived from the .so's bytes, so not part of equality.
    so_key: str = field(default="", compare=False)
    # Provenance: which tensor of the eager program this is.  Constants of different methods
    # with the same non-empty key were ONE tensor storage in the modules given to the builder
    # (a shared weight, or shared state such as a KV cache); "" when unknown (a lifted
    # constant, whose attribute name AOTInductor drops, or a file that does not say).
    storage: str = ""
    # bytes of the whole storage its view is taken of, where the format records one (a 1.5.x manifest's
    # storage_nbytes); 0: the bytes the slot reads (``nbytes``)
    storage_nbytes: int = 0

    @property
    def storage_bytes(self) -> int:
        """Bytes of the storage its view is taken of: what a runtime that uploads whole storages copies."""
        return self.storage_nbytes or self.nbytes

    def meta(self, device_type: str, device_index: int) -> TensorMeta:
        try:
            return _meta(self.dtype, self.shape, self.strides, device_type, device_index)
        except TypeError:  # unhashable (a list)
            return TensorMeta(self.dtype, self.shape, self.strides, device_type, device_index)


@functools.lru_cache(maxsize=1 << 16)
def _meta(
    dtype: str, shape: tuple[int, ...], strides: tuple[int, ...], device_type: str, device_index: int
) -> TensorMeta:
    """One TensorMeta per distinct metadata (immutable; a program's constants repeat a few shapes, and
    a dry run asks each constant's several times)."""
    return TensorMeta(dtype, shape, strides, device_type, device_index)


@dataclass(frozen=True)
class Region:
    """Bytes ``[offset, offset + size)`` of a program file, and the name its format stores them under."""

    file: str
    offset: int
    size: int
    key: str = ""  # a named-data key, an archive member ("" when none)


@dataclass(frozen=True)
class PerConstantStorages:
    """Weights kept as one storage per constant, each where its ConstantSpec says: no dense blob exists."""


@dataclass(frozen=True)
class Location:
    """Where a method's ``.so`` and weights lie: one kind per layout (a format's own beside its source)."""


@dataclass(frozen=True)
class FilesLocation(Location):
    """The ``.so`` is the whole ``so_file``, the weights the whole ``blob_file`` (a dense blob AOTI loads as is)."""


@dataclass(frozen=True)
class PackedLocation(Location):
    """The ``.so`` lies inside a larger file (``so``) and the weights are read constant by constant:
    ``weights`` is the dense blob they form inside a larger file, or :class:`PerConstantStorages`."""

    so: Region
    weights: Region | PerConstantStorages


@dataclass(frozen=True)
class InputSpec:
    """One input tensor a method takes, as its program declares it (the oracle draws inputs of it)."""

    dtype: str  # torch's name ("float32"), or what the file says where torch has no such dtype
    shape: tuple[int, ...]
    dynamic: tuple[int, ...] = ()  # the dimensions the program leaves open, each at the smallest size it allows


@dataclass(frozen=True)
class MethodSpec:
    """One method: its compiled ``.so``, its weights (``location`` says where in which file), its reference."""

    name: str
    so_file: str
    blob_file: str  # the file holding the method's weights
    reference_file: str
    blob_bytes: int  # bytes of its dense AOTInductor blob (binary_blob layout), or that it would have
    num_inputs: int
    num_outputs: int
    constants: tuple[ConstantSpec, ...]
    location: Location = FilesLocation()
    input_order: tuple[int, ...] | None = None  # for each input of the .so, the index of the method input feeding it
    output_order: tuple[int, ...] | None = None  # for each method output, the index of the .so output giving it

    @property
    def files(self) -> tuple[str, ...]:
        """Every program file this method's load reads: .so, blob, reference (if any), constants' files."""
        own = tuple(f for f in (self.so_file, self.blob_file, self.reference_file) if f)
        extra = {c.file for c in self.constants if c.file} - set(own)
        return tuple(dict.fromkeys(own)) + tuple(sorted(extra))


@dataclass(frozen=True)
class SequenceStep:
    method: str
    num_inputs: int
    num_outputs: int


@dataclass(frozen=True)
class SequenceSpec:
    """Methods run in order with their state carried (prefill, then decode, ...), and the eager
    program's inputs and outputs of every step (``step.<i>.input.<j>``, ``step.<i>.output.<j>``)."""

    name: str
    steps: tuple[SequenceStep, ...]
    reference_file: str


@dataclass(frozen=True)
class StateBuffer:
    """One mutated buffer of the eager program and the methods that write or only read it."""

    storage: str
    fqn: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]


@dataclass(frozen=True)
class FileRecord:
    """A file's size and sha256; ``chunks`` (optional) the digest of each ``chunk_bytes`` piece of
    it, in order, by ``chunk_digest`` (``"sha256"``: program format 3; ``"blake3"``: format 4),
    which lets the integrity check hash the pieces on every core at once, and only the pieces a
    load reads."""

    sha256: str
    bytes: int
    chunk_bytes: int = 0
    chunks: tuple[str, ...] = ()
    chunk_digest: str = "sha256"


@dataclass(frozen=True)
class Program:
    """A program, whichever file format it came from.

    ``root`` is the folder its relative file names resolve against (``None`` for a program
    that exists only in memory, such as a synthetic one: it can be analysed, not loaded).
    ``format`` is the file format it was read from.
    """

    name: str
    description: str
    device: str  # "cpu" or "cuda": what the methods were compiled for
    torch_version: str
    created_utc: str
    methods: tuple[MethodSpec, ...]
    files: Mapping[str, FileRecord] = field(default_factory=dict)
    root: Path | None = field(default=None, compare=False)  # where it lies is not what it is
    format: ProgramFormat = ProgramFormat.DIRECTORY
    sequences: tuple[SequenceSpec, ...] = ()
    # whether ``mutated`` says which constants a method writes (our builder records it; a .pte or
    # .pt2 does not): when False, resetting state rewrites every constant from its file
    records_mutation: bool = True
    # where the constant tables of a .pte's generation-1/2 methods came from (a table file, one given, or each
    # method's .so); "" where none was needed.  How it was opened, not what it is: not compared
    table_origin: str = field(default="", compare=False)

    def sequence(self, name: str) -> SequenceSpec:
        for q in self.sequences:
            if q.name == name:
                return q
        raise KeyError(f"program {self.name!r} has no sequence {name!r}; it has {[q.name for q in self.sequences]}")

    def state_buffers(self) -> tuple[StateBuffer, ...]:
        """Every buffer some method mutates, by eager storage: who writes it, who only reads it.

        Buffers of unknown provenance are listed per (method, FQN), each its own state.
        """
        found: dict[str, dict] = {}
        for m in self.methods:
            for c in m.constants:
                if c.kind is not ConstantKind.BUFFER:
                    continue
                key = c.storage or f"{m.name}:{c.fqn}"
                rec = found.setdefault(key, {"fqn": c.fqn, "writers": [], "readers": [], "mutated": False})
                rec["writers" if c.mutated else "readers"].append(m.name)
                rec["mutated"] |= c.mutated
        return tuple(
            StateBuffer(k, r["fqn"], tuple(r["writers"]), tuple(r["readers"])) for k, r in found.items() if r["mutated"]
        )

    def method(self, name: str) -> MethodSpec:
        found = self._methods_by_name.get(name)
        if found is not None:
            return found
        raise KeyError(f"program {self.name!r} has no method {name!r}; it has {self.method_names}")

    @functools.cached_property
    def _methods_by_name(self) -> dict[str, MethodSpec]:  # the first of a name, as a scan would find it
        return {m.name: m for m in reversed(self.methods)}

    @property
    def method_names(self) -> list[str]:
        return [m.name for m in self.methods]

    def __repr__(self) -> str:
        """A few lines: what it is and where, then a line per method (the first 8)."""
        where = f" at {self.root}" if self.root is not None else " (in memory)"
        lines = [
            f"Program {self.name!r}: {len(self.methods)} methods, {self.format} for {self.device}, "
            f"torch {self.torch_version}{where}"
        ]
        lines += [
            f"  {m.name}: {len(m.constants):,} constants, {m.blob_bytes:,} blob bytes, {m.num_inputs} inputs, "
            f"{m.num_outputs} outputs"
            for m in self.methods[:8]
        ]
        if len(self.methods) > 8:
            lines.append(f"  ... and {len(self.methods) - 8} more methods (program.methods)")
        if self.sequences:
            lines.append("  sequences: " + ", ".join(q.name for q in self.sequences))
        if self.table_origin:
            lines.append(f"  {self.table_origin}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>"

    def path(self, rel: str) -> Path:
        if self.root is None:
            raise ValueError(f"program {self.name!r} exists only in memory: it has no file {rel!r}")
        return self.root / rel
