"""The differential oracle: each method against its own unshared load (issue 24).

Done when the differential verdict per method (and per sequence) equals the verdict against
eager references, on every sample and real fixture, under every policy, except where the file
itself cannot tell (:data:`ORACLE_BLIND`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from executorch_fixtures import unpacked

import toolkit
from toolkit.build.samples import sample_names
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import BlindSpot, CheckedAgainst, MethodOutcome, ProgramFormat
from toolkit.engine import inputs, verification

SAMPLES = ("total_collision", "shared_state", "mutated_buffer")  # on the CPU (every sample on the GPU, below)
# (export set, program, sequence): where the file cannot tell intended sharing from a wrong one, so
# the differential verdict may differ from the eager one; its verdict says so (``oracle_detail``).
# ExecuTorch 1.5.1 stores mutated_buffer's two independent `kv` buffers (equal zeros) under one
# storage key: the unshared side, one storage per key, holds them as one.  1.2.0 (generation 1)
# keys every constant by method: shared_state's one intended cache is two storages in the file.
ORACLE_BLIND = {
    ("executorch-1.5.1-cuda", "mutated_buffer", "generate"),
    ("executorch-1.2.0-cuda", "shared_state", "generate"),
}


def outcomes(session, oracle: str) -> tuple[dict, dict, object]:
    session.verify(oracle=oracle)
    for q in session.program.sequences:
        session.verify(sequence=q.name, oracle=oracle)
    v = session.verdict()
    return {m.method: m.outcome for m in v.methods}, {q.sequence: q.outcome for q in v.sequences}, v


def check_agrees(program, policy: str, name: str, device: str = "cpu", export_set: str = "") -> None:
    """Under ``policy``: the unshared oracles' verdict per method and sequence is the eager one's."""
    if not isinstance(program, toolkit.Program):
        table = Path(program) / "constant_table.json"  # generation 1 keeps its table inside the .so
        program = toolkit.open_program(
            program, **({"constant_table": json.loads(table.read_text())} if table.is_file() else {})
        )
    s = toolkit.load_program(program, policy, device=device)
    try:
        eager_m, eager_q, _ = outcomes(s, "reference")
        for oracle in ("unshared", "generated"):
            diff_m, diff_q, v = outcomes(s, oracle)
            assert diff_m == eager_m, (name, policy, oracle, diff_m, eager_m)
            for q, outcome in eager_q.items():
                said = next(x for x in v.sequences if x.sequence == q)
                if program.format is not ProgramFormat.DIRECTORY and (export_set, name, q) in ORACLE_BLIND:
                    assert "cannot tell" in said.oracle_detail, said  # whether or not it agrees, it says so
                    gaps = [g for g in v.not_checked if g.subject == q and g.gap is BlindSpot.ORACLE]
                    assert gaps and all(g.reason.startswith("the file cannot tell whether ") for g in gaps), v
                else:
                    assert diff_q[q] == outcome, (name, policy, oracle, q, diff_q[q], outcome)
            for m in v.methods:
                if m.outcome in (MethodOutcome.OK, MethodOutcome.WRONG):
                    assert m.checked_against.startswith("unshared load"), m
    finally:
        s.close()


@pytest.mark.parametrize("name", SAMPLES)
def test_differential_verdict_equals_the_eager_one_under_every_policy(built_sample, name):
    program = built_sample(name)
    for policy in POLICIES:
        check_agrees(program, policy, name)


def test_verdict_names_its_oracle_per_method_and_the_generated_inputs(built_sample):
    s = toolkit.load_program(built_sample("total_collision"), "name-only")
    try:
        eager = s.verify()
        assert set(eager["oracle"]) == {CheckedAgainst.EAGER}
        assert {m.checked_against for m in s.verdict().methods} == {CheckedAgainst.EAGER}
        frame = s.verify(oracle="generated", draws=4, seed=7).set_index("method")
        assert frame.loc["decode", "draws"] == "differs, differs, differs, differs", frame.to_string()
        assert frame.loc["prefill", "draws"] == "ok, ok, ok, ok"
        v = s.verdict()
        assert v.wrong_methods == ["decode"]
        assert v.method("decode").checked_against == CheckedAgainst.UNSHARED_GENERATED
        assert "4 draws (seed 7) of float32[4, 64]" in v.method("decode").oracle_detail
        assert "bit-exact" in v.method("decode").oracle_detail
        again = s.verify(oracle="generated", draws=4, seed=8).set_index("method")
        assert again.loc["decode", "max_abs_err"] != frame.loc["decode", "max_abs_err"]  # other draws
    finally:
        s.close()


def test_a_sequence_is_checked_against_the_intended_shared_state(built_sample):
    """shared_state's cache is one buffer of the eager program: the unshared side holds it once, so
    keeping it apart (no-sharing) is wrong there too; the verdict says which model of state it used."""
    import dataclasses

    from toolkit.core.verdict import verdict_from_dict

    s = toolkit.load_program(built_sample("shared_state"), "no-sharing")
    try:
        s.verify(sequence="generate", oracle="unshared")
        v = s.verdict()
        (q,) = v.sequences
        assert q.outcome is MethodOutcome.WRONG and q.checked_against == CheckedAgainst.UNSHARED_REFERENCE_INPUTS
        assert "one tensor per storage of the eager program" in q.oracle_detail
        assert verdict_from_dict(dataclasses.asdict(v)) == v  # as an isolated worker sends it back
    finally:
        s.close()


def test_what_the_oracles_state_model_cannot_see_becomes_a_not_checked_line_per_clause(built_sample):
    """The state model lists its gaps beside the sequence's frame (never parsed back out of its words)."""
    from toolkit.engine.blind_spots import ORACLE_GAPS, blind_spots

    s = toolkit.load_program(built_sample("shared_state"), "no-sharing")
    try:
        frame = s.verify(sequence="generate", oracle="unshared")
        assert frame.attrs[ORACLE_GAPS] == []  # our program's provenance says what is one state
        program = s.program
    finally:
        s.close()
    frame = frame.copy()
    frame.attrs[ORACLE_GAPS] = ["core.kv (held by prefill, decode) was one buffer of the eager program or several"]
    (gap,) = blind_spots(program, predicted=False, sequences={"generate": frame})
    assert (gap.subject, gap.gap) == ("generate", BlindSpot.ORACLE)
    assert gap.reason == "the file cannot tell whether " + frame.attrs[ORACLE_GAPS][0]


def test_a_method_without_reference_or_declared_inputs_stays_unverified(built_sample):
    from dataclasses import replace

    program = built_sample("total_collision")
    bare = replace(program, methods=tuple(replace(m, reference_file="") for m in program.methods))
    s = toolkit.load_program(bare, "name-only")
    try:
        frame = s.verify()
        assert frame["ok"].isna().all() and frame["reason"].str.contains("does not declare its inputs").all()
        assert s.verdict().exit_code == 3
    finally:
        s.close()


def test_nondeterministic_outputs_get_the_tolerance_of_their_spread():
    a, b = [torch.tensor([1.0, 2.0])], [torch.tensor([1.0, 2.001])]
    near, far = [torch.tensor([1.0, 2.0015])], [torch.tensor([1.0, 2.01])]
    assert verification.compare_unshared(a, (a, a))["tolerance"] == "bit-exact"
    assert not verification.compare_unshared(near, (a, a))["ok"]
    got = verification.compare_unshared(near, (a, b))
    assert got["ok"] and "nondeterministic" in got["tolerance"] and got["atol"] == pytest.approx(0.002, rel=1e-3)
    assert not verification.compare_unshared(far, (a, b))["ok"]
    nan = [torch.tensor([float("nan")])]
    assert verification.compare_unshared(nan, (nan, nan))["ok"]  # the same NaN bits


def test_inputs_come_from_a_pte_execution_plan_and_integers_stay_in_range():
    root = unpacked("1.5.1")
    program = toolkit.open_program(root / "llama_prefill_decode")
    decode = program.method("decode")
    specs = inputs.input_specs(program, decode)
    assert specs and all(s.dtype == "int64" for s in specs), specs
    sets, how = inputs.generate(program, decode, 5, 0)
    bound, _ = inputs.int_bound(decode)
    assert all(0 <= int(t.min()) and int(t.max()) < bound for one in sets for t in one)
    assert "execution plan" in how and f"[0, {bound})" in how
    ok = toolkit.open_program(unpacked("1.5.1").parent.parent / "executorch-1.5.1-cuda" / "shared_ok")
    assert inputs.input_specs(ok, ok.method("prefill")) == [inputs.InputSpec("float32", (4, 64))]


# ------------------------------------------------------------------ GPU (the lead runs these on the H200)

REAL = ("shared_state", "mutated_buffer", "llama_prefill_decode", "no_constants", "three_shared")


def _real(name: str):
    root = unpacked("1.5.1")
    return root / name if (root / name).is_dir() else root.parent.parent / "executorch-1.5.1-cuda" / name


def _every_export() -> list[Path]:
    """Every exported program of every export set (a refused one has no prog.pte)."""
    roots = [
        unpacked("1.5.1"),
        unpacked("1.2.0"),
        unpacked("1.5.1", "families"),
        unpacked("1.2.0", "families"),
        unpacked("1.5.1").parent.parent / "executorch-1.5.1-cuda",
    ]
    return sorted(d for r in roots if r.is_dir() for d in r.iterdir() if (d / "prog.pte").is_file())


@pytest.mark.gpu
@pytest.mark.parametrize("name", sample_names())
def test_gpu_differential_equals_eager_on_samples(built_sample, name):
    program = built_sample(name, device="cuda")
    for policy in POLICIES:
        check_agrees(program, policy, name, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("folder", _every_export(), ids=lambda d: f"{d.parent.name}/{d.name}")
def test_gpu_differential_equals_eager_on_real_exports(folder):
    for policy in POLICIES:
        check_agrees(folder, policy, folder.name, device="cuda", export_set=folder.parent.name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ("shared_ok", "shared_state", "llama_prefill_decode"))
def test_gpu_a_pte_without_references_verifies_differentially(tmp_path, name):
    """Only the file: no reference beside it; `report` checks it against its unshared load, exits 0 or 1."""
    src = _real(name)
    bare = tmp_path / name
    shutil.copytree(src, bare, ignore=shutil.ignore_patterns("reference_*.safetensors"))
    for policy in POLICIES:
        s = toolkit.load_program(bare, policy)
        ref = toolkit.load_program(src, policy)
        try:
            got, want = s.verdict(), ref.verdict()
            assert {m.method: m.outcome for m in got.methods} == {m.method: m.outcome for m in want.methods}
            assert not got.no_reference
            assert {m.checked_against for m in got.methods if m.outcome in (MethodOutcome.OK, MethodOutcome.WRONG)} <= {
                CheckedAgainst.UNSHARED_GENERATED
            }
        finally:
            s.close()
            ref.close()
    for policy in ("fingerprint", "name-only"):
        rc = subprocess.run(
            [sys.executable, "-m", "toolkit", "report", str(bare), "--policy", policy], capture_output=True, text=True
        )
        assert rc.returncode in (0, 1), rc.stdout + rc.stderr
        # the methods' rows of the findings-first output: each checked against its unshared load
        checked = re.findall(r"^(prefill|decode)\s+(?:ok|wrong)\s+unshared load, generated inputs\s", rc.stdout, re.M)
        assert sorted(checked) == ["decode", "prefill"], rc.stdout
