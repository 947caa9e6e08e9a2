"""A torch ``.pt2`` verified from the file: each model's inputs read off its generated wrapper source.

AOTInductor generates a ``check_input_N`` per input in the wrapper ``.cpp`` it packages (the
dtype, each static size, the bounds of a dynamic size); the source reads them into the program
model, and the differential oracle draws inputs of them as it does from a ``.pte``'s execution
plan.  Checked on the CPU packages of ``pt2_packages.py`` in both weight formats: the three-model
package and the two-model one whose adapters share FQNs with other data (``chat``'s token count
is dynamic): under every policy the oracle's verdict equals the one against the eager modules,
through the API and ``constshare report``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from pt2_packages import CHAT_MIN_LENGTH, FORMATS, adapter_modules, adapter_packages, modules, packages
from safetensors.torch import save_file

import toolkit
from toolkit.core.errors import ProgramError
from toolkit.core.model import InputSpec
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import CheckedAgainst, ExitCode
from toolkit.engine import inputs
from toolkit.engine.verification import NO_REFERENCE
from toolkit.sources import open_program
from toolkit.sources.pt2 import UNCHECKED_DYNAMIC_SIZE, wrapper_inputs

CASES = [(kind, fmt) for kind in ("three-model", "adapters") for fmt in FORMATS]


@pytest.fixture(scope="session")
def built():
    """(package kind, format) -> (path, {model: (module, example args)}): compiled once, cached on disk."""
    three, adapters = packages(), adapter_packages()
    out = {}
    for fmt in FORMATS:
        out[("three-model", fmt)] = (three[fmt], modules())
        out[("adapters", fmt)] = (adapters[fmt], adapter_modules())
    return out


def declared(args) -> tuple[InputSpec, ...]:
    return tuple(InputSpec(str(a.dtype).removeprefix("torch."), tuple(a.shape)) for a in args)


def wrapper_source(path: Path, model: str) -> str:
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if f"/data/aotinductor/{model}/" in n and n.endswith(".wrapper.cpp")]
        return z.read(name).decode()


def edited(src: Path, dst: Path, model: str, edit) -> Path:
    """``src`` with ``model``'s generated wrapper source replaced by ``edit(text)`` (None: removed)."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            data = z.read(info.filename)
            if f"/data/aotinductor/{model}/" in info.filename and info.filename.endswith(".wrapper.cpp"):
                text = edit(data.decode())
                if text is None:
                    continue
                data = text.encode()
            out.writestr(info.filename, data)
    return dst


# ------------------------------------------------------------------ what the source declares


@pytest.mark.parametrize("kind,fmt", CASES)
def test_each_input_is_read_from_the_generated_wrapper_source(built, kind, fmt):
    path, mods = built[(kind, fmt)]
    program = open_program(path)
    assert program.method_names == list(mods)
    for m in program.methods:
        got = m.location.inputs
        assert got is not None and len(got) == m.num_inputs == len(mods[m.name][1])
        if m.name == "chat":  # exported at 8 tokens; the checks allow [3, 64]: the smallest is drawn
            assert mods["chat"][1][0].shape == (8,)
            assert got == (InputSpec("int64", (CHAT_MIN_LENGTH,), (0,)),)
        else:
            assert got == declared(mods[m.name][1]), m.name
        assert inputs.input_specs(program, m) == list(got)


def test_a_dynamic_size_is_the_smallest_the_checks_allow(built):
    path, _ = built[("adapters", "binary_blob")]
    src = wrapper_source(path, "chat")
    assert "dim value is too small at 0" in src and "expected it to be >= 3" in src
    assert wrapper_inputs(src, 1) == (InputSpec("int64", (3,), (0,)),)
    # without the lower bound's check (aot_inductor.check_lowerbound off): torch.export's smallest dynamic size
    no_lower = src.replace("dim value is too small", "lower bound not generated")
    assert wrapper_inputs(no_lower, 1) == (InputSpec("int64", (UNCHECKED_DYNAMIC_SIZE,), (0,)),)
    # a bound above it is kept; an upper bound below the unchecked default caps it
    assert wrapper_inputs(src.replace(">= 3,", ">= 17,"), 1) == (InputSpec("int64", (17,), (0,)),)
    assert wrapper_inputs(no_lower.replace("<= 64,", "<= 1,"), 1) == (InputSpec("int64", (1,), (0,)),)
    # the oracle draws that size, and the compiled model (checking its inputs) runs it
    program = open_program(path)
    sets, how = inputs.generate(program, program.method("chat"), 2, 0)
    assert [tuple(s[0].shape) for s in sets] == [(3,), (3,)] and all(s[0].dtype == torch.int64 for s in sets)
    assert "dynamic (input 0 dim 0) at the smallest size the checks allow" in how
    s = toolkit.load_program(path, "no-sharing")
    try:
        v = s.verify().set_index("method")
        assert bool(v.loc["chat", "ran"]) and bool(v.loc["chat", "ok"]), v.to_string()
    finally:
        s.close()


def test_a_source_that_does_not_check_every_input_declares_none(built, tmp_path):
    path, _ = built[("adapters", "pickle_weights")]
    src = wrapper_source(path, "code")
    assert wrapper_inputs(src, 2) is not None
    assert wrapper_inputs(src, 3) is None  # the model has two inputs: a third is not checked
    assert wrapper_inputs("", 0) == ()  # a model without inputs declares all of them
    assert wrapper_inputs(src.replace("check_input_1(", "check_other_1("), 2) is None
    assert wrapper_inputs(src.replace("static void check_input_", "static void unchecked_"), 2) is None
    # such a package opens, and its methods are "no reference", as before torch generated the checks
    unchecked = edited(path, tmp_path / "unchecked.pt2", "code", lambda t: t.replace("check_input_", "unchecked_"))
    program = open_program(unchecked)
    assert program.method("code").location.inputs is None and program.method("chat").location.inputs is not None
    s = toolkit.load_program(unchecked, "fingerprint")
    try:
        v = s.verify().set_index("method")
        assert v.loc["code", "ok"] is pd.NA and v.loc["code", "reason"].startswith(NO_REFERENCE)
        assert "does not declare its inputs" in v.loc["code", "reason"] and bool(v.loc["chat", "ok"])
    finally:
        s.close()


def test_a_package_without_its_generated_source_is_refused(built, tmp_path):
    """torch packages every model's wrapper .cpp; without it the constant table (and the input checks)
    lie only inside the .so, which a source never opens: refused naming the model, not half-read."""
    path, _ = built[("adapters", "binary_blob")]
    gone = edited(path, tmp_path / "no-source.pt2", "code", lambda t: None)
    with pytest.raises(ProgramError, match="model 'code' has no generated wrapper source"):
        open_program(gone)


# ------------------------------------------------------------------ the oracle against eager references


@pytest.mark.parametrize("kind,fmt", CASES)
def test_the_oracle_on_generated_inputs_agrees_with_the_eager_references(built, kind, fmt):
    path, mods = built[(kind, fmt)]
    wrong_somewhere = set()
    for policy in POLICIES:
        s = toolkit.load_program(path, policy)
        try:
            generated = s.verify().set_index("method")
            eager = s.verify(references=mods).set_index("method")
            if s.status != "loaded":  # 1.5.x's exporter refuses a key held with other data: nothing ran
                assert policy == "fqn-weight-cache" and s.error.startswith("Duplicate key"), s.error
                assert generated["ok"].isna().all() and eager["ok"].isna().all()
                continue
            assert generated["ran"].all() and eager["ran"].all(), (policy, generated.to_string())
            assert set(generated["oracle"]) == {CheckedAgainst.UNSHARED_GENERATED}
            assert all("the .pt2's generated wrapper source" in d for d in generated["oracle_detail"])
            assert set(eager["oracle"]) == {CheckedAgainst.SUPPLIED}
            assert generated["ok"].astype(bool).to_dict() == eager["ok"].astype(bool).to_dict(), policy
            wrong_somewhere |= {(policy, m) for m in generated.index[~generated["ok"].astype(bool)]}
        finally:
            s.close()
    # the name-sharing policies run a later model on the first one's data under a shared FQN
    later = {"decode", "prefill_again"} if kind == "three-model" else {"code"}
    assert {m for p, m in wrong_somewhere if p == "name-only"} == later
    assert not {m for p, m in wrong_somewhere if p in ("no-sharing", "fingerprint", "content-dedup")}


def reference_files(mods, tmp_path: Path) -> list[str]:
    out = []
    for name, (m, args) in mods.items():
        with torch.no_grad():
            y = m(*args)
        f = tmp_path / f"{name}.safetensors"
        tensors = {f"input.{i}": a.contiguous() for i, a in enumerate(args)}
        save_file({**tensors, "output.0": y.contiguous()}, str(f))
        out += ["--reference", f"{name}={f}"]
    return out


@pytest.mark.parametrize("kind,fmt", CASES)
def test_report_on_a_pt2_without_references_exits_as_with_them(built, kind, fmt, tmp_path, capsys):
    from toolkit.cli import main

    path, mods = built[(kind, fmt)]
    refs = reference_files(mods, tmp_path)
    for policy in POLICIES:
        code = main(["report", str(path), "--policy", policy])
        out = capsys.readouterr().out
        assert code in (ExitCode.OK, ExitCode.PROBLEM), (policy, out)
        assert code == main(["report", str(path), "--policy", policy, *refs]), policy
        capsys.readouterr()
        if policy != "fqn-weight-cache":  # which the exporter refuses: nothing runs
            assert CheckedAgainst.UNSHARED_GENERATED.value in out, out
            assert "not verified" not in out
        if policy in ("no-sharing", "fingerprint", "content-dedup", "name-only"):
            assert code == (ExitCode.PROBLEM if policy == "name-only" else ExitCode.OK), policy
