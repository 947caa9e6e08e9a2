"""`constshare report PROGRAM --dry-run`: decisions from metadata alone, on real ExecuTorch files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from toolkit.cli import main

PTE = Path(__file__).parent / "fixtures" / "executorch-1.5.1-cuda" / "shared_ok" / "prog.pte"


def test_dry_run_of_a_real_pte_flags_the_name_only_hole(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    assert main(["report", str(PTE), "--policy", "name-only", "--dry-run", "--csv", str(csv)]) == 1
    out = capsys.readouterr().out
    assert "shared although the content differs: prefill/_tensor_constant0" in out
    d = pd.read_csv(csv, keep_default_na=False)
    assert set(d["policy"]) == {"name-only"} and len(d) == 6


def test_dry_run_under_fingerprint_passes(capsys):
    assert main(["report", str(PTE), "--policy", "fingerprint", "--dry-run"]) == 0
    assert "content differs" not in capsys.readouterr().out


def test_a_missing_program_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.pte"), "--dry-run"]) == 2
    assert "neither a program" in capsys.readouterr().err


def test_scan_a_folder_of_real_programs(tmp_path, capsys):
    import shutil

    zoo = tmp_path / "zoo"
    for name in ("shared_ok", "identical"):
        shutil.copytree(PTE.parent.parent / name, zoo / name)
    (zoo / "broken.pte").write_bytes(b"not a flatbuffer")
    csv = tmp_path / "scan.csv"
    rc = main(["scan", str(zoo), "--policies", "name-only,fingerprint", "--csv", str(csv), "--jobs", "2"])
    f = pd.read_csv(csv, keep_default_na=False)
    wrong = f[f["wrong_data"]]
    assert rc == 1
    assert set(zip(wrong["program"], wrong["policy"], wrong["method"])) == {("prog", "name-only", "prefill"),
                                                                            ("", "", "")}
    assert (f[f["status"] == "unreadable"]["path"].str.endswith("broken.pte")).all()
    assert not f[(f["policy"] == "fingerprint")]["wrong_data"].any()
    assert main(["scan", str(zoo / "identical"), "--policies", "name-only,fingerprint"]) == 0
    assert "no method would run on wrong data" in capsys.readouterr().out


def test_scan_refuses_a_missing_folder_and_an_empty_one(tmp_path, capsys):
    assert main(["scan", str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["scan", str(tmp_path / "empty")]) == 2
    assert "no program found" in capsys.readouterr().err
