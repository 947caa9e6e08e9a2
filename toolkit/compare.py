"""Load one program under several policies, each with a fresh cache, and tabulate.

Every policy is loaded and verified once; the sessions are kept (closed: their device
memory is released, their tables and verification stay), so a notebook, the explorer or
the CLI can show any policy's decisions without loading it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from .loader import Session, load_program
from .model import Program
from .policies import POLICIES, get_policy
from .sources import open_program
from .tables import decision_counts, wrong_methods

COMPARE_COLUMNS = [
    "policy", "loaded", "status", "error", "wrong_methods", "wrong_sequences", "no_reference", "not_runnable",
    "shared", "declined", "loaded_constants", "private", "refused", "device_bytes", "load_seconds",
]
# a dry run of every policy (predict_policies): nothing runs, so "wrong" is what the metadata shows
PREDICT_COLUMNS = [
    "policy", "status", "stage", "error", "runs_on_other_data", "not_runnable", "shared", "declined",
    "loaded_constants", "private", "refused", "device_bytes", "floor_bytes", "x_floor",
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

    def memory(self) -> pd.DataFrame:
        """One row per (policy, method): constant bytes that method's load put on its device."""
        from .tables import memory_by_policy_frame

        return memory_by_policy_frame(self.sessions.values())

    def __repr__(self) -> str:
        return self.frame.to_string(index=False)

    def _repr_html_(self) -> str:
        from .rendering import html_table

        return html_table(self.frame, max_rows=len(self.frame))


def decision_columns(decisions: pd.DataFrame) -> dict[str, int]:
    """The decision counts a comparison row shows (``loaded_constants``: decisions "loaded")."""
    counts = decision_counts(decisions)
    return {"shared": counts.get("shared", 0), "declined": counts.get("declined", 0),
            "loaded_constants": counts.get("loaded", 0), "private": counts.get("private", 0),
            "refused": counts.get("refused", 0)}


def policy_row(s: Session, *, wrong_methods: list[str], wrong_sequences: list[str],
               no_reference: list[str]) -> dict:
    """One policy's row from a session and what its outputs were found (or predicted) to be."""
    row = {
        "policy": s.policy.name.value, "loaded": s.status == "loaded", "status": str(s.status),
        "error": s.error or "", "wrong_methods": wrong_methods, "wrong_sequences": wrong_sequences,
        "no_reference": no_reference,
        "not_runnable": [r.method for r in s.results.values() if r.status in ("loaded", "unloaded")
                         and not r.runnable],
        **decision_columns(s.decisions), "device_bytes": s.device_bytes, "load_seconds": round(s.load_seconds, 4),
    }
    return {k: row[k] for k in COMPARE_COLUMNS}


def comparison_row(s: Session, verification: pd.DataFrame) -> dict:
    """One policy's row; ``wrong_sequences``: the program's sequences that diverge from eager."""
    return policy_row(
        s, wrong_methods=wrong_methods(verification),
        wrong_sequences=[q.name for q in s.program.sequences
                         if s.load_outcome == "loaded" and not s.verify(sequence=q.name)["ok"].all()],
        # not run: nothing to compare against (pd.NA in the verification), neither ok nor wrong
        no_reference=verification[verification["ok"].isna()]["method"].tolist())


def compare_policies(program: "Program | str", policies: Iterable[str] | None = None, *,
                     device: "str | Mapping[str, str] | None" = None, progress: bool = False,
                     on_policy: Callable[[str, int, int], None] | None = None,
                     references: "Mapping[str, Any] | None" = None) -> PolicyComparison:
    """Load and verify ``program`` once under each policy; one row per policy.

    ``wrong_methods`` lists methods that ran and disagreed with the eager reference;
    ``not_runnable`` those blocked by the out-of-bounds guard; ``no_reference`` those with
    nothing to compare against (``references``: as for :meth:`Session.verify`, used for every
    policy).  ``on_policy(name, i, n)`` is called before each load (for progress displays).
    """
    from tqdm.auto import tqdm

    prog = open_program(program)
    names = [get_policy(p).name.value for p in (policies or POLICIES)]
    rows, sessions = [], {}
    for i, name in enumerate(tqdm(names, desc="comparing policies", disable=not progress)):
        if on_policy is not None:
            on_policy(name, i, len(names))
        s = load_program(prog, name, device=device)
        try:
            rows.append(comparison_row(s, s.verify(references=references)))
        finally:
            s.close()
        sessions[name] = s
    return PolicyComparison(pd.DataFrame(rows, columns=COMPARE_COLUMNS), sessions)


def suspect_methods(decisions: pd.DataFrame) -> list[str]:
    """Methods a load would run on a shared constant whose content digest differs from their own
    (what a dry run can see of a silent corruption), in the order they appear."""
    if not len(decisions):
        return []
    d = decisions
    bad = d[(d["decision"] == "shared") & (d["cached_digest"] != "") & (d["cached_digest"] != d["digest"])]
    return list(dict.fromkeys(bad["method"]))


def predict_policies(program: "Program | str", policies: Iterable[str] | None = None, *,
                     device: "str | Mapping[str, str] | None" = None) -> PolicyComparison:
    """Every policy's dry run of ``program`` (no GPU, nothing loaded or run): one row per policy.

    ``status`` / ``stage`` / ``error``: the predicted outcome ("failed" at stage "load", or at
    "export" where the modelled exporter refuses the program); ``runs_on_other_data``: methods
    that would run on a shared constant whose content differs (``not_runnable`` ones, which the
    out-of-bounds guard keeps from running, left out); the decision counts;
    ``device_bytes`` the constant bytes the load would hold; ``floor_bytes`` the memory floor
    M (:func:`toolkit.memory_floor`) and ``x_floor`` their ratio (NaN when nothing loads).
    :attr:`PolicyComparison.sessions` holds the dry-run sessions (their tables).
    """
    from .analysis import memory_floor, run_analysis
    from .sources import read_program_model

    prog = read_program_model(program)
    names = [get_policy(p).name.value for p in (policies or POLICIES)]
    floor = memory_floor(prog, device=device).total_bytes
    rows, sessions = [], {}
    for name in names:
        a = run_analysis(prog, name, device=device)
        s = a.session
        d = s.decisions
        loaded = s.status == "loaded"
        blocked = [r.method for r in s.results.values() if r.status == "loaded" and not r.runnable]
        rows.append({
            "policy": name, "status": str(s.status), "stage": s.failed_stage or "", "error": s.error or "",
            # a method the out-of-bounds guard blocks does not run at all
            "runs_on_other_data": [m for m in suspect_methods(d) if m not in blocked],
            "not_runnable": blocked, **decision_columns(d), "device_bytes": s.device_bytes, "floor_bytes": floor,
            "x_floor": round(s.device_bytes / floor, 3) if loaded and floor else float("nan"),
        })
        sessions[name] = s
    return PolicyComparison(pd.DataFrame(rows, columns=PREDICT_COLUMNS), sessions)
