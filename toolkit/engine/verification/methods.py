"""Verifying a session's methods: each loaded method run against its oracle, one row per method.

The oracle is the method's reference (the program's, or one the caller supplies) or, where there
is none, the differential oracle on generated inputs (:mod:`.oracle`).  A method with neither is
reported ``no reference``: not run, ``ok`` missing (``pd.NA``), neither right nor wrong.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Collection, Mapping

import pandas as pd

from toolkit.core.errors import ReferenceDataError, ToolkitError
from toolkit.core.model import MethodSpec
from toolkit.core.vocab import CheckedAgainst, Oracle, parse
from toolkit.engine.inputs import generate
from toolkit.engine.verification.comparison import compare_outputs
from toolkit.engine.verification.oracle import differential_row
from toolkit.engine.verification.references import Reference, read_reference, reference_field, resolve_references
from toolkit.engine.verification.rows import NO_REFERENCE, VERIFY_COLUMNS, empty_row, run_failed

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session

# AOTInductor's own input check (the .so's check_input_N, on when AOTI_RUNTIME_CHECK_INPUTS is set,
# which the AOTI runtime of this toolkit sets): "input_handles[0]: unmatched dim value at 1, ..."
_SO_INPUT_CHECK = re.compile(r"input_handles\[(\d+)\]: unmatched (dtype|dim value|stride value|device type)")
_CHECK_FIELD = {"dtype": "dtype", "dim value": "shape", "stride value": "strides", "device type": "device"}


def _so_input_problem(e: RuntimeError, spec: MethodSpec, method: str) -> ReferenceDataError | None:
    """The compiled model refused an input: which method input, which field."""
    m = _SO_INPUT_CHECK.search(str(e))
    if m is None:
        return None
    i = int(m.group(1))
    j = spec.input_order[i] if spec.input_order is not None and i < len(spec.input_order) else i
    first = str(e).strip().splitlines()[0]
    return ReferenceDataError(
        f"the compiled model of {method!r} refuses input {j}: {first}",
        field=reference_field(method, f".inputs[{j}].{_CHECK_FIELD[m.group(2)]}"),
    )


def verify_session(
    session: "Session",
    references: "Mapping[str, Any] | None" = None,
    *,
    oracle: str = "auto",
    draws: int = 3,
    seed: int = 0,
    methods: "Collection[str] | None" = None,
) -> pd.DataFrame:
    """One row per method of the program: did it run, how far from its oracle, ok?

    ``ok`` is a nullable boolean: True (matches), False (differs, or its run failed), or
    ``pd.NA`` where nothing was compared (no reference, not loaded, not runnable: ``reason``
    says which), neither ok nor wrong.  ``oracle`` (:class:`toolkit.core.vocab.Oracle`) says what a method is
    checked against, named per row (``oracle``, ``oracle_detail``): its reference (the
    program's or one in ``references``, see :func:`resolve_references`, checked before
    anything runs), or the same method loaded on its own bytes (:func:`differential_row`) on
    the reference's inputs or, where there is none, ``draws`` inputs generated from the
    program (:func:`toolkit.engine.inputs.generate`, ``seed``).  A supplied reference the compiled
    model refuses (another input shape or dtype), or whose outputs have another shape or dtype
    than the method's, raises :class:`~toolkit.core.errors.ReferenceDataError`.  ``methods``: only
    these rows (blame's experiments verify the wrong method alone).
    """
    oracle = parse(Oracle, oracle, what="oracle")
    refs = resolve_references(session, references) if references or oracle == "unshared" else None
    rows = []
    for spec in (m for m in session.program.methods if methods is None or m.name in methods):
        row = empty_row(method=spec.name)
        lm = session.methods.get(spec.name)
        ref: Reference | None = None
        if refs is not None:
            ref = refs[spec.name]
        elif spec.reference_file:
            ref = Reference((), (), "", supplied=False)  # read below (errors become the row's reason)
        if lm is None or not lm.runnable:  # nothing ran: neither ok nor wrong (the verdict says why not)
            row["ok"] = pd.NA
            row["reason"] = (
                "not runnable (would-be out-of-bounds alias): " + "; ".join(lm.problems)
                if lm
                else "not loaded" + (f": {session.error}" if session.failed_method == spec.name else "")
            )
        elif oracle == "unshared" and ref is not None:
            row.update(
                differential_row(
                    session,
                    spec,
                    [list(ref.inputs)],
                    CheckedAgainst.UNSHARED_SUPPLIED_INPUTS
                    if ref.supplied
                    else CheckedAgainst.UNSHARED_REFERENCE_INPUTS,
                    f"inputs: {ref.given_as}",
                )
            )
        elif ref is None or oracle == "generated":
            generated = (
                generate(session.program, spec, draws, seed, check_integrity=session.check_integrity)
                if oracle != "reference"
                else None
            )
            if generated is not None and generated[0] is not None:
                row.update(
                    differential_row(session, spec, generated[0], CheckedAgainst.UNSHARED_GENERATED, generated[1])
                )
            else:
                row["ok"] = pd.NA
                row["reason"] = (
                    f"{NO_REFERENCE}: "
                    + (
                        generated[1]  # it declares an input the oracle cannot draw: which, and why
                        if generated is not None
                        else f"the program holds none for {spec.name!r}"
                        + ("" if oracle == "reference" else " and does not declare its inputs")
                    )
                    + "; pass verify(references={...})"
                )
        else:
            row["oracle"] = CheckedAgainst.SUPPLIED if ref.supplied else CheckedAgainst.EAGER
            try:
                if ref.given_as:
                    inputs, expected = list(ref.inputs), list(ref.outputs)
                else:
                    inputs, expected = read_reference(session.program, spec, check_integrity=session.check_integrity)
                session.reset_state()  # each method alone, from the initial state
                try:
                    raw = session.run(spec.name, [x.contiguous() for x in inputs] if ref.supplied else inputs)
                except RuntimeError as e:
                    problem = _so_input_problem(e, spec, spec.name) if ref.supplied else None
                    if problem is not None:
                        raise problem from None
                    raise
                outputs = [o.detach().cpu() for o in raw]
                if ref.supplied:
                    for k, (o, x) in enumerate(zip(outputs, expected)):
                        if o.dtype != x.dtype or o.shape != x.shape:
                            raise ReferenceDataError(
                                f"output {k} of method {spec.name!r} is {o.dtype} {tuple(o.shape)}, the reference "
                                f"given is {x.dtype} {tuple(x.shape)}: not this method's output",
                                field=reference_field(spec.name, f".outputs[{k}]"),
                            )
                row["ran"] = True
                row.update(compare_outputs(outputs, [x.cpu() for x in expected]))
            except ReferenceDataError as e:
                if ref.supplied:
                    raise
                row["reason"] = str(e)
            except ToolkitError as e:
                row["reason"] = str(e)
            except RuntimeError as e:
                row["reason"] = run_failed(e)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=VERIFY_COLUMNS)
    frame["ok"] = frame["ok"].astype("boolean")
    return frame
