"""The differential oracle: a method checked against the same program loaded without sharing.

Where a method has no reference (or ``oracle="unshared"``), it is run under the session's load
and under an unshared load (``no-sharing``: each method on its own bytes) on the same inputs,
each from the initial state; the unshared side runs twice, so nondeterministic kernels are told
from sharing gone wrong.  A sequence's unshared side holds the state the program means to share
(:func:`intended_state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from toolkit.core.errors import ToolkitError
from toolkit.core.model import MethodSpec
from toolkit.core.vocab import ConstantKind, ProgramFormat
from toolkit.engine.verification.comparison import compare_unshared
from toolkit.engine.verification.rows import NO_REFERENCE, first_line, host_outputs, run_failed

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session

UNSHARED_POLICY = "no-sharing"  # the unshared side of the differential oracle: each method on its own bytes


def _unshared_load(session: "Session") -> "Session":
    """The same program on the same devices and runtime under ``no-sharing``: each method on its own bytes."""
    from toolkit.core.policies import get_policy
    from toolkit.engine.loader import ProgramLoad

    return ProgramLoad(
        session.program,
        get_policy(UNSHARED_POLICY),
        session.devices,
        record=False,
        runtime=session.runtime,
        options=session.options,
    )


def _free(load: "Session") -> None:
    """Unload every method of the unshared side and give its device memory back."""
    for name in list(load.methods):
        load.unload(name)
    if any(d.type == "cuda" for d in load.devices.values()):
        torch.cuda.empty_cache()


def differential_row(
    session: "Session", spec: MethodSpec, input_sets: list[list[torch.Tensor]], oracle: str, inputs_how: str
) -> dict[str, Any]:
    """Run ``spec`` on each input set under the session's load and under an unshared load of it alone
    (loaded, run twice per set, freed again: the unshared side holds one method at a time), each run
    from the initial state; the verification row's fields."""
    out: dict[str, Any] = {"oracle": oracle}
    shared = []
    try:
        for inputs in input_sets:
            session.reset_state()
            shared.append(host_outputs(session, spec.name, inputs))
    except (ToolkitError, RuntimeError) as e:
        return {**out, "oracle_detail": inputs_how, "reason": str(e) if isinstance(e, ToolkitError) else run_failed(e)}
    load = _unshared_load(session)
    try:
        load.load_method(spec.name)
        if not load.methods[spec.name].runnable:
            raise ToolkitError("the unshared load cannot run it: " + "; ".join(load.methods[spec.name].problems))
        repeats, fresh = [], True  # just loaded: at its initial state (a reset may rewrite every constant)
        for inputs in input_sets:
            pair = []
            for _ in range(2):
                if not fresh:
                    load.reset_state()
                fresh = False
                pair.append(host_outputs(load, spec.name, inputs))
            repeats.append(tuple(pair))
    except (ToolkitError, RuntimeError) as e:
        return {
            **out,
            "ok": pd.NA,
            "oracle_detail": inputs_how,
            "reason": f"{NO_REFERENCE}: the unshared load of {spec.name!r} failed: {first_line(e)}",
        }
    finally:
        _free(load)
    per = [compare_unshared(o, r) for o, r in zip(shared, repeats)]
    bad = [i for i, p in enumerate(per) if not p["ok"]]
    tolerances = sorted({p["tolerance"] for p in per})
    return {
        **out,
        "ran": True,
        "max_abs_err": max(p["max_abs_err"] for p in per),
        "atol": max(p["atol"] for p in per),
        "rtol": 0.0,
        "ok": not bad,
        "reason": ""
        if not bad
        else f"output differs from the unshared load on draw {', '.join(str(i + 1) for i in bad)} of {len(per)}",
        "oracle_detail": f"{inputs_how}; compared {' / '.join(tolerances)}",
        "draws": ", ".join("ok" if p["ok"] else "differs" for p in per),
    }


def intended_state(load: "Session") -> tuple[str, list[str]]:
    """Point constants of different loaded methods that the program means to be one storage at one
    tensor (our programs: the eager storage they came from; a ``.pte``/``.pt2``: their storage key).

    Returns the state model in words and what a ``.pte``/``.pt2`` cannot say: a key several methods
    hold (one buffer of the eager program, or several stored once?) and an FQN several methods hold
    under different keys (several buffers, or one the exporter stored per method?)."""
    by_provenance = load.program.format is ProgramFormat.DIRECTORY
    first: dict[str, tuple[str, Any]] = {}
    held: dict[str, list[str]] = {}
    keys_of: dict[str, dict[str, str]] = {}  # FQN -> method -> key, for what the file cannot say
    for lm in load.methods.values():
        for c in lm.spec.constants:
            key = c.storage if by_provenance else c.storage_key
            if c.fqn and c.kind is not ConstantKind.LIFTED_CONSTANT:
                keys_of.setdefault(c.fqn, {})[lm.name] = key
            if not key:
                continue
            if key not in first:
                first[key] = (lm.name, c)
                continue
            owner, c0 = first[key]
            if owner == lm.name or (c0.dtype, c0.shape, c0.strides) != (c.dtype, c.shape, c.strides):
                continue
            load.swap_constant(lm.name, c.name, load.methods[owner].tensors[c0.name])
            held.setdefault(key, [owner]).append(lm.name)
    if by_provenance:
        return "state: one tensor per storage of the eager program (the build's provenance)", []
    blind = [f"{k} (held by {', '.join(ms)}) was one buffer of the eager program or several" for k, ms in held.items()]
    apart = sorted(f for f, by in keys_of.items() if len(by) > 1 and len(set(by.values())) > 1)
    unkeyed = sorted(f for f, by in keys_of.items() if len(by) > 1 and not any(by.values()))
    if unkeyed:  # payload generations 1 and 2 record no storage key: each method's constants are its own
        blind.append(
            f"{len(unkeyed)} FQN(s) held by several methods with no storage key ({', '.join(unkeyed[:3])}"
            f"{', ...' if len(unkeyed) > 3 else ''}) were one buffer or several"
        )
    if apart:
        blind.append(
            f"{len(apart)} FQN(s) held by several methods under different keys ({', '.join(apart[:3])}"
            f"{', ...' if len(apart) > 3 else ''}) were several buffers or one"
        )
    return (
        "state: one storage per storage key"
        + (
            "; the file cannot tell whether " + "; whether ".join(blind) + ": the oracle cannot see state shared "
            "wrongly under one key, or kept apart wrongly under several"
            if blind
            else ""
        )
    ), blind


def unshared_sequence(
    session: "Session", steps: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]
) -> tuple[list[tuple[list[torch.Tensor], list[torch.Tensor]]], str, list[str], str]:
    """Each step's outputs, twice, of the sequence run on an unshared load of its methods holding the
    program's intended shared state (:func:`intended_state`); the state model in words; what it
    cannot see (one clause each); and why it stopped early ("" when every step ran)."""
    load = _unshared_load(session)
    try:
        for m in dict.fromkeys(m for m, _, _ in steps):
            load.load_method(m)
        model, blind = intended_state(load)
        runs: list[list[list[torch.Tensor]]] = [[], []]
        stopped = ""
        for run in runs:
            load.reset_state()
            for i, (m, inputs, _) in enumerate(steps):
                try:
                    run.append(host_outputs(load, m, inputs))
                except (ToolkitError, RuntimeError) as e:
                    stopped = f"the unshared load could not run step {i} ({m}): {first_line(e)}"
                    break
    except ToolkitError as e:
        return [], "", [], f"the unshared load failed: {e}"
    finally:
        _free(load)
    return list(zip(*runs)), model, blind, stopped
