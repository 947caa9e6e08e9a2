"""The Decisions grid: its cells (escaped HTML, one row per decision), its one count, and the
options of the itables/DataTables widget that shows it.

A culprit is marked red with its problem on hover, the reason on hover over its code, a constant by
its FQN with its internal name beside; the DataTables script brings a selected row into view.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pandas as pd

from toolkit.core.verdict import ConstantFinding, Verdict
from toolkit.core.vocab import BlameStatus
from toolkit.display.cells import cell_text, format_bytes
from toolkit.display.content import culprit_mask
from toolkit.display.palette import DECISION_COLOURS

GRID_HEIGHT = "360px"  # the Decisions grid scrolls inside this height

# what decides first (the decision, whether the content differs, why), then the identifiers
GRID_COLUMNS = ("method", "constant", "decision", "same content", "reason", "bytes", "shared from")
BLAME_GRID_COLUMN = "blame"  # shown once blame ran: culprit (what it breaks), harmless, not tested; why on hover
BLAME_CLASSES = {BlameStatus.CULPRIT: "cs-culprit", BlameStatus.HARMLESS: "cs-caught", BlameStatus.NOT_TESTED: ""}


def _span(text: str = "", cls: str = "", title: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    if title:
        attrs += f' title="{html.escape(title, quote=True)}"'
    return f"<span{attrs}>{html.escape(text, quote=True)}</span>"


def _constant_cell(r: dict[str, Any]) -> str:
    """A constant as users know it, its FQN, with the program's internal name beside it (smaller),
    when the two differ; wrapped at its dots rather than cut."""
    name, fqn = cell_text(r.get("name")), cell_text(r.get("fqn"))
    if not fqn or fqn == name:
        return _span(name, "cs-wrap cs-fqn")
    return _span(fqn.replace(".", ".\u200b"), "cs-wrap cs-fqn", fqn) + _span(
        _breakable(name), "cs-wrap cs-internal", f"internal name: {name}"
    )


def _breakable(text: str) -> str:
    """``text`` with a zero-width space after each ``_``, ``/`` and ``.``: a long identifier wraps there."""
    return re.sub(r"([_/.])", "\\1\u200b", text)


def grid_frame(rows: pd.DataFrame, verdict: Verdict | None = None) -> pd.DataFrame:
    """The Decisions grid's cells: escaped HTML, one row per decision (same order as ``rows``),
    decision coloured by class; a constant that runs on other data (its ``data_problem``, or a
    culprit of ``verdict``) marked red with its problem on hover, unless blame found it harmless;
    the reason on hover over its code; the constant by its FQN, its internal name beside.  Once
    blame ran (a finding of ``verdict`` not "not tested"), a "blame" column gives each finding's
    status, why on hover."""
    found: dict[tuple[str, str], ConstantFinding] = {}
    for c in verdict.constants if verdict is not None else ():
        if (c.method, c.name) not in found or c.blame is BlameStatus.CULPRIT:
            found[(c.method, c.name)] = c
    with_blame = any(c.blame is not BlameStatus.NOT_TESTED for c in found.values())
    wanted = [
        c
        for c in (
            "method",
            "name",
            "fqn",
            "decision",
            "same_content",
            "data_problem",
            "reason_code",
            "reason",
            "shared_from",
            "nbytes",
        )
        if c in rows.columns
    ]
    records = rows[wanted].to_dict("records") if len(rows) else []  # only what the cells show
    out = []
    for r, problem in zip(records, culprit_mask(rows).tolist() if len(rows) else []):
        f = found.get((cell_text(r.get("method")), cell_text(r.get("name"))))
        bad = (problem or f is not None and f.blame is BlameStatus.CULPRIT) and not (
            f is not None and f.blame is BlameStatus.HARMLESS
        )
        decision, same = cell_text(r.get("decision")), r.get("same_content")
        same_text = "" if same is None or same is pd.NA else ("same" if bool(same) else "DIFFERS")
        cls = "cs-culprit" if bad else (f"cs-d-{decision}" if decision in DECISION_COLOURS else "")
        same_cls = "cs-culprit" if bad else ("cs-caught" if same_text == "DIFFERS" else "")
        nbytes = r.get("nbytes")
        out.append(
            {
                "method": _span(cell_text(r.get("method"))),
                "constant": _constant_cell(r),
                "decision": _span(
                    decision + (" \u2717" if bad else ""),
                    f"cs-tag {cls}",
                    f"runs on other data than its own: {cell_text(r.get('data_problem')) or 'a culprit'}"
                    + (f" ({f.evidence})" if f is not None else "")
                    if bad
                    else "",
                ),
                "same content": _span(same_text, f"cs-tag {same_cls}" if same_cls else ""),
                "reason": _span(cell_text(r.get("reason_code")), "cs-reason", cell_text(r.get("reason"))),
                "shared from": _span(_breakable(cell_text(r.get("shared_from"))), "cs-wrap"),
                "bytes": _span(
                    format_bytes(nbytes) if nbytes not in (None, "") else "",
                    title=f"{int(nbytes):,} bytes" if isinstance(nbytes, (int, float)) and nbytes == nbytes else "",
                ),
            }
        )
        if with_blame:
            out[-1][BLAME_GRID_COLUMN] = (
                _span()
                if f is None
                else _span(
                    f"\u2717 culprit: {f.blame_note}" if f.blame is BlameStatus.CULPRIT else f.blame.value,
                    f"cs-tag cs-wrap {BLAME_CLASSES[f.blame]}",
                    f"{f.blame_note or f.blame.value}: {f.evidence}",
                )
            )
    columns = list(GRID_COLUMNS)
    if with_blame:
        columns.insert(columns.index("same content") + 1, BLAME_GRID_COLUMN)
    return pd.DataFrame(out, columns=columns)


def count_text(shown: int | str, total: int, filtered: bool) -> str:
    """The Decisions tab's one count, "N of M decisions (filtered)" (the grid's info line says it
    with ``shown`` "_TOTAL_": the rows its search leaves)."""
    n = f"{shown:,}" if isinstance(shown, int) else shown
    return f"{n} of {total:,} decisions" + (" (filtered)" if filtered else "")


# The grid's JavaScript (DataTables' drawCallback, once per table): a row selected, from Python
# (a matrix click, the constant menu) or by a click, is brought into view: its page shown, the
# grid's own box scrolled to it (never the notebook around it).
SCROLL_TO_SELECTION_JS = """function () {
  const table = this.api().table().node();
  if (table.dataset.csScroll) return;  // once per table element: it outlives each re-created DataTable
  table.dataset.csScroll = '1';
  this.api().on('select', function (e, api, type, indexes) {  // bound on the table element itself
    if (type !== 'row' || !indexes.length) return;
    // after the select event (never inside it: itables syncs the selection there), with the event's
    // own API (an earlier one is destroyed by an update)
    setTimeout(function () { try {
      const at = api.rows({order: 'applied', search: 'applied'}).indexes().toArray().indexOf(indexes[0]);
      const len = api.page.len();
      if (at >= 0 && len > 0 && Math.floor(at / len) !== api.page()) api.page(Math.floor(at / len)).draw(false);
      const row = api.row(indexes[0]).node(), box = row && row.closest('.dt-layout-cell');
      if (!box) return;
      const head = table.tHead ? table.tHead.offsetHeight : 0;
      const top = row.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop;
      if (top - head < box.scrollTop || top + row.offsetHeight > box.scrollTop + box.clientHeight)
        box.scrollTop = Math.max(0, top - head - 4);
    } catch (err) { console.warn('constshare grid: could not scroll to the selection', err); } }, 0);
  });
}"""


def scroll_to_selection():
    """The grid's drawCallback: :data:`SCROLL_TO_SELECTION_JS` as itables passes JavaScript."""

    from itables import JavascriptFunction

    return JavascriptFunction(SCROLL_TO_SELECTION_JS)


def grid_options(total: int = 0, filtered: bool = False) -> dict[str, Any]:
    """The grid widget's options, its info line the tab's one count of ``total`` decisions.

    No DataTables scrolling (it sizes its columns when first drawn, and the Decisions tab is hidden
    then): the page of rows scrolls inside a box of :data:`GRID_HEIGHT` (the explorer's CSS), header
    sticky.  The info line counts the rows after the filters above the grid and the grid's own search.
    """
    return dict(
        allow_html=True,
        maxBytes=0,
        showIndex=False,
        classes="display compact nowrap",
        text_in_header_can_be_selected=False,
        paging=True,
        pageLength=50,
        lengthMenu=[25, 50, 100, 500],
        order=[],
        select={"style": "single", "items": "row"},
        # search first, and always there (itables hides its default layout on short tables)
        layout={"topStart": "search", "topEnd": "pageLength", "bottomStart": "info", "bottomEnd": "paging"},
        style="width: 100%; margin: 0",
        autoWidth=False,
        drawCallback=scroll_to_selection(),
        language={
            "search": "search:",
            "emptyTable": "no decision matches the filters",
            "info": "rows _START_-_END_ · " + count_text("_TOTAL_", total, filtered),
            "infoEmpty": count_text(0, total, filtered),
            "infoFiltered": "" if filtered else "(filtered)",
        },
    )  # DataTables adds a space
