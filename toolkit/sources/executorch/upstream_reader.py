"""ExecuTorch's own reader of a ``.pte`` and ``.ptd`` (the optional ``executorch`` extra), as a cross-check.

``open_pte(reader="executorch")`` parses with upstream's serializer instead of our reader
(:mod:`.layout`) and must give the same program model.  Whatever upstream raises on a malformed
file becomes a :class:`~toolkit.core.errors.ProgramError` naming the file.
"""

from __future__ import annotations

from toolkit.core.errors import ProgramError, ToolkitError
from toolkit.core.model import Region
from toolkit.sources.binary import MappedFile
from toolkit.sources.executorch.layout import Delegate, Layout, Plan

EXTRA = "executorch"


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

    def run(f: MappedFile) -> Layout:
        try:
            return read(f)
        except ToolkitError:
            raise
        except Exception as e:  # upstream raises anything (IndexError, struct.error, ...)
            raise ProgramError(f"ExecuTorch's reader refuses it: {type(e).__name__}: {e}", path=f.path) from None

    return run


@_upstream
def read_pte_executorch(f: MappedFile) -> Layout:
    et_program, _ = _executorch_modules()
    data = bytes(f.bytes.data)
    eh = et_program._get_extended_header(data)
    size, base = (eh.program_size, eh.segment_base_offset) if eh is not None and eh.is_valid() else (len(data), 0)
    prog = et_program._flatbuffer_to_program(data[:size])
    segments = [Region(f.rel, base + s.offset, s.size) for s in prog.segments]
    layout = Layout(named={nd.key: segments[nd.segment_index] for nd in (prog.named_data or [])})
    for pi, ep in enumerate(prog.execution_plan):
        delegates = []
        for di, d in enumerate(ep.delegates):
            if d.processed.location == 0:
                payload = bytes(prog.backend_delegate_data[d.processed.index].data)
            else:
                s = segments[d.processed.index]
                payload = data[s.offset : s.offset + s.size]
            delegates.append(
                Delegate(
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
            Plan(
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
def read_ptd_executorch(f: MappedFile) -> Layout:
    _, et_flat = _executorch_modules()
    data = bytes(f.bytes.data)
    header = et_flat.FlatTensorHeader.from_bytes(data[8:])
    ft = et_flat._deserialize_to_flat_tensor(data[: header.flatbuffer_offset + header.flatbuffer_size])
    segments = [Region(f.rel, header.segment_base_offset + s.offset, s.size) for s in ft.segments]
    return Layout(named={nd.key: segments[nd.segment_index] for nd in ft.named_data})
