"""The collision matrix with matplotlib: methods x constant names, each cell coloured by decision, for
PNG export and print.

Past :data:`~toolkit.plots.matrix_view.LONG_MATRIX` names it is drawn long: a row per name,
grouped by layer, a column per method.  :mod:`toolkit.plots.interactive` draws the same cells
with plotly, each cell's decision and reason on hover.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np
import pandas as pd

from toolkit.display.cells import cell_text
from toolkit.display.palette import (
    BAND,
    CELL_EDGE,
    CULPRIT_FACE,
    CULPRIT_INK,
    DECISION_COLOURS,
    INK,
    PAPER,
    WRONG_MARK,
)
from toolkit.plots.figure import figure_and_axes, plain_text, short_key, wrapped_title
from toolkit.plots.groups import long_rows
from toolkit.plots.matrix_view import DECISION_LETTERS, DECISION_ORDER, LONG_MATRIX, MatrixView, collision_matrix_view

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from toolkit.engine.session import Session

LONG_ROW_IN = 0.2  # inches per row of a long matrix (its labels at 8 pt)
LONG_LABEL_PT = 8


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
    (None) that happens when there are more than :data:`~toolkit.plots.matrix_view.LARGE_MATRIX` names.
    (:func:`~toolkit.plots.interactive.interactive_collision_matrix` draws the same cells with plotly, each cell's
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
    longest = max([len(short_key(k)) for k in grid.columns] or [1])
    vertical = n_cols > 8
    label_in = longest * 8 * 0.62 / 72  # inches the longest name takes at 8 pt
    tilted = not vertical and n_cols > 1 and (n_cols > 3 or label_in > 0.45)  # names wider than a cell
    height = 1.4 + 0.45 * max(n_rows, 1) + (label_in if vertical else (0.71 * label_in if tilted else 0.3))
    fig, ax = figure_and_axes(
        ax, (min(3.5 + 0.32 * max(n_cols, 1) + (0 if vertical else 0.5 * label_in), 22.0), height)
    )
    label_cells = n_cols <= 24
    for i, m in enumerate(grid.index):
        for j, k in enumerate(grid.columns):
            d = grid.iat[i, j]
            bad = (m, k) in culprits
            face = CULPRIT_FACE if bad else DECISION_COLOURS.get(d, PAPER)
            ax.add_patch(
                Rectangle(
                    (j, i),
                    1,
                    1,
                    facecolor=face,
                    edgecolor=WRONG_MARK if bad else CELL_EDGE,
                    linewidth=1.6 if bad else 0.6,
                    zorder=2 if bad else 1,
                )
            )
            if d and (label_cells or bad):
                letter = DECISION_LETTERS.get(d, d[:1].upper())
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    letter + ("\u2717" if bad else ""),
                    ha="center",
                    va="center",
                    fontsize=9 if label_cells else 7,
                    color=CULPRIT_INK if bad else INK,
                    fontweight="bold" if bad else "normal",
                    zorder=3,
                )
        if m in wrong:
            ax.add_patch(
                Rectangle((0, i), max(n_cols, 1), 1, fill=False, edgecolor=WRONG_MARK, linewidth=2.0, zorder=4)
            )
    ax.set_xlim(0, max(n_cols, 1))
    ax.set_ylim(max(n_rows, 1), 0)
    ax.set_xticks([j + 0.5 for j in range(n_cols)])
    ax.set_xticklabels(
        [plain_text(short_key(k)) for k in grid.columns],
        rotation=90 if vertical else 45 if tilted else 0,
        ha="right" if tilted else "center",
        rotation_mode="anchor" if tilted else "default",
        fontsize=8,
    )
    ax.set_yticks([i + 0.5 for i in range(n_rows)])
    ax.set_yticklabels([plain_text(f"\u2717 {m} (wrong)" if m in wrong else m) for m in grid.index])
    for lbl, m in zip(ax.get_yticklabels(), grid.index):
        if m in wrong:
            lbl.set_color(WRONG_MARK)
            lbl.set_fontweight("bold")
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    _matrix_legend(ax, view, letters=label_cells)
    wrapped_title(ax, plain_text(title if title is not None else default_title))
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
    present = [d for d in DECISION_ORDER if ((cells == d) & ~bad).any()]
    handles = [
        Patch(facecolor=DECISION_COLOURS[d], edgecolor=CELL_EDGE, label=f"{DECISION_LETTERS[d]} {d}" if letters else d)
        for d in present
    ]
    if bad.any():
        handles.append(
            Patch(facecolor=CULPRIT_FACE, edgecolor=WRONG_MARK, linewidth=1.6, label="\u2717 runs on other data")
        )
    if wrong:
        handles.append(Patch(facecolor=PAPER, edgecolor=WRONG_MARK, linewidth=2, label="wrong output"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _long_matrix(view: MatrixView, ax: "Axes | None", title: str) -> "Figure":
    """A long matrix (more than :data:`~toolkit.plots.matrix_view.LONG_MATRIX` names) drawn readably: a row per
    name, grouped by layer under a grey header row each (:func:`~toolkit.plots.groups.long_rows`), a column per
    method (labelled on top, a wrong one red), the decision's letter in every cell; labels at
    :data:`LONG_LABEL_PT`."""
    from matplotlib.patches import Rectangle

    grid, culprits, wrong = view.grid, view.culprits, view.wrong
    methods, keys = [cell_text(m) for m in grid.index], [cell_text(k) for k in grid.columns]
    rows = long_rows(keys)
    n_rows, n_cols = len(rows), len(methods)
    label_in = max(len(label) for label, _j in rows) * LONG_LABEL_PT * 0.62 / 72
    method_in = max(len(m) + (10 if m in wrong else 0) for m in methods) * 9 * 0.62 / 72
    column_in = max(0.6, min(method_in + 0.15, 1.6))
    fig, ax = figure_and_axes(ax, (min(0.6 + label_in + column_in * n_cols + 2.0, 22.0), 1.3 + LONG_ROW_IN * n_rows))
    cells = grid.to_numpy(dtype=object)
    for r, (_label, j) in enumerate(rows):
        if j is None:  # a group's header row
            ax.add_patch(Rectangle((0, r), n_cols, 1, facecolor=BAND, edgecolor="none"))
            continue
        for i, m in enumerate(methods):
            d, bad = cells[i, j], (m, keys[j]) in culprits
            ax.add_patch(
                Rectangle(
                    (i, r),
                    1,
                    1,
                    facecolor=CULPRIT_FACE if bad else DECISION_COLOURS.get(d, PAPER),
                    edgecolor=WRONG_MARK if bad else CELL_EDGE,
                    linewidth=1.4 if bad else 0.5,
                    zorder=2 if bad else 1,
                )
            )
            if d:
                ax.text(
                    i + 0.5,
                    r + 0.5,
                    DECISION_LETTERS.get(d, d[:1].upper()) + ("\u2717" if bad else ""),
                    ha="center",
                    va="center",
                    fontsize=LONG_LABEL_PT - 1,
                    color=CULPRIT_INK if bad else INK,
                    fontweight="bold" if bad else "normal",
                    zorder=3,
                )
    for i, m in enumerate(methods):
        if m in wrong:
            ax.add_patch(Rectangle((i, 0), 1, n_rows, fill=False, edgecolor=WRONG_MARK, linewidth=2.0, zorder=4))
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)
    ax.xaxis.tick_top()
    ax.set_xticks([i + 0.5 for i in range(n_cols)])
    ax.set_xticklabels([plain_text(f"\u2717 {m} (wrong)" if m in wrong else m) for m in methods], fontsize=9)
    for lbl, m in zip(ax.get_xticklabels(), methods):
        if m in wrong:
            lbl.set_color(WRONG_MARK)
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
    wrapped_title(ax, plain_text(title))
    return fig
