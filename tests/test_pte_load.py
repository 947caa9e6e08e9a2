"""Real loads of ExecuTorch 1.5.1 CUDA programs (``.pte`` + ``.ptd``) through torch's AOTInductor
runtime, no ExecuTorch C++ runtime (issue 10 item 4; ``docs/upstream.md``).

The GPU tests load both real fixtures, and every program exported by
``fixtures/make_executorch_fixtures.py`` (``executorch_fixtures.py``: the folders present),
under every policy and check the outcome against what the dry run
(:func:`toolkit.workflows.dry_run.dry_run`) predicts: the same status, and a method
verifies wrong exactly when it runs on a shared constant whose content digest differs from its
own.  The CPU tests cover what can run without a GPU: extracting the embedded ``.so``, the
input reorder, the emulated whole-blob upload of a format without a dense blob, and the
refusal of a CUDA program on a machine without CUDA.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import executorch_fixtures as et
import pytest
import torch

import toolkit
from toolkit.core.errors import IncompatibleProgramError, LoadError
from toolkit.core.model import PerConstantStorages, Region
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import Decision, UploadPath
from toolkit.runtimes import CompiledConstant, CompiledMethod, aoti
from toolkit.runtimes.aoti import AotiMethod, AotiRuntime, method_outputs, so_inputs
from toolkit.runtimes.aoti_container import extract_so
from toolkit.workflows.dry_run import dry_run

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "executorch-1.5.1-cuda"
FOLDERS = ("shared_ok", "identical")
# the policies whose all-hit branch shares on name alone (shared_ok's two _tensor_constant0 differ)
NAME_SHARING = ("name-only", "blind-share", "refuse-on-mismatch", "decline-on-mismatch", "verify-always")
ALWAYS_CORRECT = ("fingerprint", "no-sharing", "content-dedup", "fqn-weight-cache")


def pte(folder: str) -> Path:
    return FIXTURES / folder / "prog.pte"


def predicted_wrong(folder: str, policy: str) -> set[str]:
    """Methods the dry run says run on another method's data: a shared constant whose digest differs."""
    d = dry_run(pte(folder), policy).decisions
    bad = d[(d["decision"] == Decision.SHARED) & (d["digest"] != d["cached_digest"])]
    return set(bad["method"])


# ------------------------------------------------------------------ CPU


def test_the_dry_run_predicts_the_expected_outcomes():
    """What the GPU tests rely on, checked here on the CPU."""
    for policy in POLICIES:
        for folder in FOLDERS:
            assert dry_run(pte(folder), policy).status == "loaded", (folder, policy)
        assert predicted_wrong("identical", policy) == set(), policy
        want = {"prefill"} if policy in NAME_SHARING else set()
        assert predicted_wrong("shared_ok", policy) == want, policy


def test_prefill_on_decodes_tensor_constant0_is_far_from_its_reference():
    """What the GPU tests expect of the name-sharing policies, computed on the CPU from the bytes:
    prefill (lin(x) @ c) run on decode's _tensor_constant0 misses its reference by far more than
    verify()'s tolerance (1e-3)."""
    from safetensors.torch import load_file

    program = toolkit.open_program(pte("shared_ok"))

    def tensors(m):
        out = {}
        for c in m.constants:
            raw = bytearray(program.path(c.file).read_bytes()[c.offset : c.offset + c.nbytes])
            out[c.fqn] = torch.frombuffer(raw, dtype=torch.float32).as_strided(c.shape, c.strides)
        return out

    pre, dec = tensors(program.method("prefill")), tensors(program.method("decode"))
    ref = load_file(str(program.path(program.method("prefill").reference_file)))
    x, want = ref["input.0"], ref["output.0"]
    own = (x @ pre["lin.weight"].T + pre["lin.bias"]) @ pre["_tensor_constant0"]
    shared = (x @ pre["lin.weight"].T + pre["lin.bias"]) @ dec["_tensor_constant0"]
    assert torch.allclose(own, want, atol=1e-4, rtol=1e-4)
    assert float((shared - want).abs().max()) > 1e-1


def test_the_embedded_so_is_extracted_once_and_reused():
    program = toolkit.open_program(pte("shared_ok"))
    so = program.methods[0].location.so
    assert so.offset > 0
    src = program.path(so.file)
    with open(src, "rb") as f:
        f.seek(so.offset)
        want = f.read(so.size)
    out = extract_so(src, so.offset, so.size)  # a sealed private copy, never a file on disk
    assert out.read_bytes() == want
    assert so.key == hashlib.sha256(want).hexdigest() + "_so_blob"  # ExecuTorch's key: the sha256 of the bytes
    assert want[:4] == b"\x7fELF"
    assert extract_so(src, so.offset, so.size) == out  # one copy per content, for the process
    with pytest.raises(OSError):
        out.write_bytes(want[:-1])  # sealed: nobody changes what dlopen reads


def test_extracting_past_the_end_of_the_file_is_refused(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"0123456789")
    with pytest.raises(toolkit.ToolkitError, match="should have 20 bytes"):
        extract_so(f, 4, 20)


def test_inputs_are_reordered_as_the_so_takes_them():
    a, b, c = object(), object(), object()
    assert so_inputs([a, b], None) == [a, b]
    assert so_inputs([a, b], (0, 1)) == [a, b]
    assert so_inputs([a, b], (1, 0)) == [b, a]
    assert so_inputs([a, b, c], (2, 0)) == [c, a]
    with pytest.raises(LoadError, match="takes method inputs"):
        so_inputs([a], (1, 0))


def test_the_fixtures_trace_their_input_order():
    for folder in FOLDERS:
        for m in toolkit.open_program(pte(folder)).methods:
            assert m.input_order == (0,), (folder, m.name)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_cuda_program_is_refused_without_cuda(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(IncompatibleProgramError, match="'cuda'") as ei:
        toolkit.load_program(pte("shared_ok"), "fingerprint", device=device)
    assert ei.value.field == "device"


def test_an_unknown_torch_version_is_not_refused():
    program = toolkit.open_program(pte("shared_ok"))
    assert program.torch_version == "unknown"
    aoti.check_compatible(program, "cuda", torch.__version__)  # no error: only the device kind counts


class _FakeContainer:
    def __init__(self):
        self.installed: list[dict] = []
        self.so_path = Path("x.so")

    def install(self, tensors):
        self.installed.append(dict(tensors))

    def run(self, inputs):
        return inputs


def _cpu_method(program, method) -> AotiMethod:
    """An AotiMethod on the CPU without a container (the fixtures' .so needs CUDA)."""
    h = AotiMethod.__new__(AotiMethod)
    h._runtime, h._program, h._spec = AotiRuntime(), program, method
    h._blob, h._blob_bytes = program.path(method.blob_file), method.blob_bytes
    h._blob_tensors = {}
    h.device = torch.device("cpu")
    h.container = _FakeContainer()
    return h


def test_without_a_dense_blob_the_whole_blob_upload_is_emulated():
    program = toolkit.open_program(pte("shared_ok"))
    m = program.method("prefill")
    assert m.location.weights == PerConstantStorages()
    h = _cpu_method(program, m)
    h.upload_blob()
    got = h.extract()
    assert set(got) == {c.name for c in m.constants}
    assert h.container.installed == [got]  # installed user-managed, all of them at once
    for c in m.constants:
        t = got[c.name]
        assert tuple(t.shape) == c.shape and tuple(t.stride()) == c.strides
        raw = program.path(c.file).read_bytes()[c.offset : c.offset + c.nbytes]
        assert hashlib.sha256(raw).hexdigest() == c.digest
        assert bytes(t.contiguous().view(torch.uint8).numpy().tobytes()) == raw


@pytest.mark.parametrize("staging", [True, False])
def test_own_uploads_read_each_constant_from_its_own_file(monkeypatch, staging):
    from toolkit import upload
    from toolkit.core.options import LoadOptions

    program = toolkit.open_program(pte("shared_ok"))
    m = program.method("decode")
    seen = []
    real, real_stage = aoti.AotiMethod._path, upload.stage_pieces

    def spy(self, c):
        p = real(self, c)
        seen.append((c.name, p))
        return p

    def stage_spy(path, record, specs, *a, **k):
        seen.extend((c.name, path) for c in specs)
        return real_stage(path, record, specs, *a, **k)

    monkeypatch.setattr(aoti.AotiMethod, "_path", spy)
    monkeypatch.setattr(upload, "stage_pieces", stage_spy)
    h = _cpu_method(program, m)
    h._runtime = AotiRuntime(LoadOptions(integrity_staging=staging))
    out = {c.name: (t, how) for c, t, how in h.upload_constants(list(m.constants))}
    assert set(out) == {c.name for c in m.constants}
    assert {how for _, how in out.values()} == {UploadPath.VERIFIED_HOST if staging else UploadPath.HOST}
    # each from ITS file: staged from it (hashed as read), or read (integrity on) from its verified copy
    files = {c.name: program.path(c.file) for c in m.constants}
    assert {name for name, _ in seen} == set(files)
    assert all(p.read_bytes() == files[name].read_bytes() for name, p in seen)
    assert len({p for _, p in seen}) == len(set(files.values()))
    for c in m.constants:
        raw = files[c.name].read_bytes()[c.offset : c.offset + c.nbytes]
        assert out[c.name][0].contiguous().view(torch.uint8).numpy().tobytes() == raw


def test_compiled_drops_blob_offsets_when_there_is_no_dense_blob(monkeypatch):
    program = toolkit.open_program(pte("shared_ok"))
    m = program.method("decode")
    slots = {c.name: CompiledConstant(c.name, c.fqn, c.dtype, c.nbytes, 0) for c in m.constants}
    monkeypatch.setattr(aoti, "read_compiled", lambda so, dev: CompiledMethod(slots, 12345))
    got = _cpu_method(program, m).compiled()
    assert got.blob_bytes is None
    assert all(c.blob_offset is None for c in got.constants.values())
    assert {n: c.fqn for n, c in got.constants.items()} == {c.name: c.fqn for c in m.constants}


def test_compiled_shifts_blob_offsets_of_a_blob_inside_another_file(monkeypatch):
    from dataclasses import replace

    program = toolkit.open_program(pte("shared_ok"))
    m = program.method("decode")
    m = replace(m, location=replace(m.location, weights=Region(m.blob_file, 1000, 12345)))
    slots = {c.name: CompiledConstant(c.name, c.fqn, c.dtype, c.nbytes, 64 * i) for i, c in enumerate(m.constants)}
    monkeypatch.setattr(aoti, "read_compiled", lambda so, dev: CompiledMethod(slots, 12345))
    got = _cpu_method(program, m).compiled()
    assert got.blob_bytes == 12345
    assert [got.constants[c.name].blob_offset for c in m.constants] == [1000 + 64 * i for i in range(len(m.constants))]


def test_run_feeds_the_so_in_its_input_order():
    program = toolkit.open_program(pte("shared_ok"))
    from dataclasses import replace

    m = replace(program.method("decode"), input_order=(1, 0), output_order=None)
    h = _cpu_method(program, m)
    x, y = torch.zeros(1), torch.ones(1)
    out = h.run([x, y])
    assert out[0] is y or torch.equal(out[0], y)
    assert torch.equal(out[1], x)


def test_outputs_are_reordered_as_the_method_gives_them():
    a, b, c = object(), object(), object()
    assert method_outputs([a, b], None) == [a, b]
    assert method_outputs([a, b], (1, 0)) == [b, a]
    assert method_outputs([a, b, c], (2, 0, 1)) == [c, a, b]
    with pytest.raises(LoadError, match="compiled model gave 1"):
        method_outputs([a], (0, 1))


def test_the_fixtures_trace_their_output_order():
    """The execution plan: the delegate's output value, copied to the host (et_copy::_d2h_copy),
    is the method's output."""
    for folder in FOLDERS:
        for m in toolkit.open_program(pte(folder)).methods:
            assert m.output_order == (0,), (folder, m.name)


def test_an_execution_plan_with_swapped_outputs_maps_them():
    """A plan whose outputs are the delegate's in another order (and one copied on its way)."""
    from dataclasses import replace

    from toolkit.sources.executorch.layout import Plan
    from toolkit.sources.executorch.methods import io_orders

    def _output_order(plan, delegate):
        return io_orders(plan, delegate)[1]

    ops = ["et_copy::_h2d_copy", "et_copy::_d2h_copy", "aten::add"]
    calls = [
        ("kernel", 0, [0, 10, 10]),
        ("kernel", 0, [1, 11, 11]),
        ("delegate", 0, [10, 11, 20, 21, 22]),  # inputs 10, 11; the .so's outputs 20, 21, 22
        ("kernel", 1, [21, 31, 31]),
    ]
    plan = Plan("m", [0, 1], [22, 31, 20], [], calls, ops, "execution_plan[0]")
    assert _output_order(plan, 0) == (2, 1, 0)
    assert io_orders(plan, 0)[0] == (0, 1)  # the .so's inputs 10, 11: copies of the method's inputs 0, 1
    assert _output_order(replace(plan, outputs=[22, 99]), 0) is None  # 99 comes from no output of the .so
    assert _output_order(replace(plan, calls=calls[:2]), 0) is None  # no delegate call
    # a value that is not a copy of the delegate's output (another kernel computes it) is not traced
    assert _output_order(replace(plan, calls=calls[:3] + [("kernel", 2, [21, 31, 31])]), 0) is None


def test_run_gives_the_outputs_in_the_methods_order():
    from dataclasses import replace

    program = toolkit.open_program(pte("shared_ok"))
    m = replace(program.method("decode"), input_order=(0, 1), output_order=(1, 0))
    h = _cpu_method(program, m)
    x, y = torch.zeros(1), torch.ones(1)
    out = h.run([x, y])  # the fake container gives its inputs back as its outputs
    assert torch.equal(out[0], y) and torch.equal(out[1], x)


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_real_pte_loads_and_verifies_as_the_dry_run_predicts(folder, policy):
    s = toolkit.load_program(pte(folder), policy)
    try:
        assert s.status == dry_run(pte(folder), policy).status == "loaded", s.error
        v = s.verify().set_index("method")
        assert bool(v["ran"].all()), v.to_string()
        wrong = set(v.index[~v["ok"].astype(bool)])
        assert wrong == predicted_wrong(folder, policy), v.to_string()
        if policy in ALWAYS_CORRECT or folder == "identical":
            assert wrong == set(), v.to_string()
        elif policy in NAME_SHARING:
            assert wrong == {"prefill"}, v.to_string()  # decode's _tensor_constant0 shared silently
    finally:
        s.close()


@pytest.mark.gpu
def test_real_pte_decisions_match_the_dry_run():
    for policy in ("fingerprint", "name-only", "fqn-weight-cache"):
        s = toolkit.load_program(pte("shared_ok"), policy)
        try:
            cols = ["method", "name", "decision", "origin"]
            real = s.decisions[cols].reset_index(drop=True)
            dry = dry_run(pte("shared_ok"), policy).decisions[cols].reset_index(drop=True)
            assert real.astype(str).equals(dry.astype(str)), (policy, real, dry)
        finally:
            s.close()


def _wrong_of(decisions) -> set[str]:
    bad = decisions[(decisions["decision"] == Decision.SHARED) & (decisions["digest"] != decisions["cached_digest"])]
    return set(bad["method"])


def _run_sequence(path: Path, policy: str, info: dict) -> list[bool]:
    """The eager sequence's steps in a fresh session, in order, state carried: ok per step."""
    from safetensors.torch import load_file

    from toolkit.engine.verification import compare_outputs

    ref = load_file(str(path.parent / info["file"]))
    s = toolkit.load_program(path, policy)
    try:
        oks = []
        for i, m in enumerate(info["steps"]):
            inputs = [ref[f"step.{i}.input.{j}"] for j in range(info["inputs"][i])]
            n_out = sum(k.startswith(f"step.{i}.output.") for k in ref)
            expected = [ref[f"step.{i}.output.{j}"] for j in range(n_out)]
            outputs = [o.detach().cpu() for o in s.run(m, inputs)]
            oks.append(bool(compare_outputs(outputs, expected)["ok"]))
        return oks
    finally:
        s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("name", et.exported())
def test_exported_fixture_loads_and_verifies_as_stated(name, policy):
    """A program exported by executorch 1.5.1 (the script's): loads under every policy as the
    dry run predicts, decision for decision; each method alone is wrong exactly where the dry
    run and the fixture's stated expectation say; each eager sequence (state carried) is right
    exactly where stated."""
    path = et.ROOT / name / "prog.pte"
    _loads_and_verifies_as_predicted(path, policy, name, same_decisions=True)
    for seq, info in et.result(name)["references"]["sequences"].items():
        oks = _run_sequence(path, policy, info)
        assert all(oks) == et.EXPECTED[name].sequence_ok(policy)[seq], (seq, info["steps"], oks)


def _loads_and_verifies_as_predicted(program, policy: str, name: str, *, same_decisions: bool) -> None:
    """Load ``program`` under ``policy``: it loads as the dry run predicts (the same decisions, when
    ``same_decisions``), every method runs, and exactly the stated methods are wrong."""
    dry = dry_run(program, policy)
    s = toolkit.load_program(program, policy)
    try:
        assert s.status == dry.status == "loaded", s.error
        if same_decisions:
            cols = ["method", "name", "decision", "origin"]
            assert (
                s.decisions[cols]
                .reset_index(drop=True)
                .astype(str)
                .equals(dry.decisions[cols].reset_index(drop=True).astype(str))
            ), (s.decisions[cols], dry.decisions[cols])
        v = s.verify().set_index("method")
        assert bool(v["ran"].all()), v.to_string()
        wrong = set(v.index[~v["ok"].astype(bool)])
        assert wrong == _wrong_of(dry.decisions) == et.EXPECTED[name].wrong(policy), v.to_string()
    finally:
        s.close()
