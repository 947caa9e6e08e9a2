"""Blame: which sharing decisions make a method wrong, found by experiment on the live load.

For every method that verifies wrong (alone, or in a sequence), each decision that could
explain it is tried on its own: a shared constant is swapped for the method's own copy
(uploaded from its own file), or a buffer the eager program shares but this load keeps
apart is pointed at the writer's tensor; the verification is re-run, and the swap undone.
A swap that makes the verification pass names a culprit.  Evidence says what differs: the
content digests, the provenance of state, or the slot the guard refused.  Every experiment
is one ``culprit_tried`` event.

When no single swap fixes it but the wrong output has several causes that only act together
(a KV cache of one buffer per layer, every one kept apart), all the candidates are swapped at
once (a consistent set: no slot both given and taken) and, if that fixes it, reduced to a
minimal set by dropping each member whose swap is not needed; each member of that set is a
culprit, one row and one event each, its swap saying how many it needs beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import pandas as pd

from . import events as ev
from .errors import LoadError
from .tables import wrong_methods
from .vocab import Decision

if TYPE_CHECKING:
    from .loader import LoadedMethod, Session

BLAME_COLUMNS = ["verification", "method", "name", "fqn", "decision", "shared_from", "swap", "fixes", "evidence"]


def _evidence(d) -> str:
    e = d.shared_from
    if e is None:
        return ""
    if d.constant.mutated or getattr(e, "mutated", False):
        if not d.constant.storage or d.constant.storage != getattr(e, "storage", ""):
            return f"state written by {e.owner_method!r}: another buffer of the eager program"
    if e.digest != d.constant.digest:
        return f"content differs: cached {e.digest[:12]}... from {e.owner_method!r}, own {d.constant.digest[:12]}..."
    if e.meta.dtype != d.constant.dtype or e.meta.shape != d.constant.shape or e.meta.strides != d.constant.strides:
        return "metadata differs"
    return "no difference known between the two tensors"


def _passes(session: "Session", method: str, sequence: str | None) -> bool:
    from .verification import verify_sequence, verify_session

    if sequence is None:
        v = verify_session(session)
        row = v[v["method"] == method]
        return bool(len(row)) and bool(row["ran"].iloc[0]) and row["ok"].iloc[0] is not pd.NA and bool(row["ok"].iloc[0])
    v = verify_sequence(session, sequence)
    return bool(v["ran"].all() and v["ok"].fillna(False).all())


def _swap(session: "Session", lm: "LoadedMethod", name: str, tensor: Any) -> Any:
    old = lm.tensors[name]
    lm.handle.install({name: tensor})
    lm.tensors[name] = tensor
    return old


def _candidates(session: "Session", methods: list[str], sequence: str | None) -> Iterator[tuple]:
    """(method, decision, swap, tensor factory, evidence) for every decision that could explain it."""
    for m in methods:
        lm = session.methods[m]
        for d in lm.outcome.decisions:
            if d.decision is Decision.SHARED:
                def own(lm=lm, c=d.constant):
                    return next(iter(lm.handle.upload_constants([c])))[1]
                yield m, d, "own copy", own, _evidence(d)
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
                yield (r, d, f"the writer's tensor ({w})", lambda wt=wt: wt,
                       f"state the eager program shares (one buffer written by {w!r}) is not shared: "
                       f"{r!r} runs on its own copy")


def blame(session: "Session", sequence: str | None = None) -> pd.DataFrame:
    """One row per experiment; ``fixes`` True marks a culprit (see the module docstring)."""
    if not session.runtime.can_run:
        raise LoadError("blame needs a real load: a dry run has nothing to run")
    v = session.verify(sequence=sequence)
    label = sequence or "standalone"
    rows: list[dict] = []
    for m, lm in session.methods.items():  # the guard already knows these: nothing to run
        if not lm.runnable:
            for d in lm.outcome.decisions:
                if d.constant.name in {p.split(":")[0] for p in lm.problems}:
                    rows.append({"verification": label, "method": m, "name": d.constant.name, "fqn": d.constant.fqn,
                                 "decision": d.decision.value, "swap": "", "fixes": False,
                                 "shared_from": f"{d.shared_from.owner_method}/{d.shared_from.name}"
                                 if d.shared_from else "", "evidence": "slot mismatch (the method is not runnable)"})
    wrong = wrong_methods(v)
    if not wrong:
        return _frame(rows)
    scope = wrong if sequence is None else list(dict.fromkeys(st.method for st in session.program.sequence(sequence).steps))

    def fixed(m: str) -> bool:
        return all(_passes(session, w, None) for w in wrong) if sequence is None else _passes(session, m, sequence)

    def row(m, d, swap, fixes, evidence) -> None:
        session.log.record(ev.CulpritTried, m, name=d.constant.name, fqn=d.constant.fqn, verification=label,
                           swap=swap, fixes=fixes, evidence=evidence)
        rows.append({"verification": label, "method": m, "name": d.constant.name, "fqn": d.constant.fqn,
                     "decision": d.decision.value,
                     "shared_from": f"{d.shared_from.owner_method}/{d.shared_from.name}" if d.shared_from else "",
                     "swap": swap, "fixes": fixes, "evidence": evidence})

    candidates = list(_candidates(session, scope, sequence))
    any_fix = False
    for m, d, swap, make, evidence in candidates:
        lm = session.methods[m]
        replacement = make()
        old = _swap(session, lm, d.constant.name, replacement)
        try:
            fixes = fixed(m)
        finally:
            _swap(session, lm, d.constant.name, old)
        any_fix |= fixes
        row(m, d, swap, fixes, evidence)
    if not any_fix and len(candidates) > 1:
        for (m, d, swap, _make, evidence), _t in _jointly(session, candidates, fixed):
            row(m, d, f"{swap}, with {len(_t) - 1} more swaps" if len(_t) > 1 else swap, True,
                f"{evidence} (only together with the {len(_t) - 1} other swaps of this set)" if len(_t) > 1
                else evidence)
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
                lm = session.methods[cand[0]]
                undo.append((lm, cand[1].constant.name, _swap(session, lm, cand[1].constant.name, replacement)))
            return fixed(members[0][0][0])
        finally:
            for lm, name, old in reversed(undo):
                _swap(session, lm, name, old)

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
