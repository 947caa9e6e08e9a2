"""The layout of an ExecuTorch ``.pte`` and ``.ptd``, as our own bounds-checked FlatBuffer reader reads it.

A ``.pte`` (``ET12``, extended header ``eh00``) gives its execution plans (inputs, outputs,
delegates with their compile specs and processed bytes, the kernel and delegate calls) and its
named data; a ``.ptd`` (FlatTensor, ``FT01``/``FH01``) its named data.  Both readers of the
package (this one, and ExecuTorch's own in :mod:`.upstream_reader`) give the same records.  A file
holds what its structure declares: bytes past its last segment, beyond padding, are refused, from
the header alone before the file is copied and hashed whole (:func:`refuse_trailing_before_copy`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import ProgramError
from toolkit.core.model import Region
from toolkit.sources.binary import Bytes, MappedFile, Table, root

PTE_IDENTIFIER, PTD_IDENTIFIER = b"ET12", b"FT01"
MAX_TRAILING_BYTES = 1 << 16  # padding after the last segment (ExecuTorch's files have none)
MAX_STRUCTURE_BYTES = 1 << 28  # a header that declares more FlatBuffer than this: the full read decides


@dataclass
class Delegate:
    """One delegate of an execution plan: its backend id, compile specs and processed bytes."""

    index: int
    id: str
    specs: dict[str, bytes]
    payload: bytes
    where: str


@dataclass
class Plan:
    """One execution plan: its values in and out, delegates, calls in order and the operators they name."""

    name: str
    inputs: list[int]
    outputs: list[int]
    delegates: list[Delegate]
    calls: list[tuple[str, int, list[int]]]  # ("kernel", op_index, args) / ("delegate", delegate_index, args)
    operators: list[str]
    where: str


@dataclass
class Layout:
    """What a ``.pte`` (plans, named data) or a ``.ptd`` (named data) says, from either reader."""

    plans: list[Plan] = field(default_factory=list)
    named: dict[str, Region] = field(default_factory=dict)


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
    """Refuse bytes past the last segment (a large sparse file around little content): what the
    file holds is bounded by what it declares."""
    end = max([structure_end] + [s.offset + s.size for s in segments])
    problem = _trailing_problem(len(b), end)
    if problem:
        raise b.error(problem, "segments", end)


def refuse_trailing_before_copy(path: Path) -> None:
    """The check of :func:`_no_trailing_bytes`, from the header and the FlatBuffer alone (read with
    ``pread``: kilobytes), before the file is copied and hashed whole (a large sparse ``.ptd``
    around little content must not cost the hashing of its whole size).  Anything it cannot read is left to the full
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


def read_pte(f: MappedFile) -> Layout:
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
    layout = Layout(named=_named_data(fb, prog, 7, segments, "named_data"))
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
            delegates.append(Delegate(di, d.string(0, "id") or "", specs, payload, dw))
        operators = [f"{o.string(0, 'name') or ''}" for o in ep.tables(6, "operators")]
        calls = []
        for ch in ep.tables(5, "chains"):
            for ins in ch.tables(2, "instructions"):
                tag, args = ins.union(0, "instr_args")
                if tag == 1 and args is not None:  # KernelCall
                    calls.append(("kernel", args.scalar(0, "op_index", "i32"), args.ints(1, "args")))
                elif tag == 2 and args is not None:  # DelegateCall
                    calls.append(("delegate", args.scalar(0, "delegate_index", "i32"), args.ints(1, "args")))
        layout.plans.append(Plan(name, ep.ints(3, "inputs"), ep.ints(4, "outputs"), delegates, calls, operators, w))
    return layout


def read_ptd(f: MappedFile) -> Layout:
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
    return Layout(named=_named_data(fb, ft, 2, segments, "named_data"))
