"""References the user supplies to ``verify()`` (issue 10 item 2), and real loads of torch
``.pt2`` packages under every policy compared with the dry run (item 5).

A ``.pt2`` carries no eager reference: checked against references only (``oracle="reference"``)
every method is "no reference" (not run, ``ok`` missing: neither ok nor wrong) in the
verification, the comparison row, the CSV and the CLI's exit code; by default the differential
oracle checks it on inputs its generated source declares (``test_pt2_inputs.py``).  With
references (a mapping, a safetensors file per method, or the original modules and inputs) the
methods run and are judged; references that do not fit
are refused with a ToolkitError naming the method and field.  The CPU tests use the CPU
packages of ``pt2_packages.py`` and our program directories; the GPU test builds a two-model
CUDA ``.pt2`` (``pytest -m gpu``).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from pt2_packages import FORMATS, cuda_packages, modules, packages
from safetensors.torch import save_file

import toolkit
from toolkit.cli import main
from toolkit.core.errors import ReferenceDataError
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import ExitCode
from toolkit.engine.verification import NO_REFERENCE
from toolkit.reports.collision import collision_report, read_report, to_csv
from toolkit.workflows.compare import compare_policies
from toolkit.workflows.dry_run import dry_run

# the name-sharing policies: decode and prefill_again run on prefill's _tensor_constant0 (other data)
NAME_SHARING = ("name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always", "blind-share")


@pytest.fixture(scope="module")
def pt2():
    return packages()


@pytest.fixture(scope="module")
def refs():
    return modules()


@pytest.fixture(scope="module")
def eager_refs(refs):
    """{method: {"inputs", "outputs"}} computed here from the modules, independently of the toolkit."""
    out = {}
    for name, (m, args) in refs.items():
        with torch.no_grad():
            out[name] = {"inputs": list(args), "outputs": [m(*args)]}
    return out


# ------------------------------------------------------------------ no reference


def test_without_references_a_pt2_method_is_neither_ok_nor_wrong(pt2, tmp_path):
    s = toolkit.load_program(pt2["binary_blob"], "fingerprint")
    try:
        v = s.verify(oracle="reference")
        assert str(v["ok"].dtype) == "boolean"
        assert v["ok"].isna().all() and not v["ran"].any()
        assert all(r.startswith(NO_REFERENCE) for r in v["reason"])
        row = compare_policies(pt2["binary_blob"], ["fingerprint"]).frame.iloc[0]  # the differential oracle
        assert row["wrong_methods"] == [] and row["no_reference"] == []
        with_refs = compare_policies(pt2["binary_blob"], ["fingerprint", "name-only"], references=modules()).frame
        assert list(with_refs["no_reference"]) == [[], []]
        assert list(with_refs["wrong_methods"]) == [[], ["decode", "prefill_again"]]
        report = collision_report(s, v)
        assert report.wrong_methods == [] and report.unverified_methods == ["decode", "prefill", "prefill_again"]
        assert "no reference" in report.summary()
        to_csv(report, tmp_path / "r.csv")
        back = read_report(tmp_path / "r.csv")
        assert back.frame["method_ok"].isna().all()  # an empty cell: neither True nor False
        raw = pd.read_csv(tmp_path / "r.csv", dtype=str, keep_default_na=False)
        assert set(raw["method_ok"]) == {""}
    finally:
        s.close()


def test_the_cli_does_not_call_an_unverified_load_a_pass(pt2, tmp_path, capsys):
    unverified = ["report", str(pt2["binary_blob"]), "--policy", "fingerprint", "--oracle", "reference"]
    assert main(unverified) == ExitCode.NOT_VERIFIED
    out = capsys.readouterr().out.replace("\n    ", " ")
    assert ": no reference: prefill, decode, prefill_again; not checked: " in out
    files = []
    for name, (m, args) in modules().items():
        with torch.no_grad():
            out = m(*args)
        f = tmp_path / f"{name}.safetensors"
        save_file({"input.0": args[0].contiguous(), "output.0": out.contiguous()}, str(f))
        files += ["--reference", f"{name}={f}"]
    assert main(["report", str(pt2["binary_blob"]), "--policy", "fingerprint", *files]) == 0
    assert main(["report", str(pt2["binary_blob"]), "--policy", "name-only", *files]) == 1
    capsys.readouterr()
    csv = tmp_path / "c.csv"
    assert (
        main(["compare", str(pt2["binary_blob"]), "--policies", "fingerprint,name-only", *files, "--csv", str(csv)])
        == 1
    )  # name-only runs two methods wrong
    f = pd.read_csv(csv, keep_default_na=False).set_index("policy")
    assert f.loc["name-only", "wrong_methods"] == "['decode', 'prefill_again']"
    assert f.loc["fingerprint", "no_reference"] == "[]"
    assert main(["report", str(pt2["binary_blob"]), "--reference", "prefill"]) == 2
    assert "METHOD=FILE" in capsys.readouterr().err


# ------------------------------------------------------------------ supplied references


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_policy_on_a_cpu_pt2_loads_and_verifies_as_the_dry_run_predicts(pt2, refs, fmt):
    """Item 5 on the CPU: the .pt2 path under every policy, through the toolkit, against the
    dry run: the same status, stage, decisions, events of a refusal and bytes; a method
    verifies wrong exactly when the dry run says it runs on other data."""
    path = pt2[fmt]
    for policy in POLICIES:
        dry = dry_run(path, policy)
        s = toolkit.load_program(path, policy)
        try:
            assert (s.status, s.failed_stage, s.error) == (dry.status, dry.session.failed_stage, dry.session.error)
            cols = ["method", "name", "fqn", "storage_key", "decision", "reason_code", "origin"]
            assert s.decisions[cols].equals(dry.decisions[cols]), policy
            assert s.device_bytes == dry.device_bytes, policy
            if policy == "fqn-weight-cache":  # 1.5.x's exporter refuses prefill_again: nothing is loaded
                assert s.failed_stage == "export" and s.device_bytes == 0 and not s.methods
                cols = [c for c in s.events.columns if c != "time_s"]
                assert s.events[cols].equals(dry.session.events[cols])
                assert set(s.events["kind"]) == {"decided", "digest_compared", "load_failed"}
                continue
            v = s.verify(references=refs).set_index("method")
            assert v["ran"].all(), v.to_string()
            wrong = set(v.index[~v["ok"].astype(bool)])
            assert wrong == set(dry.verdict.wrong_methods), (policy, v.to_string())
            assert wrong == ({"decode", "prefill_again"} if policy in NAME_SHARING else set()), policy
        finally:
            s.close()


def test_references_in_every_form_agree(pt2, refs, eager_refs, tmp_path):
    files = {}
    for name, r in eager_refs.items():
        files[name] = tmp_path / f"{name}.safetensors"
        save_file({"input.0": r["inputs"][0].contiguous(), "output.0": r["outputs"][0].contiguous()}, str(files[name]))
    s = toolkit.load_program(pt2["pickle_weights"], "name-only")
    try:
        forms = [
            refs,
            eager_refs,
            {m: (r["inputs"], r["outputs"]) for m, r in eager_refs.items()},
            {m: str(f) for m, f in files.items()},
            files,
        ]
        frames = [s.verify(references=f) for f in forms]
        for f in frames[1:]:
            assert f.equals(frames[0])
        assert frames[0]["ok"].tolist() == [True, False, False]
        # one method given, the others have none: judged against it where given, else the differential oracle
        part = s.verify(references={"decode": eager_refs["decode"]}).set_index("method")
        assert part.loc["decode", "ok"] is not pd.NA and not bool(part.loc["decode", "ok"])
        others = part.loc[["prefill", "prefill_again"]]
        assert set(others["oracle"]) == {"unshared load, generated inputs"} and others["ok"].tolist() == [True, False]
        # a reference that is right for the method gives ok (its own outputs)
        mine = {"prefill": {"inputs": eager_refs["prefill"]["inputs"], "outputs": eager_refs["prefill"]["outputs"]}}
        assert bool(s.verify(references=mine).set_index("method").loc["prefill", "ok"])
    finally:
        s.close()


def test_a_module_reference_runs_a_copy(pt2):
    """State the module writes stays as it was: the reference is computed on a copy."""

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(1))

        def forward(self, x):
            self.n.add_(1)
            return x + self.n

    from toolkit.engine.verification.references import from_module

    c = Counter()
    r = from_module("m", c, (torch.zeros(2),))
    assert torch.equal(r.outputs[0], torch.ones(2)) and float(c.n) == 0.0


def _refused(session, references, field, match=None):
    with pytest.raises(ReferenceDataError) as ei:
        session.verify(references=references)
    assert ei.value.field == field, str(ei.value)
    if match:
        assert match in str(ei.value), str(ei.value)
    return ei.value


def test_references_that_do_not_fit_are_refused_naming_method_and_field(pt2, eager_refs, tmp_path):
    s = toolkit.load_program(pt2["binary_blob"], "fingerprint")
    x, y = eager_refs["prefill"]["inputs"][0], eager_refs["prefill"]["outputs"][0]
    try:
        _refused(s, {"encoder": {"inputs": [x], "outputs": [y]}}, "references[encoder]", "does not have")
        _refused(s, {"prefill": {"inputs": [x, x], "outputs": [y]}}, "references[prefill].inputs", "2 inputs")
        _refused(s, {"prefill": {"inputs": [x], "outputs": []}}, "references[prefill].outputs", "0 outputs")
        _refused(
            s, {"prefill": {"inputs": [x.numpy()], "outputs": [y]}}, "references[prefill].inputs[0]", "not a tensor"
        )
        _refused(s, {"prefill": {"inputs": [x], "outputs": [y], "extra": 1}}, "references[prefill]", "keys")
        _refused(s, {"prefill": 42}, "references[prefill]")
        # the compiled model's own input check (AOTInductor's check_input_N) names the field
        _refused(
            s,
            {"prefill": {"inputs": [torch.zeros(3, 16)], "outputs": [y]}},
            "references[prefill].inputs[0].shape",
            "expected: 2",
        )
        _refused(s, {"prefill": {"inputs": [x.double()], "outputs": [y]}}, "references[prefill].inputs[0].dtype")
        # outputs of another shape or dtype than the method gives are not this method's
        _refused(s, {"prefill": {"inputs": [x], "outputs": [y[:1]]}}, "references[prefill].outputs[0]")
        _refused(s, {"prefill": {"inputs": [x], "outputs": [y.double()]}}, "references[prefill].outputs[0]")
        # files
        _refused(s, {"prefill": tmp_path / "missing.safetensors"}, "references[prefill]", "not a readable file")
        bad = tmp_path / "bad.safetensors"
        save_file({"input.0": x.contiguous(), "weights": y.contiguous()}, str(bad))
        _refused(s, {"prefill": bad}, "references[prefill]", "neither input.N nor output.N")
        gap = tmp_path / "gap.safetensors"
        save_file({"input.1": x.contiguous(), "output.0": y.contiguous()}, str(gap))
        _refused(s, {"prefill": gap}, "references[prefill].inputs[0]", "input.0 is missing")
        junk = tmp_path / "junk.safetensors"
        junk.write_bytes(b"not safetensors")
        _refused(s, {"prefill": junk}, "references[prefill]", "cannot be read")
        # a module that raises
        _refused(s, {"prefill": (lambda t: t.undefined(), (x,))}, "references[prefill]", "running the module")
        _refused(s, {"prefill": (torch.nn.Identity(), [x])}, "references[prefill].inputs", "must be a tuple")
        # nothing was verified by a refused call: the session still answers its own verification
        assert set(s.verify()["oracle"]) == {"unshared load, generated inputs"}
    finally:
        s.close()
    with pytest.raises(toolkit.LoadError, match="closed"):
        s.verify(references={"prefill": {"inputs": [x], "outputs": [y]}})


def test_our_programs_take_references_and_check_them_against_their_own(built_sample):
    """A program directory has its own references: supplied ones replace them, and are checked
    against the inputs the program recorded (dtype, shape) before anything runs."""
    from toolkit.build.samples import sample_module

    program = built_sample("total_collision")
    methods = sample_module("total_collision").methods()
    s = toolkit.load_program(program, "name-only")
    try:
        own = s.verify()
        assert own["ok"].tolist() == [True, False]  # decode runs on prefill's _tensor_constant0
        supplied = s.verify(references=methods)
        assert set(supplied["oracle"]) == {"supplied reference"} and set(own["oracle"]) == {"eager reference"}
        assert supplied.drop(columns="oracle").equals(
            own.drop(columns="oracle")
        )  # the modules give the same references
        (x,) = methods["decode"][1]
        with torch.no_grad():
            y = methods["decode"][0](x)
        # decode's reference from ITS module, judged on this load: still wrong
        assert s.verify(references={"decode": {"inputs": [x], "outputs": [y]}})["ok"].tolist() == [True, False]
        # prefill judged against decode's outputs: the supplied reference wins, and it says wrong
        wrong_ref = s.verify(references={"prefill": {"inputs": [x], "outputs": [y]}})
        assert wrong_ref["ok"].tolist() == [False, False]
        _refused(s, {"decode": {"inputs": [x.double()], "outputs": [y]}}, "references[decode].inputs[0].dtype")
        _refused(s, {"decode": {"inputs": [x[..., :1]], "outputs": [y]}}, "references[decode].inputs[0].shape")
    finally:
        s.close()


def test_an_export_refusal_loads_nothing_and_the_dry_run_predicts_it_exactly(built_sample):
    """fqn-weight-cache on total_collision: 1.5.1's exporter refuses the program (byte-identical
    .so files, one key with two contents), so nothing is checked, opened or uploaded."""
    program = built_sample("total_collision")
    s = toolkit.load_program(program, "fqn-weight-cache")
    dry = dry_run(program, "fqn-weight-cache").session
    so = program.files[program.methods[0].so_file].sha256
    key = f"cuda_fqn_weight:cpu:{so}_so_blob:_tensor_constant0"
    assert s.status == "failed" and s.failed_stage == "export" and s.failed_method == "decode"
    assert s.error == (
        f"Duplicate key {key} with different data. Existing data size: 16384 bytes. New data size: 16384 bytes."
    )
    assert s.device_bytes == 0 and not s.methods and len(s.cache) == 0
    assert set(s.method_results["status"]) == {"failed"} and (s.method_results["device_bytes"] == 0).all()
    cols = [c for c in s.events.columns if c != "time_s"]
    assert s.events[cols].equals(dry.events[cols])
    assert "load_started" not in set(s.events["kind"]) and "memory_sampled" not in set(s.events["kind"])
    for table in ("decisions", "lookups", "comparisons", "memory"):
        real, pred = getattr(s, table), getattr(dry, table)
        assert real.drop(columns=[c for c in ("time_s",) if c in real]).equals(
            pred.drop(columns=[c for c in ("time_s",) if c in pred])
        ), table
    d = s.decisions.set_index("method")
    assert list(d["fqn"]) == ["_tensor_constant0", "_tensor_constant0"]  # the FQN, the key beside it
    assert list(d["storage_key"]) == [key, key]
    assert d.loc["decode", "reason_code"] == "export_refused" and d.loc["decode", "cached_method"] == "prefill"
    assert d.loc["prefill", "reason_code"] == "load_refused"
    row = compare_policies(program, ["fqn-weight-cache"]).frame.iloc[0]
    assert (row["loaded"], row["refused"], row["loaded_constants"], row["device_bytes"]) == (False, 2, 0, 0)
    # loading one method on its own is refused too: the program does not exist
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session

    one = Session(program, toolkit.get_policy("fqn-weight-cache"), resolve_devices(program, None))
    with pytest.raises(toolkit.LoadError, match="Duplicate key"):
        one.load_method("prefill")
    assert not one.methods and one.device_bytes == 0


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cuda_pt2_loads_and_verifies_under_every_policy_as_the_dry_run_predicts(fmt):
    """Two models (prefill, decode) compiled for CUDA in one .pt2, each format: loaded through
    the toolkit under every policy, verified against references computed from the modules,
    and compared with the dry run (status, decisions, bytes, which methods are wrong)."""
    path = cuda_packages()[fmt]
    refs = modules("cuda")
    program = toolkit.open_program(path)
    assert program.device == "cuda" and program.method_names == ["prefill", "decode"]
    for policy in POLICIES:
        dry = dry_run(path, policy)
        s = toolkit.load_program(path, policy)
        try:
            assert (s.status, s.failed_stage) == (dry.status, dry.session.failed_stage) == ("loaded", None), s.error
            cols = ["method", "name", "fqn", "storage_key", "decision", "reason_code", "origin"]
            assert s.decisions[cols].equals(dry.decisions[cols]), policy
            assert s.device_bytes == dry.device_bytes, policy
            v = s.verify(references=refs).set_index("method")
            assert v["ran"].all(), v.to_string()
            wrong = set(v.index[~v["ok"].astype(bool)])
            assert wrong == set(dry.verdict.wrong_methods), (policy, v.to_string())
            assert wrong == ({"decode"} if policy in NAME_SHARING else set()), (policy, v.to_string())
            assert not math.isnan(v["max_abs_err"].max())
        finally:
            s.close()


def test_an_isolated_load_carries_no_reference_and_the_export_stage(pt2, built_sample):
    """In a worker process too: a .pt2's methods are checked against the differential oracle, and
    a program 1.5.x refuses fails at stage "export" with nothing loaded."""
    iso = toolkit.load_isolated(pt2["binary_blob"], "fingerprint")
    assert iso.status == "loaded", iso.worker_log
    assert iso.verification["ok"].all() and iso.verification["ran"].all()
    assert set(iso.verification["oracle"]) == {"unshared load, generated inputs"}
    assert iso.verdict.no_reference == [] and not iso.verdict.wrong_methods and "wrong" not in iso.summary()
    refused = toolkit.load_isolated(built_sample("total_collision"), "fqn-weight-cache")
    assert (refused.status, refused.failed_stage, refused.failed_method) == ("failed", "export", "decode")
    assert refused.error.startswith("Duplicate key cuda_fqn_weight:cpu:")
    assert set(refused.decisions["decision"]) == {"refused"}


def test_reset_state_rewrites_what_changed_in_a_program_that_does_not_record_mutation(pt2, eager_refs):
    """A .pt2 (like a .pte) does not say which constants its methods write: resetting state puts
    back to its file's bytes every constant of the methods that ran whose checksum changed, each
    shared tensor once; nothing else."""
    path = pt2[FORMATS[0]]
    s = toolkit.load_program(path, "name-only")
    try:
        assert s.program.records_mutation is False
        for m in s.methods:
            s.run(m, eager_refs[m]["inputs"])
        tensors = {id(t): t for lm in s.methods.values() for t in lm.tensors.values()}
        before = {k: t.clone() for k, t in tensors.items()}
        with torch.no_grad():
            for t in tensors.values():
                t.add_(1)  # what the runs could have written
        assert s.reset_state() == len(tensors)
        assert all(torch.equal(tensors[k], before[k]) for k in tensors)
        s.run(next(iter(s.methods)), eager_refs[next(iter(s.methods))]["inputs"])
        assert s.reset_state() == 0  # these methods write nothing
    finally:
        s.close()
