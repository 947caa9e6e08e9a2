"""What a load's verdict cannot check, found from the program and what was verified.

A ``.pte`` or ``.pt2`` does not record which constants a method writes, so neither a dry run nor a
load without a sequence can tell whether a constant several methods hold is state that must be one
tensor (a KV cache prefill fills and decode reads) or weights that must stay apart; the
differential oracle's state model has its own gaps, which it states in its detail.  Each becomes a
:class:`~toolkit.core.verdict.NotChecked`, so an "ok" never hides one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import pandas as pd

from toolkit.core.verdict import NotChecked
from toolkit.core.vocab import BlindSpot, ConstantKind

if TYPE_CHECKING:
    from toolkit.core.model import ProgramSpec

# a sequence frame's ``attrs`` key: the clauses of what the differential oracle's state model cannot see
# (defined here, not beside the verification rows, so that a dry run imports no torch)
ORACLE_GAPS = "oracle_gaps"
SHOWN = 4  # names listed in one line before "and N more"


def held_by_several(program: "ProgramSpec") -> list[str]:
    """The FQNs (or storage keys) of non-lifted constants that more than one method holds: what may be state."""
    holders: dict[str, set[str]] = {}
    for m in program.methods:
        for c in m.constants:
            if c.kind is ConstantKind.LIFTED_CONSTANT:
                continue
            key = c.fqn or c.storage_key
            if key:
                holders.setdefault(key, set()).add(m.name)
    return sorted(k for k, ms in holders.items() if len(ms) > 1)


def listed(names: list[str]) -> str:
    head = ", ".join(names[:SHOWN])
    return head + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def blind_spots(program: "ProgramSpec", *, predicted: bool, sequences: Mapping[str, pd.DataFrame]) -> list[NotChecked]:
    """The state and oracle blind spots of one verdict (the unreferenced ones the verdict adds itself).

    ``sequences``: the verification frame of each sequence that ran (empty for a dry run)."""
    found: list[NotChecked] = []
    may_be_state = held_by_several(program) if not program.records_mutation else []
    if may_be_state and (predicted or not sequences):
        why = (
            "a dry run cannot check state across a sequence"
            if predicted
            else "no sequence ran, so state carried from one method to the next was not checked"
        )
        found.append(
            NotChecked(
                "sequences",
                BlindSpot.STATE,
                f"{why}: the file does not record which constants a method writes, and "
                f"{len(may_be_state)} constant(s) held by several methods may be state ({listed(may_be_state)})",
                "load it for real (without --dry-run) with a sequence reference beside the file "
                "(sequences.json), or Session.verify_sequence",
            )
        )
    for name, frame in sequences.items():
        for gap in dict.fromkeys(frame.attrs.get(ORACLE_GAPS, ())):
            found.append(
                NotChecked(
                    name,
                    BlindSpot.ORACLE,
                    f"the file cannot tell whether {gap}",
                    "compare against the eager sequence: a sequence reference from the exporter",
                )
            )
    return found
