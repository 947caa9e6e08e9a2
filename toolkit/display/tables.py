"""HTML tables for notebooks, reports and the explorer: one renderer, through pandas' Styler.

Everything that shows a frame as HTML (the session's notebook display, the collision report's,
the explorer's tables, the notebooks' through :func:`table`) goes through :func:`html_table`, so
all of them

- escape every value from the data (cells, column labels, caption, "empty" text, "more rows"
  hint, hover titles: names and FQNs come from the program, which may be untrusted): cells are
  turned into display text (:func:`~toolkit.display.cells.cell_text`) and only then given to
  ``Styler.format(escape="html")``, so no value reaches the page unescaped, whatever its type;
- show what nobody can see (controls, line breaks outside prose, zero-width and bidi controls) and
  what no UTF-8 file holds (lone surrogates) as escapes, and names that look like another name of the
  table (NFC/NFD, homoglyphs) with their non-ASCII characters escaped
  (:func:`~toolkit.display.cells.escape_text`), the characters named on hover;
- switch MathJax off (the ``tex2jax_ignore mathjax_ignore`` classes): a ``$...$`` in a name is
  shown as typed;
- read at real sizes: natural width (``table-layout: auto``, in a box that scrolls sideways),
  identifiers and codes on one line, prose (:data:`TEXT_COLUMNS`) wrapped at a capped width;
  text left-aligned, numbers right-aligned;
- colour cells by the rules of :mod:`toolkit.display.palette` (:func:`default_colourers`): a row
  whose method **runs on other data** for that constant (a ``data_problem``,
  :func:`~toolkit.display.content.culprit_mask`) gets its decision, ``same_content`` and
  ``data_problem`` cells in bold red; a content difference caught (declined, refused) amber;
- shorten what is long: a sha256 digest to its first characters (beside another digest of the
  row sharing a long prefix: where the two part), the full digest on hover; byte counts
  (:data:`BYTES_COLUMNS`) as ``16 KiB``, the exact count on hover; ``reason_code`` with the
  ``reason`` on hover; a ``capped`` column cut with an ellipsis at that width, whole on hover;
- show None / NaN / ``pd.NA`` as an empty cell, an Enum by its ``.value``, a list, tuple or set
  comma-joined.

The output is plain HTML (a ``<style>`` block scoped to the table's id, then the table, in a
``<div>``): no JavaScript, and the same frame always renders to the same text (the table id is
a digest of what is shown).  Only pandas (its Styler needs jinja2) and the standard library.
"""

from __future__ import annotations

import hashlib
import html
from typing import Any, Iterable, Mapping

import pandas as pd

from toolkit.display.cells import (
    cell_text,
    escape_note,
    escape_text,
    escaped,
    format_bytes,
    is_digest,
    is_missing,
    lookalikes,
    one_line,
    short_digest,
)
from toolkit.display.content import culprit_mask
from toolkit.display.palette import (
    CAUGHT_COLOUR,
    CULPRIT_STYLE,
    WRONG_COLOUR,
    Colourer,
    decision_colour,
    equal_colour,
    is_outcome_column,
    outcome_colour,
    verdict_colour,
)
from toolkit.display.text import note_html

# columns holding a method's verification outcome (True: matched its eager reference)
VERIFICATION_BOOL_COLUMNS = ("ok", "method_ok", "correct")
# prose: wraps at a capped width; every other column stays on one line
TEXT_COLUMNS = frozenset(
    {
        "reason",
        "error",
        "verify_reason",
        "problems",
        "slot_problem",
        "what it does",
        "summary",
        "reproduces",
        "message",
        "description",
        "note",
        "why",
        "runs on other data",
        "evidence",
        "blame_note",
        "value",
    }
)
# byte counts: shown as "16 KiB", the exact number on hover
BYTES_COLUMNS = frozenset(
    {
        "nbytes",
        "device_bytes",
        "blob_bytes",
        "own_upload_bytes",
        "bytes_in_use",
        "blob bytes",
        "bytes",
        "total_bytes",
        "shareable_bytes",
        "private_bytes",
        "naive_bytes",
        "device bytes",
        "memory",
    }
)
TABLE_CLASS = "constshare-table"
DEFAULT_MAX_ROWS = 200

_TABLE_STYLE = "table-layout: auto; width: auto; margin-left: 0; margin-right: auto; border-collapse: collapse"
_TEXT_CSS = "white-space: normal; min-width: 16em; max-width: 34em; overflow-wrap: break-word"
_LINE_CSS = "white-space: nowrap"
CAPPED_EM = 22  # width of a capped column (:func:`html_table`'s ``capped``): cut with an ellipsis, all on hover


def default_colourers(columns: Iterable[Any]) -> dict[Any, Colourer]:
    """The colour rule of each column that has one by its label, among ``columns``."""
    out: dict[Any, Colourer] = {}
    for c in columns:
        if c == "decision":
            out[c] = decision_colour
        elif c in VERIFICATION_BOOL_COLUMNS:
            out[c] = verdict_colour
        elif c == "equal":
            out[c] = equal_colour
        elif c in ("result", "outcome"):
            out[c] = outcome_colour
        elif c == "culprit":  # blame's verdict: the verifications this share breaks
            out[c] = lambda text: WRONG_COLOUR if text else ""
    return out


def _select(frame: pd.DataFrame, columns: Iterable[Any] | None) -> list[int]:
    """Positions of the requested columns that the frame has, in the requested order, each
    once (all columns when None)."""
    labels = list(frame.columns)
    if columns is None:
        return list(range(len(labels)))
    wanted = [columns] if isinstance(columns, str) else list(columns)
    out: list[int] = []
    for c in wanted:
        for j, label in enumerate(labels):
            if label == c and j not in out:
                out.append(j)
    return out


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype)


def _render(
    display: pd.DataFrame,
    labels: list[str],
    *,
    css: pd.DataFrame,
    titles: pd.DataFrame,
    right: Iterable[int],
    text: Iterable[int],
    caption: str,
    capped: Mapping[int, float] | None = None,
) -> str:
    """``display`` (text cells only, columns 0..n-1, RangeIndex) through the Styler, with
    ``labels`` (unescaped text) as the column headers, ``css`` the style of each cell ('' for
    none) and ``titles`` its hover text ('' for none)."""
    digest = hashlib.blake2b(digest_size=6)
    for part in (repr(labels), caption, *display.to_numpy().ravel().tolist(), *css.to_numpy().ravel().tolist()):
        digest.update(str(part).encode("utf-8", "surrogatepass") + b"\x00")
    headers = [html.escape(t, quote=True) for t in labels]
    styler = display.style
    has_titles = bool((titles != "").to_numpy().any())
    # ids only on the cells a colour rule styles (smaller HTML), unless hover titles need them all
    styler.cell_ids = has_titles
    styler = (
        styler.set_uuid(digest.hexdigest())
        .format(escape="html")
        # headers by position (labels may repeat or not be text); escaped above
        .format_index(lambda i: headers[i], axis=1)
        .hide(axis="index")
        .set_table_attributes(f'class="{TABLE_CLASS}" style="{_TABLE_STYLE}"')
        .set_table_styles(
            [
                {"selector": "th", "props": f"text-align: left; padding: 2px 8px; {_LINE_CSS}"},
                {"selector": "td", "props": f"text-align: left; vertical-align: top; padding: 2px 8px; {_LINE_CSS}"},
                {"selector": "caption", "props": "text-align: left; padding: 2px 8px"},
            ]
        )
    )
    per_column: dict[int, list[dict[str, str]]] = {}
    for i in right:
        per_column.setdefault(i, []).append({"selector": "td", "props": "text-align: right"})
    for i in text:
        per_column.setdefault(i, []).append({"selector": "td", "props": _TEXT_CSS})
    for i, em in (capped or {}).items():
        per_column.setdefault(i, []).append(
            {"selector": "td", "props": f"max-width: {em:g}em; overflow: hidden; text-overflow: ellipsis; {_LINE_CSS}"}
        )
    if per_column:
        styler = styler.set_table_styles(per_column, overwrite=False)
    if (css != "").to_numpy().any():
        styler = styler.apply(lambda _frame: css, axis=None)
    if has_titles:
        escaped = (
            titles.map(lambda t: html.escape(t, quote=True))
            if hasattr(titles, "map")
            else titles.applymap(lambda t: html.escape(t, quote=True))
        )
        try:
            styler = styler.set_tooltips(escaped.where(titles != "", None), as_title_attribute=True)
        except TypeError:  # pandas < 2.2: no title attributes; the tooltips are a convenience
            pass
    if caption:
        # the Styler does not escape the caption: done here; line breaks kept
        styler = styler.set_caption(html.escape(one_line(caption, keep="\n"), quote=True).replace("\n", "<br>"))
    n_rows, n_cols = display.shape
    with pd.option_context("styler.html.mathjax", False, "styler.render.max_elements", max(n_rows * n_cols, 1) + 1):
        return styler.to_html(max_rows=n_rows + 1, max_columns=n_cols + 1)


def _display(
    shown: pd.DataFrame,
    source: pd.DataFrame,
    bytes_columns: Iterable[Any] = BYTES_COLUMNS,
    decimals: int | None = None,
    prose: Iterable[Any] = TEXT_COLUMNS,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The display text and the hover title of every shown cell (``source``: the rows shown,
    every column, for titles that come from columns not shown, e.g. ``reason``; ``decimals``:
    of every float column, when given; ``prose``: columns whose tabs and newlines stay, as spaces)."""
    cols = list(shown.columns)
    texts = [[cell_text(v) for v in shown.iloc[:, i].tolist()] for i in range(len(cols))]
    titles = [[""] * len(shown) for _ in cols]
    reasons = (
        [cell_text(v) for v in source["reason"].tolist()]
        if "reason" in source.columns and "reason" not in cols
        else None
    )
    for i, c in enumerate(cols):
        if c in bytes_columns and _numeric(shown.iloc[:, i]):
            raw = shown.iloc[:, i].tolist()
            for r, v in enumerate(raw):
                if not is_missing(v):
                    texts[i][r] = format_bytes(v)
                    titles[i][r] = f"{int(v):,} bytes" if float(v) == int(v) else f"{v} bytes"
        elif c == "reason_code" and reasons is not None:
            titles[i] = reasons
        elif decimals is not None and pd.api.types.is_float_dtype(shown.iloc[:, i].dtype):
            raw = shown.iloc[:, i].tolist()
            texts[i] = [t if is_missing(v) else f"{v:.{decimals}f}" for v, t in zip(raw, texts[i])]
    # digests: shortened, each against the other digests of its row
    digest_cols = [i for i in range(len(cols)) if any(is_digest(t) for t in texts[i])]
    for r in range(len(shown)):
        row_digests = [texts[i][r] for i in digest_cols if is_digest(texts[i][r])]
        for i in digest_cols:
            t = texts[i][r]
            if is_digest(t):
                other = next((d for d in row_digests if d != t), None)
                texts[i][r] = short_digest(t, other)
                titles[i][r] = t + (" (differs from the other digest in this row)" if other else "")
    # hidden characters escaped, look-alikes of each other spelled out, the characters named on hover
    looks = lookalikes(t for column in texts for t in column)
    for i, c in enumerate(cols):
        keep = "\t\n" if c in prose else ""
        for r, t in enumerate(texts[i]):
            texts[i][r] = escape_text(t, keep=keep, spell_out=t in looks)
            if texts[i][r] != t and not titles[i][r]:
                titles[i][r] = escape_note(t, t in looks)
            else:
                titles[i][r] = one_line(titles[i][r], keep="\t\n")
    index, columns = pd.RangeIndex(len(shown)), pd.RangeIndex(len(cols))
    return (
        pd.DataFrame(dict(enumerate(texts)), index=index, columns=columns, dtype=object),
        pd.DataFrame(dict(enumerate(titles)), index=index, columns=columns, dtype=object),
    )


def _cell_css(
    display: pd.DataFrame, cols: list[Any], rules: Mapping[Any, Colourer], culprit: list[bool]
) -> pd.DataFrame:
    css = pd.DataFrame("", index=display.index, columns=display.columns, dtype=object)
    for i, c in enumerate(cols):
        colour = rules.get(c)
        if colour is None and c not in rules and display[i].map(bool).any() and is_outcome_column(display[i].tolist()):
            colour = outcome_colour  # e.g. a scorecard's "ok" / "WRONG: decode" cells
        if colour is None:
            continue
        css[i] = [f"background-color: {bg}" if (bg := colour(t)) else "" for t in display[i].tolist()]
    marked = [cols.index(c) for c in ("decision", "same_content", "data_problem") if c in cols]
    spos = cols.index("same_content") if "same_content" in cols and "decision" in cols else None
    for r, bad in enumerate(culprit):
        if bad:
            for pos in marked:
                css.iat[r, pos] = CULPRIT_STYLE
        elif spos is not None and display.iat[r, spos] == "False":
            css.iat[r, spos] = f"background-color: {CAUGHT_COLOUR}"
    return css


def html_table(
    frame: pd.DataFrame,
    columns: Iterable[Any] | None = None,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
    caption: str = "",
    empty: str = "no rows",
    more_hint: str = "",
    colours: Mapping[Any, Colourer] | None = None,
    bytes_columns: Iterable[Any] = (),
    wrap: Iterable[Any] = (),
    capped: Iterable[Any] | Mapping[Any, float] = (),
    decimals: int | None = None,
) -> str:
    """``frame`` as an HTML table (see the module docstring), every value escaped.

    ``columns``: which columns, in which order (those the frame lacks are skipped; all when
    None).  Rows past ``max_rows`` are cut, with a note "... N more rows" followed by
    ``more_hint`` (plain text, escaped).  A frame with no rows (or none of the columns)
    gives ``<p><i>{empty}</i></p>``.  ``caption`` is plain text (escaped; line breaks kept).
    ``colours`` replaces the default colour rules (column -> function of the cell's text
    giving a CSS colour or ''); the culprit marking of ``decision`` / ``same_content`` stays.
    ``bytes_columns``: more columns of byte counts, besides :data:`BYTES_COLUMNS`.
    ``wrap``: more prose columns, besides :data:`TEXT_COLUMNS`, wrapped at a capped width.
    ``capped``: columns (or column -> width in em; :data:`CAPPED_EM` by default) kept on one
    line at most that wide, cut with an ellipsis; a cut cell's full text is its hover title
    (unless it has one already, e.g. a digest's).  Together they keep a table with long
    names inside a notebook's width.  ``decimals``: float columns shown with that many
    decimals (e.g. ``1.00`` beside ``1.44``).
    """
    positions = _select(frame, columns)
    if not len(frame) or not positions:
        return note_html(escaped(empty))
    max_rows = max(int(max_rows), 0)
    source = frame.iloc[:max_rows]
    shown = source.iloc[:, positions]
    cols = list(shown.columns)
    prose = TEXT_COLUMNS | set(wrap)
    display, titles = _display(shown, source, BYTES_COLUMNS | set(bytes_columns), decimals, prose)
    rules = default_colourers(cols) if colours is None else dict(colours)
    widths = dict(capped) if isinstance(capped, Mapping) else {c: CAPPED_EM for c in capped}
    capped_at = {i: float(widths[c]) for i, c in enumerate(cols) if c in widths}
    for i, em in capped_at.items():
        # under two characters an em: a text that long may be cut, so it carries itself on hover
        long = display[i].map(lambda t: len(t) > 1.6 * em) & (titles[i] == "")
        titles.loc[long, i] = display.loc[long, i]
    out = _render(
        display,
        [escape_text(cell_text(c)) for c in cols],
        css=_cell_css(display, cols, rules, culprit_mask(source).tolist()),
        titles=titles,
        right=[i for i in range(len(cols)) if _numeric(shown.iloc[:, i])],
        text=[i for i, c in enumerate(cols) if c in prose and i not in capped_at],
        caption=caption,
        capped=capped_at,
    )
    out = f'<div class="constshare-scroll" style="overflow-x: auto; max-width: 100%">{out}</div>'
    hidden = len(frame) - len(shown)
    if hidden > 0:
        hint = f": {escaped(more_hint)}" if more_hint else ""
        out += f'<p class="constshare-more tex2jax_ignore mathjax_ignore">... {hidden:,} more rows{hint}</p>'
    return out


class Table:
    """A frame shown through :func:`html_table` in a notebook (``_repr_html_``), as plain
    text elsewhere (``repr``).  ``frame`` is the data, untouched."""

    def __init__(self, frame: pd.DataFrame, columns: Iterable[Any] | None = None, **options: Any):
        self.frame = frame
        self.columns = None if columns is None else list(columns)
        self.options = options

    def _repr_html_(self) -> str:
        return html_table(self.frame, self.columns, **self.options)

    def __repr__(self) -> str:
        f = self.frame if self.columns is None else self.frame[[c for c in self.columns if c in self.frame.columns]]
        return f.to_string(index=False)


def table(
    frame: pd.DataFrame,
    columns: Iterable[Any] | None = None,
    *,
    max_rows: int | None = None,
    index: bool = False,
    **options: Any,
) -> Table:
    """``frame`` styled for a notebook: ``display(table(session.decisions[...]))``.

    Every row is shown unless ``max_rows`` says otherwise; ``index=True`` keeps the index
    as the first column(s) (e.g. a scorecard indexed by sample).  Other options as for
    :func:`html_table`.
    """
    if index:
        frame = frame.reset_index()
    return Table(frame, columns, max_rows=len(frame) if max_rows is None else max_rows, **options)
