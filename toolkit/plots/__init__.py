"""Plots of loads and policy comparisons (matplotlib, imported lazily).

Every function draws on the ``ax`` it is given (or on a fresh :class:`~matplotlib.figure.Figure`
it creates without touching pyplot's global state) and returns the Figure.  None of them
calls ``show()`` or saves a file, and none of them runs anything: whatever needs running
(``session.verify()``, :func:`toolkit.compare_policies`) is passed in.

Text that comes from the program (program, method and constant names) is escaped for
matplotlib (:func:`plain_text`): a ``$...$`` in a name is drawn as typed, never parsed as
mathtext.  Titles wrap to the figure instead of being cut; ``policy_tradeoff`` places its
labels when the figure is drawn (the layout is final then), clear of each other, of the
points and of the minimum marker.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from toolkit.core.vocab import Decision
from toolkit.display.html import DECISION_COLOURS, cell_text, content_check, culprit_mask, format_bytes
from toolkit.engine.frames import wrong_methods as _wrong_methods

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from toolkit.core.model import Program
    from toolkit.engine.session import Session

WRONG_COLOUR = "#cc0000"
CULPRIT_FACE = "#ea9999"  # a cell whose method runs on other data (its data_problem)
_DECISION_ORDER = [d.value for d in Decision]
_DECISION_LETTER = {"loaded": "L", "shared": "S", "declined": "D", "private": "P", "refused": "R", "never filled": "N"}
# Saturated variants of the table colours, for lines and markers (the table ones are pastel backgrounds).
_STRONG = {
    "loaded": "#6aa84f",
    "shared": "#3d85c6",
    "declined": "#f1c232",
    "private": "#999999",
    "refused": "#cc0000",
    "never filled": "#660000",
}
# past this many constants, the collision matrix keeps only the names more than one method holds
LARGE_MATRIX = 40
# and at most this many columns: the culprits first, then the other collisions that were not an
# honest share (declined, refused ...), then the rest, in load order within each group
MAX_MATRIX_COLUMNS = 120


def plain_text(text: Any) -> str:
    """``text`` as matplotlib should draw it literally: every ``$`` escaped, so a name
    like ``$x^2$`` is neither parsed as mathtext (an error for invalid TeX) nor typeset."""
    return cell_text(text).replace("$", "\\$")


def _axes(ax: "Axes | None", figsize: tuple[float, float]) -> tuple["Figure", "Axes"]:
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _title(ax: "Axes", text: str) -> None:
    """A title that wraps at the figure's edges rather than being cut."""
    ax.set_title(text, fontsize=10, wrap=True)


# ------------------------------------------------------------------ collision matrix


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
    # columns as lists, not rows as dicts: 10,000 decisions take milliseconds, not seconds
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
    decisions' ``data_problem``, :func:`toolkit.display.html.culprit_mask`)."""
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
        wrong = set(_wrong_methods(verification)) | set(wrong_methods)
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


def collision_matrix(
    session_or_decisions: "Session | pd.DataFrame",
    *,
    verification: pd.DataFrame | None = None,
    wrong_methods: Iterable[str] = (),
    only_colliding: bool | None = None,
    ax: "Axes | None" = None,
    title: str | None = None,
    name: str | None = None,
) -> "Figure":
    """Methods (rows, load order) x constant names (columns), each cell coloured by decision.

    A cell whose method **runs on other data** for that constant (the decisions'
    ``data_problem``: the suspect of a wrong output) is drawn red with a cross.  Methods whose
    output was wrong (a session's verdict; or ``verification`` rows that ran wrong, plus
    ``wrong_methods``) are labelled in red with a cross.  An empty cell: the method has no
    constant of that name (or its load never got there).  ``only_colliding`` keeps only the
    names that more than one method holds (the only ones sharing can touch); by default
    (None) that happens when there are more than :data:`LARGE_MATRIX` names.
    (:func:`interactive_collision_matrix` draws the same cells with plotly, each cell's
    decision and reason on hover; this one is for PNG export and print.)
    """
    from matplotlib.patches import Rectangle

    view = collision_matrix_view(
        session_or_decisions,
        verification=verification,
        wrong_methods=wrong_methods,
        only_colliding=only_colliding,
        name=name,
    )
    grid, culprits, wrong, default_title = view.grid, view.culprits, view.wrong, view.title
    n_rows, n_cols = grid.shape
    if n_cols > LONG_MATRIX:  # a row per name, grouped by layer, a column per method
        return _long_matrix(view, ax, title if title is not None else default_title)
    longest = max([len(_short(k)) for k in grid.columns] or [1])
    vertical = n_cols > 8
    label_in = longest * 8 * 0.62 / 72  # inches the longest name takes at 8 pt
    tilted = not vertical and n_cols > 1 and (n_cols > 3 or label_in > 0.45)  # names wider than a cell
    height = 1.4 + 0.45 * max(n_rows, 1) + (label_in if vertical else (0.71 * label_in if tilted else 0.3))
    fig, ax = _axes(ax, (min(3.5 + 0.32 * max(n_cols, 1) + (0 if vertical else 0.5 * label_in), 22.0), height))
    label_cells = n_cols <= 24
    for i, m in enumerate(grid.index):
        for j, k in enumerate(grid.columns):
            d = grid.iat[i, j]
            bad = (m, k) in culprits
            face = CULPRIT_FACE if bad else DECISION_COLOURS.get(d, "white")
            ax.add_patch(
                Rectangle(
                    (j, i),
                    1,
                    1,
                    facecolor=face,
                    edgecolor=WRONG_COLOUR if bad else "#888888",
                    linewidth=1.6 if bad else 0.6,
                    zorder=2 if bad else 1,
                )
            )
            if d and (label_cells or bad):
                letter = _DECISION_LETTER.get(d, d[:1].upper())
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    letter + ("\u2717" if bad else ""),
                    ha="center",
                    va="center",
                    fontsize=9 if label_cells else 7,
                    color="#7f0000" if bad else "#222222",
                    fontweight="bold" if bad else "normal",
                    zorder=3,
                )
        if m in wrong:
            ax.add_patch(
                Rectangle((0, i), max(n_cols, 1), 1, fill=False, edgecolor=WRONG_COLOUR, linewidth=2.0, zorder=4)
            )
    ax.set_xlim(0, max(n_cols, 1))
    ax.set_ylim(max(n_rows, 1), 0)
    ax.set_xticks([j + 0.5 for j in range(n_cols)])
    ax.set_xticklabels(
        [plain_text(_short(k)) for k in grid.columns],
        rotation=90 if vertical else 45 if tilted else 0,
        ha="right" if tilted else "center",
        rotation_mode="anchor" if tilted else "default",
        fontsize=8,
    )
    ax.set_yticks([i + 0.5 for i in range(n_rows)])
    ax.set_yticklabels([plain_text(f"\u2717 {m} (wrong)" if m in wrong else m) for m in grid.index])
    for lbl, m in zip(ax.get_yticklabels(), grid.index):
        if m in wrong:
            lbl.set_color(WRONG_COLOUR)
            lbl.set_fontweight("bold")
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    _matrix_legend(ax, view, letters=label_cells)
    _title(ax, plain_text(title if title is not None else default_title))
    if not n_cols:
        ax.text(0.5, 0.5, "no constants decided", ha="center", va="center", transform=ax.transAxes)
    return fig


def _matrix_legend(ax: "Axes", view: MatrixView, *, letters: bool) -> None:
    """The legend right of a matplotlib matrix: the decisions of some cell not drawn as a culprit
    (with their cell letters when the cells show them), the culprits' and the wrong outputs' marks."""
    from matplotlib.patches import Patch

    grid, culprits, wrong = view.grid, view.culprits, view.wrong
    cells = grid.to_numpy(dtype=object)
    bad = np.zeros(cells.shape, dtype=bool)
    rows, cols = {m: i for i, m in enumerate(grid.index)}, {k: j for j, k in enumerate(grid.columns)}
    for m, k in culprits:
        if m in rows and k in cols:
            bad[rows[m], cols[k]] = True
    present = [d for d in _DECISION_ORDER if ((cells == d) & ~bad).any()]
    handles = [
        Patch(facecolor=DECISION_COLOURS[d], edgecolor="#888888", label=f"{_DECISION_LETTER[d]} {d}" if letters else d)
        for d in present
    ]
    if bad.any():
        handles.append(
            Patch(facecolor=CULPRIT_FACE, edgecolor=WRONG_COLOUR, linewidth=1.6, label="\u2717 runs on other data")
        )
    if wrong:
        handles.append(Patch(facecolor="white", edgecolor=WRONG_COLOUR, linewidth=2, label="wrong output"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _long_matrix(view: MatrixView, ax: "Axes | None", title: str) -> "Figure":
    """A long matrix (more than :data:`LONG_MATRIX` names) drawn readably: a row per name, grouped
    by layer under a grey header row each (:func:`long_rows`), a column per method (labelled on
    top, a wrong one red), the decision's letter in every cell; labels at :data:`LONG_LABEL_PT`."""
    from matplotlib.patches import Rectangle

    grid, culprits, wrong = view.grid, view.culprits, view.wrong
    methods, keys = [cell_text(m) for m in grid.index], [cell_text(k) for k in grid.columns]
    rows = long_rows(keys)
    n_rows, n_cols = len(rows), len(methods)
    label_in = max(len(label) for label, _j in rows) * LONG_LABEL_PT * 0.62 / 72
    method_in = max(len(m) + (10 if m in wrong else 0) for m in methods) * 9 * 0.62 / 72
    column_in = max(0.6, min(method_in + 0.15, 1.6))
    fig, ax = _axes(ax, (min(0.6 + label_in + column_in * n_cols + 2.0, 22.0), 1.3 + LONG_ROW_IN * n_rows))
    cells = grid.to_numpy(dtype=object)
    for r, (_label, j) in enumerate(rows):
        if j is None:  # a group's header row
            ax.add_patch(Rectangle((0, r), n_cols, 1, facecolor="#eeeeee", edgecolor="none"))
            continue
        for i, m in enumerate(methods):
            d, bad = cells[i, j], (m, keys[j]) in culprits
            ax.add_patch(
                Rectangle(
                    (i, r),
                    1,
                    1,
                    facecolor=CULPRIT_FACE if bad else DECISION_COLOURS.get(d, "white"),
                    edgecolor=WRONG_COLOUR if bad else "#888888",
                    linewidth=1.4 if bad else 0.5,
                    zorder=2 if bad else 1,
                )
            )
            if d:
                ax.text(
                    i + 0.5,
                    r + 0.5,
                    _DECISION_LETTER.get(d, d[:1].upper()) + ("\u2717" if bad else ""),
                    ha="center",
                    va="center",
                    fontsize=LONG_LABEL_PT - 1,
                    color="#7f0000" if bad else "#222222",
                    fontweight="bold" if bad else "normal",
                    zorder=3,
                )
    for i, m in enumerate(methods):
        if m in wrong:
            ax.add_patch(Rectangle((i, 0), 1, n_rows, fill=False, edgecolor=WRONG_COLOUR, linewidth=2.0, zorder=4))
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)
    ax.xaxis.tick_top()
    ax.set_xticks([i + 0.5 for i in range(n_cols)])
    ax.set_xticklabels([plain_text(f"\u2717 {m} (wrong)" if m in wrong else m) for m in methods], fontsize=9)
    for lbl, m in zip(ax.get_xticklabels(), methods):
        if m in wrong:
            lbl.set_color(WRONG_COLOUR)
            lbl.set_fontweight("bold")
    ax.set_yticks([r + 0.5 for r in range(n_rows)])
    ax.set_yticklabels([plain_text(label) for label, _j in rows], fontsize=LONG_LABEL_PT)
    for lbl, (_label, j) in zip(ax.get_yticklabels(), rows):
        if j is None:
            lbl.set_fontweight("bold")
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    _matrix_legend(ax, view, letters=True)
    _title(ax, plain_text(title))
    return fig


def _short(key: str, width: int = 48) -> str:
    return key if len(key) <= width else "\u2026" + key[-(width - 1) :]


# ------------------------------------------------------------------ the interactive matrix (plotly)

_ABSENT = "absent"
_CULPRIT = "culprit"
_CATEGORIES = [_ABSENT] + _DECISION_ORDER + [_CULPRIT]
_CATEGORY_FACE = {_ABSENT: "#ffffff", **DECISION_COLOURS, _CULPRIT: CULPRIT_FACE}
PLOTLY_MIME = "application/vnd.plotly.v1+json"
MAX_PLOTLY_WIDTH = 980  # px: fits a notebook output area (1008 px at a 1440 px window) and the explorer
_HOVER_WIDTH = 72  # characters per line of a hover label
HOVER_ROOM = 470  # px kept right of a narrow matrix for its hover label (72 characters at 12 px)
MODEBAR_WIDTH = 260  # px: plotly's toolbar, top right, that a title must not run under


def plotly_text(text: Any) -> str:
    """``text`` as plotly should draw it literally: ``&``, ``<`` and ``>`` as entities (plotly
    reads a subset of HTML in labels and hover text), and a leading ``$`` kept from being
    typeset as LaTeX (plotly typesets a label that begins and ends with ``$``)."""
    out = html.escape(cell_text(text), quote=False)
    return "\u200b" + out if out.startswith("$") else out


def _hover_lines(text: str, prefix: str) -> list[str]:
    lines = textwrap.wrap(cell_text(text), _HOVER_WIDTH - len(prefix)) or [""]
    return [plotly_text(prefix) + plotly_text(lines[0])] + ["&nbsp;&nbsp;" + plotly_text(x) for x in lines[1:]]


def _cell_hover(method: str, key: str, row: Mapping[str, Any] | None, culprit: bool, wrong: bool) -> str:
    """The hover text of one matrix cell: which constant, its decision, and why."""
    head = f"<b>{plotly_text(method)} / {plotly_text(_short(key, _HOVER_WIDTH))}</b>"
    if row is None:
        return head + f"<br>{plotly_text(method)} has no constant of this name"
    decision = cell_text(row.get("decision"))
    lines = [head]
    name = cell_text(row.get("name"))
    if name and name != key:
        lines.append("internal name: " + plotly_text(name))
    lines.append(
        "decision: <b>"
        + plotly_text(decision)
        + "</b>"
        + (f" \u2717 <b>{plotly_text(cell_text(row.get('data_problem')))}</b>: runs on other data" if culprit else "")
    )
    code, reason = cell_text(row.get("reason_code")), cell_text(row.get("reason"))
    if code:
        lines.append("reason: <b>" + plotly_text(code) + "</b>")
    if reason and reason != code:
        lines += _hover_lines(reason, "")
    same = row.get("same_content")
    if same is not None and same is not pd.NA and not (isinstance(same, float) and same != same):
        lines.append("same content as the cached tensor: " + ("yes" if bool(same) else "<b>NO</b>"))
    if cell_text(row.get("shared_from")):
        lines += _hover_lines(row.get("shared_from"), "runs on: ")
    blamed = cell_text(row.get("culprit"))
    if blamed:
        lines.append("blame: sharing it breaks <b>" + plotly_text(blamed) + "</b>")
    if wrong:
        lines.append("<b>this method's output is WRONG</b>")
    return "<br>".join(lines)


def _unique_labels(keys: Sequence[str]) -> list[str]:
    """Shortened keys as axis categories, made unique (plotly merges equal categories)."""
    out, seen = [], set()
    for k in keys:
        label, n = _short(k), 1
        while label in seen:
            n += 1
            label = f"{_short(k, 44)} ({n})"
        seen.add(label)
        out.append(label)
    return out


GROUP_COLUMNS = 24  # a matrix of more names than this is grouped by layer
_LAYER = re.compile(r"^(.*?[._]\d+)[._](.+)$")  # the name up to its first index ("model.layers.3"), the rest


def layer_groups(keys: Sequence[str]) -> tuple[list[int], list[str], list[str]] | None:
    """Matrix columns grouped by layer: (the column order, contiguous by group in order of first
    appearance; each column's group; each column's label within it), from each name up to its
    first numeric part (``model.layers.3`` of ``model.layers.3.mlp.up.weight``, label
    ``mlp.up.weight``); names without one are grouped as "other".  None when grouping would not
    help (fewer than 2 groups, or nearly one name per group)."""
    parts = [(m.group(1), m.group(2)) if (m := _LAYER.match(k)) else ("other", k) for k in keys]
    first: dict[str, int] = {}
    for g, _leaf in parts:
        first.setdefault(g, len(first))
    if not 2 <= len(first) <= len(keys) / 2:
        return None
    order = sorted(range(len(keys)), key=lambda j: first[parts[j][0]])
    return order, [parts[j][0] for j in order], [parts[j][1] for j in order]


_FIRST_INDEX = re.compile(r"^(\D*?)(\d+)(.*)$")  # a name's text before its first number, the number, the rest
LONG_MATRIX = 64  # past this many names, a matrix is drawn long: a row per name, grouped, a column per method
LONG_ROW_PX = 16  # px per row of a long plotly matrix (its labels at 10 px)
LONG_ROW_IN = 0.2  # inches per row of a long matplotlib matrix (its labels at 8 pt)
LONG_LABEL_PT = 8
METHOD_LABEL_PX = 28  # px above a long plotly matrix's cells for its method labels (the legend above them)


def stem_groups(keys: Sequence[str]) -> tuple[list[int], list[str], list[str]] | None:
    """Matrix names grouped by what they are a layer of, every layer together: the group the name
    with its first number as ``<i>`` up to it (``model.layers.<i>`` of ``model.layers.3.mlp.weight``,
    ``_tensor_constant<i>`` of ``_tensor_constant7``), the label the name from that number on
    (``3.mlp.weight``; a name ending in its number keeps its whole name); names without a number
    are "other".  The same shape as :func:`layer_groups`; None when fewer than 2 groups."""
    parts = []
    for k in keys:
        m = _FIRST_INDEX.match(k)
        if m is None:
            parts.append(("other", k))
        else:
            head, number, rest = m.groups()
            parts.append((f"{head}<i>", f"{number}{rest}" if rest else k))
    first: dict[str, int] = {}
    for g, _leaf in parts:
        first.setdefault(g, len(first))
    if len(first) < 2:
        return None
    order = sorted(range(len(keys)), key=lambda j: first[parts[j][0]])
    return order, [parts[j][0] for j in order], [parts[j][1] for j in order]


def matrix_groups(keys: Sequence[str]) -> tuple[list[int], list[str], list[str]] | None:
    """How a long matrix groups its names: by layer (:func:`layer_groups`) where that helps, else by
    the layers' stem (:func:`stem_groups`), else None."""
    return layer_groups(keys) or stem_groups(keys)


def long_rows(keys: Sequence[str]) -> list[tuple[str, int | None]]:
    """The rows of a long matrix (a row per name): per group (:func:`matrix_groups`) a header row
    ``(group, None)``, then its names ``(label, index of the name in keys)``, the label what follows
    the group (never cut: a name is shortened only past 48 characters, from its start)."""
    grouped = matrix_groups(keys)
    if grouped is None:
        return [(_short(k), j) for j, k in enumerate(keys)]
    order, groups, leaves = grouped
    rows: list[tuple[str, int | None]] = []
    for g in dict.fromkeys(groups):
        rows.append((g, None))
        rows += [(_short(leaf), order[i]) for i, (gg, leaf) in enumerate(zip(groups, leaves)) if gg == g]
    return rows


def interactive_collision_matrix(
    session_or_decisions: "Session | pd.DataFrame",
    *,
    verification: pd.DataFrame | None = None,
    wrong_methods: Iterable[str] = (),
    only_colliding: bool | None = None,
    title: str | None = None,
    name: str | None = None,
):
    """The collision matrix as a plotly figure: the same cells as :func:`collision_matrix`
    (same colours, culprits red with a cross, wrong methods labelled red, only the colliding
    names of a large program), and **hovering a cell shows its decision and reason** (with the
    content check, what it runs on and blame's verdict where known).

    Returns a ``plotly.graph_objects.Figure``: a notebook shows it through plotly's JupyterLab
    renderer (shipped in the plotly wheel, no server extension); :func:`plotly_bundle` gives
    the display data the explorer puts in its Output widget.  For a PNG, use
    :func:`collision_matrix` (matplotlib).  Past :data:`GROUP_COLUMNS` names, the columns are
    grouped by layer (:func:`layer_groups`): the layer once, horizontally, under its columns,
    each column labelled by the rest of its name.
    """
    import plotly.graph_objects as go

    view = collision_matrix_view(
        session_or_decisions,
        verification=verification,
        wrong_methods=wrong_methods,
        only_colliding=only_colliding,
        name=name,
    )
    grid = view.grid
    methods, keys = [cell_text(m) for m in grid.index], [cell_text(k) for k in grid.columns]
    if len(keys) > LONG_MATRIX:  # a row per name, grouped, a column per method
        return _long_interactive(view, title if title is not None else view.title)
    grouped = layer_groups(keys) if len(keys) > GROUP_COLUMNS else None
    if grouped is not None:
        order, groups, leaves = grouped
        keys, grid = [keys[j] for j in order], grid.iloc[:, order]
        labels = []  # unique within a layer (the (layer, label) pairs are the categories)
        for g in dict.fromkeys(groups):
            labels += _unique_labels([leaf for gg, leaf in zip(groups, leaves) if gg == g])
        labels = [plotly_text(x) for x in labels]
        x_values: Any = [[plotly_text(g) for g in groups], labels]
    else:
        labels = [plotly_text(x) for x in _unique_labels(keys)]  # categories are drawn as plotly text: escaped
        x_values = labels
    n_rows, n_cols = len(methods), len(keys)
    letters = n_cols <= 24
    longest = max([len(x) for x in labels] or [1])
    vertical = n_cols > 8 or longest * n_cols > 90
    cell = max(6.0, min(48.0, (MAX_PLOTLY_WIDTH - 200) / max(n_cols, 1)))
    marks = letters or cell >= 14  # room for the culprit's cross in its cell
    index = {c: i for i, c in enumerate(_CATEGORIES)}
    z, text, hover = [], [], []
    used: set[str] = set()
    for i, m in enumerate(methods):
        zr, tr, hr = [], [], []
        for j, k in enumerate(keys):
            d = grid.iat[i, j]
            bad = (m, k) in view.culprits
            cat = _CULPRIT if bad else (d if d in index else _ABSENT)
            used.add(cat)
            zr.append(index[cat])
            tr.append(
                (_DECISION_LETTER.get(d, d[:1].upper()) + "\u2717" if bad else _DECISION_LETTER.get(d, d[:1].upper()))
                if d and (letters or (bad and marks))
                else ""
            )
            hr.append(_cell_hover(m, k, view.rows.get((m, k)), bad, m in view.wrong))
        z.append(zr), text.append(tr), hover.append(hr)
    n = len(_CATEGORIES)
    fig = go.Figure()
    if n_cols:
        # meta: each cell's method and internal name (a click on a cell says which constant it is)
        names = [[cell_text((view.rows.get((m, k)) or {}).get("name")) for k in keys] for m in methods]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=x_values,
                y=methods,
                text=text,
                texttemplate="%{text}",
                meta={"methods": methods, "names": names},
                textfont={"size": 11 if letters else 9, "color": "#222222"},
                customdata=hover,
                hovertemplate="%{customdata}<extra></extra>",
                colorscale=_plotly_scale(),
                zmin=-0.5,
                zmax=n - 0.5,
                showscale=False,
                xgap=1,
                ygap=1,
                hoverongaps=False,
                name="decisions",
                showlegend=False,
            )
        )
    _plotly_legend(fig, used)
    for i, m in enumerate(methods):
        if m in view.wrong and n_cols:
            fig.add_shape(
                type="rect",
                x0=-0.5,
                x1=n_cols - 0.5,
                y0=i - 0.5,
                y1=i + 0.5,
                xref="x",
                yref="y",
                line={"color": WRONG_COLOUR, "width": 2.5},
                fillcolor="rgba(0,0,0,0)",
                layer="above",
            )
    ticktext = [
        f"<span style='color:{WRONG_COLOUR}'><b>\u2717 {plotly_text(m)} (wrong)</b></span>"
        if m in view.wrong
        else plotly_text(m)
        for m in methods
    ]
    label_px = (min(longest, 48) * 6.2 + 10) if vertical else 24
    longest_method = max([len(m) + (10 if m in view.wrong else 0) for m in methods] or [1])
    cells_width = cell * max(n_cols, 1) + 7.5 * longest_method + 40
    # room on the right for the hover label, so it opens beside a narrow matrix instead of over it
    room = int(max(0, min(HOVER_ROOM, MAX_PLOTLY_WIDTH - cells_width)))
    width = int(min(max(cells_width + room, 460), MAX_PLOTLY_WIDTH))
    shown_title = title if title is not None else view.title
    # the title wraps short of plotly's toolbar (top right, shown on hover)
    title_text, top = _plotly_title(shown_title, width)
    height = int(top + 34 * max(n_rows, 1) + label_px + 20 + (24 if grouped is not None else 0))
    fig.update_layout(
        **_plotly_frame(title_text, width, height, {"l": 10, "r": 10 + room, "t": top, "b": 10}),
        xaxis={
            "tickangle": -90 if vertical else 0,
            "automargin": True,
            "showgrid": False,
            "ticks": "",
            "tickfont": {"size": 10 if cell >= 12 else 9},
            "zeroline": False,
            **(
                {"type": "multicategory", "dividercolor": "#999999", "dividerwidth": 1}
                if grouped is not None
                else {"type": "category", "categoryorder": "array", "categoryarray": labels}
            ),
        },
        yaxis={
            "type": "category",
            "autorange": "reversed",
            "automargin": True,
            "showgrid": False,
            "ticks": "",
            "tickmode": "array",
            "tickvals": methods,
            "ticktext": ticktext,
            "tickfont": {"size": 12},
            "zeroline": False,
        },
    )
    if not n_cols:
        fig.add_annotation(text="no constants decided", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    return fig


def _plotly_scale() -> list[list[Any]]:
    """The heatmap's colour scale: a band of its colour per :data:`_CATEGORIES` entry (z is the index)."""
    n, scale = len(_CATEGORIES), []
    for i, c in enumerate(_CATEGORIES):
        scale += [[i / n, _CATEGORY_FACE[c]], [(i + 1) / n, _CATEGORY_FACE[c]]]
    return scale


def _plotly_legend(fig, used: set[str]) -> None:
    """A legend entry (a square of its colour) per category some cell shows, absent ones aside."""
    import plotly.graph_objects as go

    legend = {_CULPRIT: "\u2717 runs on other data", _ABSENT: "no such constant"}
    for c in _CATEGORIES:
        if c in used and c != _ABSENT:
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="markers",
                    hoverinfo="skip",
                    showlegend=True,
                    name=legend.get(c, f"{_DECISION_LETTER.get(c, '')} {c}".strip()),
                    marker={
                        "symbol": "square",
                        "size": 13,
                        "color": _CATEGORY_FACE[c],
                        "line": {
                            "color": WRONG_COLOUR if c == _CULPRIT else "#888888",
                            "width": 1.5 if c == _CULPRIT else 0.8,
                        },
                    },
                )
            )


def _plotly_title(title: str, width: int) -> tuple[str, int]:
    """The title wrapped short of plotly's toolbar (top right, shown on hover), and the top margin
    it and the legend (one row above the cells) need."""
    lines = textwrap.wrap(cell_text(title), max(30, (width - 40 - MODEBAR_WIDTH) // 7)) or [""]
    return "<br>".join(plotly_text(x) for x in lines), 34 + 17 * len(lines) + 26


def _plotly_frame(title_text: str, width: int, height: int, margin: dict[str, int]) -> dict[str, Any]:
    """A matrix figure's layout but its axes: title, size, white background, legend on top, hover label."""
    return dict(
        title={
            "text": title_text,
            "font": {"size": 13},
            "x": 0.01,
            "xanchor": "left",
            "y": 1.0,
            "yanchor": "top",
            "pad": {"t": 8},
        },
        width=width,
        height=height,
        plot_bgcolor="#ffffff",
        paper_bgcolor="#ffffff",
        template="none",
        margin=margin,
        legend={"orientation": "h", "x": 0.0, "y": 1.0, "xanchor": "left", "yanchor": "bottom", "font": {"size": 11}},
        hoverlabel={"bgcolor": "#ffffff", "font": {"size": 12, "color": "#222222"}, "align": "left"},
    )


def _long_interactive(view: MatrixView, title: str):
    """The plotly matrix of more than :data:`LONG_MATRIX` names, drawn readably: a row per name
    (y: the row's number, labelled by :func:`long_rows`: a bold header per layer group, then each
    name after its group), a column per method (labelled on top, a wrong one red and framed), the
    decision's letter in every cell, :data:`LONG_ROW_PX` per row; a header row is a gap (no hover,
    no click).  ``meta``: ``long`` True, ``rows`` each row's index into ``names``' columns (-1: a
    header), ``methods`` and ``names`` as in the wide matrix."""
    import plotly.graph_objects as go

    grid = view.grid
    methods, keys = [cell_text(m) for m in grid.index], [cell_text(k) for k in grid.columns]
    rows = long_rows(keys)
    index = {c: i for i, c in enumerate(_CATEGORIES)}
    cells = grid.to_numpy(dtype=object)
    z, text, hover, used = [], [], [], set()
    for _label, j in rows:
        if j is None:
            z.append([None] * len(methods)), text.append([""] * len(methods)), hover.append([""] * len(methods))
            continue
        zr, tr, hr = [], [], []
        for i, m in enumerate(methods):
            d, bad = cells[i, j], (m, keys[j]) in view.culprits
            cat = _CULPRIT if bad else (d if d in index else _ABSENT)
            used.add(cat)
            zr.append(index[cat])
            tr.append(_DECISION_LETTER.get(d, d[:1].upper()) + ("\u2717" if bad else "") if d else "")
            hr.append(_cell_hover(m, keys[j], view.rows.get((m, keys[j])), bad, m in view.wrong))
        z.append(zr), text.append(tr), hover.append(hr)
    ticktext = [f"<b>{plotly_text(label)}</b>" if j is None else plotly_text(label) for label, j in rows]
    columns = [
        f"<span style='color:{WRONG_COLOUR}'><b>\u2717 {plotly_text(m)} (wrong)</b></span>"
        if m in view.wrong
        else plotly_text(m)
        for m in methods
    ]
    names = [[cell_text((view.rows.get((m, k)) or {}).get("name")) for k in keys] for m in methods]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=methods,
            y=list(range(len(rows))),
            text=text,
            texttemplate="%{text}",
            meta={
                "long": True,
                "methods": methods,
                "names": names,
                "rows": [-1 if j is None else j for _label, j in rows],
            },
            textfont={"size": 10, "color": "#222222"},
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            colorscale=_plotly_scale(),
            zmin=-0.5,
            zmax=len(_CATEGORIES) - 0.5,
            showscale=False,
            xgap=1,
            ygap=1,
            hoverongaps=False,
            name="decisions",
            showlegend=False,
        )
    )
    _plotly_legend(fig, used)
    for i, m in enumerate(methods):
        if m in view.wrong:
            fig.add_shape(
                type="rect",
                x0=i - 0.5,
                x1=i + 0.5,
                y0=-0.5,
                y1=len(rows) - 0.5,
                xref="x",
                yref="y",
                line={"color": WRONG_COLOUR, "width": 2.5},
                fillcolor="rgba(0,0,0,0)",
                layer="above",
            )
    label_px = max(len(label) for label, _j in rows) * 6.2 + 16
    column_px = max(70, min(160, max(len(m) + (10 if m in view.wrong else 0) for m in methods) * 7.5 + 12))
    width = int(min(MAX_PLOTLY_WIDTH, max(460, label_px + column_px * len(methods) + HOVER_ROOM)))
    room = int(max(0, min(HOVER_ROOM, width - label_px - column_px * len(methods))))
    title_text, top = _plotly_title(title, width)
    top += METHOD_LABEL_PX  # the method labels, on top, between the cells and the legend
    fig.update_layout(
        **_plotly_frame(
            title_text, width, int(top + LONG_ROW_PX * len(rows) + 20), {"l": 10, "r": 10 + room, "t": top, "b": 10}
        ),
        xaxis={
            "type": "category",
            "side": "top",
            "showgrid": False,
            "ticks": "",
            "zeroline": False,
            "automargin": True,
            "tickmode": "array",
            "tickvals": methods,
            "ticktext": columns,
            "tickfont": {"size": 12},
        },
        yaxis={
            "autorange": "reversed",
            "automargin": True,
            "showgrid": False,
            "ticks": "",
            "zeroline": False,
            "tickmode": "array",
            "tickvals": list(range(len(rows))),
            "ticktext": ticktext,
            "tickfont": {"size": 10},
        },
    )
    fig.update_layout(legend={"y": 1.0 + METHOD_LABEL_PX / (LONG_ROW_PX * len(rows))})  # above the method labels
    return fig


def plotly_bundle(fig) -> dict[str, Any]:
    """A plotly figure as notebook display data (plotly's own mime type, plain JSON, a text
    fallback): what an ipywidgets ``Output`` shows through plotly's JupyterLab renderer."""
    import json

    return {PLOTLY_MIME: json.loads(fig.to_json()), "text/plain": f"<plotly figure: {fig.layout.title.text or ''}>"}


# ------------------------------------------------------------------ memory


def minimum_device_bytes(program: "Program") -> int:
    """Constant bytes a perfect loader needs: the memory floor M of :func:`toolkit.workflows.dry_run.memory_floor`
    (each distinct content once per device, plus one copy per method of every mutated buffer)."""
    from toolkit.workflows.dry_run import memory_floor

    return memory_floor(program).total_bytes


def _as_sessions(sessions: "Session | Mapping[str, Session] | Sequence[Session]") -> list["Session"]:
    if isinstance(sessions, Mapping):
        return list(sessions.values())
    if isinstance(sessions, (list, tuple)):
        return list(sessions)
    return [sessions]  # one Session


def memory_frame(sessions: "Session | Mapping[str, Session] | Sequence[Session]") -> pd.DataFrame:
    """One row per (policy, method): constant bytes that method's load put on its device."""
    from toolkit.engine.frames import memory_by_policy_frame

    return memory_by_policy_frame(_as_sessions(sessions))


def memory_by_policy(
    sessions: "Session | Mapping[str, Session] | Sequence[Session] | pd.DataFrame",
    *,
    ax: "Axes | None" = None,
    minimum: int | None = None,
    title: str | None = None,
) -> "Figure":
    """Stacked bars: constant bytes per method, one bar per policy, against the minimum a
    perfect loader would need (dashed line).

    ``sessions`` are loads of one program, or a :func:`memory_frame` of them (then pass
    ``minimum`` yourself; with sessions it defaults to :func:`minimum_device_bytes`).
    """
    sessions = getattr(sessions, "sessions", sessions)  # a PolicyComparison: its sessions
    if isinstance(sessions, pd.DataFrame):
        frame, program_name, floor = sessions, None, minimum
        status = {p: "loaded" if g["loaded"].all() else "failed" for p, g in frame.groupby("policy", sort=False)}
    else:
        ss = _as_sessions(sessions)
        if not ss:
            raise ValueError("memory_by_policy needs at least one session")
        frame, program_name = memory_frame(ss), ss[0].program.name
        floor = minimum if minimum is not None else minimum_device_bytes(ss[0].program)
        status = {s.policy.name.value: getattr(s, "load_outcome", s.status) for s in ss}  # kept after close
    labels = list(dict.fromkeys(frame["policy"]))
    methods = list(dict.fromkeys(frame["method"]))
    fig, ax = _axes(ax, (max(6.5, 1.1 * len(labels) + 4.0), 3.8))
    cmap = _method_colours(methods)
    bottoms = [0.0] * len(labels)
    for m in methods:
        vals = [float(frame[(frame["policy"] == p) & (frame["method"] == m)]["device_bytes"].sum()) for p in labels]
        ax.bar(
            range(len(labels)), vals, bottom=bottoms, color=cmap[m], edgecolor="white", label=plain_text(m), width=0.65
        )
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, (p, total) in enumerate(zip(labels, bottoms)):
        st = status.get(p, "loaded")
        note = format_bytes(total) + ("" if st == "loaded" else f"\n({st})")
        # on a white ground: the dashed minimum line may pass right behind it
        ax.text(
            i,
            total,
            note,
            ha="center",
            va="bottom",
            fontsize=8,
            zorder=5,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
        )
    if floor is not None:
        ax.axhline(
            floor,
            color="#444444",
            linestyle="--",
            linewidth=1.2,
            label=f"minimum (unique content): {format_bytes(floor)}",
        )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(
        [plain_text(x) for x in labels],
        rotation=30 if len(labels) > 3 else 0,
        ha="right" if len(labels) > 3 else "center",
        fontsize=8,
    )
    ax.set_ylabel("constant bytes on device")
    top = max(bottoms + [floor or 0]) or 1
    ax.set_ylim(0, top * 1.3)
    _bytes_axis(ax.yaxis, top * 1.3)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    default = (
        f"{program_name}: device memory per method and policy"
        if program_name
        else "device memory per method and policy"
    )
    _title(ax, plain_text(title if title is not None else default))
    return fig


def _bytes_axis(axis, top: float) -> None:
    """Ticks at binary-round byte counts (1, 2, 4 ... KiB) with readable labels."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    step = 2.0 ** max(0, math.ceil(math.log2(max(top, 1.0) / 6.0)))
    axis.set_major_locator(MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(v)))


def _method_colours(methods: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


# ------------------------------------------------------------------ timeline

MIN_SPAN_FRACTION = 0.005  # of the time axis: the narrowest a timed step is drawn
TICK_WIDTH = 2.0  # points: a decision's tick
# event kind -> (label, colour) for events that carry a duration ("seconds")
_SPANS = {
    "container_created": ("create container", "#8e7cc3"),
    "blob_uploaded": ("upload whole blob", "#e69138"),
    "constant_uploaded": ("upload one constant", "#45818e"),
}


def event_timeline(
    session_or_events: "Session | pd.DataFrame",
    *,
    ax: "Axes | None" = None,
    title: str | None = None,
    predicted: bool | None = None,
) -> "Figure":
    """Which method did which step when, and for how long.

    One row per method: a light bar spans the whole method load, coloured bars the timed
    steps (container creation, blob upload, per-constant uploads), and thin ticks the
    decisions, coloured like the collision matrix, each kind of decision in a lane of its
    own (so a burst of decisions reads as a strip, not a blob); the legend counts them.  A
    failed method is marked with a cross.  A timed step is drawn at least
    :data:`MIN_SPAN_FRACTION` of the axis wide (a 2 ms blob upload in a 2 s load is still seen).
    ``predicted`` (default: a session whose runtime cannot run, a dry run): the axis says the
    times are the analysis's, nothing was loaded.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if isinstance(session_or_events, pd.DataFrame):
        ev, default_title = session_or_events, "load timeline"
    else:
        ev = session_or_events.events
        if predicted is None:
            predicted = not session_or_events.runtime.can_run
        what = "dry run (predicted) timeline" if predicted else "load timeline"
        default_title = f"{session_or_events.program.name}: {what} ({session_or_events.policy.name.value})"
    methods = list(dict.fromkeys(ev["method"])) if len(ev) else []
    fig, ax = _axes(ax, (8.0, 1.6 + 0.7 * max(len(methods), 1)))
    y = {m: i for i, m in enumerate(methods)}
    end_s = float(ev["time_s"].max()) if len(ev) else 0.0
    scale, unit = (1000.0, "ms") if end_s < 1.0 else (1.0, "s")
    min_span = end_s * scale * MIN_SPAN_FRACTION
    decided = ev[ev["kind"] == "decided"] if len(ev) and "decision" in ev else ev.iloc[:0]
    kinds = [d for d in _DECISION_ORDER if d in set(decided["decision"].astype(str))] if len(decided) else []
    # lanes of the decision ticks inside a method's row, one per kind present
    lane = {d: (-0.3 + 0.6 * (k + 0.5) / len(kinds)) for k, d in enumerate(kinds)}
    lane_height = min(0.6 / max(len(kinds), 1), 0.3)
    starts = {}
    ticks: dict[str, tuple[list[float], list[float]]] = {}
    used = [c for c in ("kind", "method", "time_s", "seconds", "decision") if c in ev.columns]
    for r in ev[used].to_dict("records"):  # only the columns read: 10,000 decisions stay fast
        kind, m, t = r["kind"], r["method"], float(r["time_s"]) * scale
        if kind == "load_started":
            starts[m] = t
        elif kind == "method_loaded" or kind == "load_failed":
            t0 = starts.get(m, t)
            ax.broken_barh(
                [(t0, max(t - t0, 1e-9))], (y[m] - 0.4, 0.8), facecolors="#eeeeee", edgecolor="#bbbbbb", zorder=1
            )
            if kind == "load_failed":
                ax.plot([t], [y[m]], marker="X", color=WRONG_COLOUR, markersize=10, linestyle="none", zorder=4)
        elif kind in _SPANS:
            secs = float(r.get("seconds") or 0.0) * scale
            ax.broken_barh(
                [(t - secs, max(secs, min_span, 1e-9))], (y[m] - 0.25, 0.5), facecolors=_SPANS[kind][1], zorder=2
            )
        elif kind == "decided":
            d = str(r.get("decision"))
            xs, ys = ticks.setdefault(d, ([], []))
            xs.append(t)
            ys.append(y[m] + lane.get(d, 0.0))
    marker_pts = 72 * lane_height * (fig.get_figheight() - 1.6) / max(len(methods), 1) * 0.9
    for d, (xs, ys) in ticks.items():
        ax.plot(
            xs,
            ys,
            marker="|",
            markersize=max(4.0, min(marker_pts, 12.0)),
            markeredgewidth=TICK_WIDTH,
            linestyle="none",
            color=_STRONG.get(d, "black"),
            zorder=3,
        )
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels([plain_text(m) for m in methods])
    ax.set_ylim(len(methods) - 0.4 if methods else 1, -0.6)
    ax.set_xlabel(
        f"time into the dry run's analysis ({unit}): a prediction, nothing was loaded or run"
        if predicted
        else f"time since the load began ({unit})"
    )
    ax.set_xlim(left=0)
    kinds_seen = set(ev["kind"]) if len(ev) else set()
    handles = [Patch(facecolor="#eeeeee", edgecolor="#bbbbbb", label="method load")]
    handles += [Patch(facecolor=c, label=lbl) for k, (lbl, c) in _SPANS.items() if k in kinds_seen]
    handles += [
        Line2D(
            [],
            [],
            marker="|",
            markersize=9,
            markeredgewidth=1.5,
            linestyle="none",
            color=_STRONG[d],
            label=f"decided: {d} ({len(ticks[d][0])})",
        )
        for d in kinds
    ]
    if "load_failed" in kinds_seen:
        handles.append(Line2D([], [], marker="X", linestyle="none", color=WRONG_COLOUR, label="load failed"))
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _title(ax, plain_text(title if title is not None else default_title))
    return fig


# ------------------------------------------------------------------ policy comparison


def _count(v: Any) -> int:
    if isinstance(v, (list, tuple, set, frozenset)):
        return len(v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return 0
    text = str(v).strip("[]() ")
    return len([x for x in text.split(",") if x.strip()]) if text else 0


# label offsets (points) tried in turn: right, above/below right, left, above/below left,
# straight above / below; then the same farther out
_OFFSETS = [
    (8, 0, "left", "center"),
    (6, 7, "left", "bottom"),
    (6, -7, "left", "top"),
    (-8, 0, "right", "center"),
    (-6, 7, "right", "bottom"),
    (-6, -7, "right", "top"),
    (0, 9, "center", "bottom"),
    (0, -9, "center", "top"),
]
_CANDIDATES = [(dx * k, dy * k, ha, va) for k in (1, 2, 3, 4.5) for dx, dy, ha, va in _OFFSETS]


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _move(ann, dx: float, dy: float, ha: str, va: str) -> None:
    ann.xyann = (dx, dy)
    ann.set_horizontalalignment(ha)
    ann.set_verticalalignment(va)


def _label_placer():
    """An artist that places the point labels of a policy_tradeoff plot when it is drawn.

    Drawn before them (lowest zorder) once the figure's layout is final, it moves each label
    to the first offset around its point whose box stays inside the axes and clear of the
    labels placed so far, of every point marker, of the fixed texts (the minimum marker's
    label) and of the minimum line; if none is clear, to the one overlapping least.
    """
    from matplotlib.artist import Artist
    from matplotlib.transforms import Bbox

    class LabelPlacer(Artist):
        def __init__(self, labels, points, fixed, lines, marker_pts):
            super().__init__()
            self.labels, self.points, self.fixed, self.lines = labels, points, fixed, lines
            self.marker_pts = marker_pts
            self.set_zorder(-1e9)

        def draw(self, renderer):
            ax = self.axes
            px = renderer.points_to_pixels(1.0)
            frame = ax.get_window_extent(renderer)
            r = self.marker_pts * px
            obstacles = [t.get_window_extent(renderer) for t in self.fixed if t.get_text()]
            for x in self.lines:
                x_px = ax.transData.transform((x, 0))[0]
                obstacles.append(Bbox.from_extents(x_px - 1.5 * px, frame.y0, x_px + 1.5 * px, frame.y1))
            markers = []
            for x, y in self.points:
                cx, cy = ax.transData.transform((x, y))
                markers.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
            placed: list = []
            for ann in self.labels:
                best, best_cost = None, None
                for dx, dy, ha, va in _CANDIDATES:
                    _move(ann, dx, dy, ha, va)
                    box = ann.get_window_extent(renderer)
                    outside = (max(frame.x0 - box.x0, 0) + max(box.x1 - frame.x1, 0)) * box.height + (
                        max(frame.y0 - box.y0, 0) + max(box.y1 - frame.y1, 0)
                    ) * box.width
                    cost = outside * 4 + sum(_overlap(box, o) for o in placed + obstacles + markers)
                    if best_cost is None or cost < best_cost:
                        best, best_cost = (dx, dy, ha, va), cost
                    if cost == 0:
                        break
                _move(ann, *best)
                placed.append(ann.get_window_extent(renderer))

    return LabelPlacer


def policy_tradeoff(
    comparison: "pd.DataFrame | Any", *, ax: "Axes | None" = None, minimum: int | None = None, title: str | None = None
) -> "Figure":
    """Correctness vs memory, one point per policy (:func:`toolkit.compare_policies`' result or its frame).

    x: constant bytes on the device; y: methods whose output is wrong or that cannot run.
    Policies landing on the same point share one label.  A failed load (refused) is drawn
    hollow: it is safe, but the program does not load.  ``minimum`` draws the
    perfect-loader floor (:func:`minimum_device_bytes`) as a dashed line labelled at the
    top.  Labels are placed when the figure is drawn, clear of each other, of the points
    and of the minimum marker.
    """
    comparison = getattr(comparison, "frame", comparison)  # a PolicyComparison, or its frame
    fig, ax = _axes(ax, (7.0, 4.2))
    pts: dict[tuple[float, int, bool], list[str]] = {}
    for r in comparison.to_dict("records"):
        bad = _count(r.get("wrong_methods")) + _count(r.get("not_runnable"))
        key = (float(r["device_bytes"]), bad, bool(r["loaded"]))
        pts.setdefault(key, []).append(str(r["policy"]))
    labels = []
    marker_size = 90  # points^2
    for (x, bad, loaded), names in sorted(pts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        colour = "#3d85c6" if bad == 0 and loaded else (WRONG_COLOUR if bad else "#999999")
        ax.scatter(
            [x], [bad], s=marker_size, zorder=3, color=colour if loaded else "white", edgecolors=colour, linewidths=2
        )
        label = "\n".join(plain_text(n) for n in names) + ("" if loaded else "\n(load refused)")
        labels.append(
            ax.annotate(
                label,
                (x, bad),
                textcoords="offset points",
                xytext=(8, 0),
                fontsize=8,
                va="center",
                ha="left",
                zorder=4,
                annotation_clip=False,
            )
        )
    fixed = []
    if minimum is not None:
        ax.axvline(minimum, color="#444444", linestyle="--", linewidth=1.0)
        fixed.append(
            ax.annotate(
                f"minimum {format_bytes(minimum)}",
                (minimum, 1.0),
                xycoords=("data", "axes fraction"),
                textcoords="offset points",
                xytext=(4, -4),
                ha="left",
                va="top",
                fontsize=8,
                color="#444444",
            )
        )
    ys = [k[1] for k in pts] or [0]
    ax.set_ylim(-0.9, max(ys) + 1.1)
    ax.set_yticks(range(0, max(ys) + 1))
    xs = [k[0] for k in pts] + ([minimum] if minimum is not None else [])
    hi = max(xs) if xs else 1.0
    ax.set_xlim(0, hi * 1.5 if hi else 1.0)
    _bytes_axis(ax.xaxis, hi * 1.5 if hi else 1.0)
    ax.set_xlabel("constant bytes on device (lower is better)")
    ax.set_ylabel("methods wrong or not runnable\n(lower is better)")
    ax.grid(True, alpha=0.3)
    _title(ax, plain_text(title if title is not None else "correctness vs memory, one point per policy"))
    placer = _label_placer()(
        labels,
        [(k[0], k[1]) for k in pts],
        fixed,
        [minimum] if minimum is not None else [],
        math.sqrt(marker_size) / 2 + 1,
    )
    ax.add_artist(placer)
    return fig


def figure_png(fig: "Figure", dpi: int = 100) -> bytes:
    """The figure rendered as PNG bytes (for widgets and tests); writes no file."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
