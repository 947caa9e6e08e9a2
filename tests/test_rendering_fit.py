"""toolkit.display.tables: the options that keep a table inside a notebook's width.

``wrap`` (more prose columns), ``capped`` (one line at a capped width, the whole text on hover),
``decimals``, :func:`shorten_digests`, left captions; and the session view's "show all
decisions" box: the reason on hover over its code, names and FQNs capped.  Whether the tables
really fit a notebook's width is measured in the browser (``tests/test_browser.py``).
"""

from __future__ import annotations

import re

import pandas as pd
from test_rendering import _Parsed
from test_report import _decided_session

from toolkit.display.cells import DIGEST_SHOWN, shorten_digests
from toolkit.display.session import SESSION_ALL_CAPPED, SESSION_CAPPED, session_html
from toolkit.display.tables import CAPPED_EM, html_table, table


def _column_css(p: _Parsed, index: int) -> str:
    return " ".join(
        body
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", p.css)
        if re.search(rf"td\.col{index}\b", selectors)
    )


def _titles(p: _Parsed) -> list[str]:
    return [a.get("title", "") for g, a, _t in p.cells if g == "td"]


def test_wrap_makes_more_columns_prose():
    frame = pd.DataFrame({"policy": ["name-only"], "behaviour": ["share on name alone, never compare " * 3]})
    plain, wrapped = _Parsed(html_table(frame)), _Parsed(html_table(frame, wrap=["behaviour"]))
    assert "white-space: normal" not in _column_css(plain, 1)
    assert "white-space: normal" in _column_css(wrapped, 1) and "max-width: 34em" in _column_css(wrapped, 1)
    assert "white-space: normal" not in _column_css(wrapped, 0)


def test_capped_columns_are_cut_with_the_whole_text_on_hover_escaped():
    long = "model.decoder.layers.0.encoder_attn.<k_proj>.weight"
    frame = pd.DataFrame({"fqn": [long, "w"], "payload": ["ETCUDAFQN3", "x" * 80], "n": [1, 2]})
    out = html_table(frame, capped={"fqn": 10, "payload": 30})
    p = _Parsed(out)
    for i, em in ((0, 10), (1, 30)):
        css = _column_css(p, i)
        assert f"max-width: {em}em" in css and "text-overflow: ellipsis" in css and "overflow: hidden" in css
        assert "white-space: nowrap" in css
    assert "max-width" not in _column_css(p, 2)
    assert p.texts("td")[0] == long  # the cell holds the whole text; the browser cuts it
    titles = _titles(p)
    assert titles[0] == long and titles[3] == ""  # long texts carry themselves on hover, short ones need not
    assert titles[4] == "x" * 80 and titles[1] == ""
    assert "<k_proj>" not in out  # escaped, in the cell and in its title
    # a list of columns: the default width
    assert f"max-width: {CAPPED_EM}em" in _column_css(_Parsed(html_table(frame, capped=["fqn"])), 0)


def test_a_capped_column_keeps_a_title_it_already_has():
    d = "ab" * 32
    p = _Parsed(
        html_table(
            pd.DataFrame({"digest": [d], "reason_code": ["name_hit_unchecked_all_hit_branch"], "reason": ["why"]}),
            ["digest", "reason_code"],
            capped={"digest": 4, "reason_code": 4},
        )
    )
    assert _titles(p) == [d, "why"]


def test_decimals_and_left_captions():
    frame = pd.DataFrame({"policy": ["a", "b", "c"], "x M": [1.0, 1.4444, float("nan")], "n": [1, 2, 3]})
    p = _Parsed(table(frame, decimals=2, caption="our samples")._repr_html_())
    assert p.texts("td")[1::3] == ["1.00", "1.44", ""] and p.texts("td")[2::3] == ["1", "2", "3"]
    assert re.search(r"td\.col1\s*\{[^}]*text-align:\s*right", p.css)  # still a number
    assert p.texts("caption") == ["our samples"] and re.search(r"caption\s*\{[^}]*text-align:\s*left", p.css)
    assert _Parsed(html_table(frame)).texts("td")[4] == "1.4444"


def test_shorten_digests_inside_text():
    a, b = "e4" * 32, "0f" * 32
    key = f"cuda_fqn_weight:cpu:{a}_so_blob:_tensor_constant0"
    assert shorten_digests(key) == f"cuda_fqn_weight:cpu:{a[:DIGEST_SHOWN]}\u2026_so_blob:_tensor_constant0"
    assert shorten_digests(f"{a}, {b}", 8) == f"{a[:8]}\u2026, {b[:8]}\u2026"
    assert shorten_digests("ETCUDAFQN3") == "ETCUDAFQN3" and shorten_digests("ab" * 10) == "ab" * 10


def test_every_decision_box_has_the_reason_on_hover_and_capped_names():
    a, b = "a" * 64, "b" * 64
    long = "model.decoder.layers.0.self_attn.k_proj.weight_with_a_very_long_tail"
    rows = [("enc", long, "loaded", "miss", a, ""), ("dec", long, "shared", "hit", b, a)]
    h = session_html(_decided_session(rows))
    collisions, everything = h.split("<details")
    for i in (1, 2):  # name, fqn among the collisions (method first)
        assert f"max-width: {SESSION_CAPPED['fqn']:g}em" in _column_css(_Parsed(collisions), i)
    p = _Parsed(everything)
    assert "reason" not in p.texts("th") and "reason_code" in p.texts("th")
    assert p.texts("th")[:3] == ["method", "name", "fqn"]
    titles = _titles(p)
    assert "why" in titles  # the full reason, on hover over its code
    assert titles.count(long) == 4  # name and fqn of both rows, whole on hover
    for i in (1, 2):
        assert f"max-width: {SESSION_ALL_CAPPED['fqn']:g}em" in _column_css(p, i)
