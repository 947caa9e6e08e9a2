"""CSV collision reports: columns, round trips, spreadsheet safety."""

from __future__ import annotations

import csv
import io
import math
import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit import load_program
from toolkit.core.errors import ReportError
from toolkit.reports.collision import (
    REPORT_COLUMNS,
    REPORT_SCHEMA,
    CollisionReport,
    collision_report,
    read_report,
    to_csv,
    typed_frame,
)
from toolkit.reports.tabular import FORMULA_TRIGGERS, neutralize, unneutralize

_DEFAULTS = {"str": "x", "int": 0, "float": 0.5, "bool": False, "optional_bool": pd.NA}


def synthetic(rows: list[dict]) -> CollisionReport:
    """A report built from plain rows (no program needed); unspecified cells get defaults."""
    full = [{c: r.get(c, _DEFAULTS[k]) for c, k in REPORT_SCHEMA.items()} for r in rows]
    return CollisionReport(typed_frame(pd.DataFrame(full, columns=list(REPORT_COLUMNS))))


def roundtrip(report: CollisionReport) -> tuple[str, CollisionReport]:
    buf = io.StringIO()
    report.to_csv(buf)
    text = buf.getvalue()
    return text, read_report(io.StringIO(text))


@pytest.fixture(scope="module")
def name_only_report(built_sample):
    s = load_program(built_sample("total_collision"), "name-only")
    try:
        v = s.verify()
        yield s, v, collision_report(s, v)
    finally:
        s.close()


@pytest.mark.slow
def test_report_of_total_collision_name_only(name_only_report):
    s, v, r = name_only_report
    f = r.frame
    assert tuple(f.columns) == REPORT_COLUMNS
    assert len(f) == sum(len(m.constants) for m in s.program.methods)
    assert f["method"].tolist() == ["prefill", "decode"]  # load order
    decode = f[f["method"] == "decode"].iloc[0]
    assert decode["collision"] and decode["decision"] == "shared"
    assert decode["reason_code"] == "name_hit_unchecked"
    assert decode["same_metadata"] == True  # noqa: E712  (equal metadata...)
    assert decode["same_content"] == False  # noqa: E712  (...different data)
    assert decode["method_ran"] and not decode["method_ok"] and decode["max_abs_err"] > 1
    assert decode["cached_method"] == "prefill" and decode["cached_digest"] != decode["new_digest"]
    prefill = f[f["method"] == "prefill"].iloc[0]
    assert not prefill["collision"] and prefill["decision"] == "loaded" and pd.isna(prefill["same_content"])
    assert r.wrong_methods == ["decode"]
    assert len(r.collisions) == 1
    assert "wrong outputs: decode" in repr(r)
    assert "shared despite different content: decode/_tensor_constant0" in repr(r)


@pytest.mark.slow
def test_csv_round_trip_through_pandas_and_read_report(name_only_report, tmp_path):
    s, v, r = name_only_report
    path = tmp_path / "report.csv"
    returned = to_csv(s, path, verification=v)
    pd.testing.assert_frame_equal(returned.frame, r.frame)
    plain = pd.read_csv(path)  # opens cleanly with defaults
    assert list(plain.columns) == list(REPORT_COLUMNS)
    assert plain["decision"].tolist() == ["loaded", "shared"]
    assert plain["nbytes"].dtype.kind == "i" and plain["max_abs_err"].dtype.kind == "f"
    back = read_report(path)
    pd.testing.assert_frame_equal(back.frame, r.frame)
    with open(path, encoding="utf-8") as fh:  # a handle works as well as a path
        pd.testing.assert_frame_equal(read_report(fh).frame, r.frame)
    # writing the same session twice gives byte-identical files (clean diffs)
    again = tmp_path / "again.csv"
    r.to_csv(again)
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.slow
def test_constants_of_methods_not_loaded_are_reported_undecided(built_sample):
    from toolkit.core.policies import get_policy
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session

    prog = built_sample("total_collision")
    s = Session(prog, get_policy("fingerprint"), resolve_devices(prog, None))
    s.load_method("prefill")
    try:
        f = collision_report(s).frame
    finally:
        s.close()
    decode = f[f["method"] == "decode"].iloc[0]
    assert decode["decision"] == "" and "not decided" in decode["reason"]
    assert not decode["method_ran"] and math.isnan(decode["max_abs_err"])
    assert f[f["method"] == "prefill"].iloc[0]["decision"] == "loaded"


NASTY = ["=cmd|' /C calc'!A0", "+1+1", "-2", "@SUM(A1)", "\tTAB", "\rCR", "'quoted", 'a,b\n"c"', "<b>x</b>", ""]


def test_formula_cells_are_neutralised_and_restored():
    r = synthetic([{"name": n, "fqn": n, "reason": n, "program": n} for n in NASTY])
    text, back = roundtrip(r)
    raw = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    for col in ("name", "fqn", "reason", "program"):
        for cell in raw[col]:
            assert not cell.startswith(FORMULA_TRIGGERS), (col, cell)
    assert sorted(raw["name"]) == sorted(neutralize(n) for n in NASTY)
    assert raw[raw["name"] == "'=cmd|' /C calc'!A0"].shape[0] == 1
    pd.testing.assert_frame_equal(back.frame, r.frame)
    # and straight through the csv module: every row parses to the full width
    rows = list(csv.reader(io.StringIO(text)))
    assert all(len(row) == len(REPORT_COLUMNS) for row in rows)


def test_numbers_are_not_escaped():
    r = synthetic([{"nbytes": 16384, "max_abs_err": float("nan"), "load_order": 3}])
    text, back = roundtrip(r)
    raw = pd.read_csv(io.StringIO(text))
    assert raw["nbytes"].iloc[0] == 16384 and math.isnan(raw["max_abs_err"].iloc[0])
    pd.testing.assert_frame_equal(back.frame, r.frame)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20))
def test_neutralize_is_reversible_and_safe(s):
    n = neutralize(s)
    assert unneutralize(n) == s
    assert not n.startswith(FORMULA_TRIGGERS)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
        min_size=1,
        max_size=4,
    )
)
def test_any_names_round_trip(names):
    r = synthetic([{"name": n, "fqn": n, "method": "m"} for n in names])
    _, back = roundtrip(r)
    pd.testing.assert_frame_equal(back.frame, r.frame)


def test_rows_are_sorted_by_load_order_then_name():
    r = synthetic([{"load_order": 1, "name": "b"}, {"load_order": 0, "name": "z"}, {"load_order": 1, "name": "a"}])
    assert list(zip(r.frame["load_order"], r.frame["name"])) == [(0, "z"), (1, "a"), (1, "b")]


def test_read_report_rejects_other_csv(tmp_path):
    p = tmp_path / "other.csv"
    p.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(ReportError, match="not a collision report"):
        read_report(p)
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ReportError):
        read_report(empty)
    bad = synthetic([{}])
    buf = io.StringIO()
    bad.to_csv(buf)
    with pytest.raises(ReportError, match="load_order"):
        read_report(io.StringIO(buf.getvalue().replace(",0,", ",zero,", 1)))


def test_html_escapes_names_and_colours_decisions():
    r = synthetic([{"name": "<script>alert(1)</script>", "decision": "shared", "program": "p", "policy": "q"}])
    h = r._repr_html_()
    assert "<script>" not in h and "&lt;script&gt;" in h
    assert "background-color" in h


def test_toolkit_report_names_the_collision_report_module():
    """``toolkit.report`` is the collision report's module, as users write it, in a fresh interpreter."""
    import subprocess
    import sys

    code = "import toolkit; print(toolkit.report.to_csv.__module__, toolkit.report.read_report.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["toolkit.reports.collision"] * 2
    import toolkit

    assert toolkit.report.to_csv is to_csv and toolkit.report.read_report is read_report


def test_report_module_does_not_import_presentation_libraries():
    import subprocess
    import sys

    code = (
        "import sys, toolkit, toolkit.reports.collision; "
        "print(any(m.split('.')[0] in ('matplotlib', 'ipywidgets') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ rich display of sessions (display/session.py)


def _fake_session(name: str, status: str = "loaded", error: str | None = None):
    """Just what session_text / session_html read, with a real event log and real method results."""
    from types import SimpleNamespace

    from toolkit.core import events as ev
    from toolkit.core.vocab import Decision, MethodStatus, Reason, TensorOrigin
    from toolkit.engine.frames import decisions_frame
    from toolkit.engine.loader import MethodResult

    log = ev.EventLog()
    for method, decision in (("m1", Decision.LOADED), ("m2", Decision.SHARED)):
        log.record(
            ev.Decided,
            method,
            device="cpu",
            name=name,
            fqn=name,
            constant_kind="buffer",
            mutated=False,
            lookup="hit",
            decision=decision,
            reason_code=Reason.NAME_HIT,
            reason=f"<i>{name}</i>",
            origin=TensorOrigin.CACHE,
            shared_from="",
            nbytes=4,
            dtype="float32",
            shape="(1,)",
            strides="(1,)",
            digest="d",
            cached_method="",
            cached_dtype="",
            cached_shape="",
            cached_strides="",
            cached_digest="",
            slot_problem="",
        )
    spec1, spec2 = SimpleNamespace(name="m1", blob_bytes=64), SimpleNamespace(name="m2", blob_bytes=64)
    results = {
        "m1": MethodResult("m1", "cpu", MethodStatus.LOADED, True, 64, 0, True),
        "m2": MethodResult("m2", "cpu", MethodStatus.LOADED, False, 0, 0, False, ("x",)),
    }
    return SimpleNamespace(
        decisions=decisions_frame(log),
        program=SimpleNamespace(name=name, methods=[spec1, spec2], device="cpu"),
        policy=SimpleNamespace(name=SimpleNamespace(value="name-only")),
        status=status,
        error=error,
        failed_method="m2" if error else None,
        results=results,
        device_bytes=64,
    )


def test_session_text_summary():
    from toolkit.display.session import session_text

    text = session_text(_fake_session("w", status="failed", error="boom"))
    lines = text.splitlines()
    assert lines[0] == "program 'w' (2 methods, cpu) under policy 'name-only': failed"
    assert "  error in 'm2': boom" in lines
    assert "  decisions: loaded 1, shared 1" in lines
    assert "  64 constant bytes on device in all (each of these methods on its own blob: 128)" in lines
    assert any(ln.startswith("  m2: 0 constant bytes on cpu  NOT RUNNABLE") for ln in lines)


def test_session_html_escapes_and_colours():
    from toolkit.display.palette import DECISION_COLOURS
    from toolkit.display.session import session_html

    evil = "<img src=x onerror=alert(1)>"
    h = session_html(_fake_session(evil, status="failed", error=f"bad {evil}"))
    assert "<img" not in h and "&lt;img src=x onerror=alert(1)&gt;" in h
    # the collisions (both names hit the cache), then every decision in a collapsed box
    assert h.count("<table") == 2 and h.count("<tr>") == 6
    assert "2 names already in the cache" in h and "<summary>show all 2 decisions</summary>" in h
    assert f"background-color: {DECISION_COLOURS['shared']}" in h
    assert "color: #cc0000" in h  # a failed load stands out
    assert "(not runnable)" in h


@pytest.mark.slow
def test_real_session_reprs(name_only_report):
    s, _v, _r = name_only_report
    assert repr(s).startswith("program 'total_collision' (2 methods, cpu) under policy 'name-only': loaded")
    assert "name_hit_unchecked" in s._repr_html_()


def _decided_session(rows):
    """A session stand-in whose decisions are ``rows`` (method, name, decision, lookup, digest, cached_digest)."""
    from types import SimpleNamespace

    from toolkit.core import events as ev
    from toolkit.core.verdict import find_problem
    from toolkit.core.vocab import Decision, Reason, TensorOrigin
    from toolkit.engine.frames import decisions_frame

    log = ev.EventLog()
    for method, name, decision, lookup, digest, cached in rows:
        found = find_problem(
            method=method,
            name=name,
            fqn=name,
            decision=Decision(decision),
            digest=digest,
            mutated=False,
            storage="",
            slot_problem="",
            cached_method="enc" if cached else "",
            cached_name=name,
            cached_digest=cached,
        )
        log.record(
            ev.Decided,
            method,
            device="cpu",
            name=name,
            fqn=name,
            constant_kind="parameter",
            mutated=False,
            lookup=lookup,
            decision=Decision(decision),
            reason_code=Reason.NAME_HIT,
            reason="why",
            origin=TensorOrigin.CACHE,
            shared_from="",
            nbytes=4,
            dtype="float32",
            shape="(1,)",
            strides="(1,)",
            digest=digest,
            cached_method="enc" if cached else "",
            cached_dtype="",
            cached_shape="",
            cached_strides="",
            cached_digest=cached,
            slot_problem="",
            data_problem=found.problem.value if found else "",
        )
    methods = sorted({r[0] for r in rows})
    return SimpleNamespace(
        decisions=decisions_frame(log),
        program=SimpleNamespace(
            name="p", methods=[SimpleNamespace(name=m, blob_bytes=4) for m in methods], device="cpu"
        ),
        policy=SimpleNamespace(name=SimpleNamespace(value="decline-on-mismatch")),
        status="loaded",
        error=None,
        failed_method=None,
        results={},
        device_bytes=0,
    )


def test_session_html_scales_and_points_at_the_culprits():
    """50 decisions: counts, the collisions with the culprits first, the rest one click away."""
    from toolkit.display.palette import CULPRIT_STYLE
    from toolkit.display.session import session_html, session_text

    a, b = "a" * 64, "b" * 64
    rows = [("enc", f"w{i}", "loaded", "miss", a, "") for i in range(30)]
    rows += [("dec", f"w{i}", "shared", "hit", a, a) for i in range(13)]  # honest shares
    rows += [("dec", f"w{i}", "shared", "hit", b, a) for i in range(13, 20)]  # 7 of other content
    h = session_html(_decided_session(rows))
    assert "50 decisions" in h and "7 constants run on other data than their own" in h
    assert "20 names already in the cache" in h
    collisions, everything = h.split("<details")
    assert collisions.count("<tr>") == 21  # header + the 20 hits, not all 50
    first_rows = re.findall(r"<tr>.*?</tr>", collisions, flags=re.S)[1:8]
    assert all(">w1" in r and f">{'shared'}<" in r for r in first_rows)  # w13..w19: the culprits come first
    # their decision (col 3) and same_content (col 4) cells, and only theirs, carry the culprit style
    # (no lookup column among the collisions: every one is a hit)
    rule = next(sel for sel, body in re.findall(r"([^{}]+)\{([^{}]*)\}", collisions) if "#990000" in body)
    marked = set(re.findall(r"_row(\d+)_col(\d+)", rule))
    assert marked == {(str(r), c) for r in range(7) for c in ("3", "4")}, marked
    assert CULPRIT_STYLE.startswith("background-color: #f4cccc")
    assert everything.count("<tr>") == 51 and "max-height: 32em; overflow: auto" in everything
    assert "content check: 7 run on other data than their own" in session_text(_decided_session(rows))


def test_every_column_is_documented_in_its_order_and_type():
    """docs/report_columns.md lists the columns the CSV has, in the CSV's order, each with its type."""
    from pathlib import Path

    from toolkit.reports.collision import REPORT_SCHEMA

    doc = (Path(__file__).resolve().parents[1] / "docs" / "report_columns.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(\w+)` \| (\w+) \| .+ \|$", doc, flags=re.M)
    kinds = {"optional_bool": "bool"}
    assert listed == [(c, kinds.get(k, k)) for c, k in REPORT_SCHEMA.items()]
