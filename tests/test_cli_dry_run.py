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
    assert "prefill/_tensor_constant0: content differs, runs on decode's data" in out and "cached " in out
    assert "'shared_ok' under 'name-only' (predicted): wrong: prefill" in out
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
    assert set(zip(wrong["program"], wrong["policy"], wrong["method"])) == {("shared_ok", "name-only", "prefill")}
    assert (
        f[f["status"] == "unreadable"]["path"].str.endswith("broken.pte")
    ).all()  # it fails the gate (rc 1), runs on no data
    assert not f[(f["policy"] == "fingerprint")]["wrong_data"].any()
    assert main(["scan", str(zoo / "identical"), "--policies", "name-only,fingerprint"]) == 0
    assert "every program would run each method on its own data (predicted)" in capsys.readouterr().out


def test_scan_refuses_a_missing_folder_and_an_empty_one(tmp_path, capsys):
    assert main(["scan", str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["scan", str(tmp_path / "empty")]) == 2
    assert "no program found" in capsys.readouterr().err


# ------------------------------------------------------------------ compare --dry-run


def test_compare_dry_run_of_a_real_pte_predicts_every_policy(tmp_path, capsys):
    """Every policy's predicted outcome and memory against the floor, no GPU; exit 1 as report
    --dry-run does: some policy would run prefill on decode's _tensor_constant0."""
    import toolkit

    csv = tmp_path / "c.csv"
    assert main(["compare", str(PTE), "--dry-run", "--csv", str(csv)]) == 1
    out = capsys.readouterr().out
    floor = toolkit.memory_floor(PTE).total_bytes
    assert f"memory floor M = {floor:,} bytes" in out
    assert "'shared_ok', 5 of 9 policies fail (predicted: nothing was loaded or run); exit 1" in out.splitlines()[0]
    assert "fqn-weight-cache" not in out.splitlines()[-1]
    f = pd.read_csv(csv, keep_default_na=False).set_index("policy")
    assert list(f.index) == list(toolkit.POLICIES)
    assert set(f["status"]) == {"loaded"} and (f["floor_bytes"] == floor).all()
    wrong = {p for p in f.index if f.loc[p, "wrong_methods"] != "[]"}
    assert wrong == {"name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always", "blind-share"}
    for p in f.index:  # the same numbers as a dry run of that policy alone
        a = toolkit.dry_run(PTE, p)
        assert f.loc[p, "device_bytes"] == a.device_bytes, p
        assert f.loc[p, "x_floor"] == round(a.device_bytes / floor, 3), p
    assert f.loc["fingerprint", "x_floor"] == 1.0
    # only policies that load right on the right data: a pass
    assert main(["compare", str(PTE), "--dry-run", "--policies", "fingerprint,fqn-weight-cache,no-sharing"]) == 0
    assert "'shared_ok', every policy ok (predicted: nothing was loaded or run); exit 0" in capsys.readouterr().out


def test_compare_dry_run_names_an_export_refusal(built_sample, capsys):
    """Our program directory total_collision: 1.5.x's exporter refuses it (stage "export")."""
    prog = built_sample("total_collision")
    assert main(["compare", str(prog.root), "--dry-run", "--policies", "fqn-weight-cache"]) == 1
    out = capsys.readouterr().out
    assert "findings (1):\n  the program: refused at export\n    Duplicate key cuda_fqn_weight:cpu:" in out
    assert main(["compare", str(prog.root), "--dry-run", "--policies", "fingerprint"]) == 0


def test_compare_dry_run_of_a_sample_name_and_bad_arguments(built_sample, capsys):
    built_sample("partial_collision_shape")  # the CLI builds a sample by name into the same cache
    assert main(["compare", "partial_collision_shape", "--dry-run", "--policies", "refuse-on-mismatch"]) == 1
    assert "findings (1):\n  decode: failed at load\n    Constant " in capsys.readouterr().out
    # name-only shares a tensor of another shape: the guard keeps decode from running (upstream
    # would read out of bounds): not "other data", but not a pass either
    assert main(["compare", "partial_collision_shape", "--dry-run", "--policies", "name-only"]) == 1
    out = capsys.readouterr().out
    assert "1 of 1 policies fail" in out and "; decode not runnable" in out
    assert main(["report", "partial_collision_shape", "--dry-run", "--policy", "name-only"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "decode not runnable (an installed tensor cannot fill its slot" in out
    assert main(["compare", "partial_collision_shape", "--dry-run", "--policies", "decline-on-mismatch"]) == 0
    assert main(["compare", str(PTE), "--dry-run", "--policies", "nope"]) == 2
    assert "unknown policy" in capsys.readouterr().err
