"""``--oracle generated`` reads only what the load verified, and every dtype an input can declare
is drawn or said not to be (issue 38, item 5).

The generated inputs' dtypes and shapes come from the method's reference file (a program
directory) or the ``.pte``'s execution plan.  They were read from disk: a file swapped after the
load was used silently, a damaged one escaped ``verify()`` as a raw ``SafetensorError``, and a
``uint16`` input raised ``KeyError: 'U16'``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from executorch_fixtures import unpacked
from safetensors.torch import load_file, save_file
from test_errors import clone, refresh_digests

import toolkit
from toolkit.core.errors import IntegrityError, ProgramError, ToolkitError
from toolkit.engine import inputs

SAMPLE = "total_collision"
REF = "methods/decode/reference.safetensors"


def _declare(root: Path, dtype: torch.dtype, shape=(4, 64)) -> None:
    """Rewrite decode's reference so that its input 0 is ``dtype`` (its outputs as they were)."""
    data = load_file(str(root / REF))
    data["input.0"] = torch.zeros(shape, dtype=dtype)
    save_file(data, str(root / REF))


# ------------------------------------------------------------------ only verified bytes


def test_a_reference_swapped_after_the_load_is_never_read(built_sample, tmp_path):
    root = clone(built_sample(SAMPLE), tmp_path / "p")
    s = toolkit.load_program(root, "no-sharing")
    try:
        original = (root / REF).read_bytes()
        _declare(root, torch.float64, (7, 64))  # another file in its place, the record unchanged
        with pytest.raises(IntegrityError) as e:
            s.verify(oracle="generated")
        assert e.value.path == str(root / REF)
        (root / REF).unlink()
        (root / REF).write_bytes(original)  # a new file with the verified bytes: read, checked, used
        v = s.verify(oracle="generated")
        assert v["ok"].all() and "float32[4, 64]" in v.set_index("method").loc["decode", "oracle_detail"]
    finally:
        s.close()


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "integrity-off"])
def test_a_damaged_reference_is_a_toolkit_error_naming_it(built_sample, tmp_path, checked):
    root = clone(built_sample(SAMPLE), tmp_path / "p")
    raw = bytearray((root / REF).read_bytes())
    raw[8:16] = b"{[[[[[[["  # the JSON header no longer parses
    (root / REF).write_bytes(bytes(raw))
    refresh_digests(root)  # consistent damage: the record check cannot tell
    s = toolkit.load_program(root, "no-sharing", check_integrity=checked)
    try:
        assert s.status == "loaded", s.error
        with pytest.raises(ToolkitError) as e:
            s.verify(oracle="generated")
        assert type(e.value) is ProgramError and e.value.path == str(root / REF), repr(e.value)
        assert "reference tensors cannot be read" in str(e.value)
    finally:
        s.close()


def test_a_reference_without_an_input_names_it(built_sample, tmp_path):
    root = clone(built_sample(SAMPLE), tmp_path / "p")
    data = load_file(str(root / REF))
    del data["input.0"]
    save_file(data, str(root / REF))
    program = toolkit.open_program(refresh_digests(root))
    with pytest.raises(ProgramError, match="'input.0' is missing") as e:
        inputs.generate(program, program.method("decode"), 1, 0)
    assert e.value.path == str(root / REF)


def test_a_pte_changed_after_it_was_opened_is_never_read(tmp_path):
    src = unpacked("1.5.1") / "llama_prefill_decode"
    if not (src / "prog.pte").is_file():
        pytest.skip("the ExecuTorch 1.5.1 exports are not unpacked here")
    root = tmp_path / "p"
    shutil.copytree(src, root)
    program = toolkit.open_program(root / "prog.pte")
    decode = program.method("decode")
    declared = inputs.input_specs(program, decode)
    assert declared and all(s.dtype == "int64" for s in declared)
    raw = bytearray((root / "prog.pte").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (root / "prog.pte").unlink()
    (root / "prog.pte").write_bytes(bytes(raw))
    with pytest.raises(IntegrityError) as e:
        inputs.input_specs(program, decode)
    assert e.value.path == str(root / "prog.pte")
    assert inputs.input_specs(program, decode, check_integrity=False) == declared  # what "off" reads: the file


# ------------------------------------------------------------------ every dtype an input can declare

# every dtype torch can write into a safetensors file (0.8: also U16, U32, U64, F8_E8M0, F4)
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
]


@pytest.fixture(scope="module")
def declaring(built_sample, tmp_path_factory):
    """A copy of the sample whose decode reference is rewritten per dtype."""
    return clone(built_sample(SAMPLE), tmp_path_factory.mktemp("dtypes") / "p")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_dtype_a_reference_declares_is_drawn_or_said_not_to_be(declaring, dtype):
    _declare(declaring, dtype)
    program = toolkit.open_program(refresh_digests(declaring))
    name = str(dtype).removeprefix("torch.")
    got = inputs.generate(program, program.method("decode"), 2, 0)
    assert got is not None
    sets, how = got
    if sets is None:
        assert how.startswith(f"input 0 of 'decode' is {name}") and "cannot" in how, how
        assert dtype == torch.float4_e2m1fn_x2, f"{name} is one torch can draw: {how}"
        return
    assert [[(t.dtype, tuple(t.shape)) for t in one] for one in sets] == [[(dtype, (4, 64))]] * 2
    assert f"{name}[4, 64]" in how
    if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
        assert all(0 <= int(v) < 4 for one in sets for v in one[0].flatten().tolist())


def test_a_dtype_torch_has_not_is_said_not_to_be_drawn():
    for declared in ("ScalarType 12", "safetensors F6_E2M3", "qint8"):
        why = inputs.not_generatable([inputs.InputSpec("float32", (2,)), inputs.InputSpec(declared, (2,))], "m")
        assert why is not None and why.startswith(f"input 1 of 'm' is {declared}"), why
    assert inputs.not_generatable([inputs.InputSpec("uint16", (2,))], "m") is None


def test_an_input_the_oracle_cannot_draw_is_the_rows_reason(built_sample, tmp_path):
    root = clone(built_sample(SAMPLE), tmp_path / "p")
    _declare(root, torch.float4_e2m1fn_x2)
    s = toolkit.load_program(refresh_digests(root), "no-sharing")
    try:
        row = s.verify(oracle="generated").set_index("method").loc["decode"]
        assert pd.isna(row["ok"]) and "input 0 of 'decode' is float4_e2m1fn_x2" in row["reason"], row["reason"]
    finally:
        s.close()


class _Uint16Input(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return x.to(torch.float32) @ self.w


def test_a_uint16_input_is_checked_on_generated_inputs_as_by_its_reference(tmp_path):
    """The issue's case end to end: ``report --oracle generated`` exits 0, as the default oracle does."""
    from toolkit.cli import main

    x = torch.randint(0, 4, (3, 8), generator=torch.Generator().manual_seed(2)).to(torch.uint16)
    root = tmp_path / "u16"
    toolkit.build_program({"step": (_Uint16Input(), (x,))}, root, progress=False)
    assert main(["report", str(root)]) == 0
    assert main(["report", str(root), "--oracle", "generated"]) == 0
    s = toolkit.load_program(root, "no-sharing")
    try:
        row = s.verify(oracle="generated").iloc[0]
        assert bool(row["ok"]) and "uint16[3, 8]" in row["oracle_detail"]
    finally:
        s.close()
