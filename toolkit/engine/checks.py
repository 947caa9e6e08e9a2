"""A method's load checked against its program: the compiled slots before any upload, the tensors before install.

The compiled model's own slots are the truth.  A program model that disagrees with them is
refused before anything is uploaded or run, under every policy; a tensor that does not fill the
slot it is meant for is not installed (AOTInductor checks nothing when a tensor is installed,
so a smaller one would be read out of bounds) and makes its method not runnable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from toolkit.core import events as ev
from toolkit.core.errors import ProgramError
from toolkit.core.model import ConstantSpec, MethodSpec
from toolkit.core.policies import Outcome, slot_problem
from toolkit.core.vocab import Decision, Members
from toolkit.engine.recording import record_enumerated
from toolkit.runtimes import Device, MethodRuntime, aligned_slot_bytes

# a member read once per constant, as a plain attribute (vocab.Members says why)
_Decision = Members(Decision)


def check_against_compiled(log: ev.EventLog, spec: MethodSpec, handle: MethodRuntime, so: Path) -> None:
    """Refuse (ProgramError) a method whose program model disagrees with its compiled slots.

    Names, FQNs, dtypes, byte sizes and blob offsets.  A slot smaller in the program than in
    the .so would be filled by a smaller tensor and read out of bounds; a shorter blob would be
    read past its end.  The constants checked are recorded as enumerated, also when one is refused.
    """
    m = spec.name
    compiled = handle.compiled()
    if compiled.is_manifest:  # the dry run's: every check would compare the manifest with itself
        record_enumerated(log, m, spec.constants)
        return
    slots = compiled.constants
    declared = {c.name: c for c in spec.constants}
    if set(slots) != set(declared):
        raise ProgramError(
            f"method {m!r}: the .so's constants {sorted(set(slots) ^ set(declared))[:5]} differ from the manifest's",
            path=so,
            field=f"methods[{m}].constants",
        )
    if compiled.blob_bytes is not None and spec.constants and compiled.blob_bytes != spec.blob_bytes:
        raise ProgramError(
            f"method {m!r}: the .so reads a {compiled.blob_bytes}-byte weights blob, the "
            f"manifest says {spec.blob_bytes}",
            path=so,
            field=f"methods[{m}].blob_bytes",
        )
    checked: list[ConstantSpec] = []  # enumerated: recorded as one batch, also when one is refused
    try:
        check_slots(spec, slots, compiled, so, checked)
    finally:
        record_enumerated(log, m, checked)


def check_slots(
    spec: MethodSpec, slots: Mapping[str, Any], compiled: Any, so: Path, checked: list[ConstantSpec]
) -> None:
    """Check each constant of ``spec`` against its compiled slot, appending to ``checked`` those that pass."""
    m = spec.name
    for c in spec.constants:
        slot = slots[c.name]
        where = f"methods[{m}].constants[{c.name}]"
        if slot.fqn != c.fqn:
            raise ProgramError(
                f"constant {c.name!r}: .so says FQN {slot.fqn!r}, manifest says {c.fqn!r}",
                path=so,
                field=f"{where}.fqn",
            )
        # the .so's own dtype is the slot's truth; a manifest that disagrees would size uploads wrongly
        if slot.dtype != "?" and slot.dtype != c.dtype:
            raise ProgramError(
                f"constant {c.name!r}: .so was compiled for {slot.dtype}, manifest says {c.dtype}",
                path=so,
                field=f"{where}.dtype",
            )
        # the .so reports the slot's size rounded to its 64-byte alignment (aligned_slot_bytes), or
        # unrounded where AOTInductor packs the blob without padding (every constant on CUDA: a
        # 16-byte counter's slot is 16 bytes): a lie inside the last 63 bytes of a slot cannot be
        # told from it, anything larger can
        if slot.nbytes is not None and slot.nbytes not in (c.nbytes, aligned_slot_bytes(c.nbytes)):
            raise ProgramError(
                f"constant {c.name!r}: the .so's slot holds {slot.nbytes} bytes, the manifest's "
                f"dtype/shape/strides {c.nbytes}",
                path=so,
                field=f"{where}.nbytes",
            )
        if slot.blob_offset is not None and compiled.blob_bytes is not None and slot.blob_offset != c.offset:
            raise ProgramError(
                f"constant {c.name!r}: the .so reads it at blob offset {slot.blob_offset}, "
                f"the manifest says {c.offset}",
                path=so,
                field=f"{where}.offset",
            )
        checked.append(c)


def guard_slots(
    log: ev.EventLog,
    m: str,
    outcome: Outcome,
    runs: Mapping[str, Any],
    facts: Callable[[Any], tuple[Any, int]],
    device: Device,
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The out-of-bounds guard over the tensors a method's decisions install (``runs``: name -> tensor).

    Returns what to install (name -> tensor that fills its slot), each slot's problem (name ->
    problem: one that does not fit, or one upstream never fills) and the method's problems as
    lines; an unfit tensor is recorded as an :class:`~toolkit.core.events.OutOfBoundsAlias`.
    """
    install: dict[str, Any] = {}
    problems: dict[str, str] = {}
    lines: list[str] = []
    dtype, dindex = device.type, device.index
    for d in outcome.install:
        tensor = runs[d.constant.name]
        have, have_bytes = facts(tensor)
        problem = slot_problem(have, have_bytes, d.constant, dtype, dindex)
        if problem:
            lines.append(f"{d.constant.name}: {problem}")
            problems[d.constant.name] = problem
            log.record(ev.OutOfBoundsAlias, m, name=d.constant.name, fqn=d.constant.fqn, problem=problem)
            continue
        install[d.constant.name] = tensor
    never = _Decision.NEVER_FILLED
    for d in outcome.decisions:  # upstream leaves the slot empty: the method reads garbage
        if d.decision is never:
            lines.append(f"{d.constant.name}: never filled: {d.reason}")
            problems[d.constant.name] = f"never filled: {d.reason}"
    return install, problems, lines
