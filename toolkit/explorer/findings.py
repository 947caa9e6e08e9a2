"""The constants that run on other data, as the explorer presents them: the summary sentence, the
order of the Decisions grid (culprits first), a constant's finding and where the tab starts.

Everything here reads the session's verdict (a dry run's: the prediction); nothing is worked out anew.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from toolkit.core.verdict import ConstantFinding, Verdict
from toolkit.core.vocab import BlameStatus, Lookup
from toolkit.display.cells import cell_text
from toolkit.display.content import culprit_mask
from toolkit.explorer.text import plural

# each decision row's rank in the Decisions grid, most interesting first
CULPRIT_RANK, RUNS_ON_OTHER_DATA, OF_A_WRONG_METHOD, COLLISION, OTHER = range(5)


def findings_summary(verdict: Verdict | None, keys: set[tuple[str, str]] | None = None) -> str:
    """The constants that run on other data (a finding with a problem, or a culprit), of ``keys``
    only when given, in one sentence: "N run on other data: K culprits, M harmless (why), J not
    tested"; '' when there are none."""
    found = [
        c
        for c in (verdict.constants if verdict is not None else ())
        if (c.problem is not None or c.blame is BlameStatus.CULPRIT) and (keys is None or (c.method, c.name) in keys)
    ]
    if not found:
        return ""
    by = {b: [c for c in found if c.blame is b] for b in BlameStatus}
    parts = []
    if by[BlameStatus.CULPRIT]:
        parts.append(plural(len(by[BlameStatus.CULPRIT]), "culprit") + " (undoing the share fixes the method)")
    if by[BlameStatus.HARMLESS]:
        notes = Counter(c.blame_note for c in by[BlameStatus.HARMLESS]).most_common()
        why = notes[0][0] if len(notes) == 1 else "; ".join(f"{n:,}: {note}" for note, n in notes)
        parts.append(f"{len(by[BlameStatus.HARMLESS]):,} harmless ({why})")
    if by[BlameStatus.NOT_TESTED]:
        parts.append(
            f"{len(by[BlameStatus.NOT_TESTED]):,} not tested"
            + (" (a prediction: nothing ran)" if verdict.predicted else " (no blame experiment)")
        )
    return f"{plural(len(found), 'constant')} run on other data: " + ", ".join(parts)


def interest_rank(rows: pd.DataFrame, verdict: Verdict | None) -> pd.Series:
    """Each decision row's place in the Decisions grid: culprits (:data:`CULPRIT_RANK`), then the
    other constants that run on other data, then the rows of the wrong methods, then the other
    collisions (names found in the cache), then the rest."""
    culprits, found = set(), set()
    for c in verdict.constants if verdict is not None else ():
        (culprits if c.blame is BlameStatus.CULPRIT else found).add((c.method, c.name))
    wrong = set(verdict.wrong_methods) if verdict is not None else set()
    problem = culprit_mask(rows).tolist()
    hits = (rows["lookup"].map(cell_text) == Lookup.HIT.value).tolist() if "lookup" in rows else [False] * len(rows)
    rank = [
        CULPRIT_RANK
        if k in culprits
        else RUNS_ON_OTHER_DATA
        if p or k in found
        else OF_A_WRONG_METHOD
        if k[0] in wrong
        else COLLISION
        if h
        else OTHER
        for k, p, h in zip(zip(rows["method"].tolist(), rows["name"].tolist()), problem, hits)
    ]
    return pd.Series(rank, index=rows.index, dtype="int64")


def finding_of(verdict: Verdict | None, method: str, name: str) -> ConstantFinding | None:
    """The verdict's finding for one constant (a culprit first), None when it runs on its own data."""
    found = [c for c in verdict.findings(method) if c.name == name] if verdict is not None else []
    return min(found, key=lambda c: c.blame is not BlameStatus.CULPRIT, default=None)


def first_of_interest(rows: pd.DataFrame, verdict: Verdict) -> tuple[str, str] | None:
    """Where the Decisions tab starts among ``rows``: the first culprit, else the first constant that
    runs on other data, else the first collision, else the first row."""
    keys = list(zip(rows["method"], rows["name"]))
    present = set(keys)
    for c in sorted(verdict.constants, key=lambda c: c.blame is not BlameStatus.CULPRIT):
        if (c.method, c.name) in present:
            return (c.method, c.name)
    hits = [k for k, lookup in zip(keys, rows["lookup"]) if lookup == Lookup.HIT]
    return (hits or keys or [None])[0]
