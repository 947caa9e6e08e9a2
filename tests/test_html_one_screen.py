"""The HTML report reads in one screen: the verdict, one summary table, the findings once each and what
was not checked come first, each policy's detail is collapsed, empty columns are gone, the counts say
what they count, and a report of thousands of rows stays small, saying the rest are in the CSV."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from toolkit.core.policies.releases import executorch_releases
from toolkit.core.verdict import ConstantFinding, MethodVerdict, NotChecked, Verdict
from toolkit.core.vocab import BlindSpot, DataProblem, MethodOutcome, Stage
from toolkit.reports.html import (
    DETAIL_ROWS,
    OVERVIEW_ROWS,
    LoadFrames,
    html_report,
    not_checked_frame,
    without_empty_columns,
)

OK, WRONG, REFUSED = MethodOutcome.OK, MethodOutcome.WRONG, MethodOutcome.REFUSED
POLICIES = ["no-sharing", "name-only", "decline-on-mismatch"]
STATE = NotChecked(
    "sequences", BlindSpot.STATE, "a dry run cannot check state across a sequence (kv may be state)", "load it"
)


def finding(method: str, name: str) -> ConstantFinding:
    return ConstantFinding(
        method, name, name, DataProblem.CONTENT_DIFFERS, "cached 1e833117b925... own 9df0ab238ef1...", f"decode/{name}"
    )


def verdict(program: str, policy: str, wrong: bool = False, refused: bool = False) -> Verdict:
    if refused:
        methods = (MethodVerdict("decode", REFUSED, "duplicate key"), MethodVerdict("prefill", REFUSED, "duplicate"))
        return Verdict(program, policy, True, methods, error="duplicate key", failed_stage=Stage.EXPORT)
    methods = (MethodVerdict("decode", OK), MethodVerdict("prefill", WRONG if wrong else OK, "would run on other data"))
    return Verdict(
        program,
        policy,
        True,
        methods,
        constants=(finding("prefill", "_tensor_constant0"),) if wrong else (),
        not_checked=(STATE,) if program == "kv" else (),
    )


def zoo() -> tuple[list[Verdict], list[str]]:
    """Three programs under three policies: ``collide`` wrong under two, ``refusing`` refused under one,
    ``kv`` ok with its state not checked."""
    verdicts, labels = [], []
    for label in ("collide", "refusing", "kv"):
        for p in POLICIES:
            verdicts.append(
                verdict(
                    label,
                    p,
                    wrong=label == "collide" and p != "no-sharing",
                    refused=label == "refusing" and p == "name-only",
                )
            )
            labels.append(f"zoo/{label}/prog.pte")
    return verdicts, labels


def section(page: str, sid: str) -> str:
    start = page.index(f'<section id="{sid}"')
    return page[start : page.index("</section>", start)]


def headers(html: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", html, flags=re.S)]


def test_the_answer_comes_first_and_every_detail_is_collapsed_after_it():
    verdicts, labels = zoo()
    page = html_report(verdicts, labels=labels, title="scan")
    at = [page.index(f'<section id="{s}"') for s in ("verdict", "summary", "findings", "not-checked", "policies")]
    assert at == sorted(at)
    assert page.index("<details") > at[3], "nothing before the blind spots is collapsed"
    details = section(page, "policies")
    assert details.count('<details class="policy">') == len(POLICIES)
    assert "<details open" not in page and "<script" not in page.lower()
    for p in POLICIES:  # each policy's detail is named with the ExecuTorch releases that run it
        assert f"<summary>{p} ({executorch_releases(p)}):" in details


def test_the_summary_is_one_table_of_programs_by_policies_headed_by_executorch_releases():
    verdicts, labels = zoo()
    summary = section(html_report(verdicts, labels=labels, title="scan"), "summary")
    assert summary.count("<table") == 1
    assert headers(summary) == ["program", *(f"{p}: {executorch_releases(p)}" for p in POLICIES), "not checked"]
    rows = re.findall(r"<tr>(.*?)</tr>", summary, flags=re.S)[1:]
    cells = [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, flags=re.S)] for r in rows
    ]
    assert cells == [
        ["zoo/collide/prog.pte", "ok", "wrong", "wrong", ""],
        ["zoo/refusing/prog.pte", "ok", "refused", "ok", ""],
        ["zoo/kv/prog.pte", "ok", "ok", "ok", "sequence state"],
    ]


def test_counts_say_what_they_count():
    verdicts, labels = zoo()
    counts = section(html_report(verdicts, labels=labels, title="scan"), "verdict")
    said = dict(re.findall(r"<span>([^<:]+): <b>([^<]+)</b></span>", counts))
    assert said == {
        "programs": "3",
        "policies": "3",
        "programs wrong under some policy": "1 of 3",
        "programs refused under some policy": "1 of 3",
        "programs ok under every policy": "1 of 3",
        "programs with something not checked": "1 of 3",
    }
    one = section(html_report([verdicts[1]], title="one load"), "verdict")  # one load: its methods
    assert "methods wrong: <b>1 of 2</b>" in one and "methods ok: <b>1 of 2</b>" in one


def test_a_finding_is_one_row_listing_the_policies_it_holds_under():
    verdicts, labels = zoo()
    findings = section(html_report(verdicts, labels=labels, title="scan"), "findings")
    assert findings.count("_tensor_constant0") == 1  # once, not once per policy
    assert "name-only, decline-on-mismatch" in findings
    assert findings.count("duplicate key") == 1 and "refused at export" in findings  # one row, the one policy
    cols = headers(findings)
    assert cols.index("constant") < cols.index("evidence") == len(cols) - 1  # names first, digests last
    assert "fqn" not in cols and "blame" not in cols  # nothing in them: dropped


def test_not_checked_is_a_section_with_how_to_check_it():
    verdicts, labels = zoo()
    page = html_report(verdicts, labels=labels, title="scan")
    gaps = section(page, "not-checked")
    assert "kv may be state" in gaps and "load it" in gaps and "every policy (3)" in gaps
    frame = not_checked_frame(verdicts, labels)
    assert len(frame) == 1 and frame.iloc[0]["policies"] == ", ".join(POLICIES)
    ok = [Verdict("p", "name-only", True, (MethodVerdict("m", OK),))]
    assert "nothing: every method" in section(html_report(ok, title="t"), "not-checked")


def test_empty_columns_are_dropped():
    frame = pd.DataFrame({"a": ["x", ""], "b": ["", None], "c": [[], float("nan")], "d": [0, 0]})
    assert list(without_empty_columns(frame).columns) == ["a", "d"]
    assert list(without_empty_columns(frame, keep=["b"]).columns) == ["a", "b", "d"]
    verdicts, labels = zoo()
    page = html_report(verdicts, labels=labels, title="scan")
    detail = headers(section(page, "policies"))  # the constants run on other data: no blame was tried
    assert "shared_from" in detail and "blame_note" not in detail and "fqn" in detail


def many_wrong(n: int) -> Verdict:
    methods = tuple(MethodVerdict(f"m{i}", WRONG, "would run on other data") for i in range(n))
    return Verdict("big", "name-only", True, methods, constants=tuple(finding(f"m{i}", f"w{i}") for i in range(n)))


def test_a_large_report_stays_bounded_and_says_the_rest_are_in_the_csv():
    small = html_report([many_wrong(DETAIL_ROWS * 2)], title="big", csv="out.csv")
    large = html_report([many_wrong(DETAIL_ROWS * 20)], title="big", csv="out.csv")
    assert len(large) < 1.1 * len(small), (len(small), len(large))
    findings = section(large, "findings")
    assert f"{DETAIL_ROWS * 20 - OVERVIEW_ROWS:,} more findings" in findings
    shown = OVERVIEW_ROWS + DETAIL_ROWS
    assert f"... {DETAIL_ROWS * 20 - shown:,} more rows: every row is in out.csv" in findings
    assert "more rows: pass --csv FILE to write every row" in html_report([many_wrong(DETAIL_ROWS * 2)], title="big")


def test_decisions_of_a_large_load_are_cut_in_the_page():
    n = 20_000
    decisions = pd.DataFrame(
        {
            "method": ["prefill"] * n,
            "name": [f"w{i}" for i in range(n)],
            "fqn": [f"l.w{i}" for i in range(n)],
            "lookup": ["miss"] * n,
            "decision": ["loaded"] * n,
            "reason": [""] * n,  # empty: dropped
            "data_problem": [""] * n,
        }
    )
    v = Verdict("p", "name-only", True, (MethodVerdict("prefill", OK),))
    page = html_report([v], title="t", loads=[LoadFrames(decisions, None, 1 << 20)], csv="all.csv")
    assert len(page.encode()) < 600_000, len(page.encode())
    assert f"... {n - DETAIL_ROWS:,} more rows: every row is in all.csv" in page
    table = section(page, "policies")
    assert "w0" in table and f"w{DETAIL_ROWS}" not in table and "reason" not in headers(table)
    with pytest.raises(ValueError, match="loads"):
        html_report([v], title="t", loads=[])
