"""What a collision matrix shows, whichever library draws it: the grid of decisions (methods x
constant names), the culprit cells, the wrong methods, and which names a large program keeps.

:func:`toolkit.plots.matrix.collision_matrix` (matplotlib) and
:func:`toolkit.plots.interactive.interactive_collision_matrix` (plotly) both draw a
:class:`MatrixView`, so the two show the same cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from toolkit.core.vocab import Decision
from toolkit.display.cells import cell_text
from toolkit.display.content import content_check, culprit_mask
from toolkit.engine.frames import wrong_methods as wrong_methods_of

if TYPE_CHECKING:
    from toolkit.engine.session import Session

DECISION_ORDER = [d.value for d in Decision]
# the letter a matrix cell shows for its decision
DECISION_LETTERS: dict[Decision, str] = {
    Decision.LOADED: "L",
    Decision.SHARED: "S",
    Decision.DECLINED: "D",
    Decision.PRIVATE: "P",
    Decision.REFUSED: "R",
    Decision.NEVER_FILLED: "N",
}
# past this many constants, the collision matrix keeps only the names more than one method holds
LARGE_MATRIX = 40
# and at most this many columns: the culprits first, then the other collisions that were not an
# honest share (declined, refused ...), then the rest, in load order within each group
MAX_MATRIX_COLUMNS = 120
LONG_MATRIX = 64  # past this many names, a matrix is drawn long: a row per name, grouped, a column per method


def _key(r: Mapping[str, Any]) -> str:
    return cell_text(r.get("fqn")) or cell_text(r.get("name"))


def _keys(decisions: pd.DataFrame) -> list[str]:
    """Each decision row's matrix key (:func:`_key`), in row order."""
    if not len(decisions):
        return []
    names = decisions["name"].tolist() if "name" in decisions.columns else [""] * len(decisions)
    fqns = decisions["fqn"].tolist() if "fqn" in decisions.columns else [""] * len(decisions)
    return [cell_text(f) or cell_text(n) for f, n in zip(fqns, names)]


def collision_matrix_data(decisions: pd.DataFrame, method_order: Sequence[str] | None = None) -> pd.DataFrame:
    """methods x constant keys (FQN, or internal name when there is none) -> decision, "" if absent.

    Columns are in order of first appearance, so the first method's constants come first.
    """
    if method_order is None:
        method_order = list(dict.fromkeys(decisions["method"])) if len(decisions) else []
    keys: dict[str, None] = {}
    cells: dict[tuple[str, str], str] = {}
    # columns as lists, not rows as dicts: a dict per row is slow for a program of many constants
    for method, key, decision in zip(
        decisions["method"].tolist(), _keys(decisions), decisions["decision"].tolist() if len(decisions) else []
    ):
        keys.setdefault(key, None)
        cells[(method, key)] = str(getattr(decision, "value", decision))
    data = [[cells.get((m, k), "") for k in keys] for m in method_order]
    keys = list(keys)
    return pd.DataFrame(
        data, index=pd.Index(list(method_order), name="method"), columns=pd.Index(keys, name="constant")
    )


def culprit_cells(decisions: pd.DataFrame) -> set[tuple[str, str]]:
    """(method, constant key) of every constant its method runs on other data for (the
    decisions' ``data_problem``, :func:`toolkit.display.content.culprit_mask`)."""
    if not len(decisions):
        return set()
    return {(cell_text(r["method"]), _key(r)) for r in decisions[culprit_mask(decisions)].to_dict("records")}


@dataclass
class MatrixView:
    """What a collision matrix shows (matplotlib's and plotly's alike): the grid of decisions
    (methods x constant keys, "" where absent) after the large-program selection, the culprit
    cells, the wrong methods, the default title, and each shown cell's decision row."""

    grid: pd.DataFrame
    culprits: set[tuple[str, str]]
    wrong: set[str]
    title: str
    total: int  # constant keys before the selection
    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def collision_matrix_view(
    session_or_decisions: "Session | pd.DataFrame",
    *,
    verification: pd.DataFrame | None = None,
    wrong_methods: Iterable[str] = (),
    only_colliding: bool | None = None,
    name: str | None = None,
) -> MatrixView:
    """The selection both collision matrices draw: with more than :data:`LARGE_MATRIX` names
    (or ``only_colliding=True``) only the names more than one method holds; past
    :data:`MAX_MATRIX_COLUMNS` of those, the culprits first, then the collisions not shared as
    equal, then the rest, in load order within each group.  ``name``: what the title calls the
    program (default: its own name)."""
    if isinstance(session_or_decisions, pd.DataFrame):
        decisions, order, default_title = session_or_decisions, None, "constant decisions"
    else:
        s = session_or_decisions
        decisions = s.decisions
        order = [m.name for m in s.program.methods]
        default_title = f"{name or s.program.name}: {s.policy.name.value}"
    if verification is not None or wrong_methods or isinstance(session_or_decisions, pd.DataFrame):
        wrong = set(wrong_methods_of(verification)) | set(wrong_methods)
    else:  # a session's own verdict
        wrong = set(session_or_decisions.verdict().wrong_methods)
    culprits = culprit_cells(decisions)
    grid = collision_matrix_data(decisions, order)
    total = grid.shape[1]
    if only_colliding is None:
        only_colliding = total > LARGE_MATRIX
    # the selection on a numpy array (a frame of thousands of columns is slow to compare)
    cells = grid.to_numpy(dtype=object)
    keep = list(range(total))
    if only_colliding:
        keep = [int(j) for j in np.flatnonzero((cells != "").sum(axis=0) > 1)]
    if len(keep) > MAX_MATRIX_COLUMNS:
        bad_keys = {k for _m, k in culprits}
        sub = cells[:, keep]
        other = (~np.isin(sub, ["", "shared", "loaded"])).any(axis=0).tolist()  # declined, refused ...
        rank = [0 if grid.columns[j] in bad_keys else (1 if o else 2) for j, o in zip(keep, other)]
        chosen = sorted(sorted(range(len(rank)), key=lambda i: rank[i])[:MAX_MATRIX_COLUMNS])
        keep = [keep[i] for i in chosen]
        default_title += (
            f" ({len(keep):,} of {total:,} names: the culprits first, then the other "
            f"collisions not shared as equal; every decision is in session.decisions)"
        )
    elif len(keep) < total:
        default_title += f" ({len(keep)} of {total} names: those more than one method holds)"
    if len(keep) < total:
        grid = grid.iloc[:, keep]
    shown = set(grid.columns)
    rows = {}
    if len(decisions):  # the rows of the cells shown only (at most methods x MAX_MATRIX_COLUMNS)
        keys = _keys(decisions)
        picked = decisions[[k in shown for k in keys]]
        picked = content_check(picked) if "digest" in picked.columns else picked
        for r, k in zip(picked.to_dict("records"), [k for k in keys if k in shown]):
            rows[(cell_text(r["method"]), k)] = r
    return MatrixView(grid, culprits, wrong, default_title, total, rows)
