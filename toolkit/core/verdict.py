"""The verdict: which method ran wrong, why, and which constant made it so, computed once.

Pure data and pure functions (no torch, no pandas).  The loader classifies every decision
with :func:`find_problem` as it records it; :func:`build_verdict` turns one load's facts (its
method results, verification rows and blame experiments) into a :class:`Verdict`.  Every
surface (CLI and its exit code, CSV, comparison frames, the explorer, plots, HTML) reads a
verdict and decides nothing again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from toolkit.core.vocab import (
    BlameStatus,
    BlindSpot,
    CheckedAgainst,
    DataProblem,
    Decision,
    ExitCode,
    Members,
    MethodOutcome,
    MethodStatus,
    Stage,
)

_Decision = Members(Decision)  # read per constant by find_problem (vocab.Members says why)


# outcomes that make a load's result a failure (exit code 1)
BAD_OUTCOMES = frozenset(
    {
        MethodOutcome.WRONG,
        MethodOutcome.NOT_RUNNABLE,
        MethodOutcome.FAILED,
        MethodOutcome.REFUSED,
        MethodOutcome.NOT_REACHED,
    }
)


EXIT_CODE_MEANINGS = {
    ExitCode.OK: "every method verified ok (dry run: would run on its own data)",
    ExitCode.PROBLEM: "a load failed or was refused, or a method or sequence ran (would run) wrong or is not runnable",
    ExitCode.USAGE: "bad arguments, or a program that cannot be read",
    ExitCode.NOT_VERIFIED: "nothing wrong found, but some method had no reference (pass --reference)",
}
EXIT_CODE_TABLE = "\n".join(f"  {c.value}  {EXIT_CODE_MEANINGS[c]}" for c in ExitCode)


def find_problem(
    *,
    method: str,
    name: str,
    fqn: str,
    decision: Decision,
    digest: str,
    mutated: bool,
    storage: str,
    slot_problem: str,
    cached_method: str = "",
    cached_name: str = "",
    cached_digest: str = "",
    cached_mutated: bool = False,
    cached_storage: str = "",
) -> "ConstantFinding | None":
    """The one rule for "this constant runs on other data than its own" (None: it does not).

    ``cached_*`` describe the cache entry the method was given or checked against ("" when none)."""
    shared = decision is _Decision.SHARED
    source = f"{cached_method}/{cached_name}" if shared and cached_method else ""
    if decision is _Decision.NEVER_FILLED:
        return ConstantFinding(method, name, fqn, DataProblem.SLOT_NEVER_FILLED, slot_problem, source)
    if slot_problem:
        return ConstantFinding(method, name, fqn, DataProblem.SLOT_MISMATCH, slot_problem, source)
    if not shared:
        return None
    if cached_digest and cached_digest != digest:
        return ConstantFinding(
            method,
            name,
            fqn,
            DataProblem.CONTENT_DIFFERS,
            f"cached {cached_digest[:12]}... from {cached_method!r}, own {digest[:12]}...",
            source,
        )
    if (mutated or cached_mutated) and (not storage or storage != cached_storage):
        return ConstantFinding(
            method,
            name,
            fqn,
            DataProblem.STATE_LEAKED,
            f"state written by {cached_method!r}: another buffer of the eager program",
            source,
        )
    return None


@dataclass(frozen=True)
class ConstantFinding:
    """One constant of one method that runs (or would run) on other data, and what blame found."""

    method: str
    name: str
    fqn: str
    problem: DataProblem | None  # None: no difference is known, yet undoing the share fixed the method
    evidence: str  # one sentence: what differs
    shared_from: str = ""  # "method/name" of the tensor it runs on, "" when its own
    blame: BlameStatus = BlameStatus.NOT_TESTED
    blame_note: str = ""  # the verifications it breaks (culprit), or why it is harmless
    broken: tuple[str, ...] = ()  # verifications ("standalone", a sequence) blame found it to break


@dataclass(frozen=True)
class MethodVerdict:
    method: str
    outcome: MethodOutcome
    reason: str = ""
    stage: Stage | None = None  # where it failed (FAILED, REFUSED)
    # the oracle: "eager reference", "supplied reference", "unshared load, generated inputs" (or reference /
    # supplied inputs: toolkit.engine.verification's names), "prediction", ""
    checked_against: str = ""
    oracle_detail: str = ""  # how: the inputs it generated, the tolerance, the state model, what it cannot see


@dataclass(frozen=True)
class SequenceVerdict:
    sequence: str
    outcome: MethodOutcome  # OK, WRONG, FAILED (a step could not run), NO_REFERENCE
    first_bad_step: int | None = None
    reason: str = ""
    checked_against: str = ""  # as MethodVerdict's
    oracle_detail: str = ""


@dataclass(frozen=True)
class NotChecked:
    """One thing a verdict could not see, why, and how to check it: shown beside every "ok"."""

    subject: str  # what it concerns: a method, a sequence, or the constants named in ``reason``
    gap: BlindSpot
    reason: str  # one sentence: what was not checked and why
    how: str = ""  # how to check it (a real load, a sequence, a reference)


@dataclass(frozen=True)
class Verdict:
    """One load's (or one dry run's) answer; ``predicted``: a dry run, nothing ran."""

    program: str
    policy: str
    predicted: bool
    methods: tuple[MethodVerdict, ...]
    constants: tuple[ConstantFinding, ...] = ()
    sequences: tuple[SequenceVerdict, ...] = ()
    error: str = ""
    failed_stage: Stage | None = None
    not_checked: tuple[NotChecked, ...] = ()

    def _with(self, *outcomes: MethodOutcome) -> list[str]:
        return [m.method for m in self.methods if m.outcome in outcomes]

    @property
    def wrong_methods(self) -> list[str]:
        return self._with(MethodOutcome.WRONG)

    @property
    def not_runnable(self) -> list[str]:
        return self._with(MethodOutcome.NOT_RUNNABLE)

    @property
    def no_reference(self) -> list[str]:
        return self._with(MethodOutcome.NO_REFERENCE)

    @property
    def wrong_sequences(self) -> list[str]:
        return [s.sequence for s in self.sequences if s.outcome in BAD_OUTCOMES]

    @property
    def culprits(self) -> list[ConstantFinding]:
        return [c for c in self.constants if c.blame is BlameStatus.CULPRIT]

    def method(self, name: str) -> MethodVerdict:
        return next(m for m in self.methods if m.method == name)

    def findings(self, method: str) -> list[ConstantFinding]:
        return [c for c in self.constants if c.method == method]

    @property
    def outcome(self) -> MethodOutcome:
        """The session as one outcome: REFUSED or FAILED (the load), else WRONG (anything bad), else
        NO_REFERENCE (something unverified), else OK."""
        if self.failed_stage is Stage.EXPORT:
            return MethodOutcome.REFUSED
        if self.failed_stage is not None:
            return MethodOutcome.FAILED
        if any(m.outcome in BAD_OUTCOMES for m in self.methods) or self.wrong_sequences:
            return MethodOutcome.WRONG
        if self.no_reference or any(s.outcome is MethodOutcome.NO_REFERENCE for s in self.sequences):
            return MethodOutcome.NO_REFERENCE
        return MethodOutcome.OK

    @property
    def exit_code(self) -> ExitCode:
        o = self.outcome
        return (
            ExitCode.OK
            if o is MethodOutcome.OK
            else (ExitCode.NOT_VERIFIED if o is MethodOutcome.NO_REFERENCE else ExitCode.PROBLEM)
        )

    def gaps(self, method: str | None = None) -> str:
        """What was not checked, one cell of text: every gap, or those that concern ``method`` and the
        whole program ("" when nothing was left unchecked)."""
        return "; ".join(
            f"{n.gap.value} ({n.subject}): {n.reason}"
            for n in self.not_checked
            if method is None or n.subject in (method, "sequences")
        )

    def headline(self, name: str | None = None) -> str:
        """One line: the outcome and what is behind it (the methods of that outcome named once, then the
        others, the culprits, what was not checked); the program called ``name`` when given (what a
        view calls it), else by its own name."""
        head = f"{name or self.program!r} under {self.policy!r}{' (predicted)' if self.predicted else ''}: "
        parts = [head + self.outcome.value]
        if self.error:
            parts.append(f"{self.failed_stage.value if self.failed_stage else 'load'} failed: {self.error}")
        for label, names in (
            ("wrong", self.wrong_methods),
            ("not runnable", self.not_runnable),
            ("sequences wrong", self.wrong_sequences),
            ("no reference", self.no_reference),
        ):
            if not names:
                continue
            if label == self.outcome.value and len(parts) == 1:
                parts[0] += f": {', '.join(names)}"  # "wrong: prefill", not "wrong; wrong: prefill"
            else:
                parts.append(f"{label}: {', '.join(names)}")
        if self.culprits:
            parts.append("culprits: " + ", ".join(f"{c.method}/{c.name}" for c in self.culprits))
        if self.not_checked:
            parts.append("not checked: " + ", ".join(dict.fromkeys(g.gap.value for g in self.not_checked)))
        return "; ".join(parts)


# ------------------------------------------------------------------ building one


@dataclass(frozen=True)
class MethodFacts:
    """What the load did with one method, as the verdict needs it."""

    method: str
    status: MethodStatus
    runnable: bool
    problems: tuple[str, ...] = ()
    error: str = ""
    findings: tuple[ConstantFinding, ...] = ()


@dataclass(frozen=True)
class CheckRow:
    """One verification row (a method alone, or a sequence step): ``ok`` None where nothing was compared."""

    method: str
    ran: bool
    ok: bool | None
    reason: str = ""
    step: int | None = None
    oracle: str = ""  # what it was checked against ("" : the verdict's default)
    oracle_detail: str = ""


@dataclass(frozen=True)
class BlameRow:
    """One blame experiment: undoing ``name`` of ``method`` fixed verification ``label`` or not."""

    label: str  # "standalone" or a sequence's name
    method: str
    name: str
    fqn: str
    fixes: bool
    problem: DataProblem | None
    evidence: str
    shared_from: str = ""


STANDALONE = "standalone"


def ran_wrong(check: CheckRow) -> bool:
    """The one rule for a wrong output: it ran, and its outputs did not match."""
    return check.ran and check.ok is not True


def _method_verdict(
    f: MethodFacts, check: CheckRow | None, *, predicted: bool, failed_stage: Stage | None, oracle: str
) -> MethodVerdict:
    if f.status is MethodStatus.NOT_REACHED:
        return MethodVerdict(f.method, MethodOutcome.NOT_REACHED, "an earlier method failed the load first")
    if f.status is MethodStatus.FAILED:
        refused = failed_stage is Stage.EXPORT
        return MethodVerdict(
            f.method,
            MethodOutcome.REFUSED if refused else MethodOutcome.FAILED,
            f.error,
            Stage.EXPORT if refused else Stage.LOAD,
        )
    if not f.runnable:
        return MethodVerdict(f.method, MethodOutcome.NOT_RUNNABLE, "; ".join(f.problems))
    if predicted:
        bad = [c for c in f.findings if c.problem and c.problem.standalone]
        if bad:
            return MethodVerdict(
                f.method,
                MethodOutcome.WRONG,
                f"would run on other data: {bad[0].evidence}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                None,
                "prediction",
            )
        return MethodVerdict(f.method, MethodOutcome.OK, "", None, "prediction")
    if check is None:
        return MethodVerdict(f.method, MethodOutcome.NO_REFERENCE, "not verified")
    by = (check.oracle or oracle, check.oracle_detail)
    if ran_wrong(check):
        return MethodVerdict(f.method, MethodOutcome.WRONG, check.reason, None, *by)
    if check.ran:
        return MethodVerdict(f.method, MethodOutcome.OK, "", None, *by)
    if check.ok is None:
        return MethodVerdict(
            f.method, MethodOutcome.NO_REFERENCE, check.reason, None, check.oracle, check.oracle_detail
        )
    return MethodVerdict(f.method, MethodOutcome.FAILED, check.reason, Stage.RUN, *by)


def _sequence_verdict(name: str, steps: Sequence[CheckRow], oracle: str) -> SequenceVerdict:
    by = (steps[0].oracle or oracle, steps[0].oracle_detail) if steps else (oracle, "")
    for st in steps:
        if st.ran and not ran_wrong(st):
            continue
        i = st.step if st.step is not None else 0
        if ran_wrong(st):
            return SequenceVerdict(name, MethodOutcome.WRONG, i, f"step {i} ({st.method}): {st.reason}", *by)
        if st.ok is None:
            return SequenceVerdict(name, MethodOutcome.NO_REFERENCE, i, st.reason, *by)
        return SequenceVerdict(name, MethodOutcome.FAILED, i, f"step {i} ({st.method}): {st.reason}", *by)
    return SequenceVerdict(name, MethodOutcome.OK, None, "", *by)


def _with_blame(
    found: ConstantFinding, tried: list[BlameRow], verdicts: Mapping[str, MethodVerdict], explained: set[str]
) -> ConstantFinding:
    broken = tuple(dict.fromkeys(b.label for b in tried if b.fixes))
    if broken:
        return _replace(found, BlameStatus.CULPRIT, "breaks " + ", ".join(broken), broken)
    if tried and any(b.label in explained for b in tried):
        return _replace(found, BlameStatus.HARMLESS, "undoing it fixes nothing: the culprits are others")
    if tried:
        return _replace(found, BlameStatus.INCONCLUSIVE, "undoing it fixes nothing, and no share found explains it")
    v = verdicts.get(found.method)
    if (
        v is not None
        and v.outcome is MethodOutcome.OK
        and v.checked_against != "prediction"
        and found.problem is not None
        and found.problem.standalone
    ):
        return _replace(
            found, BlameStatus.HARMLESS, "the method verifies ok: the difference does not reach its outputs"
        )
    return found


def _replace(f: ConstantFinding, blame: BlameStatus, note: str, broken: tuple[str, ...] = ()) -> ConstantFinding:
    return dataclasses.replace(f, blame=blame, blame_note=note, broken=broken)


def build_verdict(
    *,
    program: str,
    policy: str,
    predicted: bool,
    methods: Sequence[MethodFacts],
    checks: Sequence[CheckRow] | None = None,
    sequences: Mapping[str, Sequence[CheckRow]] | None = None,
    blame: Sequence[BlameRow] = (),
    error: str = "",
    failed_stage: Stage | None = None,
    oracle: str = CheckedAgainst.EAGER,
    not_checked: Sequence[NotChecked] = (),
) -> Verdict:
    """The verdict of one load from its facts.  ``checks``: the standalone verification (None: not
    verified, or a dry run); ``sequences``: each verified sequence's steps; ``blame``: every
    experiment of ``session.blame()``, standalone or of a sequence."""
    by_method = {c.method: c for c in (checks or ())}
    verdicts = {
        f.method: _method_verdict(
            f, by_method.get(f.method), predicted=predicted, failed_stage=failed_stage, oracle=oracle
        )
        for f in methods
    }
    tried: dict[tuple[str, str, DataProblem | None], list[BlameRow]] = {}
    for b in blame:
        tried.setdefault((b.method, b.name, b.problem), []).append(b)
    explained = {b.label for b in blame if b.fixes}  # verifications blame found a culprit of
    found: list[ConstantFinding] = []
    seen: set[tuple[str, str, DataProblem | None]] = set()
    for f in methods:
        for c in f.findings:
            key = (c.method, c.name, c.problem)
            seen.add(key)
            found.append(_with_blame(c, tried.get(key, []), verdicts, explained))
    for key, rows in tried.items():  # what only an experiment shows: state kept apart, or a share that fixes
        if key not in seen and (key[2] is not None or any(b.fixes for b in rows)):
            b = rows[0]
            found.append(
                _with_blame(
                    ConstantFinding(b.method, b.name, b.fqn, b.problem, b.evidence, b.shared_from),
                    rows,
                    verdicts,
                    explained,
                )
            )
    sequence_verdicts = tuple(_sequence_verdict(n, s, oracle) for n, s in (sequences or {}).items())
    return Verdict(
        program,
        policy,
        predicted,
        tuple(verdicts.values()),
        tuple(found),
        sequence_verdicts,
        error,
        failed_stage,
        (*not_checked, *_unreferenced(verdicts.values(), sequence_verdicts)),
    )


def _unreferenced(methods: Iterable[MethodVerdict], sequences: Iterable[SequenceVerdict]) -> list[NotChecked]:
    """A blind spot for each method or sequence that had nothing to be compared against."""
    how = "pass --reference (a file of reference outputs), or --oracle generated to compare with an unshared load"
    return [
        NotChecked(getattr(v, "method", None) or v.sequence, BlindSpot.NO_REFERENCE, v.reason or "no reference", how)
        for v in [*methods, *sequences]
        if v.outcome is MethodOutcome.NO_REFERENCE
    ]


def verdict_from_dict(d: Mapping) -> Verdict:
    """The verdict :func:`dataclasses.asdict` gave, read back (e.g. from an isolated worker's JSON)."""

    def stage(s):
        return Stage(s) if s else None

    return Verdict(
        d["program"],
        d["policy"],
        d["predicted"],
        tuple(
            MethodVerdict(
                m["method"],
                MethodOutcome(m["outcome"]),
                m["reason"],
                stage(m["stage"]),
                m["checked_against"],
                m.get("oracle_detail", ""),
            )
            for m in d["methods"]
        ),
        tuple(
            ConstantFinding(
                **{
                    **c,
                    "problem": DataProblem(c["problem"]) if c["problem"] else None,
                    "blame": BlameStatus(c["blame"]),
                    "broken": tuple(c["broken"]),
                }
            )
            for c in d["constants"]
        ),
        tuple(
            SequenceVerdict(
                s["sequence"],
                MethodOutcome(s["outcome"]),
                s["first_bad_step"],
                s["reason"],
                s.get("checked_against", ""),
                s.get("oracle_detail", ""),
            )
            for s in d["sequences"]
        ),
        d["error"],
        stage(d["failed_stage"]),
        tuple(NotChecked(n["subject"], BlindSpot(n["gap"]), n["reason"], n["how"]) for n in d.get("not_checked", ())),
    )
