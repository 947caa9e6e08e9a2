"""Generated inputs: what a method takes (dtype, shape) read off the program itself, and random draws of it.

For a method with no reference the differential oracle (:func:`toolkit.engine.verification.verify_session`)
needs inputs: a ``.pte``'s execution plan declares each input tensor (scalar type, sizes: a
dynamic dimension at the size the plan was exported with); a ``.pt2``'s generated wrapper
source checks each input's dtype and sizes (read with its program model,
:func:`toolkit.sources.pt2.wrapper_inputs`: a dynamic dimension at the smallest size the checks
allow); our program directories store every method's reference inputs, whose dtypes and shapes
are used.  Integer inputs (token ids, positions) are drawn from a small range that fits the
program: ``[0, n)`` with ``n`` the smaller of :data:`SMALL_INT_RANGE` and the rows of the
method's smallest 2-D constant (the embedding a gather reads has at least that many rows).

What is read is what the load verified: the reference file and the ``.pte`` come from their
verified copies (:func:`toolkit.integrity.verified_files`), so a file changed since the load is
read anew and checked against its record (an :class:`~toolkit.core.errors.IntegrityError` naming
it when it differs), never used as it is; a file that cannot be parsed is a
:class:`~toolkit.core.errors.ProgramError` naming it.  An input of a dtype torch cannot draw
(a packed 4-bit float, a quantized type) is reported as such, with the input and why.
"""

from __future__ import annotations

import mmap
import warnings

import torch

from toolkit.core.errors import ProgramError, ToolkitError
from toolkit.core.model import SCALAR_TYPES, InputSpec, MethodSpec, PackedLocation, Program
from toolkit.core.vocab import ProgramFormat
from toolkit.integrity import VerifiedCopy, verified_files
from toolkit.sources.binary import Bytes, MappedFile, root
from toolkit.sources.pt2 import Pt2Location

SMALL_INT_RANGE = 4
_TENSOR_TAG = 5  # KernelTypes union tag of Tensor (0 is NONE): schema/program.fbs

# a safetensors dtype -> torch's name of it (safetensors' own table, safetensors/torch.py, 0.8)
_ST_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}


def _verified(program: Program, rel: str, check_integrity: bool) -> VerifiedCopy | None:
    """The verified copy of program file ``rel`` (the one the load made while the file is unchanged;
    else read and checked against its record now); None where nothing is checked."""
    record = program.files.get(rel)
    if not check_integrity or record is None:
        return None
    return verified_files().copy(program.path(rel), record)


def _plan_inputs(b: Bytes, method: str) -> list[InputSpec] | None:
    """The input tensors execution plan ``method`` of the ``.pte`` ``b`` declares (None: a non-tensor
    input, or no such plan)."""
    size = b.u64(16, "extended_header.program_size") if len(b) >= 24 and b.raw(8, 4) == b"eh00" else len(b)
    prog = root(Bytes(b.data[:size], b.path), b"ET12", "ExecuTorch program (.pte)")
    for ep in prog.tables(1, "execution_plan"):
        if (ep.string(0, "name") or "") != method:
            continue
        values = ep.tables(2, "values")
        specs = []
        for i in ep.ints(3, "inputs"):
            tag, t = values[i].union(0, "val") if 0 <= i < len(values) else (0, None)
            if tag != _TENSOR_TAG or not t:
                return None
            code = t.scalar(0, "scalar_type", "i8")
            specs.append(InputSpec(SCALAR_TYPES.get(code, f"ScalarType {code}"), tuple(t.ints(2, "sizes"))))
        return specs
    return None


def _pte_plan_inputs(program: Program, rel: str, method: str, check_integrity: bool) -> list[InputSpec] | None:
    """:func:`_plan_inputs` of program file ``rel``, read from its verified copy (None: it does not parse)."""
    path = program.path(rel)
    copy = _verified(program, rel, check_integrity)  # outside the try: a changed file is refused, not skipped
    if copy is None:
        try:
            f = MappedFile(path, path.name)
            try:
                return _plan_inputs(f.bytes, method)
            finally:
                f.close()
        except ProgramError:
            return None
    mm = mmap.mmap(copy.fd, 0, access=mmap.ACCESS_READ) if copy.size else None
    try:
        return _plan_inputs(Bytes(mm if mm is not None else b"", path), method)
    except ProgramError:
        return None
    finally:
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view still held by an error's traceback: unmapped when it goes
                pass


def _reference_inputs(program: Program, spec: MethodSpec, check_integrity: bool) -> list[InputSpec]:
    """Each ``input.N`` tensor's dtype and shape in the method's reference file, read from its verified copy."""
    from safetensors import safe_open

    path = program.path(spec.reference_file)
    copy = _verified(program, spec.reference_file, check_integrity)
    try:
        with safe_open(str(copy.path if copy is not None else path), "pt") as f:
            names = set(f.keys())
            out = []
            for i in range(spec.num_inputs):
                if f"input.{i}" not in names:
                    raise ProgramError(f"reference tensor 'input.{i}' is missing", path=path)
                one = f.get_slice(f"input.{i}")
                dtype = one.get_dtype()
                out.append(InputSpec(_ST_DTYPES.get(dtype, f"safetensors {dtype}"), tuple(one.get_shape())))
            return out
    except ToolkitError:
        raise
    except Exception as e:  # safetensors' own errors (a damaged header) name no file
        raise ProgramError(f"reference tensors cannot be read: {e}", path=path) from None


def input_specs(program: Program, spec: MethodSpec, *, check_integrity: bool = True) -> list[InputSpec] | None:
    """Each input's dtype and shape as the program declares them, in the method's order (None: it does not say).

    Read from the files' verified copies unless ``check_integrity`` is False; a file that differs
    from its record raises :class:`~toolkit.core.errors.IntegrityError`, a reference file that does
    not parse :class:`~toolkit.core.errors.ProgramError`, both naming the file."""
    if program.root is None:
        return None
    if program.format is ProgramFormat.PTE and isinstance(spec.location, PackedLocation):
        return _pte_plan_inputs(program, spec.location.so.file, spec.name, check_integrity)
    if isinstance(spec.location, Pt2Location):  # read with the model, from the bytes the file's record hashed
        return None if spec.location.inputs is None else list(spec.location.inputs)
    if spec.reference_file:
        return _reference_inputs(program, spec, check_integrity)
    return None


def int_bound(spec: MethodSpec) -> tuple[int, str]:
    """(n, why): integer inputs are drawn from ``[0, n)``."""
    rows = [c.shape[0] for c in spec.constants if len(c.shape) == 2 and c.shape[0] > 0]
    if rows and min(rows) < SMALL_INT_RANGE:
        return min(rows), f"the rows of the method's smallest 2-D constant ({min(rows)})"
    return (
        SMALL_INT_RANGE,
        f"a small range (every 2-D constant has at least {SMALL_INT_RANGE} rows)" if rows else "a small range",
    )


def _draw(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator, bound: int) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, bound, shape, generator=gen, dtype=dtype)


def not_generatable(specs: list[InputSpec], method: str) -> str | None:
    """Why the oracle cannot draw ``specs`` (the first input it cannot), or None where it can."""
    for i, s in enumerate(specs):
        dtype = getattr(torch, s.dtype, None) if s.dtype.isidentifier() else None
        if not isinstance(dtype, torch.dtype):
            return f"input {i} of {method!r} is {s.dtype}, which torch has no dtype for: the oracle cannot generate it"
        try:  # one value, on a generator of its own: the draws below are the same with or without this
            with warnings.catch_warnings():  # (a quantized dtype warns that it is deprecated before it fails)
                warnings.simplefilter("ignore")
                _draw(dtype, (1,), torch.Generator().manual_seed(0), SMALL_INT_RANGE)
        except (RuntimeError, TypeError, NotImplementedError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            return f"input {i} of {method!r} is {s.dtype}, whose values torch cannot draw ({first})"
    return None


def generate(
    program: Program, spec: MethodSpec, draws: int, seed: int, *, check_integrity: bool = True
) -> tuple[list[list[torch.Tensor]] | None, str] | None:
    """``draws`` random input sets for ``spec`` and one sentence saying how; ``(None, why)`` where
    the program declares an input the oracle cannot draw; None where it does not declare its inputs.
    The declarations are read from the files' verified copies (:func:`input_specs`)."""
    specs = input_specs(program, spec, check_integrity=check_integrity)
    if specs is None or len(specs) != spec.num_inputs:
        return None
    why = not_generatable(specs, spec.name)
    if why is not None:
        return None, why
    bound, why = int_bound(spec)
    gen = torch.Generator().manual_seed(seed)
    sets = [[_draw(getattr(torch, s.dtype), s.shape, gen, bound) for s in specs] for _ in range(draws)]
    source = {
        ProgramFormat.PTE: "the .pte's execution plan",
        ProgramFormat.PT2: "the .pt2's generated wrapper source (check_input_N)",
    }.get(program.format, "the program's reference inputs")
    shown = ", ".join(f"{s.dtype}{list(s.shape)}" for s in specs) or "no inputs"
    dynamic = [f"input {i} dim {', '.join(map(str, s.dynamic))}" for i, s in enumerate(specs) if s.dynamic]
    if dynamic:
        source += f"; dynamic ({'; '.join(dynamic)}) at the smallest size the checks allow"
    ints = (
        f"; integers in [0, {bound}): {why}"
        if any(not (getattr(torch, s.dtype).is_floating_point or getattr(torch, s.dtype).is_complex) for s in specs)
        else ""
    )
    return sets, f"{draws} draws (seed {seed}) of {shown} (dtypes, shapes: {source}): floats standard normal{ints}"
