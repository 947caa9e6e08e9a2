"""The collision matrix with plotly: the same cells as :func:`toolkit.plots.matrix.collision_matrix`,
and hovering a cell shows its decision and reason.

Text that comes from the program is escaped for plotly (:func:`plotly_text`), which reads a subset
of HTML in labels and hover text.  A notebook shows the figure through plotly's JupyterLab
renderer, and every other reader the static image it carries (:mod:`toolkit.plots.static`);
:func:`plotly_bundle` gives the display data the explorer puts in its Output widget.
"""

from __future__ import annotations

import html
import textwrap
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import pandas as pd

from toolkit.display.cells import cell_text, one_line
from toolkit.display.palette import CELL_EDGE, CULPRIT_FACE, DECISION_COLOURS, DIVIDER, INK, PAPER, WRONG_MARK
from toolkit.plots.figure import short_key
from toolkit.plots.groups import GROUP_COLUMNS, layer_groups, long_rows
from toolkit.plots.matrix_view import DECISION_LETTERS, DECISION_ORDER, LONG_MATRIX, MatrixView, collision_matrix_view

if TYPE_CHECKING:
    from toolkit.engine.session import Session

_ABSENT = "absent"
_CULPRIT = "culprit"
_CATEGORIES = [_ABSENT] + DECISION_ORDER + [_CULPRIT]
_CATEGORY_FACE = {_ABSENT: PAPER, **DECISION_COLOURS, _CULPRIT: CULPRIT_FACE}
PLOTLY_MIME = "application/vnd.plotly.v1+json"
MAX_PLOTLY_WIDTH = 980  # px: fits a notebook's output area and the explorer
_HOVER_WIDTH = 72  # characters per line of a hover label
HOVER_ROOM = 470  # px kept right of a narrow matrix for its hover label (72 characters at 12 px)
MODEBAR_WIDTH = 260  # px: plotly's toolbar, top right, that a title must not run under
LONG_ROW_PX = 16  # px per row of a long matrix (its labels at 10 px)
METHOD_LABEL_PX = 28  # px above a long matrix's cells for its method labels (the legend above them)


def plotly_text(text: Any) -> str:
    """``text`` as plotly should draw it literally: ``&``, ``<`` and ``>`` as entities (plotly
    reads a subset of HTML in labels and hover text), and a leading ``$`` kept from being
    typeset as LaTeX (plotly typesets a label that begins and ends with ``$``)."""
    out = html.escape(one_line(cell_text(text)), quote=False)  # hidden characters shown, as plain_text does
    return "\u200b" + out if out.startswith("$") else out


def _hover_lines(text: str, prefix: str) -> list[str]:
    lines = textwrap.wrap(cell_text(text), _HOVER_WIDTH - len(prefix)) or [""]
    return [plotly_text(prefix) + plotly_text(lines[0])] + ["&nbsp;&nbsp;" + plotly_text(x) for x in lines[1:]]


def _cell_hover(method: str, key: str, row: Mapping[str, Any] | None, culprit: bool, wrong: bool) -> str:
    """The hover text of one matrix cell: which constant, its decision, and why."""
    head = f"<b>{plotly_text(method)} / {plotly_text(short_key(key, _HOVER_WIDTH))}</b>"
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
        label, n = short_key(k), 1
        while label in seen:
            n += 1
            label = f"{short_key(k, 44)} ({n})"
        seen.add(label)
        out.append(label)
    return out


def interactive_collision_matrix(
    session_or_decisions: "Session | pd.DataFrame",
    *,
    verification: pd.DataFrame | None = None,
    wrong_methods: Iterable[str] = (),
    only_colliding: bool | None = None,
    title: str | None = None,
    name: str | None = None,
):
    """The collision matrix as a plotly figure: the same cells as
    :func:`~toolkit.plots.matrix.collision_matrix` (same colours, culprits red with a cross, wrong
    methods labelled red, only the colliding names of a large program), and **hovering a cell
    shows its decision and reason** (with the content check, what it runs on and blame's verdict
    where known).

    Returns a ``plotly.graph_objects.Figure``
    (:class:`~toolkit.plots.static.InteractiveFigure`): a notebook shows it through plotly's
    JupyterLab renderer (shipped in the plotly wheel, no server extension), and its display
    data also carries the same cells as a PNG (:func:`~toolkit.plots.matrix.collision_matrix`,
    drawn on first display), which nbconvert, GitHub and a PDF export show;
    :func:`plotly_bundle` gives the display data the explorer puts in its Output widget.  Past
    :data:`~toolkit.plots.groups.GROUP_COLUMNS` names, the columns are grouped by layer
    (:func:`~toolkit.plots.groups.layer_groups`): the layer once, horizontally, under its columns,
    each column labelled by the rest of its name.
    """
    import plotly.graph_objects as go

    from toolkit.plots.matrix import collision_matrix
    from toolkit.plots.static import InteractiveFigure

    def draw():  # the same cells with matplotlib: the static image every reader without plotly shows
        return collision_matrix(
            session_or_decisions,
            verification=verification,
            wrong_methods=wrong_methods,
            only_colliding=only_colliding,
            title=title,
            name=name,
        )

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
        return _long_interactive(view, title if title is not None else view.title, draw)
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
                (DECISION_LETTERS.get(d, d[:1].upper()) + "\u2717" if bad else DECISION_LETTERS.get(d, d[:1].upper()))
                if d and (letters or (bad and marks))
                else ""
            )
            hr.append(_cell_hover(m, k, view.rows.get((m, k)), bad, m in view.wrong))
        z.append(zr), text.append(tr), hover.append(hr)
    n = len(_CATEGORIES)
    fig = InteractiveFigure(draw=draw)
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
                textfont={"size": 11 if letters else 9, "color": INK},
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
                line={"color": WRONG_MARK, "width": 2.5},
                fillcolor="rgba(0,0,0,0)",
                layer="above",
            )
    ticktext = [
        f"<span style='color:{WRONG_MARK}'><b>\u2717 {plotly_text(m)} (wrong)</b></span>"
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
                {"type": "multicategory", "dividercolor": DIVIDER, "dividerwidth": 1}
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
                    name=legend.get(c, f"{DECISION_LETTERS.get(c, '')} {c}".strip()),
                    marker={
                        "symbol": "square",
                        "size": 13,
                        "color": _CATEGORY_FACE[c],
                        "line": {
                            "color": WRONG_MARK if c == _CULPRIT else CELL_EDGE,
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
        plot_bgcolor=PAPER,
        paper_bgcolor=PAPER,
        template="none",
        margin=margin,
        legend={"orientation": "h", "x": 0.0, "y": 1.0, "xanchor": "left", "yanchor": "bottom", "font": {"size": 11}},
        hoverlabel={"bgcolor": PAPER, "font": {"size": 12, "color": INK}, "align": "left"},
    )


def _long_interactive(view: MatrixView, title: str, draw):
    """The plotly matrix of more than :data:`~toolkit.plots.matrix_view.LONG_MATRIX` names, drawn readably: a
    row per name (y: the row's number, labelled by :func:`~toolkit.plots.groups.long_rows`: a bold header per
    layer group, then each name after its group), a column per method (labelled on top, a wrong one red and framed), the
    decision's letter in every cell, :data:`LONG_ROW_PX` per row; a header row is a gap (no hover,
    no click).  ``meta``: ``long`` True, ``rows`` each row's index into ``names``' columns (-1: a
    header), ``methods`` and ``names`` as in the wide matrix; ``draw`` makes its static image."""
    import plotly.graph_objects as go

    from toolkit.plots.static import InteractiveFigure

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
            tr.append(DECISION_LETTERS.get(d, d[:1].upper()) + ("\u2717" if bad else "") if d else "")
            hr.append(_cell_hover(m, keys[j], view.rows.get((m, keys[j])), bad, m in view.wrong))
        z.append(zr), text.append(tr), hover.append(hr)
    ticktext = [f"<b>{plotly_text(label)}</b>" if j is None else plotly_text(label) for label, j in rows]
    columns = [
        f"<span style='color:{WRONG_MARK}'><b>\u2717 {plotly_text(m)} (wrong)</b></span>"
        if m in view.wrong
        else plotly_text(m)
        for m in methods
    ]
    names = [[cell_text((view.rows.get((m, k)) or {}).get("name")) for k in keys] for m in methods]
    fig = InteractiveFigure(
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
            textfont={"size": 10, "color": INK},
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
        ),
        draw=draw,
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
                line={"color": WRONG_MARK, "width": 2.5},
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
