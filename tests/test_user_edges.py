"""What a new user meets first: the README's module attributes, a mistyped policy, the
generation-1/2 fixtures' constant table beside the file, and readable reprs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from executorch_fixtures import unpacked

import toolkit
from toolkit.cli import main
from toolkit.core.errors import ProgramError, ToolkitError, UnknownPolicyError
from toolkit.core.policies import POLICIES
from toolkit.sources import open_program

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
GEN1 = unpacked("1.2.0") / "shared_ok"  # generation 1, exported by executorch 1.2.0
TABLED = [
    str(GEN1),
    "synthetic-gen2",
]  # payload generations whose constant table lies in the .so (absolute: FIXTURES / p is p)


def test_submodules_are_attributes_after_a_bare_import():
    """``import toolkit`` then ``toolkit.report.to_csv`` (the README's way), in a fresh interpreter."""
    code = (
        "import sys, toolkit; assert 'toolkit.plots' not in sys.modules; "
        "print(toolkit.report.to_csv.__module__, toolkit.plots.__name__, 'report' in dir(toolkit) or 'x')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.split()[:2] == ["toolkit.reports.collision", "toolkit.plots"]
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        toolkit.not_a_module  # noqa: B018


def test_a_mistyped_policy_is_a_toolkit_error_naming_every_policy_and_the_close_one():
    with pytest.raises(UnknownPolicyError) as e:
        toolkit.load_program(GEN1, policy="fingerprints")
    assert isinstance(e.value, ToolkitError) and isinstance(e.value, ValueError)  # old `except ValueError` still works
    assert all(repr(p) in str(e.value) for p in POLICIES) and "did you mean 'fingerprint'?" in str(e.value)
    with pytest.raises(UnknownPolicyError) as e:
        toolkit.get_policy("zzz")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("folder", TABLED)
def test_the_constant_table_beside_the_pte_is_read_by_default(folder, tmp_path):
    given = open_program(
        FIXTURES / folder, constant_table=json.loads((FIXTURES / folder / "constant_table.json").read_text())
    )
    assert open_program(FIXTURES / folder) == given  # the file beside it
    moved = tmp_path / "table.json"
    bare = shutil.copytree(FIXTURES / folder, tmp_path / Path(folder).name, ignore=shutil.ignore_patterns("*.json"))
    shutil.copy(FIXTURES / folder / "constant_table.json", moved)
    assert open_program(bare, constant_table=str(moved)) == open_program(bare, constant_table=moved)
    assert [m.constants for m in open_program(bare, constant_table=moved).methods] == [
        m.constants for m in given.methods
    ]


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "constant table cannot be read"),
        ("[1, 2]", "is a JSON list, not an object"),
        ('{"decode": "lin_weight", "prefill": []}', r"constant_table\['decode'\] is a str, not a list of rows"),
        ('{"decode": [1], "prefill": []}', "constant table row is a int"),
        ('{"decode": [{"name": "x"}], "prefill": []}', "constant table row is not an AotiConstant"),
    ],
)
def test_a_malformed_constant_table_is_a_program_error_naming_its_file(content, match, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(ProgramError, match=match) as e:
        open_program(GEN1, constant_table=str(bad))
    assert e.value.path == str(bad)


def test_the_cli_reads_the_table_beside_the_file_and_takes_one(tmp_path, capsys):
    pte = GEN1 / "prog.pte"
    assert main(["report", str(pte), "--policy", "fingerprint", "--dry-run"]) == 0
    bare = shutil.copytree(pte.parent, tmp_path / "bare", ignore=shutil.ignore_patterns("*.json"))
    assert main(["report", str(bare / "prog.pte"), "--dry-run"]) == 2
    assert "--constant-table FILE" in capsys.readouterr().err
    assert (
        main(
            ["report", str(bare / "prog.pte"), "--dry-run", "--policy", "fingerprint"]
            + ["--constant-table", str(pte.parent / "constant_table.json")]
        )
        == 0
    )
    (tmp_path / "bad.json").write_text("[]")
    assert main(["report", str(bare / "prog.pte"), "--dry-run", "--constant-table", str(tmp_path / "bad.json")]) == 2
    assert str(tmp_path / "bad.json") in capsys.readouterr().err


def test_a_programs_repr_is_a_short_summary():
    from toolkit.build.synthetic import SyntheticSpec, generate

    p = generate(SyntheticSpec(methods=12, constants=400))
    text = repr(p)
    lines = text.splitlines()
    assert len(lines) == 1 + 8 + 1 and max(map(len, lines)) < 120  # was one line of thousands of characters
    assert lines[0].startswith(f"Program {p.name!r}: 12 methods") and "(in memory)" in lines[0]
    assert lines[1].startswith(f"  {p.methods[0].name}: 400 constants") and "4 more methods" in lines[-1]
    assert p._repr_html_() == "<pre>" + text.replace("'", "&#x27;") + "</pre>"
