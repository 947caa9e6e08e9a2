"""Load one program under several policies, each with a fresh cache, and tabulate.

Every policy is loaded and verified once; the sessions are kept (closed: their device
memory is released, their tables and verification stay), so a notebook, the explorer or
the CLI can show any policy's decisions without loading it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

import toolkit.engine.session as session_module
from toolkit.core.model import Program
from toolkit.core.policies import POLICIES, get_policy
from toolkit.core.policies.releases import executorch_releases
from toolkit.core.verdict import Verdict
from toolkit.core.vocab import ExitCode, SessionStatus
from toolkit.engine.frames import decision_counts
from toolkit.engine.session import Session
from toolkit.sources import open_program

COMPARE_COLUMNS = [
    "policy",
    "executorch",
    "outcome",
    "loaded",
    "status",
    "stage",
    "error",
    "wrong_methods",
    "wrong_sequences",
    "no_reference",
    "not_runnable",
    "shared",
    "declined",
    "loaded_constants",
    "private",
    "refused",
    "device_bytes",
    "load_seconds",
    "not_checked",
]
# a dry run of every policy (compare_policies(dry_run=True)): nothing runs, so "wrong" is what the metadata shows
DRY_RUN_COMPARE_COLUMNS = [
    c for c in COMPARE_COLUMNS if c not in ("wrong_sequences", "no_reference", "load_seconds")
] + [
    "floor_bytes",
    "x_floor",
]


@dataclass
class PolicyComparison:
    """:attr:`frame` has one row per policy; :attr:`sessions` the (closed) session of each policy."""

    frame: pd.DataFrame
    sessions: dict[str, Session] = field(default_factory=dict, repr=False)

    def session(self, policy: str) -> Session:
        name = get_policy(policy).name.value
        if name not in self.sessions:
            raise KeyError(f"policy {name!r} was not compared; compared: {list(self.sessions)}")
        return self.sessions[name]

    def verdicts(self) -> dict[str, Verdict]:
        """Each policy's verdict (computed once per session)."""
        return {name: s.verdict() for name, s in self.sessions.items()}

    @property
    def exit_code(self) -> ExitCode:
        """The comparison as the CLI's exit code: the worst of the policies'."""
        return ExitCode.worst(v.exit_code for v in self.verdicts().values())

    def memory(self) -> pd.DataFrame:
        """One row per (policy, method): constant bytes that method's load put on its device."""
        from toolkit.engine.frames import memory_by_policy_frame

        return memory_by_policy_frame(self.sessions.values())

    def __repr__(self) -> str:
        return self.frame.to_string(index=False)

    def _repr_html_(self) -> str:
        from toolkit.display.tables import html_table

        return html_table(self.frame, max_rows=len(self.frame))


def decision_columns(decisions: pd.DataFrame) -> dict[str, int]:
    """The decision counts a comparison row shows (``loaded_constants``: decisions "loaded")."""
    counts = decision_counts(decisions)
    return {
        "shared": counts.get("shared", 0),
        "declined": counts.get("declined", 0),
        "loaded_constants": counts.get("loaded", 0),
        "private": counts.get("private", 0),
        "refused": counts.get("refused", 0),
    }


def policy_row(s: Session, v: Verdict) -> dict:
    """One policy's row from its session and verdict (a real load's or a dry run's: the same columns)."""
    return {
        "policy": s.policy.name.value,
        "executorch": executorch_releases(s.policy.name.value),
        "outcome": v.outcome.value,
        "loaded": s.load_outcome is SessionStatus.LOADED,
        "status": str(s.status),
        "stage": v.failed_stage.value if v.failed_stage else "",
        "error": v.error,
        "wrong_methods": v.wrong_methods,
        "wrong_sequences": v.wrong_sequences,
        "no_reference": v.no_reference,
        "not_runnable": v.not_runnable,
        **decision_columns(s.decisions),
        "device_bytes": s.device_bytes,
        "load_seconds": round(s.load_seconds, 4),
        "not_checked": v.gaps(),
    }


def compare_policies(
    program: "Program | str",
    policies: Iterable[str] | None = None,
    *,
    device: "str | Mapping[str, str] | None" = None,
    progress: bool = False,
    on_policy: Callable[[str, int, int], None] | None = None,
    references: "Mapping[str, Any] | None" = None,
    dry_run: bool = False,
) -> PolicyComparison:
    """Load and verify ``program`` once under each policy; one row per policy.

    ``dry_run=True`` predicts each instead (:func:`toolkit.dry_run`: no GPU, nothing loaded or
    run): the columns a prediction has, read from each dry run's verdict (``wrong_methods``:
    methods that would run on a shared constant whose content differs), plus ``floor_bytes``,
    the memory floor M (:func:`toolkit.memory_floor`), and ``x_floor``, ``device_bytes`` against
    it (NaN when nothing loads).  ``references`` and ``progress`` do not apply to it.

    The row reads each session's verdict (:meth:`Session.verdict`): ``outcome``, and
    ``wrong_methods`` (ran and disagreed with the reference), ``wrong_sequences``,
    ``not_runnable`` (blocked by the out-of-bounds guard), ``no_reference`` (nothing to compare
    against; ``references``: as for :meth:`Session.verify`, used for every policy).
    ``on_policy(name, i, n)`` is called before each load (for progress displays).
    """
    from toolkit.display.progress import progress_bar

    if dry_run:
        return _dry_run_comparison(program, policies, device=device, on_policy=on_policy)
    prog = open_program(program)
    names = [get_policy(p).name.value for p in (policies or POLICIES)]
    rows, sessions = [], {}
    for i, name in enumerate(progress_bar(names, enabled=progress, desc="comparing policies", unit="policy")):
        if on_policy is not None:
            on_policy(name, i, len(names))
        s = session_module.load_program(prog, name, device=device)  # looked up per call: tests patch it there
        try:
            if references is not None:
                s.verify(references=references)
            rows.append(policy_row(s, s.verdict()))
        finally:
            s.close()
        sessions[name] = s
    return PolicyComparison(pd.DataFrame(rows, columns=COMPARE_COLUMNS), sessions)


def _dry_run_comparison(
    program: "Program | str",
    policies: Iterable[str] | None,
    *,
    device: "str | Mapping[str, str] | None",
    on_policy: Callable[[str, int, int], None] | None,
) -> PolicyComparison:
    from toolkit.sources import read_program_model
    from toolkit.workflows.dry_run import dry_run, memory_floor

    prog = read_program_model(program)
    names = [get_policy(p).name.value for p in (policies or POLICIES)]
    floor = memory_floor(prog, device=device).total_bytes
    rows, sessions = [], {}
    for i, name in enumerate(names):
        if on_policy is not None:
            on_policy(name, i, len(names))
        s = dry_run(prog, name, device=device).session
        row = {k: v for k, v in policy_row(s, s.verdict()).items() if k in DRY_RUN_COMPARE_COLUMNS}
        loaded = s.status is SessionStatus.LOADED
        rows.append(
            {
                **row,
                "floor_bytes": floor,
                "x_floor": round(s.device_bytes / floor, 3) if loaded and floor else float("nan"),
            }
        )
        sessions[name] = s
    return PolicyComparison(pd.DataFrame(rows, columns=DRY_RUN_COMPARE_COLUMNS), sessions)
