"""Where each method of a program is loaded: one device per method, placed as the runtime places it.

The AOTInductor runtime is the default and is imported only when first needed, so a dry run,
which passes its own runtime, never imports torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from toolkit.core.model import Program
from toolkit.core.options import LoadOptions
from toolkit.runtimes import Device, Runtime


def default_runtime(options: LoadOptions | None = None) -> Runtime:
    """The AOTInductor runtime, imported when first needed (a dry run never imports torch)."""
    from toolkit.runtimes.aoti import AotiRuntime

    return AotiRuntime(options)


def resolve_devices(
    program: Program, device: "str | Any | Mapping[str, str] | None", runtime: Runtime | None = None
) -> dict[str, Device]:
    """One device per method: ``None`` picks the program's own kind (cuda / cpu).

    ``device`` is a device ('cpu', 'cuda', 'cuda:1') or ``{method: device}`` (unnamed
    methods get the program's own kind).  A bare 'cuda' is placed as ``runtime`` places it
    (by default the AOTInductor runtime: the current CUDA device).
    """
    rt = runtime if runtime is not None else default_runtime()
    default = "cuda" if program.device == "cuda" else "cpu"
    if device is None:
        device = default
    if isinstance(device, Mapping):
        unknown = set(device) - set(program.method_names)
        if unknown:
            raise ValueError(f"device placement names unknown methods {sorted(unknown)}")
        return {m: rt.resolve(device.get(m, default)) for m in program.method_names}
    d = rt.resolve(device)
    return {m: d for m in program.method_names}
