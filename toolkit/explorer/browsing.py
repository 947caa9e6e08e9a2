"""Browsing a load's decisions, the Decisions tab's model: the filters and the rows they leave (culprits
first), the selected constant, its decision, its finding and its field-by-field comparison.

A mixin of :class:`toolkit.explorer.state.ExplorerState` (its ``session``, ``verdict``, ``rows``,
``selected`` and filter traits).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from toolkit.core.errors import InvalidChoiceError
from toolkit.core.verdict import ConstantFinding
from toolkit.display.cells import cell_text
from toolkit.display.content import content_check
from toolkit.explorer.findings import RUNS_ON_OTHER_DATA, finding_of, interest_rank

ALL = ""  # filter value meaning "no filter"
FILTERS = ("method", "decision", "reason")  # the Decisions tab's filters (state.filter_<key>)
DECISION_TABLE_COLUMNS = (
    "method",
    "name",
    "fqn",
    "lookup",
    "decision",
    "same_content",
    "data_problem",
    "culprit",
    "reason_code",
    "reason",
    "shared_from",
)


class BrowseMixin:
    """The Decisions tab's filters, rows and selection."""

    def filter_options(self) -> dict[str, list[str]]:
        if self.session is None:
            return {key: [] for key in FILTERS}
        d = self.session.decisions
        return {
            "method": [m.name for m in self.session.program.methods if m.name in set(d["method"])],
            "decision": sorted({cell_text(x) for x in d["decision"]}),
            "reason": sorted({cell_text(x) for x in d["reason_code"]}),
        }

    @property
    def filtered(self) -> bool:
        """Whether a filter is set (the Decisions tab's count says "(filtered)")."""
        return any((self.filter_method, self.filter_decision, self.filter_reason, self.culprits_only))

    @property
    def total_decisions(self) -> int:
        return len(self.session.decisions) if self.session is not None else 0

    def set_filters(
        self,
        *,
        method: str | None = None,
        decision: str | None = None,
        reason: str | None = None,
        culprits_only: bool | None = None,
    ) -> None:
        """Set filters (:data:`ALL`: none; ``culprits_only``: only the constants that run on other
        data); the rows follow, and the selection stays among them."""
        opts, chosen = self.filter_options(), {"method": method, "decision": decision, "reason": reason}
        for key, value in chosen.items():
            if value not in (None, ALL, *opts[key]):
                raise InvalidChoiceError(f"no {key} {value!r} in this load; choose one of {opts[key]}")
        with self.hold_trait_notifications():
            for key, value in chosen.items():
                if value is not None:
                    setattr(self, f"filter_{key}", value)
            if culprits_only is not None:
                self.culprits_only = bool(culprits_only)
            self.rows = self._filtered()
            keys = list(zip(self.rows["method"], self.rows["name"]))
            if self.selected not in keys:
                self.selected = keys[0] if keys else None

    def _filtered(self) -> pd.DataFrame:
        """The decisions under the filters (a new frame), with ``same_content`` (see ``content_check``),
        in :func:`interest_rank` order (culprits first), load order within a rank."""
        if self.session is None:
            return pd.DataFrame(columns=list(DECISION_TABLE_COLUMNS))
        d = self.session.decisions
        for column, value in (
            ("method", self.filter_method),
            ("decision", self.filter_decision),
            ("reason_code", self.filter_reason),
        ):
            if value:
                d = d[d[column].map(cell_text) == value]
        rank = interest_rank(d, self.verdict)
        if self.culprits_only:
            d, rank = d[rank <= RUNS_ON_OTHER_DATA], rank[rank <= RUNS_ON_OTHER_DATA]
        order = np.argsort(rank.to_numpy(), kind="stable")
        return content_check(d.iloc[order].reset_index(drop=True))

    def select(self, method: str | None, name: str | None) -> None:
        if method is not None and name is not None:
            d = self.session.decisions if self.session is not None else None
            if d is None or not ((d["method"] == method) & (d["name"] == name)).any():
                raise ValueError(f"no decided constant {name!r} in method {method!r}")
        self.selected = None if method is None or name is None else (method, name)

    def selected_decision(self) -> dict[str, Any] | None:
        """The selected constant's decision, with ``same_content``, enums as their values."""
        if self.selected is None or self.session is None:
            return None
        d = self.session.decisions
        row = content_check(d[(d["method"] == self.selected[0]) & (d["name"] == self.selected[1])])
        return {k: (v.value if hasattr(v, "value") else v) for k, v in row.iloc[0].to_dict().items()}

    def selected_finding(self) -> ConstantFinding | None:
        return finding_of(self.verdict, *self.selected) if self.selected is not None else None

    def content_verdict(self) -> tuple[str, str]:
        """(kind, sentence) on the selected constant.  One that runs on other data: its finding in
        the verdict, kind blame's status (``"culprit"``, ``"harmless"``, ``"not tested"``); else
        the content check: ``"caught"`` (differs, not shared), ``"same"``, or ``"none"`` (no cache entry)."""
        d = self.selected_decision()
        if d is None:
            return "none", ""
        f = self.selected_finding()
        if f is not None:
            runs_on = f"{f.shared_from}'s tensor" if f.shared_from else "other data than its own"
            blame = f"{f.blame.value}: {f.blame_note}" if f.blame_note else f.blame.value
            return f.blame.value, (
                f"{f.problem.value if f.problem else 'no known difference'}: {d['method']} runs "
                f"on {runs_on} ({f.evidence}); blame: {blame}"
            )
        same, owner = d.get("same_content"), cell_text(d.get("cached_method")) or "another method"
        if same is None or same is pd.NA:
            return "none", "no cache entry to compare with: this constant was not found in the cache"
        if not same:
            return "caught", (
                f"content differs: {cell_text(d['decision'])}, so the difference was caught; "
                f"{d['method']} keeps its own bytes (the content digests below disagree)"
            )
        return "same", f"same content: this constant and {owner}'s cached tensor have equal content digests"

    def selected_comparison(self) -> pd.DataFrame:
        """Field-by-field comparison (cached vs new) of the selected constant; empty if none was made."""
        cols = ["field", "cached", "new", "equal"]
        if self.selected is None or self.session is None:
            return pd.DataFrame(columns=cols)
        c = self.session.comparisons
        out = c[(c["method"] == self.selected[0]) & (c["name"] == self.selected[1])][cols].copy()
        out["field"] = out["field"].map(cell_text)
        return out.reset_index(drop=True)
