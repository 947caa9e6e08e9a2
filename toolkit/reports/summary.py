"""Verdicts summed up as frames: one row per method, per culprit constant, or per scanned program.

The HTML report, the JUnit XML and ``scan``'s printed table read these; nothing is decided here
again, every outcome comes from a :class:`~toolkit.core.verdict.Verdict`.  When several outcomes
are summed up as one, the worst wins, in the order of :data:`SEVERITY`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from toolkit.core.policies.releases import executorch_releases
from toolkit.core.verdict import BAD_OUTCOMES, Verdict
from toolkit.core.vocab import UNREADABLE, BlameStatus, MethodOutcome, Stage
from toolkit.display.findings import findings_text

# worst first: what one program's row in scan's summary shows as its outcome
SEVERITY = (
    MethodOutcome.WRONG,
    MethodOutcome.NOT_RUNNABLE,
    MethodOutcome.FAILED,
    UNREADABLE,
    MethodOutcome.REFUSED,
    MethodOutcome.NOT_REACHED,
    MethodOutcome.NO_REFERENCE,
    MethodOutcome.OK,
)
SHORT_TEXT = 48  # characters of an error or a list shown in a summary row; the whole text is in the CSV / HTML


def outcome_rank(outcome: str) -> int:
    """``outcome``'s place in :data:`SEVERITY` (0: the worst)."""
    return SEVERITY.index(outcome) if outcome in SEVERITY else 0  # an outcome not listed: the worst


def worst_outcome(outcomes: Iterable[str]) -> str:
    """The worst of ``outcomes`` (:data:`SEVERITY`)."""
    return min(outcomes, key=outcome_rank)


def _short(text: str, width: int = SHORT_TEXT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def failure_message(v: Verdict, method: str) -> str:
    """One line: a method's outcome, its reason, and the constants it runs on other data for."""
    m = v.method(method)
    found = findings_text(v, method)
    return (
        f"{method} {m.outcome.value} under {v.policy!r}"
        + (f": {m.reason}" if m.reason else "")
        + (f"; runs on other data for {found}" if found else "")
    )


def labelled(verdicts: Sequence[Verdict], labels: Sequence[str] | None) -> list[tuple[str, Verdict]]:
    """Each verdict with the name that tells its program apart (``labels``: e.g. paths; default the program's name)."""
    return list(zip(labels if labels is not None else [v.program for v in verdicts], verdicts, strict=True))


def _culprit_findings(v: Verdict) -> list:
    """The findings a surface lists: culprits, and problems that make a method wrong on their own."""
    return [
        c for c in v.constants if c.problem is not None and (c.problem.standalone or c.blame is BlameStatus.CULPRIT)
    ]


def verdicts_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per program, policy and method: its outcome and the failure message."""
    return pd.DataFrame(
        [
            {
                "program": label,
                "policy": v.policy,
                "method": m.method,
                "outcome": m.outcome.value,
                "message": failure_message(v, m.method) if m.outcome in BAD_OUTCOMES else m.reason,
            }
            for label, v in labelled(verdicts, labels)
            for m in v.methods
        ],
        columns=["program", "policy", "method", "outcome", "message"],
    )


def culprits_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Every constant some method runs (would run) on other data for, across the verdicts."""
    return pd.DataFrame(
        [
            {
                "program": label,
                "policy": v.policy,
                "method": c.method,
                "name": c.name,
                "fqn": c.fqn,
                "data_problem": c.problem.value if c.problem else "",
                "evidence": c.evidence,
                "shared_from": c.shared_from,
                "blame": c.blame.value,
                "blame_note": c.blame_note,
            }
            for label, v in labelled(verdicts, labels)
            for c in _culprit_findings(v)
        ],
        columns=[
            "program",
            "policy",
            "method",
            "name",
            "fqn",
            "data_problem",
            "evidence",
            "shared_from",
            "blame",
            "blame_note",
        ],
    )


def scan_summary(frame: pd.DataFrame, root: "str | Path | None" = None) -> pd.DataFrame:
    """scan's rows (one per program, policy and method) as one row per program: its worst outcome,
    the methods that fail the gate, the policies under which any does, and the first error,
    shortened; paths relative to ``root`` (the folder scanned)."""
    rows = []
    for path, g in frame.groupby("path", sort=False):
        shown = str(Path(path).relative_to(root)) if root is not None and Path(path).is_relative_to(root) else path
        bad = g[g["outcome"].isin([*BAD_OUTCOMES, UNREADABLE])]
        policies = list(dict.fromkeys(p for p in bad["policy"] if p))
        asked = list(dict.fromkeys(p for p in g["policy"] if p))
        errors = [e.removeprefix(f"{path}: ") for e in g["error"] if e]  # the path is in its own column
        rows.append(
            {
                "path": shown,
                "outcome": worst_outcome(g["outcome"]),
                "failing methods": _short(", ".join(dict.fromkeys(m for m in bad["method"] if m))),
                "policies failing": f"{len(policies)} of {len(asked)}"
                + (f": {_short(', '.join(policies))}" if policies else "")
                if asked
                else "",
                "first error": _short(errors[0]) if errors else "",
            }
        )
    return pd.DataFrame(rows, columns=["path", "outcome", "failing methods", "policies failing", "first error"])


def _releases(policy: str) -> str:
    """The ExecuTorch releases that run ``policy`` ("" for a name the table does not know)."""
    try:
        return executorch_releases(policy)
    except (KeyError, ValueError):
        return ""


def not_checked_text(v: Verdict) -> str:
    """The verdict's blind spots in one cell: each gap once, with what it concerns."""
    gaps: dict[str, list[str]] = {}
    for n in v.not_checked:
        gaps.setdefault(n.gap.value, []).append(n.subject)
    return "; ".join(f"{gap} ({', '.join(dict.fromkeys(subjects))})" for gap, subjects in gaps.items())


FINDING_COLUMNS = [
    "program",
    "method",
    "constant",
    "fqn",
    "problem",
    "evidence",
    "shared_from",
    "blame",
    "method_outcome",
    "policies",
]


def findings_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Every finding once across policies: one row per program, method, constant and problem, with
    the policies it holds under (in the order given).  A method that fails with no constant to name
    (refused, failed, not reached, wrong by state) is a row of its own with the outcome as its problem."""
    rows: dict[tuple, dict] = {}

    def add(key: tuple, policy: str, row: dict) -> None:
        found = rows.setdefault(key, {**row, "policies": []})
        if policy not in found["policies"]:
            found["policies"].append(policy)

    for label, v in labelled(verdicts, labels):
        named = set()
        outcomes = {m.method: m.outcome.value for m in v.methods}
        for c in _culprit_findings(v):
            named.add(c.method)
            problem = c.problem.value if c.problem else ""
            add(
                (label, c.method, c.name, problem),
                v.policy,
                {
                    "program": label,
                    "method": c.method,
                    "constant": c.name,
                    "fqn": c.fqn if c.fqn != c.name else "",
                    "problem": problem,
                    "evidence": c.evidence,
                    "shared_from": c.shared_from,
                    "blame": c.blame.value if c.blame is not BlameStatus.NOT_TESTED else "",
                    "method_outcome": outcomes.get(c.method, ""),
                },
            )
        if v.failed_stage is Stage.EXPORT:  # the exporter refuses the whole program: one finding, not one per method
            add(
                (label, "", "", MethodOutcome.REFUSED.value),
                v.policy,
                {
                    "program": label,
                    "method": "",
                    "constant": "",
                    "fqn": "",
                    "problem": f"refused at {Stage.EXPORT.value}",
                    "evidence": v.error,
                    "shared_from": "",
                    "blame": "",
                    "method_outcome": "",
                },
            )
            named.update(m.method for m in v.methods)
        for m in [*v.methods, *v.sequences]:
            name = getattr(m, "method", None) or m.sequence
            if m.outcome is MethodOutcome.NOT_REACHED:
                continue  # a consequence: the method that failed first is a finding of its own
            if m.outcome in BAD_OUTCOMES and name not in named:
                why = v.error if m.outcome is MethodOutcome.REFUSED and v.error else m.reason
                add(
                    (label, name, "", m.outcome.value),
                    v.policy,
                    {
                        "program": label,
                        "method": name,
                        "constant": "",
                        "fqn": "",
                        "problem": m.outcome.value + (f" at {m.stage.value}" if getattr(m, "stage", None) else ""),
                        "evidence": why,
                        "shared_from": "",
                        "blame": "",
                    },
                )
    out = pd.DataFrame(list(rows.values()), columns=FINDING_COLUMNS)
    out["policies"] = [", ".join(p) for p in out["policies"]]
    return out


POLICY_COLUMNS = ["program", "policy", "executorch", "outcome", "methods wrong", "not checked"]


def policies_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per program and policy: the ExecuTorch releases that run the policy, the session's
    outcome, the methods (and sequences) that fail the gate, and what was not checked."""
    return pd.DataFrame(
        [
            {
                "program": label,
                "policy": v.policy,
                "executorch": _releases(v.policy),
                "outcome": v.outcome.value,
                "methods wrong": ", ".join(
                    [m.method for m in v.methods if m.outcome in BAD_OUTCOMES] + v.wrong_sequences
                ),
                "not checked": not_checked_text(v),
            }
            for label, v in labelled(verdicts, labels)
        ],
        columns=POLICY_COLUMNS,
    )
