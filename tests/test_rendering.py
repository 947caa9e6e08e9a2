"""toolkit.display: the one HTML table renderer (pandas Styler, escaping on) and the views built on it."""

from __future__ import annotations

import enum
import html.parser
import re
import subprocess
import sys

import pandas as pd
import pytest

from toolkit.display.cells import cell_text, short_digest
from toolkit.display.content import content_check, culprit_mask
from toolkit.display.findings import verification_html
from toolkit.display.palette import CULPRIT_STYLE, DECISION_COLOURS
from toolkit.display.tables import html_table, table
from toolkit.display.text import markdown_html

HOSTILE = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>', "a & b", "it's", "&amp;", "$x$"]


class _Parsed(html.parser.HTMLParser):
    """Tags, the text of each <td>/<th>/<caption>, and the CSS of the <style> block."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.cells: list[tuple[str, dict, str]] = []  # (tag, attrs, text)
        self.css = ""
        self._open: tuple[str, dict] | None = None
        self._text = ""
        self._in_style = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag in ("td", "th", "caption", "p"):
            self._open, self._text = (tag, dict(attrs)), ""
        self._in_style = tag == "style"

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if self._open and tag == self._open[0]:
            self.cells.append((tag, self._open[1], self._text))
            self._open = None
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.css += data
        elif self._open:
            self._text += data

    def texts(self, tag: str) -> list[str]:
        return [t for g, _a, t in self.cells if g == tag]

    def cell_colour(self, tag_attrs: dict) -> str | None:
        """The background colour the <style> block gives this cell (by its id)."""
        cell_id = tag_attrs.get("id")
        if not cell_id:
            return None
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", self.css):
            if f"#{cell_id}" in [s.strip() for s in selectors.split(",")]:
                m = re.search(r"background-color:\s*([^;]+);", body)
                if m:
                    return m.group(1).strip()
        return None

    def column(self, index: int) -> list[tuple[str, str | None]]:
        """(text, colour) of every body cell of column ``index``."""
        return [
            (t, self.cell_colour(a))
            for g, a, t in self.cells
            if g == "td" and f"col{index}" in a.get("class", "").split()
        ]


# ------------------------------------------------------------------ escaping


@pytest.mark.parametrize("evil", HOSTILE)
def test_hostile_text_is_escaped_everywhere(evil):
    frame = pd.DataFrame({evil: [evil, [evil, "b"]], "decision": ["shared", evil]})
    out = html_table(frame, caption=f"report of {evil}", max_rows=1, more_hint=evil)
    # no tag but the renderer's own
    assert set(_Parsed(out).tags) <= {"div", "style", "table", "caption", "thead", "tr", "th", "tbody", "td", "p", "br"}
    assert "<script" not in out and "<img" not in out
    if any(ch in evil for ch in "<\"'") or " & " in evil:
        assert evil not in out  # the raw text never reaches the page ("&amp;" is checked below)
    p = _Parsed(out)
    # and once the browser decodes the entities, the text is exactly what was in the data
    assert p.texts("th") == [evil, "decision"]
    assert p.texts("caption") == [f"report of {evil}"]
    assert p.texts("td") == [evil, "shared"]
    assert p.texts("p") == [f"... 1 more rows: {evil}"]


def test_hostile_empty_text_is_escaped():
    out = html_table(pd.DataFrame({"a": []}), empty="<b>none</b> & more")
    assert "<b>" not in out and "&lt;b&gt;none&lt;/b&gt; &amp; more" in out


def test_hostile_verification_is_escaped():
    v = pd.DataFrame(
        {
            "method": ["<script>m</script>"],
            "ran": [True],
            "max_abs_err": [1.0],
            "atol": [1e-5],
            "rtol": [1e-4],
            "ok": [False],
            "reason": ['"&<b>bad</b>'],
        }
    )
    from toolkit.core.verdict import MethodFacts, build_verdict
    from toolkit.core.vocab import MethodStatus
    from toolkit.engine.frames import check_rows

    verdict = build_verdict(
        program="p",
        policy="name-only",
        predicted=False,
        checks=check_rows(v),
        methods=[MethodFacts("<script>m</script>", MethodStatus.LOADED, True)],
    )
    out = verification_html(v, verdict)
    assert "<script" not in out and "<b>" not in out
    assert _Parsed(out).texts("td") == [
        "<script>m</script>",
        "wrong",
        "eager reference",
        "1",
        "1e-05",
        "0.0001",
        '"&<b>bad</b>',
    ]


def test_mathjax_is_off_for_names_with_dollars():
    out = html_table(pd.DataFrame({"name": ["$\\href{javascript:alert(1)}{x}$"]}))
    table_class = re.search(r'<table[^>]*class="([^"]*)"', out).group(1).split()
    assert {"constshare-table", "tex2jax_ignore", "mathjax_ignore"} <= set(table_class)


# ------------------------------------------------------------------ colours


def test_the_palette():
    assert DECISION_COLOURS == {
        "loaded": "#d9ead3",
        "shared": "#cfe2f3",
        "declined": "#fff2cc",
        "private": "#eeeeee",
        "refused": "#f4cccc",
        "never filled": "#ea9999",
    }
    from toolkit.core.vocab import Decision

    assert set(DECISION_COLOURS) == {d.value for d in Decision}  # every decision has its colour


def test_every_decision_gets_its_colour():
    decisions = list(DECISION_COLOURS)
    frame = pd.DataFrame({"name": [f"c{i}" for i in range(len(decisions) + 1)], "decision": decisions + [""]})
    p = _Parsed(html_table(frame))
    got = p.column(1)
    assert got == [(d, DECISION_COLOURS[d]) for d in decisions] + [("", None)]
    assert p.column(0) == [(f"c{i}", None) for i in range(len(decisions) + 1)]  # other columns plain


def test_decision_enums_are_coloured_by_value():
    from toolkit.core.vocab import Decision

    frame = pd.DataFrame({"decision": [Decision.SHARED, Decision.REFUSED]})
    assert _Parsed(html_table(frame)).column(0) == [
        ("shared", DECISION_COLOURS["shared"]),
        ("refused", DECISION_COLOURS["refused"]),
    ]


@pytest.mark.parametrize("column", ["ok", "method_ok"])
def test_verification_booleans_are_coloured(column):
    frame = pd.DataFrame({"method": ["a", "b", "c"], column: pd.array([True, False, pd.NA], dtype="boolean")})
    assert _Parsed(html_table(frame)).column(1) == [("True", "#d9ead3"), ("False", "#f4cccc"), ("", None)]


def test_other_boolean_columns_are_not_coloured():
    frame = pd.DataFrame({"same_content": [True, False]})
    assert _Parsed(html_table(frame)).column(0) == [("True", None), ("False", None)]


def _verdict(v, statuses=None, findings=()):
    """A verdict over verification frame ``v`` (every method loaded and runnable unless ``statuses`` says)."""
    from toolkit.core.verdict import MethodFacts, build_verdict
    from toolkit.core.vocab import MethodStatus
    from toolkit.engine.frames import check_rows

    statuses = statuses or {}
    facts = [
        MethodFacts(
            m,
            statuses.get(m, (MethodStatus.LOADED, True))[0],
            statuses.get(m, (None, True))[1],
            findings=tuple(f for f in findings if f.method == m),
        )
        for m in v["method"]
    ]
    return build_verdict(program="p", policy="name-only", predicted=False, methods=facts, checks=check_rows(v))


def test_verification_results_are_coloured():
    from toolkit.core.vocab import MethodStatus

    v = pd.DataFrame(
        {
            "method": ["a", "b", "c"],
            "ran": [True, True, False],
            "max_abs_err": [0.0, 0.123456, None],
            "atol": [1e-5, 1e-5, 1e-5],
            "rtol": [1e-4, 1e-4, 1e-4],
            "ok": pd.array([True, False, pd.NA], dtype="boolean"),
            "reason": ["", "outputs differ", "not loaded"],
        }
    )
    p = _Parsed(verification_html(v, _verdict(v, {"c": (MethodStatus.NOT_REACHED, False)})))
    assert p.texts("th") == ["method", "result", "checked against", "max abs err", "atol", "rtol", "reason"]
    assert p.column(1) == [("ok", "#d9ead3"), ("wrong", "#f4cccc"), ("not reached", "#eeeeee")]
    assert [t for t, _c in p.column(2)] == ["eager reference", "eager reference", ""]  # the verdict's oracle
    assert [t for t, _c in p.column(3)] == ["0", "0.123", ""]
    assert [t for t, _c in p.column(6)] == ["", "outputs differ", "not loaded"]


def test_verification_empty():
    assert verification_html(None, None) == verification_html(pd.DataFrame(), None) != ""
    assert "no methods" in verification_html(None, None)


# ------------------------------------------------------------------ rows, empties, cell text


def test_max_rows_cuts_with_a_note():
    frame = pd.DataFrame({"n": range(10)})
    p = _Parsed(html_table(frame, max_rows=3, more_hint="see session.decisions"))
    assert p.texts("td") == ["0", "1", "2"]
    assert p.texts("p") == ["... 7 more rows: see session.decisions"]
    assert "more rows" not in html_table(frame, max_rows=10)
    assert _Parsed(html_table(frame, max_rows=3)).texts("p") == ["... 7 more rows"]


def test_empty_frame():
    assert html_table(pd.DataFrame(columns=["a", "b"]), empty="nothing here").endswith("<i>nothing here</i></p>")
    assert "<table" not in html_table(pd.DataFrame())
    assert "no rows" in html_table(pd.DataFrame())
    # none of the asked-for columns: nothing to show either
    assert "<table" not in html_table(pd.DataFrame({"a": [1]}), ["b"])


def test_missing_values_show_empty():
    frame = pd.DataFrame(
        {
            "s": ["x", None, pd.NA, float("nan")],
            "f": [1.5, float("nan"), None, 2.0],
            "b": pd.array([True, pd.NA, False, pd.NA], dtype="boolean"),
            "i": pd.array([1, pd.NA, 3, None], dtype="Int64"),
            "t": [pd.Timestamp("2024-01-01"), pd.NaT, pd.NaT, pd.NaT],
        }
    )
    p = _Parsed(html_table(frame))
    assert [t for t, _ in p.column(0)] == ["x", "", "", ""]
    assert [t for t, _ in p.column(1)] == ["1.5", "", "", "2.0"]
    assert [t for t, _ in p.column(2)] == ["True", "", "False", ""]
    assert [t for t, _ in p.column(3)] == ["1", "", "3", ""]
    assert [t for t, _ in p.column(4)][1:] == ["", "", ""]
    for bad in ("None", "nan", "NaN", "<NA>", "NaT"):
        assert f">{bad}<" not in html_table(frame)


def test_lists_enums_and_sets_as_text():
    class Colour(enum.Enum):
        RED = "red"

    frame = pd.DataFrame({"l": [["decode", "prefill"], [], ("a", None), {"z", "y"}, [Colour.RED, 2]]})
    assert [t for t, _ in _Parsed(html_table(frame)).column(0)] == ["decode, prefill", "", "a, ", "y, z", "red, 2"]
    assert cell_text(Colour.RED) == "red" and cell_text(["x"]) == "x" and cell_text(None) == ""


def test_columns_select_and_order():
    frame = pd.DataFrame({"a": [1], "b": [2], "c": [3]})
    p = _Parsed(html_table(frame, ["c", "missing", "a", "c"]))
    assert p.texts("th") == ["c", "a"] and p.texts("td") == ["3", "1"]


def test_index_is_hidden_and_output_is_deterministic():
    frame = pd.DataFrame({"a": ["x", "y"]}, index=["<idx>", "<idx>"])  # a non-unique, hostile index
    out = html_table(frame)
    assert "idx" not in out
    assert out == html_table(frame.copy())  # no random ids
    assert html_table(pd.DataFrame({"a": ["x"]})) != html_table(pd.DataFrame({"a": ["z"]}))


def test_text_is_left_aligned():
    css = _Parsed(html_table(pd.DataFrame({"a": ["x"]}))).css
    assert re.search(r"td\s*\{\s*text-align:\s*left", css)


def test_display_imports_only_pandas_the_stdlib_and_the_vocabulary():
    """Each module's own imports, checked in the source, and what importing the package and
    rendering a table loads, in a fresh interpreter: no torch, no plotting or widget library, and
    of the toolkit only the display and the vocabulary."""
    import ast
    from pathlib import Path

    import toolkit.display as display

    allowed = {"__future__", "enum", "hashlib", "html", "math", "re", "typing", "unicodedata", "pandas"}
    for path in sorted(Path(display.__file__).parent.glob("*.py")):
        top = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                top |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                top.add(node.module if node.module.startswith("toolkit.") else node.module.split(".")[0])
        inside = {m for m in top if m.startswith("toolkit.")}
        assert top - inside <= allowed, (path.name, top - inside - allowed)
        assert all(m.startswith("toolkit.display.") or m == "toolkit.core.vocab" for m in inside), (path.name, inside)
    code = (
        "import sys, toolkit.display as d, pandas as pd; d.html_table(pd.DataFrame({'decision': ['shared']})); "
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'torch', 'matplotlib', 'ipywidgets'}), "
        "sorted(n for n in sys.modules if n.startswith('toolkit.') and not n.startswith('toolkit.display')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] ['toolkit.core', 'toolkit.core.vocab']", out.stdout[:2000]


# ------------------------------------------------------------------ the callers


def test_collision_table_html_is_a_wrapper():
    from toolkit.reports.collision import collision_table_html

    frame = pd.DataFrame(
        {"method": ["m"], "name": ["<x>"], "decision": ["declined"], "method_ok": [False], "not_shown": ["secret"]}
    )
    out = collision_table_html(frame, "cap\nline")
    assert out.startswith("<div class='constshare-report'>") and "secret" not in out
    p = _Parsed(out)
    assert p.texts("th") == ["method", "name", "decision", "method_ok"]
    assert p.column(2) == [("declined", DECISION_COLOURS["declined"])]
    assert p.column(3) == [("False", "#f4cccc")]
    assert "cap<br>line" in out
    assert "cap" in collision_table_html(frame.iloc[:0], "cap")  # the caption survives an empty report


def test_widget_helpers_use_the_renderer():
    from toolkit.explorer.markup import table_html

    assert "<i>nothing</i>" in table_html(pd.DataFrame(columns=["a"]), ["a"], "nothing")
    out = table_html(pd.DataFrame({"a": ["<b>"], "wrong_methods": [["decode", "x"]]}), ["a", "wrong_methods"], "e")
    assert "constshare-table" in out and "&lt;b&gt;" in out and ">decode, x<" in out


# ------------------------------------------------------------------ tables that read at real sizes


def _cell_css(p: _Parsed, attrs: dict) -> str:
    """The declarations the <style> block gives this cell (by its id), as 'prop: value; ...'."""
    cell_id = attrs.get("id")
    out = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", p.css):
        if cell_id and f"#{cell_id}" in [x.strip() for x in selectors.split(",")]:
            out += [d.strip() for d in body.split(";") if d.strip()]
    return "; ".join(out)


def _column_css(p: _Parsed, index: int) -> str:
    return " ".join(
        body
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", p.css)
        if re.search(rf"td\.col{index}\b", selectors)
    )


def test_tables_keep_their_natural_width_and_wrap_only_prose():
    frame = pd.DataFrame({"name": ["_tensor_constant0"], "reason": ["a long sentence " * 8], "error": ["x"]})
    out = html_table(frame)
    table_tag = re.search(r"<table[^>]*>", out).group(0)
    # JupyterLab's own table CSS is table-layout: fixed (equal columns, one word per line); ours wins inline
    assert "table-layout: auto" in table_tag and "margin-left: 0" in table_tag
    assert out.startswith('<div class="constshare-scroll" style="overflow-x: auto')  # scrolls, never squeezes
    p = _Parsed(out)
    assert re.search(r"td\s*\{[^}]*white-space:\s*nowrap", p.css)  # identifiers on one line
    for i in (1, 2):  # prose wraps, at a readable width
        css = _column_css(p, i)
        assert "white-space: normal" in css and "min-width: 16em" in css and "max-width: 34em" in css
    assert "white-space: normal" not in _column_css(p, 0)


def test_short_digest_keeps_the_difference_visible():
    a = "0123456789abcdef" * 4
    b = "0123456789abcdef" * 2 + "f" + a[33:]  # parts at character 32
    assert short_digest(a) == a[:12] + "\u2026"
    assert short_digest(a, a) == a[:12] + "\u2026"
    assert short_digest(a, b) == "0123\u2026" + a[32:40] + "\u2026"
    assert short_digest(b, a) == "0123\u2026" + b[32:40] + "\u2026"
    assert short_digest(a, b) != short_digest(b, a)  # the shortened texts differ where the digests do
    c = "f" + a[1:]
    assert short_digest(a, c) == a[:12] + "\u2026" and short_digest(c, a) == c[:12] + "\u2026"


def test_digests_in_a_row_are_shortened_against_each_other_with_the_full_one_on_hover():
    a = "ab" * 32
    b = "ab" * 10 + "cd" + "ab" * 21
    frame = pd.DataFrame(
        {"field": ["digest", "dtype"], "cached": [a, "float32"], "new": [b, "float32"], "equal": [False, True]}
    )
    p = _Parsed(html_table(frame))
    texts = p.texts("td")
    assert texts[1] == short_digest(a, b) and texts[2] == short_digest(b, a) and texts[1] != texts[2]
    assert a not in texts and b not in texts
    titles = [attrs.get("title", "") for tag, attrs, _t in p.cells if tag == "td"]
    assert titles[1].startswith(a) and titles[2].startswith(b) and "differs" in titles[1]
    assert p.column(3) == [("False", "#f4cccc"), ("True", None)]  # an unequal field is red


def test_content_check_and_the_culprit():
    d = pd.DataFrame(
        {
            "method": ["a", "b", "c", "d"],
            "name": ["w"] * 4,
            "decision": ["loaded", "shared", "shared", "declined"],
            "digest": ["x" * 64, "y" * 64, "x" * 64, "z" * 64],
            "cached_digest": ["", "x" * 64, "x" * 64, "x" * 64],
            "data_problem": ["", "content differs", "", ""],
        }
    )  # the loader's verdict.find_problem
    checked = content_check(d)
    assert list(checked.columns).index("same_content") == list(checked.columns).index("decision") + 1
    assert checked["same_content"].tolist()[1:] == [False, True, False] and pd.isna(checked["same_content"][0])
    assert culprit_mask(checked).tolist() == [False, True, False, False]
    assert not culprit_mask(d.drop(columns="data_problem")).any()  # the verdict's column, never re-derived
    p = _Parsed(html_table(checked, ["method", "decision", "same_content"]))
    cells = [(t, _cell_css(p, a)) for g, a, t in p.cells if g == "td"]
    decision, same = cells[1::3], cells[2::3]
    assert CULPRIT_STYLE in decision[1][1] and CULPRIT_STYLE in same[1][1]  # b: shared, other content
    assert DECISION_COLOURS["shared"] in decision[2][1] and CULPRIT_STYLE not in decision[2][1]  # c: honest share
    assert "#fff2cc" in same[3][1] and CULPRIT_STYLE not in decision[3][1]  # d: caught, amber
    assert same[0] == ("", "")


def test_bytes_are_formatted_with_the_exact_count_on_hover():
    p = _Parsed(html_table(pd.DataFrame({"nbytes": [16384, 525_619, 12], "device_bytes": [0, 1536, 3 * 1024**3]})))
    assert [t for t, _c in p.column(0)] == ["16 KiB", "513.3 KiB", "12 B"]
    assert [t for t, _c in p.column(1)] == ["0 B", "1.5 KiB", "3 GiB"]
    titles = [a.get("title") for g, a, _t in p.cells if g == "td"]
    assert titles[:2] == ["16,384 bytes", "0 bytes"]
    assert re.search(r"td\.col0\s*\{[^}]*text-align:\s*right", p.css)


def test_reason_code_shows_the_full_reason_on_hover_escaped():
    evil = '<b>"x"</b> & <script>'
    p = _Parsed(html_table(pd.DataFrame({"reason_code": ["name_hit"], "reason": [evil]}), ["reason_code"]))
    ((tag, attrs, text),) = [c for c in p.cells if c[0] == "td"]
    assert text == "name_hit" and attrs["title"] == evil
    assert "<script" not in html_table(pd.DataFrame({"reason_code": ["c"], "reason": [evil]}), ["reason_code"])


def test_outcome_texts_and_scorecards_are_coloured():
    card = pd.DataFrame(
        {
            "sample": ["a", "b", "c"],
            "name-only": ["WRONG: decode", "ok", "load refused"],
            "fingerprint": ["ok", "ok", "ok"],
            "correct": [False, True, True],
        }
    )
    p = _Parsed(html_table(card))
    assert p.column(1) == [("WRONG: decode", "#f4cccc"), ("ok", "#d9ead3"), ("load refused", "#eeeeee")]
    assert p.column(2) == [("ok", "#d9ead3")] * 3
    assert p.column(3) == [("False", "#f4cccc"), ("True", "#d9ead3"), ("True", "#d9ead3")]
    assert p.column(0) == [("a", None), ("b", None), ("c", None)]  # not every text column is an outcome


def test_table_for_notebooks_shows_every_row_and_the_index_on_request():
    frame = pd.DataFrame({"x": range(300)}, index=pd.Index([f"r{i}" for i in range(300)], name="row"))
    t = table(frame)
    assert "more rows" not in t._repr_html_() and len(_Parsed(t._repr_html_()).texts("td")) == 300
    assert "r1" not in t._repr_html_()
    t = table(frame.head(3), index=True)
    assert _Parsed(t._repr_html_()).texts("th") == ["row", "x"]
    assert repr(t).splitlines()[0].split() == ["row", "x"]


def test_markdown_is_rendered_escaped():
    out = markdown_html("`a<b>` **bold** <i>not a tag</i> *em*\n\nsecond `x*y` 3 * 4")
    assert "<code>a&lt;b&gt;</code>" in out and "<b>bold</b>" in out and "<i>em</i>" in out
    assert "&lt;i&gt;not a tag&lt;/i&gt;" in out and "`" not in out and "**" not in out
    assert out.count("<p") == 2 and "<code>x*y</code> 3 * 4" in out


def test_verification_names_the_constants_that_run_on_other_data():
    from toolkit.core.verdict import find_problem
    from toolkit.core.vocab import Decision

    v = pd.DataFrame(
        {
            "method": ["prefill", "decode"],
            "ran": [True, True],
            "max_abs_err": [0.0, 9.0],
            "atol": [1e-5] * 2,
            "rtol": [1e-4] * 2,
            "ok": [True, False],
            "reason": ["", "outputs differ"],
        }
    )
    found = [
        find_problem(
            method="decode",
            name="w",
            fqn="w",
            decision=Decision.SHARED,
            digest="b" * 64,
            mutated=False,
            storage="",
            slot_problem="",
            cached_method="prefill",
            cached_name="w",
            cached_digest="a" * 64,
        )
    ]
    p = _Parsed(verification_html(v, _verdict(v, findings=found)))
    assert p.texts("th")[-1] == "runs on other data"
    assert p.column(7) == [("", None), ("w (content differs)", "#fff2cc")]  # not tested by blame: amber
    assert "runs on other data" not in verification_html(v, _verdict(v))  # nothing found: no column


def test_verification_says_blames_finding_once_for_the_constants_it_was_found_for():
    from toolkit.core.verdict import ConstantFinding
    from toolkit.core.vocab import BlameStatus, DataProblem
    from toolkit.display.findings import findings_text

    note = "breaks standalone (only together with the 4 other swaps of this set)"

    class V:
        def findings(self, method):
            return [
                ConstantFinding(
                    method,
                    f"w{i}",
                    f"w{i}",
                    DataProblem.CONTENT_DIFFERS,
                    "differs",
                    f"a/w{i}",
                    BlameStatus.CULPRIT,
                    note,
                    ("standalone",),
                )
                for i in range(5)
            ] + [
                ConstantFinding(
                    method,
                    "h",
                    "h",
                    DataProblem.CONTENT_DIFFERS,
                    "differs",
                    "a/h",
                    BlameStatus.HARMLESS,
                    "undoing it fixes nothing",
                )
            ]

    text = findings_text(V(), "decode")
    assert text.count("only together with the 4 other swaps") == 1
    assert text == (
        f"w0, w1, w2, w3, w4 (content differs; culprit: {note}); "
        f"h (content differs; harmless: undoing it fixes nothing)"
    )


def test_session_facts_are_a_table_in_binary_units():
    from types import SimpleNamespace

    from toolkit.display.session import session_facts_html

    decisions = pd.DataFrame({"method": ["prefill", "decode"], "name": ["w", "w"], "decision": ["loaded", "shared"]})
    methods = [
        SimpleNamespace(name="prefill", blob_bytes=35_485_875_968),
        SimpleNamespace(name="decode", blob_bytes=35_485_875_968),
    ]
    results = {
        m.name: SimpleNamespace(method=m.name, status="loaded", device_bytes=b, runnable=True, problems=[])
        for m, b in zip(methods, (35_485_875_968, 0))
    }
    session = SimpleNamespace(
        decisions=decisions,
        results=results,
        devices={"prefill": "cuda:0", "decode": "cuda:0"},
        program=SimpleNamespace(name="prog", methods=methods, device="cuda"),
        policy=SimpleNamespace(name=SimpleNamespace(value="name-only")),
        status="loaded",
        error=None,
        device_bytes=35_485_875_968,
    )
    out = session_facts_html(session, predicted=True, name="llama_cuda")
    assert "llama_cuda (2 methods, on cuda:0)" in out and "predicted (dry run: nothing loaded or run)" in out
    assert "33.0 GiB would be on the device" in out and "66.1 GiB with each method on its own blob" in out
    assert "35,485,875,968" not in out and "<pre>" not in out
    assert ">loaded<" not in session_facts_html(session, predicted=True).replace("loaded 1", "")
