"""HTML tables for notebooks, reports and the explorer: one renderer, through pandas' Styler.

Everything that shows a frame as HTML (the session's notebook display, the collision report's,
the explorer's tables, the notebooks' through :func:`table`) goes through :func:`html_table` or
:func:`verification_html`, so all of them

- escape every value from the data (cells, column labels, caption, "empty" text, "more rows"
  hint, hover titles: names and FQNs come from the program, which may be untrusted): cells are
  turned into display text (:func:`cell_text`) and only then given to
  ``Styler.format(escape="html")``, so no value reaches the page unescaped, whatever its type;
- switch MathJax off (the ``tex2jax_ignore mathjax_ignore`` classes): a ``$...$`` in a name is
  shown as typed;
- read at real sizes: natural width (``table-layout: auto``, in a box that scrolls sideways),
  identifiers and codes on one line, prose (:data:`TEXT_COLUMNS`) wrapped at a capped width;
  text left-aligned, numbers right-aligned;
- colour ``decision`` by :data:`DECISION_COLOURS`, the boolean verification columns and outcome
  texts red or green, an unequal ``equal`` red; a row whose method **runs on other data** for
  that constant (a ``data_problem``, :func:`culprit_mask`) gets its decision, ``same_content``
  and ``data_problem`` cells in bold red; a content difference caught (declined, refused) amber;
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

import enum
import hashlib
import html
import math
import re
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

# decision -> background colour; the one palette of the notebook display, reports, explorer and plots.
DECISION_COLOURS: dict[str, str] = {
    "loaded": "#d9ead3",
    "shared": "#cfe2f3",
    "declined": "#fff2cc",
    "private": "#eeeeee",
    "refused": "#f4cccc",
    "never filled": "#ea9999",
}
OK_COLOUR = "#d9ead3"  # a method that reproduced its reference
WRONG_COLOUR = "#f4cccc"  # a method that did not
NOT_RUN_COLOUR = "#eeeeee"  # a method that never ran
CAUGHT_COLOUR = "#fff2cc"  # content differs, and the share was declined or refused
# a constant its method runs on other data for (the verdict's data_problem): the suspect of a wrong output
CULPRIT_STYLE = "background-color: #f4cccc; color: #990000; font-weight: bold"

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
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
DIGEST_SHOWN = 12  # characters of a digest shown

Colourer = Callable[[str], str]  # display text -> CSS colour ("" for none)

_TABLE_STYLE = "table-layout: auto; width: auto; margin-left: 0; margin-right: auto; border-collapse: collapse"
_TEXT_CSS = "white-space: normal; min-width: 16em; max-width: 34em; overflow-wrap: break-word"
_LINE_CSS = "white-space: nowrap"
CAPPED_EM = 22  # width of a capped column (:func:`html_table`'s ``capped``): cut with an ellipsis, all on hover


# ------------------------------------------------------------------ cell text


def _is_missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    try:
        return bool(pd.api.types.is_scalar(v) and pd.isna(v))
    except (TypeError, ValueError):
        return False


def cell_text(v: Any) -> str:
    """The text a cell shows (not yet escaped): '' for None / NaN / NA, an Enum by its
    value, a list / tuple / set as comma-joined text (sets sorted), anything else ``str``."""
    if isinstance(v, enum.Enum):
        return cell_text(v.value)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return ", ".join(cell_text(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return ", ".join(sorted(cell_text(x) for x in v))
    if _is_missing(v):
        return ""
    return str(v)


def _escape(text: Any) -> str:
    return html.escape(cell_text(text), quote=True)


def _note(text: str) -> str:
    """A paragraph of (escaped) text, MathJax off like the tables."""
    return f'<p class="tex2jax_ignore mathjax_ignore"><i>{text}</i></p>'


def format_bytes(n: Any) -> str:
    """``16384`` -> ``"16 KiB"``, ``1536`` -> ``"1.5 KiB"``; ``"?"`` for a missing value."""
    if _is_missing(n):
        return "?"
    try:
        n = float(n)
    except (TypeError, ValueError):
        return cell_text(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop always returns


def is_digest(text: str) -> bool:
    """Whether ``text`` is a sha256 hex digest (64 lowercase hex characters)."""
    return bool(DIGEST_RE.fullmatch(text))


def shorten_digests(text: str, width: int = DIGEST_SHOWN) -> str:
    """``text`` with every sha256 digest inside it (a storage key, a blob name) cut to its
    first ``width`` characters and an ellipsis."""
    return DIGEST_RE.sub(lambda m: m.group(0)[:width] + "\u2026", text)


def short_digest(digest: str, other: str | None = None, width: int = DIGEST_SHOWN) -> str:
    """``digest`` shortened to about ``width`` characters, the difference kept visible.

    Alone, or beside an equal digest: its first ``width`` characters and an ellipsis.  Beside
    a different one that shares the first characters, the start, an ellipsis, then the
    characters from the first one that differs: ``'1a2b…7f03c9e1…'``.
    """
    if len(digest) <= width + 1:
        return digest
    if other is None or other == digest:
        return digest[:width] + "\u2026"
    first = next((i for i, (a, b) in enumerate(zip(digest, other)) if a != b), min(len(digest), len(other)))
    if first < width - 2:
        return digest[:width] + "\u2026"
    return digest[:4] + "\u2026" + digest[first : first + width - 4] + "\u2026"


# ------------------------------------------------------------------ content check


def content_check(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of decision rows with ``same_content``: whether the constant's content digest
    equals the digest of the cache entry it was checked against (``digest`` vs
    ``cached_digest``); NA where there was no cache entry.  Inserted after ``decision``.
    Which rows run on other data is the verdict's (the ``data_problem`` column,
    :func:`culprit_mask`), not this display's."""
    out = frame.copy()
    if "digest" not in out.columns or "cached_digest" not in out.columns:
        return out
    pairs = [
        (cell_text(n).strip(), cell_text(c).strip())
        for n, c in zip(out["digest"].tolist(), out["cached_digest"].tolist())
    ]
    col = pd.array([a == b if a and b else pd.NA for a, b in pairs], dtype="boolean")
    if "same_content" in out.columns:
        out["same_content"] = col
    else:
        at = list(out.columns).index("decision") + 1 if "decision" in out.columns else len(out.columns)
        out.insert(at, "same_content", col)
    return out


def culprit_mask(frame: pd.DataFrame) -> pd.Series:
    """Rows whose method runs on other data than its own for that constant: a ``data_problem``
    (:func:`toolkit.core.verdict.find_problem`, recorded with each decision)."""
    if "data_problem" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["data_problem"].map(cell_text) != ""


def caught_mask(frame: pd.DataFrame) -> pd.Series:
    """Rows whose content differs and that were not shared (declined, refused, ...)."""
    f = frame if "same_content" in frame.columns else content_check(frame)
    if "same_content" not in f.columns or "decision" not in f.columns:
        return pd.Series(False, index=frame.index)
    differs = f["same_content"].map(lambda v: (not _is_missing(v)) and not bool(v)).astype(bool)
    return differs & (f["decision"].map(cell_text) != "shared") & ~culprit_mask(frame)


# ------------------------------------------------------------------ colours


def decision_colour(text: str) -> str:
    return DECISION_COLOURS.get(text, "")


def verdict_colour(text: str) -> str:
    """Colour of a boolean verification cell: False red, True green, empty / other none."""
    return {"False": WRONG_COLOUR, "True": OK_COLOUR}.get(text, "")


def equal_colour(text: str) -> str:
    """An ``equal`` cell of a field-by-field comparison: unequal (False / NO) red."""
    return WRONG_COLOUR if text in ("False", "NO", "no") else ""


# the verdict's outcomes (toolkit.core.verdict.MethodOutcome values) and the notebooks' scorecard texts
RESULT_COLOURS = {
    "ok": OK_COLOUR,
    "wrong": WRONG_COLOUR,
    "not runnable": WRONG_COLOUR,
    "failed": WRONG_COLOUR,
    "refused": NOT_RUN_COLOUR,
    "not reached": NOT_RUN_COLOUR,
    "no reference": NOT_RUN_COLOUR,
    "not run": NOT_RUN_COLOUR,
    "load refused": NOT_RUN_COLOUR,
}
_OUTCOME_RE = re.compile("|".join(map(re.escape, RESULT_COLOURS)) + r"|WRONG\b.*|")


def outcome_colour(text: str) -> str:
    """An outcome text: ``ok`` green, ``wrong`` / ``WRONG ...`` / ``not runnable`` / ``failed`` red,
    ``refused`` / ``no reference`` / ``not run`` grey."""
    return WRONG_COLOUR if text.startswith("WRONG") else RESULT_COLOURS.get(text, "")


def count_colour(text: str) -> str:
    """A count of failures: 0 green, anything else red."""
    return OK_COLOUR if text == "0" else (WRONG_COLOUR if text else "")


def _is_outcome_column(texts: list[str]) -> bool:
    return any(t in ("ok", "wrong") or t.startswith("WRONG") for t in texts) and all(
        _OUTCOME_RE.fullmatch(t) for t in texts
    )


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


# ------------------------------------------------------------------ tables


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
        styler = styler.set_caption(html.escape(caption, quote=True).replace("\n", "<br>"))
    n_rows, n_cols = display.shape
    with pd.option_context("styler.html.mathjax", False, "styler.render.max_elements", max(n_rows * n_cols, 1) + 1):
        return styler.to_html(max_rows=n_rows + 1, max_columns=n_cols + 1)


def _display(
    shown: pd.DataFrame, source: pd.DataFrame, bytes_columns: Iterable[Any] = BYTES_COLUMNS, decimals: int | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The display text and the hover title of every shown cell (``source``: the rows shown,
    every column, for titles that come from columns not shown, e.g. ``reason``; ``decimals``:
    of every float column, when given)."""
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
                if not _is_missing(v):
                    texts[i][r] = format_bytes(v)
                    titles[i][r] = f"{int(v):,} bytes" if float(v) == int(v) else f"{v} bytes"
        elif c == "reason_code" and reasons is not None:
            titles[i] = reasons
        elif decimals is not None and pd.api.types.is_float_dtype(shown.iloc[:, i].dtype):
            raw = shown.iloc[:, i].tolist()
            texts[i] = [t if _is_missing(v) else f"{v:.{decimals}f}" for v, t in zip(raw, texts[i])]
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
        if colour is None and c not in rules and display[i].map(bool).any() and _is_outcome_column(display[i].tolist()):
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
        return _note(_escape(empty))
    max_rows = max(int(max_rows), 0)
    source = frame.iloc[:max_rows]
    shown = source.iloc[:, positions]
    cols = list(shown.columns)
    display, titles = _display(shown, source, BYTES_COLUMNS | set(bytes_columns), decimals)
    rules = default_colourers(cols) if colours is None else dict(colours)
    widths = dict(capped) if isinstance(capped, Mapping) else {c: CAPPED_EM for c in capped}
    capped_at = {i: float(widths[c]) for i, c in enumerate(cols) if c in widths}
    for i, em in capped_at.items():
        # under two characters an em: a text that long may be cut, so it carries itself on hover
        long = display[i].map(lambda t: len(t) > 1.6 * em) & (titles[i] == "")
        titles.loc[long, i] = display.loc[long, i]
    prose = TEXT_COLUMNS | set(wrap)
    out = _render(
        display,
        [cell_text(c) for c in cols],
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
        hint = f": {_escape(more_hint)}" if more_hint else ""
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


def _number(v: Any, spec: str) -> str:
    if _is_missing(v):
        return ""
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return cell_text(v)


FINDINGS_COLUMN = "runs on other data"
MAX_NAMED = 8  # constants named in one verification cell; the rest counted (every one is in the decisions)


def _named(items: list[str], limit: int = MAX_NAMED, sep: str = ", ") -> str:
    """Up to ``limit`` items, joined, then "... and N more" (a cell stays readable at 10,000 constants;
    every one is in the decisions)."""
    if len(items) <= limit:
        return sep.join(items)
    return sep.join(items[:limit]) + f" ... and {len(items) - limit:,} more"


def findings_text(verdict: Any, method: str) -> str:
    """A method's constants that run on other data, culprits first, with what blame found said once
    for every constant it was found for: ``"a, b (content differs; culprit: breaks standalone)"``."""
    found = sorted(verdict.findings(method), key=lambda c: list(type(c.blame)).index(c.blame))  # culprits first
    groups: dict[str, list[str]] = {}
    for c in found:
        groups.setdefault(
            f"{c.problem.value if c.problem else 'no known difference'}"
            + (f"; {c.blame.value}: {c.blame_note}" if c.blame_note else ""),
            [],
        ).append(c.name)
    return "; ".join(f"{_named(names)} ({why})" for why, names in groups.items())


def verification_html(frame: pd.DataFrame | None, verdict: Any, *, empty: str = "no methods") -> str:
    """The verification frame (``Session.verify()``) as a table of method, result (the verdict's
    outcome: ok green, wrong / not runnable / failed red, others grey), what it was checked
    against (the verdict's oracle), max abs err, atol, rtol,
    reason, and the constants each method runs on other data for, culprits first, with blame's
    confirmation (culprit, harmless and why, not tested); every value escaped."""
    if frame is None or not len(frame):
        return _note(_escape(empty))
    outcomes = {m.method: m.outcome.value for m in verdict.methods}
    oracles = {m.method: m.checked_against for m in verdict.methods}
    rows = [
        {
            "method": cell_text(r.get("method")),
            "result": outcomes.get(cell_text(r.get("method")), ""),
            "checked against": oracles.get(cell_text(r.get("method")), ""),
            "max abs err": _number(r.get("max_abs_err"), ".3g"),
            "atol": _number(r.get("atol"), "g"),
            "rtol": _number(r.get("rtol"), "g"),
            "reason": cell_text(r.get("reason")),
            FINDINGS_COLUMN: findings_text(verdict, cell_text(r.get("method"))),
        }
        for r in frame.to_dict("records")
    ]
    table = pd.DataFrame(
        rows, columns=["method", "result", "checked against", "max abs err", "atol", "rtol", "reason", FINDINGS_COLUMN]
    )
    drop = [c for c in ("checked against", "atol", "rtol", "max abs err") if (table[c] == "").all()]
    if not verdict.constants:
        drop.append(FINDINGS_COLUMN)
    return html_table(
        table.drop(columns=drop),
        max_rows=len(table),
        empty=empty,
        colours={
            "result": outcome_colour,
            FINDINGS_COLUMN: lambda text: WRONG_COLOUR if "culprit" in text else (CAUGHT_COLOUR if text else ""),
        },
    )


class Html:
    """An HTML block for a notebook (``_repr_html_``), plain text for ``repr``."""

    def __init__(self, html_text: str, text: str):
        self.html, self.text = html_text, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def verification_table(frame: pd.DataFrame, verdict: Any) -> Html:
    """``session.verify()`` for a notebook, its results read from ``verdict`` (:func:`verification_html`)."""
    return Html(verification_html(frame, verdict), frame.to_string(index=False) if frame is not None else "no methods")


# ------------------------------------------------------------------ text


_MD_CODE = re.compile(r"`([^`]+)`")
_MD_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_MD_EM = re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")


def markdown_html(text: str) -> str:
    """A small, safe subset of markdown as HTML: paragraphs (blank lines), ``code``,
    **bold** and *emphasis*; everything escaped first, so no tag of the text survives and
    no raw markdown is shown.  For sample descriptions and other short notes."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    out = []
    for p in paragraphs:
        pieces = []
        for k, piece in enumerate(_MD_CODE.split(p)):  # odd pieces: code spans, taken literally
            h = html.escape(piece, quote=True)
            if k % 2:
                pieces.append(f"<code>{h}</code>")
            else:
                h = _MD_BOLD.sub(lambda m: f"<b>{m.group(1)}</b>", h)
                pieces.append(_MD_EM.sub(lambda m: f"<i>{m.group(1)}</i>", h))
        out.append(f'<p class="tex2jax_ignore mathjax_ignore">{"".join(pieces)}</p>')
    return "".join(out)


def markdown_text(text: str) -> str:
    """The same subset as plain text: the markup removed, whitespace collapsed."""
    pieces = _MD_CODE.split(" ".join(text.split()))
    return "".join(
        piece if k % 2 else _MD_EM.sub(lambda m: m.group(1), _MD_BOLD.sub(lambda m: m.group(1), piece))
        for k, piece in enumerate(pieces)
    )


# ------------------------------------------------------------------ sessions


SESSION_TABLE_COLUMNS = (
    "method",
    "name",
    "fqn",
    "lookup",
    "decision",
    "same_content",
    "reason_code",
    "reason",
    "shared_from",
)
# names and FQNs at a capped width, whole on hover: the collisions (where the share came from
# narrower), and every decision (two more columns, so all narrower): a 50-decision BART
# program's tables then fit a notebook at 1440 px with room to spare
SESSION_CAPPED = {"name": CAPPED_EM, "fqn": CAPPED_EM, "shared_from": 16}
SESSION_ALL_CAPPED = {"name": 16, "fqn": 16, "shared_from": 16}
SESSION_ALL_ROWS = 2000  # rows inside the "every decision" box; past that, session.decisions


def _session_facts(session: Any) -> tuple[pd.DataFrame, dict[str, int], list[Any]]:
    """What a session display reads: its decisions, their counts, and the methods it loaded."""
    d = session.decisions
    counts = {str(k): int(v) for k, v in d["decision"].value_counts().items()} if len(d) else {}
    loaded = [r for r in session.results.values() if cell_text(r.status) in ("loaded", "unloaded")]
    return d, counts, loaded


def _collisions(d: pd.DataFrame) -> pd.DataFrame:
    """The decisions whose name was already in the cache, culprits first (then caught
    collisions, then the rest, each in load order), with ``same_content``."""
    checked = content_check(d)
    if "lookup" not in checked.columns:
        return checked.iloc[:0]
    hits = checked[checked["lookup"].map(cell_text) == "hit"]
    rank = culprit_mask(hits).map({True: 0, False: 2}) - caught_mask(hits).astype(int)
    return hits.assign(_rank=rank.to_numpy()).sort_values("_rank", kind="stable").drop(columns="_rank")


def content_summary(d: pd.DataFrame) -> tuple[int, int]:
    """(culprits, caught): shares of different content, and collisions of different content declined or refused."""
    if not len(d):
        return 0, 0
    checked = content_check(d)
    return int(culprit_mask(checked).sum()), int(caught_mask(checked).sum())


def session_text(session: Any) -> str:
    """A few lines for a terminal: status, decision counts, content check, bytes per method."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    lines = [
        f"program {program.name!r} ({len(program.methods)} methods, {program.device}) "
        f"under policy {session.policy.name.value!r}: {cell_text(session.status)}"
    ]
    if session.error:
        lines.append(f"  error in {session.failed_method!r}: {session.error}")
    lines.append("  decisions: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    culprits, caught = content_summary(d)
    if culprits or caught:
        lines.append(
            f"  content check: {culprits} run on other data than their own, {caught} collisions of "
            f"different content caught"
        )
    if loaded:
        blobs = {m.name: m.blob_bytes for m in program.methods}
        unshared = sum(blobs[r.method] for r in loaded)
        lines.append(
            f"  {session.device_bytes:,} constant bytes on device in all "
            f"(each of these methods on its own blob: {unshared:,})"
        )
    for r in loaded:
        flag = "" if r.runnable else "  NOT RUNNABLE: " + "; ".join(r.problems)
        lines.append(f"  {r.method}: {r.device_bytes:,} constant bytes on {r.device}{flag}")
    return "\n".join(lines)


def session_facts_html(session: Any, *, predicted: bool = False, name: str | None = None) -> str:
    """A session's summary as a small table of facts (program, policy, status, decisions, memory
    in binary units, the exact count on hover); ``predicted``: a dry run, its status "predicted"."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    devices = ", ".join(sorted({cell_text(x) for x in session.devices.values()})) or cell_text(program.device)
    status = "predicted (dry run: nothing loaded or run)" if predicted else cell_text(session.status)
    facts = [
        ("program", f"{name or program.name} ({len(program.methods)} methods, on {devices})"),
        ("policy", session.policy.name.value),
        ("status", status),
        ("decisions", f"{len(d):,}: " + (", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) or "none")),
    ]
    if session.error:
        facts.append(("error", f"in {session.failed_method!r}: {session.error}"))
    if loaded:
        blobs = {m.name: m.blob_bytes for m in program.methods}
        unshared = sum(blobs[r.method] for r in loaded)
        on = "would be" if predicted else "are"
        facts.append(
            (
                "constant bytes",
                f"{format_bytes(session.device_bytes)} {on} on the device; "
                f"{format_bytes(unshared)} with each method on its own blob",
            )
        )
        facts += [
            (
                f"  {r.method}",
                format_bytes(r.device_bytes) + ("" if r.runnable else " (NOT RUNNABLE: " + "; ".join(r.problems) + ")"),
            )
            for r in loaded
        ]
    frame = pd.DataFrame(facts, columns=["fact", "value"])
    return html_table(
        frame,
        max_rows=len(frame),
        colours={"value": lambda text: WRONG_COLOUR if "NOT RUNNABLE" in text or text.startswith("in '") else ""},
    )


def session_html(session: Any, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """The notebook view of a session: a summary with the decision counts as a colour key,
    the content check, the collisions (names already cached; the culprits first), and every
    decision inside a collapsed, scrolling box."""
    d, counts, loaded = _session_facts(session)
    program = session.program
    ok = cell_text(session.status) == "loaded"
    status = (
        f'<span style="color: {"#38761d" if ok else "#cc0000"}; font-weight: bold">'
        f"{_escape(cell_text(session.status))}</span>"
    )
    parts = [
        f"<p><b>{_escape(program.name)}</b> ({len(program.methods)} methods, {_escape(program.device)}) "
        f"under policy <b>{_escape(session.policy.name.value)}</b>: {status}</p>"
    ]
    if session.error:
        parts.append(
            f'<p style="color: #cc0000">error in {_escape(repr(session.failed_method))}: {_escape(session.error)}</p>'
        )
    badges = " ".join(
        f'<span style="background-color: {DECISION_COLOURS.get(k, "#ffffff")}; padding: 1px 6px; '
        f'border-radius: 3px">{_escape(k)} {v}</span>'
        for k, v in sorted(counts.items())
    )
    parts.append(f"<p>{len(d):,} decisions: {badges or 'none'}</p>")
    if loaded:
        per_method = ", ".join(
            f"{_escape(r.method)} {format_bytes(r.device_bytes)}" + ("" if r.runnable else " <b>(not runnable)</b>")
            for r in loaded
        )
        parts.append(
            f"<p>constant bytes on device: {format_bytes(session.device_bytes)} "
            f"({session.device_bytes:,}; {per_method})</p>"
        )
    if len(d):
        culprits, caught = content_summary(d)
        if culprits:
            parts.append(
                f'<p><span style="{CULPRIT_STYLE}; padding: 1px 6px">{culprits} constant'
                f"{'s' if culprits != 1 else ''} run on other data than their own</span> (the content "
                f"differs, the state is another buffer's, or the tensor cannot fill the slot)"
                + (f"; {caught} collision{'s' if caught != 1 else ''} of different content caught" if caught else "")
                + "</p>"
            )
        elif caught:
            parts.append(
                f"<p>{caught} collision{'s' if caught != 1 else ''} of different content caught "
                f"(declined or refused); nothing was shared across different content</p>"
            )
        hits = _collisions(d)
        if len(hits):
            parts.append(
                f"<p><b>collisions</b>: {len(hits):,} name{'s' if len(hits) != 1 else ''} already in the "
                f"cache when {'their' if len(hits) != 1 else 'its'} method loaded</p>"
            )
            blamed = "culprit" in hits.columns and bool((hits["culprit"].map(cell_text) != "").any())
            # every one of them is a cache hit (no lookup column); the reason is on hover over its
            # code (a 50-row BART program's table then fits a notebook at 1440 px)
            parts.append(
                html_table(
                    hits,
                    [c for c in SESSION_TABLE_COLUMNS if c not in ("lookup", "reason")]
                    + (["culprit"] if blamed else []),
                    max_rows=max_rows,
                    capped=SESSION_CAPPED,
                    more_hint="see session.decisions (the full reason is on hover over its code)",
                )
            )
        else:
            parts.append(_note("no collisions: no name was already in the cache when its method loaded"))
        # as the collisions: the reason on hover over its code, long names cut (whole on hover)
        every = html_table(
            content_check(d),
            [c for c in SESSION_TABLE_COLUMNS if c != "reason"],
            max_rows=SESSION_ALL_ROWS,
            capped=SESSION_ALL_CAPPED,
            more_hint="see session.decisions (the full reason is on hover over its code)",
        )
        parts.append(
            f'<details class="constshare-all"><summary>show all {len(d):,} decisions</summary>'
            f'<div style="max-height: 32em; overflow: auto">{every}</div></details>'
        )
    return f'<div class="constshare-session">{"".join(parts)}</div>'
