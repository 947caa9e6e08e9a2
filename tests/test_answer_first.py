"""The answer first, in ExecuTorch's terms: what report/compare/scan print first, within 100 columns; the
policy a `.pte` is answered for; what a verdict could not check, on every surface."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from executorch_fixtures import unpacked

from toolkit.cli import main
from toolkit.cli.answer import WIDTH, fitted
from toolkit.core.policies import POLICIES
from toolkit.core.policies.releases import executorch_releases
from toolkit.core.vocab import BlindSpot
from toolkit.sources.naming import program_name
from toolkit.workflows.dry_run import dry_run

GEN3 = unpacked("1.5.1")
GEN1 = unpacked("1.2.0")


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


def widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


@pytest.mark.parametrize("name", ["total_collision", "mutated_buffer", "bart_encoder_decoder", "shared_ok"])
def test_report_opens_with_the_verdict_and_findings_then_methods_within_100_columns(capsys, name):
    pte = GEN1 / name / "prog.pte"
    code, out = run(capsys, "report", str(pte), "--dry-run", "--policy", "name-only")
    v = dry_run(pte, "name-only").verdict
    lines = out.splitlines()
    assert out.replace("\n    ", " ").splitlines()[0] == v.headline() and code == int(v.exit_code)
    assert widest(out) <= WIDTH, max(lines, key=len)
    assert "Decisions" not in out and "lookup" not in out  # the decision table only with --tables
    if v.culprits or v.wrong_methods:
        assert out.index("findings (") < out.index("\nmethods:")
    assert any(line.startswith(f"exit {code}: ") for line in lines[-4:])


def test_tables_adds_the_decisions_after_the_answer(capsys):
    pte = GEN1 / "shared_ok" / "prog.pte"
    _, short = run(capsys, "report", str(pte), "--dry-run", "--policy", "name-only")
    _, full = run(capsys, "report", str(pte), "--dry-run", "--policy", "name-only", "--tables")
    assert full.splitlines()[0] == short.splitlines()[0]
    assert "lookup" in full and full.index("findings (") < full.index("lookup")


def test_a_generic_file_name_takes_its_folder_name(tmp_path):
    for stem in ("prog", "model", "program"):
        f = tmp_path / "my_llama" / f"{stem}.pte"
        f.parent.mkdir(exist_ok=True)
        f.touch()
        assert program_name(f) == "my_llama"
    assert program_name(tmp_path / "my_llama" / "llama3.pte") == "llama3"
    assert dry_run(GEN1 / "three_methods" / "prog.pte", "fingerprint").verdict.program == "three_methods"


def test_a_pte_given_no_policy_is_answered_for_the_executorch_that_reads_it(capsys):
    code, out = run(capsys, "report", str(GEN3 / "total_collision" / "prog.pte"), "--dry-run")
    assert out.startswith("'total_collision' under 'fqn-weight-cache' (predicted)")
    assert "payload generation 3" in out and "ExecuTorch 1.5.x" in out
    code, out = run(capsys, "report", str(GEN1 / "total_collision" / "prog.pte"), "--dry-run")
    assert out.startswith("'total_collision' under 'refuse-on-mismatch' (predicted): wrong") and code == 1
    assert "payload generation 1" in out and "weight_sharing_across_methods=on" in out
    # ours is offered as the fix where it differs
    assert "fix: under fingerprint (ours) every method would run on its own data" in out


def test_executorch_version_picks_what_that_release_runs(capsys):
    pte = str(GEN1 / "shared_ok" / "prog.pte")
    code, out = run(capsys, "report", pte, "--dry-run", "--executorch", "1.5.1")
    assert out.startswith("'shared_ok' under 'decline-on-mismatch'")
    code, out = run(capsys, "report", pte, "--dry-run", "--executorch", "v1.3.1")
    assert out.startswith("'shared_ok' under 'refuse-on-mismatch'")
    # a release that cannot read the file, or one that does not exist: one line, exit 2
    assert main(["report", str(GEN3 / "shared_state" / "prog.pte"), "--dry-run", "--executorch", "1.4"]) == 2
    assert main(["report", pte, "--dry-run", "--executorch", "9.9"]) == 2
    code, out = run(capsys, "compare", pte, "--dry-run", "--executorch", "1.4")
    rows = out.split("\npolicies:")[1]
    assert {"no-sharing", "refuse-on-mismatch", "fingerprint"} <= set(rows.split()) and "blind-share" not in rows


def test_policies_lists_every_policy_with_its_releases(capsys):
    code, out = run(capsys, "policies")
    assert code == 0 and widest(out) <= WIDTH
    for p in POLICIES:
        line = next(line for line in out.splitlines() if line.split() and line.split()[0] == p)
        assert executorch_releases(p)[:20] in line, (p, line)


def test_a_dry_run_of_a_pte_says_it_cannot_check_state(capsys, tmp_path):
    """1.5.1 mutated_buffer: ok under every policy in a dry run, yet its sequence is wrong on the H200:
    the verdict carries the blind spot, and every surface shows it."""
    pte = GEN3 / "mutated_buffer" / "prog.pte"
    v = dry_run(pte, "fqn-weight-cache").verdict
    assert v.outcome.value == "ok"
    (gap,) = [n for n in v.not_checked if n.gap is BlindSpot.STATE]
    assert "kv" in gap.reason and "sequence" in gap.how
    assert "not checked: sequence state" in v.headline()
    csv, xml = tmp_path / "r.csv", tmp_path / "r.xml"
    code, out = run(
        capsys, "report", str(pte), "--dry-run", "--policy", "fqn-weight-cache", "--csv", str(csv), "--junit", str(xml)
    )
    assert code == 0 and "not checked (1):" in out and "sequence state" in out
    assert pd.read_csv(csv, keep_default_na=False)["not_checked"].str.contains("sequence state").all()
    skipped = [c for c in ET.parse(xml).getroot().iter("testcase") if c.find("skipped") is not None]
    assert [c.get("name") for c in skipped] == ["not checked: sequences"]
    assert "sequence state" in skipped[0].find("skipped").get("message")


def test_a_program_that_records_its_writes_has_no_state_blind_spot():
    from toolkit.build.samples import build_sample

    v = dry_run(build_sample("mutated_buffer"), "name-only").verdict
    assert not [n for n in v.not_checked if n.gap is BlindSpot.STATE]


def test_scan_lists_findings_then_one_row_per_program_named_by_folder(capsys, tmp_path):
    zoo = tmp_path / "zoo"
    for name in ("total_collision", "mutated_buffer", "no_constants"):
        shutil.copytree(GEN1 / name, zoo / name)
    code, out = run(capsys, "scan", str(zoo), "--jobs", "1", "--policies", "name-only,fingerprint")
    assert code == 1 and widest(out) <= WIDTH
    assert out.splitlines()[0].startswith("3 programs, 2 policies: 1 of 3 programs would fail")
    assert out.index("findings (") < out.index("not checked (") < out.index("\nprograms:")
    table = out.split("\nprograms:\n")[1].split("\n\n")[0].splitlines()
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == {"total_collision", "mutated_buffer", "no_constants"}
    assert "sequence state" in rows["mutated_buffer"] and "state" not in rows["no_constants"]


def test_fitted_cuts_text_not_numbers():
    df = pd.DataFrame({"name": ["x" * 300, "y"], "n": [123456789, 2]})
    text = fitted(df, 60)
    assert widest(text) <= 60 and "123456789" in text and "\u2026" in text


def test_table_refuses_to_replace_a_table_without_force(capsys):
    pte = GEN1 / "shared_ok" / "prog.pte"
    assert main(["table", str(pte)]) == 2
    assert "constant_table.json: already exists; replace it with --force" in capsys.readouterr().err
