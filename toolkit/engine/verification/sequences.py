"""Verifying a sequence: its steps run in order from the initial state, state carried, one row per step.

Checked against the eager sequence the program stores, or against the same steps run on an
unshared load holding the program's intended shared state (:func:`~.oracle.unshared_sequence`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from toolkit.core.errors import ToolkitError
from toolkit.core.vocab import CheckedAgainst, Oracle, parse
from toolkit.engine.blind_spots import ORACLE_GAPS
from toolkit.engine.verification.comparison import compare_outputs, compare_unshared
from toolkit.engine.verification.oracle import unshared_sequence
from toolkit.engine.verification.references import read_sequence_reference
from toolkit.engine.verification.rows import NO_REFERENCE, SEQUENCE_COLUMNS, empty_row, run_failed

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session


def verify_sequence(session: "Session", name: str, *, oracle: str = "auto") -> pd.DataFrame:
    """One row per step of sequence ``name``: run in order from the initial state, state carried.

    Checked against the eager sequence the program stores, or (``oracle="unshared"``) against the
    same steps run on an unshared load holding the program's intended shared state."""
    oracle = parse(Oracle, oracle, what="oracle")
    rows = []
    try:
        steps = read_sequence_reference(session.program, name, check_integrity=session.check_integrity)
    except ToolkitError as e:
        return pd.DataFrame([empty_row(sequence=name, step=0, method="", reason=str(e))], columns=SEQUENCE_COLUMNS)
    unshared = oracle in ("unshared", "generated")  # a sequence's inputs are always its reference's
    detail, stopped, repeats, blind = "", "", [], []
    if unshared:
        repeats, detail, blind, stopped = unshared_sequence(session, steps)
        detail = f"inputs: the program's sequence reference; {detail}"
    session.reset_state()
    broken = ""  # once a step cannot run, the state of every later step is unknown
    for i, (method, inputs, expected) in enumerate(steps):
        row = empty_row(
            sequence=name,
            step=i,
            method=method,
            reason=broken,
            oracle=CheckedAgainst.UNSHARED_REFERENCE_INPUTS if unshared else CheckedAgainst.EAGER,
            oracle_detail=detail,
        )
        if not broken:
            try:
                outputs = [o.detach().cpu() for o in session.run(method, inputs)]
                if not unshared:
                    row["ran"] = True
                    row.update(compare_outputs(outputs, expected, against="the eager sequence"))
                elif i < len(repeats):
                    row["ran"] = True
                    result = compare_unshared(outputs, repeats[i])
                    row.update({k: v for k, v in result.items() if k != "tolerance"})
                    row["reason"] = "" if row["ok"] else "output differs from the unshared load"
                else:
                    row["ok"] = pd.NA
                    row["reason"] = f"{NO_REFERENCE}: {stopped}"
            except ToolkitError as e:
                row["reason"] = str(e)
                broken = f"not run: step {i} ({method}) could not run"
            except RuntimeError as e:
                row["reason"] = run_failed(e)
                broken = f"not run: step {i} ({method}) failed"
        rows.append(row)
    frame = pd.DataFrame(rows, columns=SEQUENCE_COLUMNS)
    frame["ok"] = frame["ok"].astype("boolean")
    frame.attrs[ORACLE_GAPS] = blind  # what the oracle's state model cannot see, one clause each
    return frame
