"""The eager sequences beside a ``.pte``: our fixtures' convention, not ExecuTorch's format.

A ``sequence_<name>.safetensors`` beside the ``.pte`` holds each step's inputs and outputs, and
lists its steps in its header metadata; it becomes a :class:`~toolkit.core.model.SequenceSpec`
(the steps run in order from the initial state, state carried), checked against the methods the
``.pte`` has.
"""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError

from toolkit.core.errors import ProgramError
from toolkit.core.model import SequenceSpec, SequenceStep
from toolkit.sources.directory import StepDoc, validation_problem
from toolkit.sources.executorch.files import ProgramFiles

_STEPS = TypeAdapter(list[StepDoc])


def read_sequences(files: ProgramFiles, methods: set[str]) -> tuple[SequenceSpec, ...]:
    """``sequence_<name>.safetensors`` beside the ``.pte`` whose header metadata ``steps`` lists
    the steps (``[{"method", "num_inputs", "num_outputs"}, ...]``, as our fixture script writes
    it): the eager sequence, state carried, as the builder records one.  A file without that
    key is not ours and is left alone."""
    out = []
    for path in sorted(files.root.glob("sequence_*.safetensors")):
        f = files.open(path)
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
            files.drop(f)
            continue
        try:  # the manifest's own step schema: counts are integers >= 0 (not -1, 2.7, 1e400 or Infinity)
            if not isinstance(raw, str):
                raise ProgramError(
                    f"steps must be a JSON list of {{method, num_inputs, num_outputs}} held "
                    f"in a string, not a {type(raw).__name__}",
                    path=path,
                    field=where,
                )
            steps = tuple(SequenceStep(st.method, st.num_inputs, st.num_outputs) for st in _STEPS.validate_json(raw))
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
