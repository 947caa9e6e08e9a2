"""One method of a ``.pte``: the execution plan run by one CUDA delegate, as the program model's method.

The delegate's payload (:mod:`.payload`) says where its ``.so`` and weights lie; its constants
come from the per-FQN manifest (:mod:`.fqn_constants`) or a constant table over a dense blob
(:mod:`.constant_table`).  The ``.so`` takes its inputs and gives its outputs in its own order:
:func:`io_orders` traces them through the plan's copy kernels to the method's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.core.errors import ProgramError
from toolkit.core.model import MethodSpec, PackedLocation
from toolkit.sources.executorch.constant_table import ConstantTable, blob_constants
from toolkit.sources.executorch.files import ProgramFiles
from toolkit.sources.executorch.fqn_constants import fqn_constants
from toolkit.sources.executorch.layout import Delegate, Plan
from toolkit.sources.executorch.payload import decode_payload

COPY_OPS = re.compile(r"^(et_copy::.*|aten::_to_copy|aten::copy_?|aten::clone|aten::_device_copy)$")


@dataclass(frozen=True)
class PteLocation(PackedLocation):
    """A ``.pte``'s method: ``.so`` and weights named data, a dense blob (generations 1, 2) or per-FQN storages."""

    payload: str  # the delegate payload's generation (with every .so variant of a multi-arch one)
    generation: int = 0  # the payload generation's number (1, 2, 3), which says which ExecuTorch reads it


def io_orders(plan: Plan, delegate: int) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
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


def method_spec(files: ProgramFiles, table: ConstantTable, plan: Plan, d: Delegate) -> MethodSpec:
    """The method of ``plan``, run by its CUDA delegate ``d``: its .so, constants, reference and I/O order."""
    spec_name = d.specs.get("method_name", b"").decode("utf-8", "replace")
    payload = decode_payload(d, spec_name, files.pte.path)
    pw = f"{d.where}.processed"
    so = files.find(payload.so_keys[0], f"{pw}.so_blob_key")
    if payload.generation >= 2:
        got = files[so.file].sha256(so.offset, so.size) + "_so_blob"
        if got != payload.so_keys[0]:
            raise ProgramError(
                f".so key {payload.so_keys[0]!r} does not match the sha256 of its bytes "
                f"({got!r}): the .so was modified",
                path=files[so.file].path,
                field=f"named_data[{payload.so_keys[0]!r}]",
            )
    for k in payload.so_keys[1:]:
        files.find(k, f"{pw}.variants")
    constants, blob_file, weights, blob_bytes = (
        fqn_constants(files, payload)
        if payload.generation == 3
        else blob_constants(files, table, plan, d, payload, so, pw)
    )
    ref = f"reference_{plan.name}.safetensors"
    ref = ref if (files.root / ref).is_file() else ""
    label = payload.label + (f": {', '.join(payload.so_keys)}" if len(payload.so_keys) > 1 else "")
    input_order, output_order = io_orders(plan, d.index)
    return MethodSpec(
        name=plan.name,
        so_file=so.file,
        blob_file=blob_file,
        reference_file=ref,
        blob_bytes=blob_bytes,
        num_inputs=len(plan.inputs),
        num_outputs=len(plan.outputs),
        constants=tuple(constants),
        location=PteLocation(so, weights, label, payload.generation),
        input_order=input_order,
        output_order=output_order,
    )
