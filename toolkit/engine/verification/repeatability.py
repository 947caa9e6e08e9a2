"""Repeatability: which outputs change between repeated runs of a method, and why.

Changes that vanish when the state is reset before every run are state carried in mutated
buffers; changes that remain with identical state and inputs are nondeterministic kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from toolkit.engine.verification.comparison import bitwise_equal
from toolkit.engine.verification.references import read_reference
from toolkit.engine.verification.rows import host_outputs

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session


REPEATABILITY_COLUMNS = ["method", "runs", "changes_with_reset", "changes_without_reset", "cause", "buffers"]


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
        if lm is None or not lm.runnable or not spec.reference_file:  # no reference: no inputs to run on
            continue
        inputs, _ = read_reference(session.program, spec, check_integrity=session.check_integrity)
        with_reset = []
        for _ in range(runs):
            session.reset_state()
            with_reset.append(host_outputs(session, spec.name, inputs))
        session.reset_state()
        without = [host_outputs(session, spec.name, inputs) for _ in range(runs)]
        changes_reset = any(not bitwise_equal(with_reset[0], o) for o in with_reset[1:])
        changes_free = any(not bitwise_equal(without[0], o) for o in without[1:])
        buffers = sorted(c.fqn for c in spec.constants if c.fqn in state_fqns)
        if changes_reset:
            cause = "nondeterministic kernels: outputs differ with identical state and inputs"
        elif changes_free:
            cause = "state carried in mutated buffers: " + (", ".join(buffers) or "(none known)")
        else:
            cause = ""
        rows.append(
            {
                "method": spec.name,
                "runs": runs,
                "changes_with_reset": changes_reset,
                "changes_without_reset": changes_free,
                "cause": cause,
                "buffers": ", ".join(buffers),
            }
        )
    session.reset_state()
    return pd.DataFrame(rows, columns=REPEATABILITY_COLUMNS)
