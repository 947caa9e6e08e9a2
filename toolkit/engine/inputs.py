"""Generated inputs: what a method takes (dtype, shape) read off the program itself, and random draws of it.

For a method with no reference the differential oracle (:func:`toolkit.engine.verification.verify_session`)
needs inputs: a ``.pte``'s execution plan declares each input tensor (scalar type, sizes: a
dynamic dimension at the size the plan was exported with); our program directories store
every method's reference inputs, whose dtypes and shapes are used.  Integer inputs (token
ids, positions) are drawn from a small range that fits the program: ``[0, n)`` with ``n`` the
smaller of :data:`SMALL_INT_RANGE` and the rows of the method's smallest 2-D constant (the
embedding a gather reads has at least that many rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.core.errors import ProgramError
from toolkit.core.model import SCALAR_TYPES, MethodSpec, PackedLocation, Program
from toolkit.core.vocab import ProgramFormat
from toolkit.sources.binary import Bytes, MappedFile, root

SMALL_INT_RANGE = 4
# the input dtypes the oracle generates, by ExecuTorch's ScalarType (runtime/core/portable_type/scalar_type.h)
_SCALAR_TYPES = {c: SCALAR_TYPES[c] for c in (0, 1, 2, 3, 4, 5, 6, 7, 11, 15)}
_TENSOR_TAG = 5  # KernelTypes union tag of Tensor (0 is NONE): schema/program.fbs


@dataclass(frozen=True)
class InputSpec:
    dtype: str
    shape: tuple[int, ...]


def _pte_plan_inputs(path, method: str) -> list[InputSpec] | None:
    """The input tensors execution plan ``method`` of a ``.pte`` declares (None: a non-tensor input)."""
    f = MappedFile(path, path.name)
    b = f.bytes
    size = b.u64(16, "extended_header.program_size") if len(b) >= 24 and b.raw(8, 4) == b"eh00" else len(b)
    prog = root(Bytes(b.data[:size], path), b"ET12", "ExecuTorch program (.pte)")
    for ep in prog.tables(1, "execution_plan"):
        if (ep.string(0, "name") or "") != method:
            continue
        values = ep.tables(2, "values")
        specs = []
        for i in ep.ints(3, "inputs"):
            tag, t = values[i].union(0, "val") if 0 <= i < len(values) else (0, None)
            dtype = _SCALAR_TYPES.get(t.scalar(0, "scalar_type", "i8")) if tag == _TENSOR_TAG and t else None
            if dtype is None:
                return None
            specs.append(InputSpec(dtype, tuple(t.ints(2, "sizes"))))
        return specs
    return None


def input_specs(program: Program, spec: MethodSpec) -> list[InputSpec] | None:
    """Each input's dtype and shape as the program declares them, in the method's order (None: it does not say)."""
    if program.root is None:
        return None
    if program.format is ProgramFormat.PTE and isinstance(spec.location, PackedLocation):
        try:
            return _pte_plan_inputs(program.path(spec.location.so.file), spec.name)
        except ProgramError:
            return None
    if spec.reference_file:
        from safetensors import safe_open

        with safe_open(str(program.path(spec.reference_file)), "pt") as f:
            return [
                InputSpec(
                    _ST_DTYPES[f.get_slice(f"input.{i}").get_dtype()], tuple(f.get_slice(f"input.{i}").get_shape())
                )
                for i in range(spec.num_inputs)
            ]
    return None


_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def int_bound(spec: MethodSpec) -> tuple[int, str]:
    """(n, why): integer inputs are drawn from ``[0, n)``."""
    rows = [c.shape[0] for c in spec.constants if len(c.shape) == 2 and c.shape[0] > 0]
    if rows and min(rows) < SMALL_INT_RANGE:
        return min(rows), f"the rows of the method's smallest 2-D constant ({min(rows)})"
    return (
        SMALL_INT_RANGE,
        f"a small range (every 2-D constant has at least {SMALL_INT_RANGE} rows)" if rows else "a small range",
    )


def generate(program: Program, spec: MethodSpec, draws: int, seed: int) -> tuple[list[list[torch.Tensor]], str] | None:
    """``draws`` random input sets for ``spec`` and one sentence saying how; None where the program
    does not declare its inputs."""
    specs = input_specs(program, spec)
    if specs is None or len(specs) != spec.num_inputs:
        return None
    bound, why = int_bound(spec)
    gen = torch.Generator().manual_seed(seed)
    sets = []
    for _ in range(draws):
        one = []
        for s in specs:
            dtype = getattr(torch, s.dtype)
            if dtype == torch.bool:
                one.append(torch.randint(0, 2, s.shape, generator=gen).bool())
            elif dtype.is_floating_point:
                one.append(torch.randn(s.shape, generator=gen).to(dtype))
            else:
                one.append(torch.randint(0, bound, s.shape, generator=gen, dtype=dtype))
        sets.append(one)
    source = "the .pte's execution plan" if program.format is ProgramFormat.PTE else "the program's reference inputs"
    shown = ", ".join(f"{s.dtype}{list(s.shape)}" for s in specs) or "no inputs"
    ints = (
        f"; integers in [0, {bound}): {why}"
        if any(not getattr(torch, s.dtype).is_floating_point for s in specs)
        else ""
    )
    return sets, f"{draws} draws (seed {seed}) of {shown} (dtypes, shapes: {source}): floats standard normal{ints}"
