"""ExecuTorch programs of the CUDA backend: a ``.pte`` and the ``.ptd`` beside it, as the program model.

Our own bounds-checked FlatBuffer reader (:mod:`toolkit.sources.binary`) reads the ``.pte``
(``ET12``, extended header ``eh00``) and each ``.ptd`` (FlatTensor, ``FT01``/``FH01``); every
malformed byte is a :class:`~toolkit.core.errors.ProgramError` naming the file, field and offset.
Methods are the execution plans with one CUDA delegate; its ``processed`` bytes, in one of
three payload generations (named-data keys; ``.so`` and weights keys; the ``ETCUDAFQN3``,
``4``, ``5`` and ``0`` per-FQN manifests of 1.5.x), say where its ``.so`` and weights lie.
Generations 1 and 2 keep the constant table inside the ``.so``, which a source never opens:
pass ``constant_table=`` (:class:`AotiConstant` rows per method, or a JSON file of them; by
default ``constant_table.json`` beside the ``.pte``); the offsets then follow AOTInductor's dense
``binary_blob`` layout and must add up to the blob's size.  ``reader="executorch"`` parses
with upstream's own reader instead (the ``executorch`` extra), as a cross-check.  The payload
generations, how each field of the model is filled, and why our own reader: ``docs/upstream.md``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from pydantic import TypeAdapter, ValidationError

from toolkit.core.errors import ProgramError, ToolkitError
from toolkit.core.model import (
    DTYPE_ITEMSIZE,
    METHOD_NAME_RE,
    ConstantSpec,
    MethodSpec,
    PackedLocation,
    PerConstantStorages,
    Program,
    Region,
    SequenceSpec,
    SequenceStep,
    aligned_slot_bytes,
    required_nbytes,
)
from toolkit.core.vocab import ConstantKind, ProgramFormat
from toolkit.integrity import VerifiedFiles
from toolkit.sources.binary import Bytes, Cursor, MappedFile, Table, root
from toolkit.sources.directory import StepDoc, validation_problem

DEFAULT_DATA_FILE = "aoti_cuda_blob.ptd"
DEFAULT_CONSTANT_TABLE_FILE = "constant_table.json"  # read from beside the .pte when constant_table= is not given
CUDA_BACKEND_ID = "CudaBackend"
PTE_IDENTIFIER, PTD_IDENTIFIER = b"ET12", b"FT01"
EXTRA = "executorch"
MAX_RANK = 64
MAX_ENTRIES = 1 << 20  # the runtime's own bound (kMaxManifestEntries)
MAX_VARIANTS = 256
MAX_TRAILING_BYTES = 1 << 16  # padding after the last segment (ExecuTorch's files have none)

# c10::ScalarType codes the 1.5.x runtime accepts (is_supported_cuda_fqn_dtype)
SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    11: "bool",
    15: "bfloat16",
}
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
FQN_MAGICS = ("ETCUDAFQN3", "ETCUDAFQN4", "ETCUDAFQN5", "ETCUDAFQN0")
_STEPS = TypeAdapter(list[StepDoc])
COPY_OPS = re.compile(r"^(et_copy::.*|aten::_to_copy|aten::copy_?|aten::clone|aten::_device_copy)$")


# ------------------------------------------------------------------ what a reader gives


@dataclass(frozen=True)
class PteLocation(PackedLocation):
    """A ``.pte``'s method: ``.so`` and weights named data, a dense blob (generations 1, 2) or per-FQN storages."""

    payload: str  # the delegate payload's generation (with every .so variant of a multi-arch one)


@dataclass
class _Delegate:
    index: int
    id: str
    specs: dict[str, bytes]
    payload: bytes
    where: str


@dataclass
class _Plan:
    name: str
    inputs: list[int]
    outputs: list[int]
    delegates: list[_Delegate]
    calls: list[tuple[str, int, list[int]]]  # ("kernel", op_index, args) / ("delegate", delegate_index, args)
    operators: list[str]
    where: str


@dataclass
class _Layout:
    """What a ``.pte`` (plans, named data) or a ``.ptd`` (named data) says, from either reader."""

    plans: list[_Plan] = field(default_factory=list)
    named: dict[str, Region] = field(default_factory=dict)


@dataclass(frozen=True)
class AotiConstant:
    """One entry of a ``.so``'s constant table, for generations 1 and 2 (``constant_table=``).

    ``data_size`` is the bytes of its storage in the dense blob (default: what the view
    reads); ``offset`` its byte offset in the blob (default: AOTInductor's layout rule).
    A :class:`~toolkit.core.model.ConstantSpec` (e.g. of the program the ``.so`` was built from)
    is accepted in place of one.
    """

    name: str
    fqn: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int = 0
    kind: ConstantKind = ConstantKind.PARAMETER
    mutated: bool = False
    data_size: int | None = None
    offset: int | None = None


# ------------------------------------------------------------------ files


def _rel(path: Path, root: Path) -> str:
    try:
        return os.path.relpath(path, root)
    except ValueError:  # another drive (Windows)
        return str(path.resolve())


def _not_a_file(path: Path) -> str:
    """Why ``path``, not a regular file, is not opened."""
    return "is not a regular file (a folder, FIFO or device)" if path.exists() else "does not exist"


# ------------------------------------------------------------------ our reader


def _region(b: Bytes, rel: str, base: int, seg: Table, where: str, file_size: int) -> Region:
    off, size = seg.scalar(0, "offset", "u64"), seg.scalar(1, "size", "u64")
    start = base + off
    if start + size > file_size:
        raise b.error(
            f"segment [{start}, {start + size}) runs past the end of the file ({file_size} bytes)", where, seg.pos
        )
    return Region(rel, start, size)


def _trailing_problem(size: int, end: int) -> str:
    """Why a file of ``size`` bytes whose structure ends at ``end`` is refused ("" if it is not)."""
    if size - end <= MAX_TRAILING_BYTES:
        return ""
    return f"{size - end} bytes after the end of its last segment ({end}): not part of the file's structure"


def _no_trailing_bytes(b: Bytes, segments: list[Region], structure_end: int) -> None:
    """Refuse bytes past the last segment (a sparse 8 GiB file with 50 KB of content): what the
    file holds is bounded by what it declares."""
    end = max([structure_end] + [s.offset + s.size for s in segments])
    problem = _trailing_problem(len(b), end)
    if problem:
        raise b.error(problem, "segments", end)


MAX_STRUCTURE_BYTES = 1 << 28  # a header that declares more FlatBuffer than this: the full read decides


def _refuse_trailing_before_copy(path: Path) -> None:
    """The check of :func:`_no_trailing_bytes`, from the header and the FlatBuffer alone (read with
    ``pread``: kilobytes), before the file is copied and hashed whole (a sparse 8 GiB ``.ptd``
    holding 50 KB must not cost 8 GiB of hashing).  Anything it cannot read is left to the full
    parse of the verified copy, which checks again."""
    try:
        with open(path, "rb", buffering=0) as fh:
            fd, size = fh.fileno(), os.fstat(fh.fileno()).st_size
            if size <= MAX_TRAILING_BYTES:
                return
            head = Bytes(os.pread(fd, 48, 0), path)
            if len(head) >= 32 and head.raw(8, 4) == b"eh00":  # a .pte: its program FlatBuffer first
                prefix, seg_base, ident, index = head.u64(16, ""), head.u64(24, ""), PTE_IDENTIFIER, 4
            elif len(head) >= 48 and head.raw(8, 4) == b"FH01":  # a .ptd
                prefix, seg_base = head.u64(16, "") + head.u64(24, ""), head.u64(32, "")
                ident, index = PTD_IDENTIFIER, 1
            else:
                return
            if not 8 < prefix <= min(size, MAX_STRUCTURE_BYTES):
                return
            fb = Bytes(os.pread(fd, prefix, 0), path)
        segments = root(fb, ident, "").tables(index, "segments")
        end = max([prefix] + [seg_base + t.scalar(0, "offset", "u64") + t.scalar(1, "size", "u64") for t in segments])
    except (OSError, ProgramError):
        return
    problem = _trailing_problem(size, end)
    if problem:
        raise ProgramError(problem, path=path, field="segments")


def _named_data(b: Bytes, table: Table, index: int, segments: list[Region], where: str) -> dict[str, Region]:
    named: dict[str, Region] = {}
    for i, nd in enumerate(table.tables(index, where)):
        w = f"{where}[{i}]"
        key = nd.string(0, "key")
        if not key:
            raise b.error("named data without a key", f"{w}.key", nd.pos)
        idx = nd.scalar(1, "segment_index", "u32")
        if idx >= len(segments):
            raise b.error(f"segment index {idx} >= {len(segments)} segments", f"{w}.segment_index", nd.pos)
        if key in named:
            raise b.error(f"duplicate named data key {key!r}", f"{w}.key", nd.pos)
        named[key] = segments[idx]
    return named


def _read_pte(f: MappedFile) -> _Layout:
    b = f.bytes
    if len(b) < 8:
        raise ProgramError(f"not an ExecuTorch program: {len(b)} bytes", path=f.path)
    program_size, seg_base = len(b), 0
    if len(b) >= 16 and b.raw(8, 4) == b"eh00":
        length = b.u32(12, "extended_header.length")
        if length < 24:
            raise b.error(f"extended header length {length} < 24", "extended_header.length", 12)
        program_size = b.u64(16, "extended_header.program_size")
        seg_base = b.u64(24, "extended_header.segment_base_offset")
        if not 8 < program_size <= len(b):
            raise b.error(
                f"program size {program_size} does not fit the file ({len(b)} bytes)",
                "extended_header.program_size",
                16,
            )
        if seg_base > len(b):
            raise b.error(
                f"segment base offset {seg_base} is past the end of the file ({len(b)} bytes)",
                "extended_header.segment_base_offset",
                24,
            )
    fb = Bytes(b.data[:program_size], f.path)
    prog = root(fb, PTE_IDENTIFIER, "ExecuTorch program (.pte)")
    segments = [
        _region(fb, f.rel, seg_base, s, f"segments[{i}]", len(b)) for i, s in enumerate(prog.tables(4, "segments"))
    ]
    _no_trailing_bytes(b, segments, program_size)
    inline = prog.tables(3, "backend_delegate_data")
    layout = _Layout(named=_named_data(fb, prog, 7, segments, "named_data"))
    for pi, ep in enumerate(prog.tables(1, "execution_plan")):
        w = f"execution_plan[{pi}]"
        name = ep.string(0, "name") or ""
        delegates = []
        for di, d in enumerate(ep.tables(7, "delegates")):
            dw = f"{w}.delegates[{di}]"
            specs = {}
            for ci, cs in enumerate(d.tables(2, "compile_specs")):
                key = cs.string(0, "key") or ""
                reg = cs.byte_region(1, "value")
                specs[key] = fb.raw(reg[0], reg[1], f"{dw}.compile_specs[{ci}].value") if reg else b""
            ref = d.table(1, "processed")
            if ref is None:
                raise fb.error("delegate has no processed data reference", f"{dw}.processed", d.pos)
            loc, idx = ref.scalar(0, "location", "u8"), ref.scalar(1, "index", "u32")
            if loc == 0:  # INLINE
                if idx >= len(inline):
                    raise fb.error(f"inline data index {idx} >= {len(inline)}", f"{dw}.processed.index", ref.pos)
                reg = inline[idx].byte_region(0, "data")
                payload = fb.raw(reg[0], reg[1], f"backend_delegate_data[{idx}].data") if reg else b""
            elif loc == 1:  # SEGMENT
                if idx >= len(segments):
                    raise fb.error(f"segment index {idx} >= {len(segments)}", f"{dw}.processed.index", ref.pos)
                s = segments[idx]
                payload = b.raw(s.offset, s.size, f"segments[{idx}]")
            else:
                raise fb.error(f"unknown data location {loc}", f"{dw}.processed.location", ref.pos)
            delegates.append(_Delegate(di, d.string(0, "id") or "", specs, payload, dw))
        operators = [f"{o.string(0, 'name') or ''}" for o in ep.tables(6, "operators")]
        calls = []
        for ch in ep.tables(5, "chains"):
            for ins in ch.tables(2, "instructions"):
                tag, args = ins.union(0, "instr_args")
                if tag == 1 and args is not None:  # KernelCall
                    calls.append(("kernel", args.scalar(0, "op_index", "i32"), args.ints(1, "args")))
                elif tag == 2 and args is not None:  # DelegateCall
                    calls.append(("delegate", args.scalar(0, "delegate_index", "i32"), args.ints(1, "args")))
        layout.plans.append(_Plan(name, ep.ints(3, "inputs"), ep.ints(4, "outputs"), delegates, calls, operators, w))
    return layout


def _read_ptd(f: MappedFile) -> _Layout:
    b = f.bytes
    if len(b) < 48:
        raise ProgramError(f"not an ExecuTorch data file: {len(b)} bytes, a header needs 48", path=f.path)
    if b.raw(8, 4) != b"FH01":
        raise b.error(f"no FlatTensor header: {b.raw(8, 4)!r} at byte 8, expected b'FH01'", "header.magic", 8)
    length = b.u32(12, "header.length")
    if length < 40:
        raise b.error(f"header length {length} < 40", "header.length", 12)
    fb_off, fb_size = b.u64(16, "header.flatbuffer_offset"), b.u64(24, "header.flatbuffer_size")
    seg_base = b.u64(32, "header.segment_base_offset")
    if fb_off + fb_size > len(b):
        raise b.error(
            f"FlatBuffer [{fb_off}, {fb_off + fb_size}) runs past the end of the file ({len(b)} bytes)",
            "header.flatbuffer_size",
            24,
        )
    if seg_base > len(b):
        raise b.error(f"segment base offset {seg_base} is past the end of the file", "header.segment_base_offset", 32)
    fb = Bytes(b.data[: fb_off + fb_size], f.path)
    ft = root(fb, PTD_IDENTIFIER, "ExecuTorch data file (.ptd)")
    segments = [
        _region(fb, f.rel, seg_base, s, f"segments[{i}]", len(b)) for i, s in enumerate(ft.tables(1, "segments"))
    ]
    _no_trailing_bytes(b, segments, fb_off + fb_size)
    return _Layout(named=_named_data(fb, ft, 2, segments, "named_data"))


# ------------------------------------------------------------------ ExecuTorch's reader (the extra)


def _executorch_modules():
    try:
        from executorch.exir._serialize import _program as et_program  # noqa: PLC0415
        from executorch.extension.flat_tensor.serialize import serialize as et_flat  # noqa: PLC0415
    except ImportError as e:
        raise ToolkitError(
            f"reading with ExecuTorch's own reader needs the optional extra {EXTRA!r}: "
            f"pip install 'constshare-toolkit[{EXTRA}]' (then pip install --no-deps executorch==1.5.1); "
            f"import failed: {e}"
        ) from None
    return et_program, et_flat


def _upstream(read):
    """Run one of upstream's readers: whatever it raises becomes a ProgramError naming the file."""

    def run(f: MappedFile) -> _Layout:
        try:
            return read(f)
        except ToolkitError:
            raise
        except Exception as e:  # upstream raises anything (IndexError, struct.error, ...)
            raise ProgramError(f"ExecuTorch's reader refuses it: {type(e).__name__}: {e}", path=f.path) from None

    return run


@_upstream
def _read_pte_executorch(f: MappedFile) -> _Layout:
    et_program, _ = _executorch_modules()
    data = bytes(f.bytes.data)
    eh = et_program._get_extended_header(data)
    size, base = (eh.program_size, eh.segment_base_offset) if eh is not None and eh.is_valid() else (len(data), 0)
    prog = et_program._flatbuffer_to_program(data[:size])
    segments = [Region(f.rel, base + s.offset, s.size) for s in prog.segments]
    layout = _Layout(named={nd.key: segments[nd.segment_index] for nd in (prog.named_data or [])})
    for pi, ep in enumerate(prog.execution_plan):
        delegates = []
        for di, d in enumerate(ep.delegates):
            if d.processed.location == 0:
                payload = bytes(prog.backend_delegate_data[d.processed.index].data)
            else:
                s = segments[d.processed.index]
                payload = data[s.offset : s.offset + s.size]
            delegates.append(
                _Delegate(
                    di,
                    d.id,
                    {c.key: bytes(c.value) for c in d.compile_specs},
                    payload,
                    f"execution_plan[{pi}].delegates[{di}]",
                )
            )
        calls = []
        for ch in ep.chains:
            for ins in ch.instructions:
                a = ins.instr_args
                if type(a).__name__ == "KernelCall":
                    calls.append(("kernel", a.op_index, list(a.args)))
                elif type(a).__name__ == "DelegateCall":
                    calls.append(("delegate", a.delegate_index, list(a.args)))
        layout.plans.append(
            _Plan(
                ep.name,
                list(ep.inputs),
                list(ep.outputs),
                delegates,
                calls,
                [o.name for o in ep.operators],
                f"execution_plan[{pi}]",
            )
        )
    return layout


@_upstream
def _read_ptd_executorch(f: MappedFile) -> _Layout:
    _, et_flat = _executorch_modules()
    data = bytes(f.bytes.data)
    header = et_flat.FlatTensorHeader.from_bytes(data[8:])
    ft = et_flat._deserialize_to_flat_tensor(data[: header.flatbuffer_offset + header.flatbuffer_size])
    segments = [Region(f.rel, header.segment_base_offset + s.offset, s.size) for s in ft.segments]
    return _Layout(named={nd.key: segments[nd.segment_index] for nd in ft.named_data})


# ------------------------------------------------------------------ payloads


@dataclass
class _Payload:
    generation: int
    label: str
    so_keys: list[str]  # the variants' .so keys, the one modelled first
    weights_key: str = ""
    entries: list[dict] = field(default_factory=list)


def _decode_entries(c: Cursor, where: str) -> list[dict]:
    n = c.u32(f"{where}.num_entries")
    if n > MAX_ENTRIES:
        raise c.b.error(
            f"{n} weight entries (the runtime accepts at most {MAX_ENTRIES})", f"{where}.num_entries", c.at - 4
        )
    entries = []
    for i in range(n):
        w = f"{where}.entries[{i}]"
        start = c.at
        fqn, key = c.string(f"{w}.fqn"), c.string(f"{w}.storage_key")
        nbytes, dtype, dev = c.u64(f"{w}.storage_nbytes"), c.i32(f"{w}.dtype"), c.i32(f"{w}.device_type")
        offset, ndim = c.i64(f"{w}.storage_offset"), c.u32(f"{w}.ndim")
        if not fqn or not key:
            raise c.b.error("weight entry without an FQN or a storage key", w, start)
        if ndim > MAX_RANK:
            raise c.b.error(f"rank {ndim} > {MAX_RANK}", f"{w}.ndim", c.at - 4)
        sizes = [c.i64(f"{w}.sizes") for _ in range(ndim)]
        strides = [c.i64(f"{w}.strides") for _ in range(ndim)]
        if offset < 0 or any(v < 0 for v in sizes + strides):
            raise c.b.error(
                f"negative storage offset, size or stride (offset {offset}, sizes {sizes}, strides {strides})", w, start
            )
        if dtype not in SCALAR_TYPES:
            raise c.b.error(f"ScalarType {dtype} is not one the CUDA runtime accepts", f"{w}.dtype", start)
        if dev not in DEVICE_TYPES:
            raise c.b.error(f"device type {dev} is neither 0 (cpu) nor 1 (cuda)", f"{w}.device_type", start)
        entries.append(
            {
                "fqn": fqn,
                "storage_key": key,
                "storage_nbytes": nbytes,
                "dtype": SCALAR_TYPES[dtype],
                "device": DEVICE_TYPES[dev],
                "storage_offset": offset,
                "sizes": tuple(sizes),
                "strides": tuple(strides),
                "where": w,
            }
        )
    return entries


def _decode_payload(d: _Delegate, method_name: str, path: Path) -> _Payload:
    where = f"{d.where}.processed"
    raw = d.payload
    b = Bytes(raw, path, what=f"CUDA delegate payload of method {method_name!r}")
    if not raw:
        base = method_name or ""
        return _Payload(
            1,
            "method keys (before #20424)",
            [f"{base}_so_blob" if base else "so_blob"],
            f"{base}_weights_blob" if base else "weights_blob",
        )
    if raw.startswith(b"ETCUDAFQN"):
        magic = raw[:10].decode("ascii", "replace")
        if magic not in FQN_MAGICS:
            raise b.error(
                f"payload {magic!r} is not one this toolkit reads ({', '.join(FQN_MAGICS)})", f"{where}.magic", 0
            )
        c = Cursor(b, 10)
        variants = []
        if magic == "ETCUDAFQN3":
            key = c.string(f"{where}.so_blob_key")
            if not key:
                raise b.error("payload names no .so key", f"{where}.so_blob_key", 10)
            variants.append((0, 0, False, key))
        else:
            n = c.u32(f"{where}.num_variants")
            if not 1 <= n <= MAX_VARIANTS:
                raise b.error(f"{n} variants (1 to {MAX_VARIANTS} allowed)", f"{where}.num_variants", 10)
            for i in range(n):
                vw = f"{where}.variants[{i}]"
                at = c.at
                sm, ptx = c.u32(f"{vw}.target_sm"), c.u32(f"{vw}.ptx_compute")
                flags = c.u32(f"{vw}.flags") if magic in ("ETCUDAFQN5", "ETCUDAFQN0") else 0
                key = c.string(f"{vw}.so_blob_key")
                fallback = bool(flags & 1)
                bad = (
                    not key
                    or ptx > sm
                    or flags & ~1
                    or (sm == 0 and (magic != "ETCUDAFQN0" or n != 1 or ptx or fallback))
                    or (fallback and (ptx == 0 or any(v[2] for v in variants)))
                    or (not fallback and sm and any(v[0] == sm and not v[2] for v in variants))
                )
                if bad:  # the checks of upstream's decoder (decode_cuda_aoti_metadata, CudaWeightCache::parse)
                    raise b.error(f"invalid variant (target sm {sm}, ptx {ptx}, flags {flags}, key {key!r})", vw, at)
                variants.append((sm, ptx, fallback, key))
            if any(v[2] for v in variants) and any(v[1] and not v[2] for v in variants):
                raise b.error("a regular variant advertises PTX beside a fallback variant", f"{where}.variants", 10)
        entries = _decode_entries(c, where)
        if c.remaining():
            raise b.error(f"{c.remaining()} bytes after the last weight entry", where, c.at)
        chosen = [v for v in variants if not v[2]] or variants
        order = chosen[:1] + [v for v in variants if v is not chosen[0]]
        label = (
            magic
            if len(variants) == 1 and variants[0][0] == 0
            else magic
            + " ("
            + ", ".join(
                (f"sm{sm}" if sm else "any") + (f"+ptx{ptx}" if ptx else "") + (" fallback" if fb else "")
                for sm, ptx, fb, _ in variants
            )
            + ")"
        )
        return _Payload(3, label, [v[3] for v in order], "", entries)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise b.error(
            "payload is neither empty, nor ETCUDAFQN*, nor the text '<so_key>\\n<weights_key>'", where, e.start
        ) from None
    if len(lines) != 2 or not all(lines):
        raise b.error(f"text payload has {len(lines)} line(s); expected '<so_key>\\n<weights_key>'", where, 0)
    return _Payload(2, "so and weights keys (#20424 to 1.4)", [lines[0]], lines[1])


# ------------------------------------------------------------------ the model


def aoti_internal_names(fqns: Iterable[str]) -> list[str]:
    """AOTInductor's internal constant names for ``fqns`` (``graph.allocate_non_dup_const_name``)."""
    taken: set[str] = set()
    next_suffix: dict[str, int] = {}  # every ``prefix_k`` below it is taken: linear in the FQNs, not quadratic
    out = []
    for fqn in fqns:
        name = f"constant_{fqn}" if fqn[:1].isdigit() else fqn
        prefix = name = re.sub(r"[^a-zA-Z0-9_]", "_", name)
        n = next_suffix.get(prefix, 0)
        while name in taken:
            name, n = f"{prefix}_{n}", n + 1
        next_suffix[prefix] = n
        taken.add(name)
        out.append(name)
    return out


def _kind(fqn: str) -> ConstantKind:
    return ConstantKind.LIFTED_CONSTANT if fqn.startswith("_tensor_constant") else ConstantKind.PARAMETER


def _io_orders(plan: _Plan, delegate: int) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(input order, output order) of the delegate's ``.so``: for each of its inputs, the method
    input feeding it; for each method output, the ``.so`` output giving it.  Both are traced
    through the copy kernels (``et_copy::_d2h_copy`` ...): the delegate call's arguments are its
    traced inputs, then its outputs, followed to the plan's outputs.  None where a value cannot
    be traced (then the ``.so``'s order is taken as the method's)."""
    src = {v: i for i, v in enumerate(plan.inputs)}
    made: dict[int, int] = {}  # value -> index of the .so output it holds
    inputs: tuple[int, ...] | None = None
    for kind, idx, args in plan.calls:
        if kind == "kernel":
            op = plan.operators[idx] if 0 <= idx < len(plan.operators) else ""
            if COPY_OPS.match(op) and len(args) >= 2:
                if args[0] in src:
                    src[args[-1]] = src[args[0]]
                if args[0] in made:
                    made[args[-1]] = made[args[0]]
        elif idx == delegate and inputs is None:
            traced = [a in src for a in args]
            n = sum(traced)
            if n == 0 or not all(traced[:n]):  # inputs traced, then outputs: anything else is unknown
                return None, None
            inputs = tuple(src[a] for a in args[:n])
            made.update({a: k for k, a in enumerate(args[n:])})
    order = [made.get(v) for v in plan.outputs]
    return inputs, (None if inputs is None or any(k is None for k in order) else tuple(order))  # type: ignore[arg-type]


class _Builder:
    def __init__(self, pte: Path, data: Sequence[Path], reader: str, constant_table, verified: VerifiedFiles | None):
        self.root, self.verified = pte.parent, verified
        self.pte_path = pte
        self.reader = reader
        self.table, self.table_file = constant_table, None  # table_file: the JSON file it was read from
        self.files: dict[str, MappedFile] = {}
        self.pte = self._open(pte)
        self.ptds = [self._open(p) for p in data]

    def _open(self, path: Path) -> MappedFile:
        rel = _rel(path, self.root)
        if rel not in self.files:
            if not path.is_file():  # opening a FIFO would block, a device would read without end
                raise ProgramError(_not_a_file(path), path=path)
            _refuse_trailing_before_copy(path)
            self.files[rel] = MappedFile(path, rel, self.verified)
        return self.files[rel]

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def build(self) -> Program:
        read_pte, read_ptd = (
            (_read_pte_executorch, _read_ptd_executorch) if self.reader == "executorch" else (_read_pte, _read_ptd)
        )
        pte = read_pte(self.pte)
        named = dict(pte.named)
        for f in self.ptds:
            for key, reg in read_ptd(f).named.items():
                if key in named:
                    other = named[key].file
                    raise ProgramError(
                        f"named data key {key!r} is also in {other!r}", path=f.path, field=f"named_data[{key!r}]"
                    )
                named[key] = reg
        self.named = named
        methods, skipped, devices = [], [], set()
        seen: set[str] = set()
        for plan in pte.plans:
            cuda = [d for d in plan.delegates if d.id == CUDA_BACKEND_ID]
            if not cuda:
                skipped.append(plan.name)
                continue
            if len(cuda) > 1:
                raise ProgramError(
                    f"method {plan.name!r} has {len(cuda)} {CUDA_BACKEND_ID} delegates; the program "
                    "model has one compiled container per method",
                    path=self.pte.path,
                    field=f"{plan.where}.delegates",
                )
            if not METHOD_NAME_RE.match(plan.name):
                raise ProgramError(
                    f"method name {plan.name!r} is not a plain identifier",
                    path=self.pte.path,
                    field=f"{plan.where}.name",
                )
            if plan.name in seen:
                raise ProgramError(
                    f"duplicate method name {plan.name!r}", path=self.pte.path, field=f"{plan.where}.name"
                )
            seen.add(plan.name)
            d = cuda[0]
            target = d.specs.get("target_device", b"cuda").decode("utf-8", "replace")
            devices.add(target.partition(":")[0] or "cuda")
            methods.append(self._method(plan, d))
        if not methods:
            raise ProgramError(
                f"no execution plan has a {CUDA_BACKEND_ID} delegate: not a CUDA program "
                f"(plans: {[p.name for p in pte.plans]})",
                path=self.pte.path,
                field="execution_plan",
            )
        device = "cuda" if devices <= {"cuda"} else "cpu"
        for m in methods:  # references: our fixtures' convention, not the format's
            if m.reference_file:
                self._open(self.root / m.reference_file)
        sequences = self._sequences({m.name for m in methods})
        files = {rel: f.record() for rel, f in self.files.items()}
        gens = sorted({m.location.payload for m in methods})
        desc = f"ExecuTorch {CUDA_BACKEND_ID} program ({'; '.join(gens)})"
        if skipped:
            desc += f"; execution plans without a {CUDA_BACKEND_ID} delegate, not modelled: {', '.join(skipped)}"
        return Program(
            name=self.pte_path.stem,
            description=desc,
            device=device,
            torch_version="unknown",
            created_utc="",
            methods=tuple(methods),
            files=files,
            root=self.root,
            format=ProgramFormat.PTE,
            sequences=sequences,
            records_mutation=False,
        )

    def _sequences(self, methods: set[str]) -> tuple[SequenceSpec, ...]:
        """``sequence_<name>.safetensors`` beside the ``.pte`` whose header metadata ``steps`` lists
        the steps (``[{"method", "num_inputs", "num_outputs"}, ...]``, as our fixture script writes
        it): the eager sequence, state carried, as the builder records one.  A file without that
        key is not ours and is left alone."""
        out = []
        for path in sorted(self.root.glob("sequence_*.safetensors")):
            f = self._open(path)
            where = "__metadata__.steps"
            n = f.bytes.u64(0, "(safetensors header length)")
            text = f.bytes.text(8, n, "(safetensors header)")  # a ProgramError naming the file when cut short
            try:
                header = json.loads(text)
                raw = (header.get("__metadata__") or {}).get("steps")
            except (ValueError, AttributeError, RecursionError) as e:
                raise ProgramError(
                    f"safetensors header is not a JSON object: {str(e)[:300]}", path=path, field="(header)"
                ) from None
            if raw is None:
                self.files.pop(f.rel).close()
                continue
            try:  # the manifest's own step schema: counts are integers >= 0 (not -1, 2.7, 1e400 or Infinity)
                if not isinstance(raw, str):
                    raise ProgramError(
                        f"steps must be a JSON list of {{method, num_inputs, num_outputs}} held "
                        f"in a string, not a {type(raw).__name__}",
                        path=path,
                        field=where,
                    )
                steps = tuple(
                    SequenceStep(st.method, st.num_inputs, st.num_outputs) for st in _STEPS.validate_json(raw)
                )
            except ValidationError as e:
                message, at = validation_problem(e)
                raise ProgramError(
                    f"steps must be a JSON list of {{method, num_inputs, num_outputs}}: {message}",
                    path=path,
                    field=where + at.removeprefix("(top level)"),
                ) from None
            unknown = sorted({st.method for st in steps} - methods)
            if not steps or unknown:
                raise ProgramError(
                    f"steps name no method or methods the .pte does not have: {unknown}", path=path, field=where
                )
            out.append(SequenceSpec(path.stem.removeprefix("sequence_"), steps, f.rel))
        return tuple(out)

    def _find(self, key: str, field: str) -> Region:
        reg = self.named.get(key)
        if reg is None:
            where = ", ".join(f.rel for f in self.ptds) or "no .ptd was found or given"
            raise ProgramError(
                f"named data {key!r} is in neither the .pte nor the data files ({where})",
                path=self.pte.path,
                field=field,
            )
        return replace(reg, key=key)

    def _method(self, plan: _Plan, d: _Delegate) -> MethodSpec:
        spec_name = d.specs.get("method_name", b"").decode("utf-8", "replace")
        payload = _decode_payload(d, spec_name, self.pte.path)
        pw = f"{d.where}.processed"
        so = self._find(payload.so_keys[0], f"{pw}.so_blob_key")
        if payload.generation >= 2:
            got = self.files[so.file].sha256(so.offset, so.size) + "_so_blob"
            if got != payload.so_keys[0]:
                raise ProgramError(
                    f".so key {payload.so_keys[0]!r} does not match the sha256 of its bytes "
                    f"({got!r}): the .so was modified",
                    path=self.files[so.file].path,
                    field=f"named_data[{payload.so_keys[0]!r}]",
                )
        for k in payload.so_keys[1:]:
            self._find(k, f"{pw}.variants")
        constants, blob_file, weights, blob_bytes = (
            self._fqn_constants(plan, payload)
            if payload.generation == 3
            else self._blob_constants(plan, d, payload, so, pw)
        )
        ref = f"reference_{plan.name}.safetensors"
        ref = ref if (self.root / ref).is_file() else ""
        label = payload.label + (f": {', '.join(payload.so_keys)}" if len(payload.so_keys) > 1 else "")
        input_order, output_order = _io_orders(plan, d.index)
        return MethodSpec(
            name=plan.name,
            so_file=so.file,
            blob_file=blob_file,
            reference_file=ref,
            blob_bytes=blob_bytes,
            num_inputs=len(plan.inputs),
            num_outputs=len(plan.outputs),
            constants=tuple(constants),
            location=PteLocation(so, weights, label),
            input_order=input_order,
            output_order=output_order,
        )

    def _fqn_constants(self, plan: _Plan, payload: _Payload):
        names = aoti_internal_names(e["fqn"] for e in payload.entries)
        constants, seen = [], set()
        total, blob_file = 0, (self.ptds[0].rel if self.ptds else self.pte.rel)
        all_cuda = all(e["device"] == "cuda" for e in payload.entries)
        for name, e in zip(names, payload.entries):
            w = e["where"]
            if e["fqn"] in seen:  # the runtime refuses it too ("appears more than once")
                raise ProgramError(
                    f"FQN {e['fqn']!r} appears more than once in the method's manifest", path=self.pte.path, field=w
                )
            seen.add(e["fqn"])
            reg = self._find(e["storage_key"], f"{w}.storage_key")
            if reg.size != e["storage_nbytes"]:
                raise ProgramError(
                    f"storage {e['storage_key']!r} has {reg.size} bytes, the manifest says {e['storage_nbytes']}",
                    path=self.files[reg.file].path,
                    field=f"named_data[{e['storage_key']!r}]",
                )
            need = required_nbytes(e["dtype"], e["sizes"], e["strides"], e["storage_offset"])
            if need > reg.size:
                raise ProgramError(
                    f"the view of {e['fqn']!r} reads {need} bytes of a {reg.size}-byte storage",
                    path=self.pte.path,
                    field=w,
                )
            blob_file = reg.file
            total += aligned_slot_bytes(reg.size, all_cuda=all_cuda)
            constants.append(
                ConstantSpec(
                    name=name,
                    fqn=e["fqn"],
                    kind=_kind(e["fqn"]),
                    mutated=False,
                    dtype=e["dtype"],
                    shape=e["sizes"],
                    strides=e["strides"],
                    storage_offset=e["storage_offset"],
                    nbytes=need,
                    offset=reg.offset,
                    digest=self.files[reg.file].sha256(reg.offset, need),
                    file=reg.file,
                    storage_key=e["storage_key"],
                    so_key=payload.so_keys[0],
                )
            )
        return constants, blob_file, PerConstantStorages(), total

    def _table(self, method: str, so: Region, field: str) -> list:
        if self.table is None and (self.root / DEFAULT_CONSTANT_TABLE_FILE).is_file():
            self.table = self.root / DEFAULT_CONSTANT_TABLE_FILE
        if isinstance(self.table, (str, os.PathLike)):
            self.table_file = Path(self.table)
            self.table = _read_constant_table(self.table_file)
        if self.table is None:
            raise ProgramError(
                f"method {method!r}: this payload generation keeps the constant table only inside the .so; "
                "reading it needs the .so opened by a runtime: pass constant_table= (see AotiConstant; the CLI's "
                f"--constant-table FILE), or put {DEFAULT_CONSTANT_TABLE_FILE} beside the .pte",
                path=self.pte.path,
                field=field,
            )
        try:
            if callable(self.table):
                rows = self.table(method, self.files[so.file].bytes.raw(so.offset, so.size))
            else:
                rows = self.table[method]
        except KeyError:
            raise ProgramError(
                f"constant_table has no entry for method {method!r}", path=self.table_file or self.pte.path, field=field
            ) from None
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
            raise ProgramError(
                f"constant_table[{method!r}] is a {type(rows).__name__}, not a list of rows",
                path=self.table_file or self.pte.path,
                field=field,
            )
        return list(rows)

    def _blob_constants(self, plan: _Plan, d: _Delegate, payload: _Payload, so: Region, pw: str):
        blob = self._find(payload.weights_key, f"{pw}.weights_key")
        if payload.generation == 2:
            got = self.files[blob.file].sha256(blob.offset, blob.size) + "_weights_blob"
            if got != payload.weights_key:
                raise ProgramError(
                    f"weights key {payload.weights_key!r} does not match the sha256 of its bytes "
                    f"({got!r}): the blob was modified",
                    path=self.files[blob.file].path,
                    field=f"named_data[{payload.weights_key!r}]",
                )
        rows = self._table(plan.name, so, f"{pw}.constant_table")
        all_cuda = d.specs.get("target_device", b"cuda").startswith(b"cuda")
        constants, at = [], 0
        for i, r in enumerate(rows):
            w = f"constant_table[{plan.name!r}][{i}]"
            if isinstance(r, Mapping):
                try:
                    r = AotiConstant(
                        **{
                            **r,
                            "shape": tuple(r["shape"]),
                            "strides": tuple(r["strides"]),
                            "kind": ConstantKind(r.get("kind", "parameter")),
                        }
                    )
                except (TypeError, KeyError, ValueError) as e:
                    raise ProgramError(
                        f"constant table row is not an AotiConstant: {e}",
                        path=self.table_file or self.pte.path,
                        field=w,
                    ) from None
            elif not isinstance(r, (AotiConstant, ConstantSpec)):
                raise ProgramError(
                    f"constant table row is a {type(r).__name__}, not an AotiConstant or a mapping",
                    path=self.table_file or self.pte.path,
                    field=w,
                )
            shape, strides = tuple(r.shape), tuple(r.strides)
            if r.dtype not in DTYPE_ITEMSIZE or len(shape) != len(strides):
                raise ProgramError(
                    f"constant {r.name!r}: dtype {r.dtype!r}, shape {shape}, strides {strides} is not a layout",
                    path=self.pte.path,
                    field=w,
                )
            need = required_nbytes(r.dtype, shape, strides, r.storage_offset)
            size = getattr(r, "data_size", None)
            size = need if size is None else size
            off = getattr(r, "offset", None) if isinstance(r, AotiConstant) else None
            off = at if off is None else off
            if need > size or off + need > blob.size:
                raise ProgramError(
                    f"constant {r.name!r} reads [{off}, {off + need}) of a {blob.size}-byte blob "
                    f"(storage {size} bytes)",
                    path=self.files[blob.file].path,
                    field=w,
                )
            at = off + aligned_slot_bytes(size, all_cuda=all_cuda)
            constants.append(
                ConstantSpec(
                    name=r.name,
                    fqn=r.fqn,
                    kind=ConstantKind(r.kind),
                    mutated=bool(r.mutated),
                    dtype=r.dtype,
                    shape=shape,
                    strides=strides,
                    storage_offset=r.storage_offset,
                    nbytes=need,
                    offset=blob.offset + off,
                    digest=self.files[blob.file].sha256(blob.offset + off, need),
                    file=blob.file,
                    so_key=payload.so_keys[0],
                )
            )
        if at != blob.size:
            raise ProgramError(
                f"the constant table lays out {at} bytes, the weights blob has {blob.size}: the "
                "table is not this .so's",
                path=self.files[blob.file].path,
                field=f"named_data[{payload.weights_key!r}]",
            )
        return constants, blob.file, blob, blob.size


def _read_constant_table(path: Path) -> dict:
    """A constant table JSON file: {method: [row, ...]}, each row :class:`AotiConstant`'s fields."""
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ProgramError(f"constant table cannot be read: {e}", path=path) from None
    if not isinstance(table, dict):
        raise ProgramError(
            f"constant table is a JSON {type(table).__name__}, not an object of method -> rows", path=path
        )
    return table


def _data_files(pte: Path, data) -> list[Path]:
    if data is None:
        p = pte.parent / DEFAULT_DATA_FILE
        return [p] if p.is_file() else []
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    out = []
    for d in items:
        p = Path(d)
        if not p.is_file():
            raise ProgramError(f"data file (.ptd) given for the program {_not_a_file(p)}", path=p)
        out.append(p)
    return out


def open_pte(
    path: "str | Path",
    data: "str | Path | Sequence[str | Path] | None" = None,
    *,
    constant_table=None,
    reader: str = "toolkit",
    verified: VerifiedFiles | None = None,
) -> Program:
    """The program model of an ExecuTorch CUDA ``.pte`` and its data file(s).

    ``data`` is the ``.ptd`` (or several); by default ``aoti_cuda_blob.ptd`` beside the
    ``.pte`` when it exists.  ``constant_table`` is needed for payload generations 1 and 2
    only (see the module docstring).  ``reader="executorch"`` parses with ExecuTorch's own
    reader (the optional extra) instead of ours.  Each file, hashed for its record, is noted in
    ``verified``.  Every failure is a ToolkitError naming the file; a malformed file a
    :class:`~toolkit.core.errors.ProgramError` naming the field and offset.
    """
    if reader not in ("toolkit", "executorch"):
        raise ValueError(f"unknown reader {reader!r}; choose 'toolkit' or 'executorch'")
    pte = Path(path)
    if not pte.is_file():
        raise ProgramError(f"ExecuTorch program (.pte) {_not_a_file(pte)}", path=pte)
    b = None
    try:
        b = _Builder(pte, _data_files(pte, data), reader, constant_table, verified)
        return b.build()
    finally:
        if b is not None:
            b.close()
