"""Reports a CI can keep: ``report``/``scan``/``compare`` write one self-contained HTML report and
JUnit XML, read from the verdict; ``scan`` prints one compact row per program."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from executorch_fixtures import unpacked

from toolkit.cli import main
from toolkit.core.verdict import BAD_OUTCOMES
from toolkit.core.vocab import MethodOutcome
from toolkit.reports.junit import junit_xml
from toolkit.reports.summary import failure_message
from toolkit.workflows.dry_run import dry_run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# shared_ok exported by executorch 1.2.0 (generation 1): under name-only prefill runs on decode's _tensor_constant0
CULPRIT_PROGRAM = unpacked("1.2.0") / "shared_ok" / "prog.pte"
POLICIES = ["name-only", "fingerprint"]

# The JUnit shape CI systems read (Jenkins' and GitLab's junit reports, the Ant schema):
# element -> (required attributes, allowed children)
JUNIT_SHAPE = {
    "testsuites": ({"tests", "failures", "errors"}, {"testsuite"}),
    "testsuite": ({"name", "tests", "failures", "errors", "skipped"}, {"testcase"}),
    "testcase": ({"name", "classname"}, {"failure", "error", "skipped"}),
    "failure": ({"message", "type"}, set()),
    "error": ({"message", "type"}, set()),
    "skipped": ({"message"}, set()),
}
COUNTED = {"failures": "failure", "errors": "error", "skipped": "skipped"}


def check_junit_shape(root: ET.Element) -> None:
    """``root`` follows :data:`JUNIT_SHAPE`, and every count attribute is the count of its elements."""
    assert root.tag == "testsuites"
    for el in root.iter():
        required, children = JUNIT_SHAPE[el.tag]
        assert required <= set(el.attrib), (el.tag, el.attrib)
        assert {c.tag for c in el} <= children, (el.tag, [c.tag for c in el])
        if el.tag == "testcase":
            assert len(el) <= 1, "a test case has at most one result element"
        if el.tag in ("testsuites", "testsuite"):
            assert int(el.get("tests")) == len(list(el.iter("testcase")))
            for attr, tag in COUNTED.items():
                if attr in el.attrib:
                    assert int(el.get(attr)) == sum(1 for case in el.iter("testcase") for _ in case.iter(tag))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    shutil.copytree(CULPRIT_PROGRAM.parent, root / "gen1")
    shutil.copytree(FIXTURES / "executorch-1.5.1-cuda" / "identical", root / "identical")
    (root / "broken.pte").write_bytes(b"not a flatbuffer")
    return root


@pytest.fixture(scope="module")
def scanned(zoo, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    files = {k: out / f"scan.{k}" for k in ("csv", "html", "xml")}
    rc = main(
        [
            "scan",
            str(zoo),
            "--policies",
            ",".join(POLICIES),
            "--jobs",
            "1",
            "--csv",
            str(files["csv"]),
            "--html",
            str(files["html"]),
            "--junit",
            str(files["xml"]),
        ]
    )
    return rc, files


def expected_verdicts(zoo):
    return {
        (d, p): dry_run(zoo / d / "prog.pte", p).session.verdict()  # a scan names bart/prog.pte "bart"
        for d in ("gen1", "identical")
        for p in POLICIES
    }


def test_scan_junit_has_a_case_per_program_and_method_and_names_the_culprit(zoo, scanned):
    rc, files = scanned
    root = ET.parse(files["xml"]).getroot()
    check_junit_shape(root)
    cases = {(s.get("name"), c.get("name")): c for s in root.iter("testsuite") for c in s.iter("testcase")}
    expected = expected_verdicts(zoo)
    culprits_named = 0
    for (label, policy), v in expected.items():
        for m in v.methods:
            case = cases.pop((f"{label} under {policy}", m.method))
            failure = case.find("failure")
            assert (failure is not None) == (m.outcome in BAD_OUTCOMES), (label, policy, m)
            if failure is not None:
                assert failure.get("message") == failure_message(v, m.method)
                for c in v.findings(m.method):
                    assert c.name in failure.get("message")
                    culprits_named += 1
    assert culprits_named, "the culprit program has a culprit under name-only"
    # what each verdict could not check: a skipped case of its own, with the reason and how to check it
    for (label, policy), v in expected.items():
        for n in v.not_checked:
            if n.gap.value != "no reference":
                case = cases.pop((f"{label} under {policy}", f"not checked: {n.subject}"))
                assert n.reason in case.find("skipped").get("message")
    # the program that cannot be read: one error case, not a failure of any method
    ((key, case),) = cases.items()
    assert key == ("broken.pte", "open") and case.find("error").get("type") == "unreadable"
    assert rc == 1


def test_an_unreadable_program_fails_the_gate_without_running_on_wrong_data(scanned):
    rc, files = scanned
    f = pd.read_csv(files["csv"], keep_default_na=False)
    broken = f[f["path"].str.endswith("broken.pte")]
    assert list(broken["outcome"]) == ["unreadable"] and not broken["wrong_data"].any()
    assert rc == 1  # it still fails the gate


def test_scan_prints_one_compact_row_per_program(zoo, capsys):
    rc = main(["scan", str(zoo), "--jobs", "1"])
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100, max(out.splitlines(), key=len)
    table = out.split("\nprograms:\n")[1].split("\n\n")[0].splitlines()
    assert len(table) == 1 + 3  # a header and one row per program, for 3 programs x 9 policies x 2 methods
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == {"broken.pte", "gen1", "identical"}  # a generic file name gives way to its folder's
    assert rows["broken.pte"].split()[1] == "unreadable" and rows["gen1"].split()[1] == "wrong"
    assert rows["identical"].split()[1] == "ok"
    assert "every row: --csv FILE" in out and rc == 1


def test_the_html_report_is_self_contained_and_puts_the_verdict_and_findings_first(scanned):
    _rc, files = scanned
    text = files["html"].read_text()
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert not [u for u in ('src="http', 'href="http', "url(http") if u in text]
    at = [text.index(f'id="{s}"') for s in ("verdict", "summary", "findings", "not-checked", "policies")]
    assert at == sorted(at) and at[-1] < text.index("Methods: the outcome") < text.index("Programs: the worst outcome")
    assert "_tensor_constant0" in text[at[2] : text.index("</section>", at[2])]  # the culprit, in its section


def test_report_writes_html_with_the_plot_and_junit_for_one_load(tmp_path, capsys):
    html, xml = tmp_path / "r.html", tmp_path / "r.xml"
    rc = main(
        ["report", str(CULPRIT_PROGRAM), "--policy", "name-only", "--dry-run", "--html", str(html), "--junit", str(xml)]
    )
    v = dry_run(CULPRIT_PROGRAM, "name-only").session.verdict()
    assert rc == int(v.exit_code) == 1
    root = ET.parse(xml).getroot()
    check_junit_shape(root)
    assert [c.get("name") for c in root.iter("testcase")] == [m.method for m in v.methods] + [
        f"not checked: {n.subject}" for n in v.not_checked if n.gap.value != "no reference"
    ]
    text = html.read_text()
    assert text.count("<svg") >= 1 and "Decisions" in text
    # the output file is checked before any work, as --csv is
    assert main(["report", str(CULPRIT_PROGRAM), "--dry-run", "--html", str(html)]) == 2
    assert "--html" in (err := capsys.readouterr().err) and "exists already" in err


def test_junit_marks_no_reference_skipped_and_refused_failed():
    from toolkit.core.verdict import MethodVerdict, Verdict

    v = Verdict(
        "p",
        "fqn-weight-cache",
        False,
        (
            MethodVerdict("a", MethodOutcome.REFUSED, "duplicate key"),
            MethodVerdict("b", MethodOutcome.NO_REFERENCE, "not verified"),
        ),
    )
    root = ET.fromstring(junit_xml([v]))
    check_junit_shape(root)
    a, b = root.iter("testcase")
    assert a.find("failure").get("type") == "refused" and "duplicate key" in a.find("failure").get("message")
    assert b.find("skipped") is not None and root.get("failures") == "1" and root.get("skipped") == "1"


@pytest.mark.browser
def test_the_html_report_shows_the_culprit_in_chromium_offline(scanned):
    """The real headless Chromium, offline, opens the file and shows the culprit in its section."""
    from conftest import in_ci, require
    from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        msg = "needs Debian's chromium at /usr/bin/chromium: run .ci/install_browser.sh as root"
        pytest.fail(msg) if in_ci() else pytest.skip(msg)
    sync_api = require("playwright.sync_api")
    _rc, files = scanned
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            ctx = browser.new_context(viewport={"width": 1440, "height": 1200}, offline=True)
            page = ctx.new_page()
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(files["html"].as_uri())
            findings = page.locator("#findings")
            assert findings.is_visible() and "_tensor_constant0" in findings.inner_text()
            boxes = [page.locator(f"#{s}").bounding_box()["y"] for s in ("verdict", "summary", "findings")]
            assert boxes == sorted(boxes)
            assert "wrong" in page.locator("#summary").inner_text()
            assert [u for u in requests if not u.startswith("file:")] == []  # nothing fetched
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "ci-report-scan.png"), full_page=True)
        finally:
            browser.close()


def test_report_of_a_real_load_names_the_culprit_in_junit_and_html(built_sample, tmp_path):
    from toolkit import load_program

    prog = built_sample("total_collision")
    html, xml = tmp_path / "r.html", tmp_path / "r.xml"
    rc = main(["report", str(prog.root), "--policy", "name-only", "--html", str(html), "--junit", str(xml)])
    s = load_program(prog, "name-only")
    s.verify()
    v = s.verdict()
    s.close()
    assert rc == int(v.exit_code) == 1 and v.wrong_methods
    root = ET.parse(xml).getroot()
    check_junit_shape(root)
    failures = {c.get("name"): c.find("failure") for c in root.iter("testcase")}
    assert {m for m, f in failures.items() if f is not None} == {
        m.method for m in v.methods if m.outcome in BAD_OUTCOMES
    }
    for m in v.wrong_methods:
        assert all(c.name in failures[m].get("message") for c in v.findings(m))
    text = html.read_text()
    assert text.index('id="findings"') > text.index("Verification") and "<svg" in text
    assert text.index('id="policies"') < text.index("Decisions")  # the decisions: in the collapsed detail
