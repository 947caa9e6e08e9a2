"""Blame: which sharing decisions make a method wrong, found by experiment on the live load.

For every method that verifies wrong (alone, or in a sequence), each decision that could
explain it is undone on its own through ``Session.swap_constant`` (a shared constant swapped
for the method's own copy, a buffer the eager program shares but this load keeps apart
pointed at the writer's tensor), the verification re-run and the swap undone; a swap that
makes it pass names a culprit.  When only several swaps together fix it (a KV cache of one
buffer per layer), all are made at once (no slot both given and taken) and reduced to a
minimal set, each member a culprit.  Every experiment is one ``culprit_tried`` event; what
differs is the verdict's finding (:func:`toolkit.verdict.find_problem`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pandas as pd

from . import events as ev
from .tables import check_rows, wrong_methods
from .verdict import STANDALONE, ConstantFinding, DataProblem, ran_wrong
from .vocab import Decision

if TYPE_CHECKING:
    from .loader import ProgramLoad as Session

BLAME_COLUMNS = ["verification", "method", "name", "fqn", "decision", "shared_from", "problem", "swap", "fixes",
                 "evidence"]


def _passes(session: "Session", method: str, sequence: str | None) -> bool:
    """The method (alone), or every step of the sequence, ran and matched its reference."""
    from .verification import verify_sequence, verify_session

    rows = check_rows(verify_session(session) if sequence is None else verify_sequence(session, sequence))
    rows = [r for r in rows if sequence is not None or r.method == method]
    return bool(rows) and all(r.ran and not ran_wrong(r) for r in rows)


def _candidates(session: "Session", methods: list[str], sequence: str | None) -> Iterator[tuple]:
    """(method, decision, swap, tensor factory, finding) for every decision that could explain it."""
    for m in methods:
        lm = session.methods[m]
        found = {f.name: f for f in session.results[m].findings}
        for d in lm.outcome.decisions:
            if d.decision is Decision.SHARED:
                f = found.get(d.constant.name) or ConstantFinding(
                    m, d.constant.name, d.constant.fqn, None, "no difference known between the two tensors")
                yield m, d, "own copy", lambda m=m, n=d.constant.name: session.own_copy(m, n), f
    if sequence is None:
        return
    # state the eager program holds once, kept apart by this load: point readers at the writer's tensor
    for buf in session.program.state_buffers():
        holders = {}
        for m in dict.fromkeys(methods):
            c = next((c for c in session.methods[m].spec.constants if c.fqn == buf.fqn and c.storage == buf.storage),
                     None)
            if c is not None:
                holders[m] = c
        writers = [m for m in holders if holders[m].mutated]
        for w in writers:
            wt = session.methods[w].tensors.get(holders[w].name)
            for r, c in holders.items():
                lm = session.methods[r]
                if r == w or lm.tensors.get(c.name) is wt or wt is None:
                    continue
                d = next(d for d in lm.outcome.decisions if d.constant.name == c.name)
                yield (r, d, f"the writer's tensor ({w})", lambda wt=wt: wt, ConstantFinding(
                    r, c.name, c.fqn, DataProblem.STATE_NOT_SHARED,
                    f"state the eager program shares (one buffer written by {w!r}) is not shared: "
                    f"{r!r} runs on its own copy", f"{w}/{holders[w].name}"))


def blame(session: "Session", sequence: str | None, v: pd.DataFrame) -> pd.DataFrame:
    """One row per experiment; ``fixes`` True marks a culprit (see the module docstring).
    ``v``: the session's verification (of ``sequence``, or of each method alone)."""
    label = sequence or STANDALONE
    rows: list[dict] = []

    def row(m, d, swap, fixes, f: ConstantFinding, evidence: str) -> None:
        if swap:
            session.log.record(ev.CulpritTried, m, name=d.constant.name, fqn=d.constant.fqn, verification=label,
                               swap=swap, fixes=fixes, evidence=evidence)
        rows.append({"verification": label, "method": m, "name": d.constant.name, "fqn": d.constant.fqn,
                     "decision": d.decision.value,
                     "shared_from": f"{d.shared_from.owner_method}/{d.shared_from.name}" if d.shared_from else "",
                     "problem": f.problem.value if f.problem else "", "swap": swap, "fixes": fixes,
                     "evidence": evidence})

    for m, lm in session.methods.items():  # the guard already knows these: nothing to run
        if not lm.runnable:
            slots = {f.name: f for f in session.results[m].findings if f.problem is DataProblem.SLOT_MISMATCH}
            for d in lm.outcome.decisions:
                if d.constant.name in slots:
                    row(m, d, "", False, slots[d.constant.name], "slot mismatch (the method is not runnable)")
    wrong = wrong_methods(v)
    if not wrong:
        return _frame(rows)
    scope = wrong if sequence is None else list(dict.fromkeys(st.method for st in session.program.sequence(sequence).steps))

    def fixed(m: str) -> bool:
        return all(_passes(session, w, None) for w in wrong) if sequence is None else _passes(session, m, sequence)

    candidates = list(_candidates(session, scope, sequence))
    any_fix = False
    for m, d, swap, make, f in candidates:
        old = session.swap_constant(m, d.constant.name, make())
        try:
            fixes = fixed(m)
        finally:
            session.swap_constant(m, d.constant.name, old)
        any_fix |= fixes
        row(m, d, swap, fixes, f, f.evidence)
    if not any_fix and len(candidates) > 1:
        for (m, d, swap, _make, f), members in _jointly(session, candidates, fixed):
            row(m, d, f"{swap}, with {len(members) - 1} more swaps" if len(members) > 1 else swap, True, f,
                f.evidence)
    session.reset_state()
    return _frame(rows)


def _jointly(session: "Session", candidates: list[tuple], fixed) -> list[tuple]:
    """A minimal set of candidates whose swaps, made together, fix the verification ([] when even
    all of them do not): [(candidate, the set)].  The set is consistent: a slot whose tensor is
    another member's replacement is not also replaced (two state swaps in opposite directions
    would only exchange the buffers)."""
    chosen, given, taken = [], set(), set()
    for cand in candidates:
        m, d = cand[0], cand[1]
        lm = session.methods[m]
        current = lm.tensors.get(d.constant.name)
        replacement = cand[3]()
        if (m, d.constant.name) in {(c[0], c[1].constant.name) for c, _r in chosen} or \
                id(current) in given or id(replacement) in taken:
            continue
        chosen.append((cand, replacement))
        given.add(id(replacement))
        taken.add(id(current))

    def passes(members) -> bool:
        undo = []
        try:
            for cand, replacement in members:
                undo.append((cand[0], cand[1].constant.name,
                             session.swap_constant(cand[0], cand[1].constant.name, replacement)))
            return fixed(members[0][0][0])
        finally:
            for m, name, old in reversed(undo):
                session.swap_constant(m, name, old)

    if len(chosen) < 2 or not passes(chosen):
        return []
    needed = list(chosen)
    for member in list(chosen):
        rest = [x for x in needed if x is not member]
        if rest and passes(rest):
            needed = rest
    return [(cand, needed) for cand, _r in needed]


def _frame(rows: list[dict]) -> pd.DataFrame:
    f = pd.DataFrame(rows, columns=BLAME_COLUMNS)
    f["fixes"] = f["fixes"].astype(bool)
    return f
