"""References: what a method's outputs are checked against, read from the program or given by the caller.

Our program directories store each method's eager inputs and outputs at build time (a ``.pte``
may have ``reference_<method>.safetensors`` beside it), and each sequence's steps; reading one
checks the file against its recorded digest first.  The caller may supply references
(``session.verify(references={...})``, :func:`resolve_references`): a mapping of inputs and
outputs, a safetensors file, or the original module and its inputs to compute them from; each
is checked against the method before anything runs.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

from toolkit.core.errors import ProgramError, ReferenceDataError
from toolkit.core.model import MethodSpec, Program

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session


def _read_checked(program: Program, rel: str, check_integrity: bool) -> tuple[dict[str, torch.Tensor], "Path"]:
    """The tensors of a reference file (safetensors, never pickle), its digest checked first."""
    from safetensors.torch import load_file

    from toolkit.integrity import verified_files

    path = program.path(rel)
    record = program.files.get(rel)
    # checked: read from the verified copy (what was hashed is what is read)
    source = verified_files().copy(path, record).path if check_integrity and record is not None else path
    try:
        return load_file(str(source)), path
    except Exception as e:
        raise ProgramError(f"reference tensors cannot be read: {e}", path=path) from None


def read_reference(
    program: Program, spec: MethodSpec, *, check_integrity: bool = True
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs, outputs) stored at build time in the method's reference file (safetensors, never pickle).

    The file is checked against its recorded digest first, as the load checks its files
    (free when it is unchanged since): a reference copied over another after the load
    would make a correct method look wrong.  A method whose program holds no reference
    (a ``.pt2``, a ``.pte`` without ``reference_<method>.safetensors``) raises
    :class:`~toolkit.core.errors.ReferenceDataError`: pass ``references=`` to ``verify()``.
    """
    if not spec.reference_file:
        raise ReferenceDataError(
            f"method {spec.name!r} has no reference in the program: pass session.verify(references={{...}})",
            path=program.root,
            field=f"methods[{spec.name}].reference_file",
        )
    data, path = _read_checked(program, spec.reference_file, check_integrity)
    try:
        inputs = [data[f"input.{i}"] for i in range(spec.num_inputs)]
        outputs = [data[f"output.{i}"] for i in range(spec.num_outputs)]
    except KeyError as e:
        raise ProgramError(f"reference tensor {e.args[0]!r} is missing", path=path) from None
    return inputs, outputs


def read_sequence_reference(
    program: Program, name: str, *, check_integrity: bool = True
) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]:
    """[(method, inputs, outputs)] of every step of a sequence, as the eager program ran it."""
    seq = program.sequence(name)
    data, path = _read_checked(program, seq.reference_file, check_integrity)
    try:
        return [
            (
                st.method,
                [data[f"step.{i}.input.{j}"] for j in range(st.num_inputs)],
                [data[f"step.{i}.output.{j}"] for j in range(st.num_outputs)],
            )
            for i, st in enumerate(seq.steps)
        ]
    except KeyError as e:
        raise ProgramError(f"sequence reference tensor {e.args[0]!r} is missing", path=path) from None


@dataclass(frozen=True)
class Reference:
    """One method's reference: its inputs in the method's own order, and the outputs eager gave."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    given_as: str  # where it came from: "the program's file ...", "supplied", "safetensors file ...", "computed"
    supplied: bool = True  # given by the caller (not the program's own file)


def reference_field(method: str, *parts: str) -> str:
    return f"references[{method}]" + "".join(parts)


def _tensors(values: Any, method: str, what: str, path: Any = None) -> tuple[torch.Tensor, ...]:
    if isinstance(values, torch.Tensor):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise ReferenceDataError(
            f"{what} of method {method!r} must be a list of tensors, got {type(values).__name__}",
            path=path,
            field=reference_field(method, f".{what}"),
        )
    for i, t in enumerate(values):
        if not isinstance(t, torch.Tensor):
            raise ReferenceDataError(
                f"{what}[{i}] of method {method!r} is a {type(t).__name__}, not a tensor",
                path=path,
                field=reference_field(method, f".{what}[{i}]"),
            )
    return tuple(t.detach() for t in values)


def from_file(method: str, path: "str | os.PathLike[str]") -> Reference:
    """``input.N`` / ``output.N`` tensors of a safetensors file (never pickle), as the builder writes them."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ReferenceDataError(
            f"reference file of method {method!r} is not a readable file", path=p, field=reference_field(method)
        )
    try:
        data = load_file(str(p))
    except Exception as e:
        raise ReferenceDataError(
            f"reference tensors cannot be read: {e}", path=p, field=reference_field(method)
        ) from None
    pat = re.compile(r"(input|output)\.(\d+)")
    found: dict[str, dict[int, torch.Tensor]] = {"input": {}, "output": {}}
    for k, t in data.items():
        m = pat.fullmatch(k)
        if m is None:
            raise ReferenceDataError(
                f"tensor {k!r} is neither input.N nor output.N", path=p, field=reference_field(method)
            )
        found[m.group(1)][int(m.group(2))] = t
    out = {}
    for kind, got in found.items():
        missing = [i for i in range(len(got)) if i not in got]
        if missing:
            raise ReferenceDataError(
                f"{kind}.{missing[0]} is missing (the file has {sorted(got)})",
                path=p,
                field=reference_field(method, f".{kind}s[{missing[0]}]"),
            )
        out[kind] = tuple(got[i] for i in range(len(got)))
    return Reference(out["input"], out["output"], f"safetensors file {p}")


def from_module(method: str, module: Any, args: Any) -> Reference:
    """Run the original module (a copy: state it writes stays as it was) on ``args``, as the builder does."""
    from torch.utils import _pytree as pytree

    if not isinstance(args, tuple):
        raise ReferenceDataError(
            f"the inputs given with the module of method {method!r} must be a tuple, got {type(args).__name__}",
            field=reference_field(method, ".inputs"),
        )
    inputs = _tensors(pytree.tree_flatten(args)[0], method, "inputs")
    mod = copy.deepcopy(module)
    if isinstance(mod, torch.nn.Module):
        mod.eval()
    try:
        with torch.no_grad():
            result = mod(*copy.deepcopy(args))
    except Exception as e:
        raise ReferenceDataError(
            f"running the module of method {method!r} failed: {type(e).__name__}: {e}", field=reference_field(method)
        ) from None
    outputs = _tensors(pytree.tree_flatten(result)[0], method, "outputs")
    return Reference(inputs, tuple(o.cpu() for o in outputs), "computed from the module given")


def _as_reference(method: str, value: Any) -> Reference:
    if isinstance(value, Reference):
        return value
    if isinstance(value, (str, os.PathLike)):
        return from_file(method, value)
    if isinstance(value, Mapping):
        extra = set(value) - {"inputs", "outputs"}
        if extra or not {"inputs", "outputs"} <= set(value):
            raise ReferenceDataError(
                f"a reference mapping has the keys 'inputs' and 'outputs', got {sorted(value)}",
                field=reference_field(method),
            )
        return Reference(
            _tensors(value["inputs"], method, "inputs"), _tensors(value["outputs"], method, "outputs"), "supplied"
        )
    if isinstance(value, (tuple, list)) and len(value) == 2:
        first, second = value
        if callable(first) and not isinstance(first, torch.Tensor):
            return from_module(method, first, second)
        return Reference(_tensors(first, method, "inputs"), _tensors(second, method, "outputs"), "supplied")
    raise ReferenceDataError(
        f"a reference is {{'inputs': [...], 'outputs': [...]}}, (inputs, outputs), a safetensors file or "
        f"(module, example_args); got {type(value).__name__}",
        field=reference_field(method),
    )


def resolve_references(session: "Session", references: "Mapping[str, Any] | None") -> dict[str, Reference | None]:
    """method -> its reference (None: no reference), the supplied ones checked first.

    ``references`` maps a method name to one of: ``{"inputs": [...], "outputs": [...]}`` or
    ``(inputs, outputs)`` (tensors, in the method's own input order); a safetensors file
    (``input.N``, ``output.N``); or ``(module, example_args)``, run here (on a copy) to
    compute the outputs.  A supplied reference replaces the program's own file.  Refused
    with :class:`~toolkit.core.errors.ReferenceDataError` naming the method and field: an
    unknown method, a number of inputs or outputs the method does not have, a value that
    is not a tensor, or an input whose dtype or shape differs from the program's own
    reference.  (The compiled model checks shapes too when it runs: see :func:`verify_session`.)
    """
    program = session.program
    given = dict(references or {})
    unknown = [m for m in given if m not in program.method_names]
    if unknown:
        raise ReferenceDataError(
            f"references name method {unknown[0]!r}, which the program does not have; it has {program.method_names}",
            path=program.root,
            field=reference_field(str(unknown[0])),
        )
    out: dict[str, Reference | None] = {}
    for spec in program.methods:
        m = spec.name
        own = None
        if spec.reference_file:
            inputs, outputs = read_reference(program, spec, check_integrity=session.check_integrity)
            own = Reference(tuple(inputs), tuple(outputs), f"the program's file {spec.reference_file}", supplied=False)
        if m not in given:
            out[m] = own
            continue
        ref = _as_reference(m, given[m])
        for what, got, want in (("inputs", ref.inputs, spec.num_inputs), ("outputs", ref.outputs, spec.num_outputs)):
            if len(got) != want:
                raise ReferenceDataError(
                    f"{len(got)} {what} given for method {m!r}, which has {want}",
                    path=program.root,
                    field=reference_field(m, f".{what}"),
                )
        if own is not None:  # the program's own reference says what the method takes
            for i, (t, o) in enumerate(zip(ref.inputs, own.inputs)):
                if t.dtype != o.dtype:
                    raise ReferenceDataError(
                        f"input {i} of method {m!r} is {t.dtype}, the method takes {o.dtype}",
                        path=program.root,
                        field=reference_field(m, f".inputs[{i}].dtype"),
                    )
                if tuple(t.shape) != tuple(o.shape):
                    raise ReferenceDataError(
                        f"input {i} of method {m!r} has shape {tuple(t.shape)}, the method takes {tuple(o.shape)}",
                        path=program.root,
                        field=reference_field(m, f".inputs[{i}].shape"),
                    )
        out[m] = ref
    return out
