"""Verification: every loaded method run on its eager reference inputs, outputs compared."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from .errors import ProgramError, ToolkitError
from .model import MethodSpec, Program

if TYPE_CHECKING:
    from .loader import Session

VERIFY_COLUMNS = ["method", "ran", "max_abs_err", "atol", "rtol", "ok", "reason"]
SEQUENCE_COLUMNS = ["sequence", "step", *VERIFY_COLUMNS]


def dtype_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) fitting the output dtype: compiled kernels reorder reductions."""
    if dtype in (torch.bfloat16,):
        return 5e-2, 5e-2
    if dtype in (torch.float16,):
        return 1e-2, 1e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-3, 1e-3
    return 0.0, 0.0


def _read_checked(program: Program, rel: str, check_integrity: bool) -> tuple[dict[str, torch.Tensor], "Path"]:
    """The tensors of a reference file (safetensors, never pickle), its digest checked first."""
    from safetensors.torch import load_file

    from .integrity import VERIFIED

    path = program.path(rel)
    record = program.files.get(rel)
    if check_integrity and record is not None:
        VERIFIED.check(path, record)
    try:
        return load_file(str(path)), path
    except Exception as e:
        raise ProgramError(f"reference tensors cannot be read: {e}", path=path) from None


def read_reference(program: Program, spec: MethodSpec, *, check_integrity: bool = True
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs, outputs) stored at build time in the method's reference file (safetensors, never pickle).

    The file is checked against its recorded digest first, as the load checks its files
    (free when it is unchanged since): a reference copied over another after the load
    would make a correct method look wrong.
    """
    data, path = _read_checked(program, spec.reference_file, check_integrity)
    try:
        inputs = [data[f"input.{i}"] for i in range(spec.num_inputs)]
        outputs = [data[f"output.{i}"] for i in range(spec.num_outputs)]
    except KeyError as e:
        raise ProgramError(f"reference tensor {e.args[0]!r} is missing", path=path) from None
    return inputs, outputs


def compare_outputs(outputs: list[torch.Tensor], expected: list[torch.Tensor]) -> dict[str, Any]:
    """max_abs_err, atol, rtol, ok of outputs against the reference (NaN where the reference has NaN)."""
    errs, ok = [], len(outputs) == len(expected)
    atol, rtol = 0.0, 0.0
    for o, e in zip(outputs, expected):
        a, r = dtype_tolerance(e.dtype)
        atol, rtol = max(atol, a), max(rtol, r)
        if o.shape != e.shape or o.dtype != e.dtype:
            ok = False
            errs.append(math.inf)
            continue
        diff = (o.double() - e.double()).abs()
        finite = torch.isfinite(e.double())
        errs.append(float(diff.max()) if diff.numel() else 0.0)
        ok &= bool(torch.allclose(o.double(), e.double(), atol=a, rtol=r, equal_nan=True)) and \
            bool((torch.isfinite(o.double()) == finite).all())
    err = max(errs) if errs else 0.0
    return {"max_abs_err": err, "atol": atol, "rtol": rtol, "ok": ok and not math.isnan(err)}


def verify_session(session: "Session") -> pd.DataFrame:
    """One row per method of the program: did it run, how far from the eager reference, ok?"""
    rows = []
    for spec in session.program.methods:
        row: dict[str, Any] = {"method": spec.name, "ran": False, "max_abs_err": math.nan,
                               "atol": math.nan, "rtol": math.nan, "ok": False, "reason": ""}
        lm = session.methods.get(spec.name)
        if lm is None:
            row["reason"] = "not loaded" + (f": {session.error}" if session.failed_method == spec.name else "")
        elif not lm.runnable:
            row["reason"] = "not runnable (would-be out-of-bounds alias): " + "; ".join(lm.problems)
        else:
            try:
                inputs, expected = session.reference(spec.name)
                session.reset_state()  # each method alone, from the initial state
                outputs = [o.detach().cpu() for o in session.run(spec.name, inputs)]
                row["ran"] = True
                row.update(compare_outputs(outputs, expected))
                row["reason"] = "" if row["ok"] else "output differs from the eager reference"
            except ToolkitError as e:
                row["reason"] = str(e)
            except RuntimeError as e:
                row["reason"] = f"run failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        rows.append(row)
    return pd.DataFrame(rows, columns=VERIFY_COLUMNS)


def read_sequence_reference(program: Program, name: str, *, check_integrity: bool = True
                            ) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]:
    """[(method, inputs, outputs)] of every step of a sequence, as the eager program ran it."""
    seq = program.sequence(name)
    data, path = _read_checked(program, seq.reference_file, check_integrity)
    try:
        return [(st.method, [data[f"step.{i}.input.{j}"] for j in range(st.num_inputs)],
                 [data[f"step.{i}.output.{j}"] for j in range(st.num_outputs)]) for i, st in enumerate(seq.steps)]
    except KeyError as e:
        raise ProgramError(f"sequence reference tensor {e.args[0]!r} is missing", path=path) from None


def verify_sequence(session: "Session", name: str) -> pd.DataFrame:
    """One row per step of sequence ``name``: run in order from the initial state, state carried."""
    rows = []
    try:
        steps = read_sequence_reference(session.program, name, check_integrity=session.check_integrity)
    except ToolkitError as e:
        return pd.DataFrame([{"sequence": name, "step": 0, "method": "", "ran": False, "max_abs_err": math.nan,
                              "atol": math.nan, "rtol": math.nan, "ok": False, "reason": str(e)}],
                            columns=SEQUENCE_COLUMNS)
    session.reset_state()
    broken = ""  # once a step cannot run, the state of every later step is unknown
    for i, (method, inputs, expected) in enumerate(steps):
        row: dict[str, Any] = {"sequence": name, "step": i, "method": method, "ran": False, "max_abs_err": math.nan,
                               "atol": math.nan, "rtol": math.nan, "ok": False, "reason": broken}
        if not broken:
            try:
                outputs = [o.detach().cpu() for o in session.run(method, inputs)]
                row["ran"] = True
                row.update(compare_outputs(outputs, expected))
                row["reason"] = "" if row["ok"] else "output differs from the eager sequence"
            except ToolkitError as e:
                row["reason"] = str(e)
                broken = f"not run: step {i} ({method}) could not run"
            except RuntimeError as e:
                row["reason"] = f"run failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                broken = f"not run: step {i} ({method}) failed"
        rows.append(row)
    return pd.DataFrame(rows, columns=SEQUENCE_COLUMNS)


REPEATABILITY_COLUMNS = ["method", "runs", "changes_with_reset", "changes_without_reset", "cause", "buffers"]


def _outputs(session: "Session", method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [o.detach().cpu().clone() for o in session.run(method, inputs)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def repeatability(session: "Session", runs: int = 3) -> pd.DataFrame:
    """Run each loaded, runnable method ``runs`` times on its reference inputs, once with the
    state reset before every run and once without, and say which outputs change and why.

    Changes that vanish with resets are state carried in mutated buffers (named: the buffers
    the method runs on that some method writes); changes that remain with identical state
    and inputs are nondeterministic kernels.  Outputs are compared bit for bit.
    """
    if runs < 2:
        raise ValueError(f"runs must be at least 2, got {runs!r}")
    state_fqns = {b.fqn for b in session.program.state_buffers()}
    rows = []
    for spec in session.program.methods:
        lm = session.methods.get(spec.name)
        if lm is None or not lm.runnable:
            continue
        inputs, _ = session.reference(spec.name)
        with_reset = []
        for _ in range(runs):
            session.reset_state()
            with_reset.append(_outputs(session, spec.name, inputs))
        session.reset_state()
        without = [_outputs(session, spec.name, inputs) for _ in range(runs)]
        changes_reset = any(not _same(with_reset[0], o) for o in with_reset[1:])
        changes_free = any(not _same(without[0], o) for o in without[1:])
        buffers = sorted(c.fqn for c in spec.constants if c.fqn in state_fqns)
        if changes_reset:
            cause = "nondeterministic kernels: outputs differ with identical state and inputs"
        elif changes_free:
            cause = "state carried in mutated buffers: " + (", ".join(buffers) or "(none known)")
        else:
            cause = ""
        rows.append({"method": spec.name, "runs": runs, "changes_with_reset": changes_reset,
                     "changes_without_reset": changes_free, "cause": cause, "buffers": ", ".join(buffers)})
    session.reset_state()
    return pd.DataFrame(rows, columns=REPEATABILITY_COLUMNS)
