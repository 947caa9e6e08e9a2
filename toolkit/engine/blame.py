"""Blame: which sharing decisions make a method wrong, found by experiment on the live load.

The suspects of a method that verifies wrong (alone, or in a sequence) are the decisions that
could explain it: a shared constant (undone by swapping in the method's own copy through
``Session.swap_constant``), a buffer the eager program shares but this load keeps apart
(pointed at the writer's tensor).  A shared constant whose recorded sha256 and layout are those
of the tensor it shares is cleared without an experiment: its own copy would hold the same bytes.
The rest are group-tested: swapped together in halves (a bisection, for one culprit:
about log2(suspects) + 1 verifications of the wrong method), and when no single swap fixes it
(a KV cache of one buffer per layer), reduced to a minimal set that does, each member a
culprit.  A group is consistent: no slot both given and taken.  Swaps are undone after each
experiment; every suspect gets one ``culprit_tried`` event; the frame's ``attrs["experiments"]``
counts the verifications run.  What differs is the verdict's finding (:func:`toolkit.core.verdict.find_problem`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pandas as pd

from toolkit.core import events as ev
from toolkit.core.verdict import STANDALONE, ConstantFinding, ran_wrong
from toolkit.core.vocab import DataProblem, Decision
from toolkit.engine.frames import check_rows, wrong_methods

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session

BLAME_COLUMNS = [
    "verification",
    "method",
    "name",
    "fqn",
    "decision",
    "shared_from",
    "problem",
    "swap",
    "fixes",
    "evidence",
]


def _passes(session: "Session", method: str | None, sequence: str | None) -> bool:
    """The method (alone), or every step of the sequence, ran and matched its reference."""
    from toolkit.engine.verification import verify_sequence, verify_session

    rows = check_rows(
        verify_session(session, methods=[method]) if sequence is None else verify_sequence(session, sequence)
    )
    return bool(rows) and all(r.ran and not ran_wrong(r) for r in rows)


def _candidates(session: "Session", methods: list[str], sequence: str | None) -> Iterator[tuple]:
    """(method, decision, swap, tensor factory, finding) for every decision that could explain it."""
    for m in methods:
        lm = session.methods[m]
        found = {f.name: f for f in session.results[m].findings}
        for d in lm.outcome.decisions:
            if d.decision is Decision.SHARED:
                f = found.get(d.constant.name) or ConstantFinding(
                    m, d.constant.name, d.constant.fqn, None, "no difference known between the two tensors"
                )
                yield m, d, "own copy", lambda m=m, n=d.constant.name: session.own_copy(m, n), f
    if sequence is None:
        return
    # state the eager program holds once, kept apart by this load: point readers at the writer's tensor
    for buf in session.program.state_buffers():
        holders = {}
        for m in dict.fromkeys(methods):
            c = next(
                (c for c in session.methods[m].spec.constants if c.fqn == buf.fqn and c.storage == buf.storage), None
            )
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
                yield (
                    r,
                    d,
                    f"the writer's tensor ({w})",
                    lambda wt=wt: wt,
                    ConstantFinding(
                        r,
                        c.name,
                        c.fqn,
                        DataProblem.STATE_NOT_SHARED,
                        f"state the eager program shares (one buffer written by {w!r}) is not shared: "
                        f"{r!r} runs on its own copy",
                        f"{w}/{holders[w].name}",
                    ),
                )


def blame(session: "Session", sequence: str | None, v: pd.DataFrame, *, clear_same_bytes: bool = True) -> pd.DataFrame:
    """One row per suspect; ``fixes`` True marks a culprit (see the module docstring).
    ``v``: the session's verification (of ``sequence``, or of each method alone);
    ``clear_same_bytes`` False group-tests every suspect (a benchmark's worst case)."""
    label = sequence or STANDALONE
    rows: list[dict] = []

    def row(m, d, swap, fixes, f: ConstantFinding, evidence: str) -> None:
        if swap:
            session.log.record(
                ev.CulpritTried,
                m,
                name=d.constant.name,
                fqn=d.constant.fqn,
                verification=label,
                swap=swap,
                fixes=fixes,
                evidence=evidence,
            )
        rows.append(
            {
                "verification": label,
                "method": m,
                "name": d.constant.name,
                "fqn": d.constant.fqn,
                "decision": d.decision.value,
                "shared_from": f"{d.shared_from.owner_method}/{d.shared_from.name}" if d.shared_from else "",
                "problem": f.problem.value if f.problem else "",
                "swap": swap,
                "fixes": fixes,
                "evidence": evidence,
            }
        )

    for m, lm in session.methods.items():  # the guard already knows these: nothing to run
        if not lm.runnable:
            slots = {f.name: f for f in session.results[m].findings if f.problem is DataProblem.SLOT_MISMATCH}
            for d in lm.outcome.decisions:
                if d.constant.name in slots:
                    row(m, d, "", False, slots[d.constant.name], "slot mismatch (the method is not runnable)")
    wrong = wrong_methods(v)
    experiments = 0
    if sequence is None:  # each method alone: its own slots are all that can explain it
        scopes = [([w], lambda w=w: _passes(session, w, None)) for w in wrong]
    else:
        steps = list(dict.fromkeys(st.method for st in session.program.sequence(sequence).steps))
        scopes = [(steps, lambda: _passes(session, None, sequence))] if wrong else []
    for scope, fixed in scopes:
        suspects = []
        for cand in _candidates(session, scope, sequence):
            m, d, swap, _make, f = cand
            if clear_same_bytes and _same_bytes(session, d):
                row(
                    m,
                    d,
                    swap,
                    False,
                    f,
                    "not run: its recorded sha256 and layout are those of the tensor it "
                    "shares, so its own copy would hold the same bytes",
                )
            else:
                suspects.append(cand)
        search = _GroupTest(session, fixed)
        needed, cleared = search.run(suspects)
        experiments += search.experiments
        culprits, tried_alone = {id(c) for c in needed or ()}, {id(c) for c in cleared}
        for cand in suspects:
            m, d, swap, _make, f = cand
            if id(cand) in culprits:
                row(
                    m, d, f"{swap}, with {len(needed) - 1} more swaps" if len(needed) > 1 else swap, True, f, f.evidence
                )
            else:
                row(
                    m,
                    d,
                    swap,
                    False,
                    f,
                    f.evidence
                    if id(cand) in tried_alone
                    else f"not needed: {_culprits_swap(needed)} without this one. {f.evidence}",
                )
    session.reset_state()
    frame = _frame(rows)
    frame.attrs["experiments"] = experiments
    return frame


def _culprits_swap(needed: list[tuple]) -> str:
    return "the culprit's swap fixes it" if len(needed) == 1 else f"the {len(needed)} culprits' swaps together fix it"


def _same_bytes(session: "Session", d) -> bool:
    """A shared constant whose own copy would be bytes-identical to the tensor it runs on: the same
    recorded sha256 (files verified against it), layout, and neither written by its graph."""
    src = d.shared_from
    owner = session.methods.get(src.owner_method) if d.decision is Decision.SHARED and src else None
    if owner is None or not session.check_integrity or not d.constant.digest:
        return False
    s = next((c for c in owner.spec.constants if c.name == src.name), None)
    c = d.constant
    return (
        s is not None
        and not (c.mutated or s.mutated)
        and (s.digest, s.dtype, s.shape, s.strides, s.storage_offset, s.nbytes)
        == (c.digest, c.dtype, c.shape, c.strides, c.storage_offset, c.nbytes)
    )


class _GroupTest:
    """Group tests over suspects: which swaps, made together, make ``fixed()`` true."""

    def __init__(self, session: "Session", fixed):
        self.session, self.fixed, self.experiments = session, fixed, 0
        self._made: dict[int, object] = {}  # replacement tensors, made once per suspect while needed

    def run(self, suspects: list[tuple]) -> tuple[list[tuple] | None, list[tuple]]:
        """(a minimal fixing set, or None where nothing fixes it; the suspects shown not to fix it alone)."""
        cleared: list[tuple] = []
        for layer in self._layers(suspects):
            group, passed = layer, False
            while len(group) > 1:  # one culprit: halve, trusting the other half when one does not fix it
                half = group[: len(group) // 2]
                passed = self.passes(half)
                if passed:
                    group = half
                else:
                    cleared += half
                    group = group[len(group) // 2 :]
                self._keep(group)
            if passed or self.passes(group):
                return group, cleared
            cleared += group
            if len(layer) > 1 and self.passes(layer):  # several needed together
                return self._reduce(layer, []), cleared
        return None, cleared

    def _layers(self, suspects: list[tuple]) -> list[list[tuple]]:
        """Suspects split into consistent groups, in order: no slot replaced twice, and none whose
        tensor is another member's replacement (two state swaps in opposite directions only
        exchange the buffers)."""
        layers: list[dict] = []
        for cand in suspects:
            slot = (cand[0], cand[1].constant.name)
            current = id(self.session.methods[cand[0]].tensors.get(slot[1]))
            given = id(self._replacement(cand)) if cand[2] != "own copy" else None  # an own copy is new
            layer = next(
                (
                    ly
                    for ly in layers
                    if slot not in ly["slots"] and current not in ly["given"] and given not in ly["taken"]
                ),
                None,
            )
            if layer is None:
                layers.append(layer := {"members": [], "slots": set(), "given": set(), "taken": set()})
            layer["members"].append(cand)
            layer["slots"].add(slot)
            layer["taken"].add(current)
            layer["given"].add(given)
        return [ly["members"] for ly in layers]

    def _replacement(self, cand: tuple):
        if id(cand) not in self._made:
            self._made[id(cand)] = cand[3]()
        return self._made[id(cand)]

    def _keep(self, group: list[tuple]) -> None:
        """Drop replacements outside ``group`` (own copies are device memory)."""
        keep = {id(c) for c in group}
        self._made = {k: t for k, t in self._made.items() if k in keep}

    def _make_own_copies(self, members: list[tuple]) -> None:
        """The own copies ``members`` still lack, uploaded as one batch per method (one by one,
        a group of many gigabytes read its pieces a constant at a time)."""
        wanted: dict[str, list[tuple]] = {}
        for cand in members:
            if cand[2] == "own copy" and id(cand) not in self._made:
                wanted.setdefault(cand[0], []).append(cand)
        for m, cands in wanted.items():
            made = self.session.own_copies(m, [c[1].constant.name for c in cands])
            for cand in cands:
                self._made[id(cand)] = made[cand[1].constant.name]

    def passes(self, members: list[tuple]) -> bool:
        """One experiment: every member swapped, the verification re-run, the swaps undone."""
        self.experiments += 1
        self._make_own_copies(members)
        undo = []
        try:
            for cand in members:
                name = cand[1].constant.name
                undo.append((cand[0], name, self.session.swap_constant(cand[0], name, self._replacement(cand))))
            return self.fixed()
        finally:
            for m, name, old in reversed(undo):
                self.session.swap_constant(m, name, old)

    def _reduce(self, group: list[tuple], base: list[tuple]) -> list[tuple]:
        """A minimal subset of ``group`` that fixes it with ``base``, given that ``base + group``
        fixes it and ``base`` alone does not."""
        if len(group) == 1:
            return group
        a, b = group[: len(group) // 2], group[len(group) // 2 :]
        if self.passes(base + a):
            return self._reduce(a, base)
        if self.passes(base + b):
            return self._reduce(b, base)
        need_a = self._reduce(a, base + b)
        return need_a + self._reduce(b, base + need_a)


def _frame(rows: list[dict]) -> pd.DataFrame:
    f = pd.DataFrame(rows, columns=BLAME_COLUMNS)
    f["fixes"] = f["fixes"].astype(bool)
    return f
