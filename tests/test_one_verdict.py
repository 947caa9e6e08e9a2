"""Issue 27: one verdict, computed once, told the same by every surface.

Every sample under every policy, a real load and a dry run (a refused export among them:
total_collision under fqn-weight-cache): the verdict is the truth, and the CLI's exit codes
and printed lines, the comparison frames, the collision-report CSV (written and read back),
the HTML verification table and the collision matrix must say the same about which methods
are wrong, failed or not runnable and which constants run on other data.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from toolkit.build.samples import sample_module, sample_names
from toolkit.cli import main as cli_main
from toolkit.core.verdict import BAD_OUTCOMES
from toolkit.core.vocab import ExitCode, MethodOutcome
from toolkit.display.findings import verification_html
from toolkit.plots import collision_matrix_view
from toolkit.reports.collision import collision_report, read_report
from toolkit.workflows.compare import compare_policies

REPO = Path(__file__).resolve().parents[1]
SAMPLES = [n for n in sample_names() if n != "llama_static_cache"]  # its real loads are test_llm_state's


def _listed(cell) -> list[str]:
    return list(cell) if isinstance(cell, list) else []


def _check_frame_row(row, v) -> None:
    assert row["outcome"] == v.outcome.value
    assert _listed(row["wrong_methods"]) == v.wrong_methods
    assert _listed(row["not_runnable"]) == v.not_runnable
    assert row["stage"] == (v.failed_stage.value if v.failed_stage else "")


def _findings(v) -> set[tuple[str, str]]:
    return {(c.method, c.name) for c in v.constants if c.problem is not None}


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_every_surface_tells_the_same_verdict(sample, built_sample, tmp_path, capsys):
    prog = built_sample(sample)
    real, predicted = compare_policies(prog), compare_policies(prog, dry_run=True)
    for policy, s in real.sessions.items():  # the truth each sample states, independently of the toolkit
        v, expected = s.verdict(), sample_module(sample).EXPECTED[policy]
        assert (set(v.wrong_methods), set(v.not_runnable), set(v.wrong_sequences), v.failed_stage is None) == (
            expected.wrong,
            expected.not_runnable,
            expected.sequence_wrong,
            expected.loaded,
        ), policy
    for comparison in (real, predicted):
        frame = comparison.frame.set_index("policy")
        for policy, s in comparison.sessions.items():
            v = s.verdict()
            assert v is s.verdict()  # computed once
            assert v.predicted is (comparison is predicted)
            _check_frame_row(frame.loc[policy], v)
            # the decisions table marks exactly the verdict's constants
            d = s.decisions
            marked = d[d["data_problem"] != ""]
            assert set(zip(marked["method"], marked["name"])) == _findings(v)
            # the CSV, written and read back
            report = collision_report(s)
            path = tmp_path / f"{policy}-{v.predicted}.csv"
            report.to_csv(path)
            back = read_report(path)
            assert back.wrong_methods == sorted(v.wrong_methods)
            outcomes = dict(zip(back.frame["method"], back.frame["method_outcome"]))
            assert all(outcomes[m.method] == m.outcome.value for m in v.methods if m.method in outcomes)
            if v.predicted:  # nothing ran: nothing is ok or wrong by a run
                assert back.frame["method_ok"].isna().all() and not back.frame["method_ran"].any()
            # the HTML verification table: its result column is the verdict's
            if not v.predicted:
                html = verification_html(s.verify(), v)
                for m in v.methods:
                    assert re.search(
                        rf">{re.escape(m.method)}</td>\s*<td[^>]*>{re.escape(m.outcome.value)}</td>", html
                    ), (policy, m)
            # the collision matrix marks the verdict's wrong methods and its constants on other data
            view = collision_matrix_view(s)
            assert view.wrong == set(v.wrong_methods)
            keys = {(r["method"], r["fqn"] or r["name"]) for r in d.to_dict("records") if r["data_problem"]}
            assert view.culprits == keys
    # the CLI: one exit-code table, the same verdict
    root = str(prog.root)
    for policy, s in real.sessions.items():
        v = s.verdict()
        assert cli_main(["report", root, "--policy", policy]) == v.exit_code, policy
        out = capsys.readouterr().out
        assert out.replace("\n    ", " ").splitlines()[0] == v.headline()  # the answer first
    for policy, s in predicted.sessions.items():
        v = s.verdict()
        assert cli_main(["report", root, "--policy", policy, "--dry-run"]) == v.exit_code, policy
        out = capsys.readouterr().out
        assert out.replace("\n    ", " ").splitlines()[0] == v.headline()
        for m in v.not_runnable:
            assert f"; {m} not runnable" in out
    assert (
        cli_main(["compare", root]) == real.exit_code == ExitCode.worst(v.exit_code for v in real.verdicts().values())
    )
    assert cli_main(["compare", root, "--dry-run"]) == predicted.exit_code
    capsys.readouterr()


def test_scan_reads_the_dry_run_verdict(built_sample, tmp_path):
    """scan's per-method outcome is the dry run's verdict; wrong_data marks exactly the failing outcomes."""
    import shutil

    from toolkit.workflows.dry_run import dry_run

    zoo = tmp_path / "zoo"
    for name in ("total_collision", "partial_collision_shape"):
        shutil.copytree(built_sample(name).root, zoo / name)
    csv = tmp_path / "scan.csv"
    rc = cli_main(["scan", str(zoo), "--csv", str(csv), "--jobs", "1"])
    f = pd.read_csv(csv, keep_default_na=False)
    expected = set()
    for name in ("total_collision", "partial_collision_shape"):
        for policy in f["policy"].unique():
            for m in dry_run(zoo / name, policy).session.verdict().methods:
                expected.add((name, policy, m.method, m.outcome.value, m.outcome in BAD_OUTCOMES))
    assert set(zip(f["program"], f["policy"], f["method"], f["outcome"], f["wrong_data"])) == expected
    assert rc == (ExitCode.PROBLEM if f["wrong_data"].any() else ExitCode.OK) == ExitCode.PROBLEM


def test_a_refused_export_reads_the_same_everywhere(built_sample, tmp_path):
    """fqn-weight-cache refuses total_collision at export: refused, not wrong, on every surface."""
    prog = built_sample("total_collision")
    s = compare_policies(prog, ["fqn-weight-cache"]).session("fqn-weight-cache")
    v = s.verdict()
    assert v.outcome is MethodOutcome.REFUSED and v.exit_code is ExitCode.PROBLEM
    assert {m.outcome for m in v.methods} == {MethodOutcome.REFUSED} and not v.wrong_methods
    ver = s.verify()
    assert ver["ok"].isna().all() and not ver["ran"].any()  # neither ok nor wrong: nothing exists to run
    assert set(collision_report(s).frame["method_outcome"]) == {"refused"}


def test_the_exit_codes_are_documented_once(capsys):
    """--help and the README show the one table ExitCode defines."""
    from toolkit.core.verdict import EXIT_CODE_MEANINGS

    with pytest.raises(SystemExit):
        cli_main(["--help"])
    help_text = capsys.readouterr().out
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for code in ExitCode:
        assert f"  {int(code)}  {EXIT_CODE_MEANINGS[code]}" in help_text
        assert f"| {int(code)} | {EXIT_CODE_MEANINGS[code]} |" in readme
    assert "``" not in help_text  # no reST markup on a terminal


def test_the_rules_are_defined_once():
    """grep: the culprit rule (verdict.find_problem) and the wrong-output rule (verdict.ran_wrong)
    are written in one place; no surface compares content digests or ran/ok to decide."""
    src = {p: p.read_text(encoding="utf-8") for p in (REPO / "toolkit").rglob("*.py")}
    digest_rule = re.compile(r"cached_digest[\"'\]]*\s*!=|!=\s*[\w.\[\]\"']*cached_digest")
    assert [p.name for p, t in src.items() if digest_rule.search(t)] == ["verdict.py"]
    wrong_rule = re.compile(r"\[\"ran\"\][^,\n]*(?:&|\band\b)[^,\n]*\[\"ok\"\]|\.ran and \w+\.ok\b")
    assert [p.name for p, t in src.items() if wrong_rule.search(t)] == ["verdict.py"]


def test_no_import_circle_in_the_package():
    code = (
        "import grimp, sys\n"
        "g = grimp.build_graph('toolkit')\n"
        "bad = [(a, b) for a in g.modules for b in g.find_modules_directly_imported_by(a)\n"
        "       if g.chain_exists(importer=b, imported=a)]\n"
        "print(sorted(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import circles: {out.stdout}"


def test_blame_confirms_clears_or_leaves_open_each_finding():
    """The verdict's per-constant confirmation from blame's experiments (pure: no load)."""
    from toolkit.core.verdict import BlameRow, CheckRow, MethodFacts, build_verdict, find_problem
    from toolkit.core.vocab import BlameStatus, DataProblem, Decision, MethodStatus

    def found(m, n):
        return find_problem(
            method=m,
            name=n,
            fqn=n,
            decision=Decision.SHARED,
            digest="b" * 64,
            mutated=False,
            storage="",
            slot_problem="",
            cached_method="enc",
            cached_name=n,
            cached_digest="a" * 64,
        )

    facts = [
        MethodFacts("enc", MethodStatus.LOADED, True),
        MethodFacts("dec", MethodStatus.LOADED, True, findings=(found("dec", "w"), found("dec", "v"))),
        MethodFacts("aux", MethodStatus.LOADED, True, findings=(found("aux", "u"),)),
        MethodFacts("ok", MethodStatus.LOADED, True, findings=(found("ok", "t"),)),
    ]
    checks = [
        CheckRow("enc", True, True),
        CheckRow("dec", True, False),
        CheckRow("aux", True, False),
        CheckRow("ok", True, True),
    ]
    cd = DataProblem.CONTENT_DIFFERS
    tried = [
        BlameRow("standalone", "dec", "w", "w", True, cd, "e"),
        BlameRow("standalone", "dec", "v", "v", False, cd, "e"),
        BlameRow("seq", "aux", "u", "u", False, cd, "e"),
    ]
    v = build_verdict(program="p", policy="name-only", predicted=False, methods=facts, checks=checks, blame=tried)
    status = {(c.method, c.name): (c.blame, c.blame_note) for c in v.constants}
    assert status[("dec", "w")] == (BlameStatus.CULPRIT, "breaks standalone")
    assert status[("dec", "v")][0] is BlameStatus.HARMLESS and "others" in status[("dec", "v")][1]
    assert status[("aux", "u")][0] is BlameStatus.INCONCLUSIVE  # its verification has no culprit at all
    assert status[("ok", "t")] == (
        BlameStatus.HARMLESS,
        "the method verifies ok: the difference does not reach its outputs",
    )
    assert v.wrong_methods == ["dec", "aux"] and [c.name for c in v.culprits] == ["w"]
    assert v.exit_code is ExitCode.PROBLEM and v.outcome is MethodOutcome.WRONG
    # without experiments nothing is confirmed, and a dry run confirms nothing either
    assert {c.blame for c in build_verdict(program="p", policy="x", predicted=True, methods=facts).constants} == {
        BlameStatus.NOT_TESTED
    }


@pytest.mark.slow
def test_blame_of_a_sequence_names_the_state_kept_apart(built_sample):
    """shared_state under no-sharing: prefill's cache is kept from decode; blame's culprit enters the verdict."""
    from toolkit.core.vocab import BlameStatus, DataProblem
    from toolkit.engine.session import load_program

    s = load_program(built_sample("shared_state"), "no-sharing")
    before = s.verdict()
    assert before.wrong_sequences and before.exit_code is ExitCode.PROBLEM and not before.culprits
    seq = before.wrong_sequences[0]
    s.blame(sequence=seq)
    after = s.verdict()
    assert after is not before and after.culprits
    assert {c.problem for c in after.culprits} == {DataProblem.STATE_NOT_SHARED}
    assert all(c.blame is BlameStatus.CULPRIT and seq in c.broken for c in after.culprits)


@pytest.mark.slow
def test_an_isolated_load_brings_back_the_same_verdict(built_sample):
    from toolkit.engine.session import load_program
    from toolkit.workflows.isolation import load_isolated

    prog = built_sample("total_collision")
    for policy in ("name-only", "fqn-weight-cache"):
        here = load_program(prog, policy).verdict()
        there = load_isolated(prog, policy).verdict
        assert there == here, policy
        assert here.headline() in load_isolated(prog, policy).summary()
