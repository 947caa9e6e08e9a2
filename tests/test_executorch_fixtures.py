"""The programs exported on the H200 by executorch 1.5.1's own CUDA backend (``executorch_fixtures.py``).

CPU only: every exported fixture opens with ``toolkit.open_program`` into a model that agrees
with what the exporter recorded storing; every policy's dry run gives the decisions stated
per fixture; for a refused fixture, ``fqn-weight-cache``'s dry run of the program built from
the same modules predicts the exporter's refusal, message for message.  The script itself is
tested up to the point where CUDA is needed.  GPU loads: ``test_pte_load.py``.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from executorch_fixtures import (
    EXPECTED,
    MANIFEST,
    POLICY_NAMES,
    ROOT,
    RUN_COMMAND,
    SCRIPT,
    built_program,
    exported,
    manifest,
    present,
    refused,
    result,
    script,
    with_so_keys,
)
from safetensors.torch import load_file

import toolkit
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import Decision, ProgramFormat
from toolkit.workflows.dry_run import dry_run


def wrong_of(analysis) -> set[str]:
    d = analysis.decisions
    bad = d[(d["decision"] == Decision.SHARED) & (d["digest"] != d["cached_digest"])]
    return set(bad["method"])


def decisions_by_fqn(analysis, program) -> dict:
    """(method, FQN) -> decision (the fqn-weight-cache frame shows storage keys in ``fqn``)."""
    fqn = {(m.name, c.name): c.fqn for m in program.methods for c in m.constants}
    return {(r.method, fqn[(r.method, r.name)]): r.decision for r in analysis.decisions.itertuples()}


# ------------------------------------------------------------------ the set of fixtures


def test_the_expectations_cover_every_program_of_the_script():
    in_archive = {n: p for n, p in script().PROGRAMS.items() if n not in script().EXPORTED_ELSEWHERE_BY_1_5_1}
    assert set(EXPECTED) == set(in_archive)
    assert all((SCRIPT.parents[2] / f / "prog.pte").is_file() for f in script().EXPORTED_ELSEWHERE_BY_1_5_1.values())
    assert set(POLICY_NAMES) == set(POLICIES)
    for name, pdef in in_archive.items():
        assert EXPECTED[name].status == pdef.expect, name


def test_every_expected_fixture_is_present_once_the_manifest_is():
    listed = manifest()
    if listed is None:
        if present():
            pytest.fail(
                f"{len(present())} exported fixture folder(s) but no {MANIFEST.name}: "
                f"the script writes it at the end; run it again: {RUN_COMMAND}"
            )
        pytest.fail(
            f"the 1.5.1 exports are missing ({MANIFEST}): the repository holds them as "
            f"tests/fixtures/executorch-1.5.1-cuda-exports.tar.xz (written by {RUN_COMMAND} --pack DIR)"
        )
    missing = sorted(set(EXPECTED) - set(listed))
    assert not missing, (
        f"{MANIFEST.name} does not list {missing}: export them ({RUN_COMMAND} --only {','.join(missing)})"
    )
    absent = sorted(set(listed) - set(present()))
    assert not absent, (
        f"{MANIFEST.name} lists {absent}, but their folders (with result.json) are not there: were they committed?"
    )
    unknown = sorted(set(present()) - set(EXPECTED))
    assert not unknown, f"fixtures without stated expectations: {unknown} (add them to EXPECTED)"


# ------------------------------------------------------------------ every fixture


@pytest.mark.parametrize("name", present())
def test_result_json_says_what_was_attempted_and_what_happened(name):
    r = result(name)
    e = EXPECTED[name]
    assert r["program"] == name and r["schema"] == 1
    assert r["status"] == e.status, (r["status"], r["message"][:400])
    assert r["environment"]["executorch"] == "1.5.1" and r["environment"]["gpu"], r["environment"]
    assert r["environment"]["torch"] and r["date_utc"]
    assert r["methods"] == list(script().PROGRAMS[name].methods())
    # every file is the one the script wrote
    folder = ROOT / name
    for fname, rec in r["files"].items():
        data = (folder / fname).read_bytes()
        assert len(data) == rec["bytes"] and hashlib.sha256(data).hexdigest() == rec["sha256"], fname
    # the references are the modules' eager outputs, recomputed here; a transformers model's random
    # initialisation (seeded) may change between transformers releases: values are compared only
    # under the release that exported it
    import transformers

    refs = script().references(script().PROGRAMS[name].methods())
    same_init = (
        name not in ("bart_encoder_decoder", "llama_prefill_decode")
        or r["environment"]["transformers"] == transformers.__version__
    )
    for m, file in r["references"]["methods"].items():
        saved = load_file(str(folder / file))
        assert set(saved) == set(refs[m])
        for k, t in refs[m].items():
            assert (saved[k].shape, saved[k].dtype) == (t.shape, t.dtype), (m, k)
            if same_init:
                torch.testing.assert_close(saved[k], t, rtol=1e-5, atol=1e-5)
    rec = r["exporter_record"]
    assert rec["available"], rec["note"]
    assert set(r["processed_order"]) <= set(r["methods"]) and r["processed_order"]
    if e.status == "exported":
        assert {"prog.pte", "aoti_cuda_blob.ptd"} <= set(r["files"]) and r["message"] == ""
        assert sorted(r["processed_order"]) == sorted(r["methods"])  # every method compiled
    else:
        assert (folder / "refusal.txt").read_text() == r["message"]
        assert "prog.pte" not in r["files"]


@pytest.mark.parametrize("name", exported())
def test_an_exported_fixture_opens_and_agrees_with_what_the_exporter_stored(name):
    p = toolkit.open_program(ROOT / name)
    r = result(name)
    assert p.format is ProgramFormat.PTE and p.device == "cuda"
    assert p.method_names == list(EXPECTED[name].methods), p.method_names
    for m in p.methods:
        assert m.reference_file == f"reference_{m.name}.safetensors"
        ref = load_file(str(ROOT / name / m.reference_file))
        assert m.num_inputs == sum(k.startswith("input.") for k in ref)
        assert m.input_order is not None and sorted(m.input_order) == list(range(m.num_inputs)), m.input_order
    for rm in r["exporter_record"]["methods"]:
        m = p.method(rm["method"])
        assert m.location.so.key == rm["so_key"], m.name
        by_fqn = {c.fqn: c for c in m.constants}
        assert set(by_fqn) == {s["fqn"] for s in rm["storages"]}, m.name
        for s in rm["storages"]:
            c = by_fqn[s["fqn"]]
            assert c.storage_key == s["storage_key"], (m.name, c.fqn)
            assert list(c.shape) == s["sizes"] and list(c.strides) == s["strides"], (m.name, c.fqn)
            if c.nbytes == s["storage_nbytes"]:
                assert c.digest == s["sha256"], (m.name, c.fqn)
            assert not s["outcome"].startswith("refused"), s


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("name", exported())
def test_every_policys_dry_run_on_an_exported_fixture(name, policy):
    p = toolkit.open_program(ROOT / name)
    e = EXPECTED[name]
    a = dry_run(p, policy)
    assert a.status == "loaded", (policy, a.session.error)
    got = decisions_by_fqn(a, p)
    for key, want in e.decisions(policy).items():
        assert got.get(key) == want, (policy, key, got.get(key), want)
    assert wrong_of(a) == e.wrong(policy), policy
    if name == "llama_prefill_decode":  # every named weight of the second method is a genuine hit
        named = [c.fqn for c in p.method("prefill").constants if not c.fqn.startswith("_tensor_constant")]
        assert len(named) >= 21 and "model.model.embed_tokens.weight" in named
        assert {got[("prefill", f)] for f in named} == {"private" if policy == "no-sharing" else "shared"}, policy


@pytest.mark.parametrize("name", exported())
def test_executorchs_own_reader_gives_the_same_model(name):
    try:
        import executorch.exir._serialize._program  # noqa: F401  (the extra's reader)
    except ImportError:
        pytest.skip("the executorch extra is not installed")
    assert toolkit.open_program(ROOT / name, reader="executorch") == toolkit.open_program(ROOT / name)


def test_shared_state_keeps_one_storage_for_the_cache():
    if "shared_state" not in exported():
        pytest.skip(f"shared_state not exported yet: {RUN_COMMAND}")
    p = toolkit.open_program(ROOT / "shared_state")
    d, f = p.method("decode"), p.method("prefill")
    kv = {m.name: next(c for c in m.constants if c.fqn == "core.kv") for m in (d, f)}
    assert kv["decode"].storage_key == kv["prefill"].storage_key == "cuda_fqn_weight:cuda:core.kv"
    assert kv["decode"].offset == kv["prefill"].offset  # one .ptd entry


# ------------------------------------------------------------------ refusals: predicted by fqn-weight-cache


@pytest.mark.slow
@pytest.mark.parametrize("name", refused())
def test_fqn_weight_cache_predicts_the_exporters_refusal(name):
    """The program built from the same modules (our builder, CPU), methods in the order the
    exporter processed them, each method's .so key the exporter's (its .so was compiled for
    CUDA, ours for the CPU): the dry run under fqn-weight-cache on a CUDA device fails at
    stage "export" with exactly the exporter's message."""
    r = result(name)
    message = (ROOT / name / "refusal.txt").read_text()
    assert message.startswith("Duplicate key cuda_fqn_weight:cuda:") and " with different data." in message
    if EXPECTED[name].refusal_key is not None:
        assert message.startswith(f"Duplicate key {EXPECTED[name].refusal_key(r)} with different data.")
    keys = {m["method"]: m["so_key"] for m in r["exporter_record"]["methods"]}
    program = built_program(name, r["processed_order"])  # methods the exporter never reached left out
    assert program.method_names == r["processed_order"]
    a = dry_run(with_so_keys(program, keys), "fqn-weight-cache", device="cuda")
    assert (a.status, a.session.failed_stage) == ("failed", "export"), a.session.error
    assert a.session.error == message, (a.session.error, message)
    assert a.session.failed_method == r["processed_order"][-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", exported())
def test_fqn_weight_cache_predicts_that_the_exporter_accepts(name):
    """The other half of "exactly the refusals": every program 1.5.1 exported, built from the same
    modules with the exporter's .so keys, passes fqn-weight-cache's export check (total_collision
    among them: its two CUDA .so files differ, so its lifted constants' keys do)."""
    r = result(name)
    keys = {m["method"]: m["so_key"] for m in r["exporter_record"]["methods"]}
    program = built_program(name, r["processed_order"])
    a = dry_run(with_so_keys(program, keys), "fqn-weight-cache", device="cuda")
    assert a.status == "loaded", a.session.error
    if len(set(keys.values())) == 1 and name == "total_collision":  # one key would have been refused
        pytest.fail("total_collision's .so keys are equal: the exporter would have refused it")


@pytest.mark.slow
@pytest.mark.parametrize("name", refused())
def test_the_other_policies_on_a_refused_program(name):
    """What each revision before 1.5 would have done with the program 1.5.1 refuses (dry run of
    the program built from the same modules, all its methods)."""
    program = built_program(name)
    for policy in POLICY_NAMES:
        a = dry_run(program, policy, device="cuda")
        if policy == "fqn-weight-cache":
            assert a.status == "failed" and a.session.error.startswith("Duplicate key cuda_fqn_weight:cuda:")
            continue
        assert a.status == "loaded", (policy, a.session.error)
        assert wrong_of(a) == EXPECTED[name].wrong(policy), policy


# ------------------------------------------------------------------ the script, on the CPU


def test_the_script_writes_a_result_for_an_export_and_for_a_refusal(tmp_path):
    mef = script()

    def refuse(methods, folder, log=print):
        try:
            raise ValueError(
                "Duplicate key k with different data. Existing data size: 4 bytes. New data size: 4 bytes."
            )
        except ValueError as e:
            raise RuntimeError("lowering failed") from e

    def write(methods, folder, log=print):
        (folder / "prog.pte").write_bytes(b"pte")
        (folder / "aoti_cuda_blob.ptd").write_bytes(b"ptd")

    lines = []
    ok = mef.run_program(mef.PROGRAMS["shared_state"], tmp_path, export=write, log=lines.append)
    bad = mef.run_program(mef.PROGRAMS["three_methods"], tmp_path, export=refuse)
    assert ok["status"] == "exported" and ok["matches_expectation"]
    assert bad["status"] == "refused" and bad["matches_expectation"]
    assert bad["message"].startswith("Duplicate key k ") and [c["type"] for c in bad["exception"]["chain"]] == [
        "builtins.RuntimeError",
        "builtins.ValueError",
    ]
    assert (tmp_path / "three_methods" / "refusal.txt").read_text() == bad["message"]
    saved = json.loads((tmp_path / "shared_state" / "result.json").read_text())
    assert saved["references"]["sequences"]["generate"]["steps"] == ["prefill", "decode", "decode"]
    seq = load_file(str(tmp_path / "shared_state" / "sequence_generate.safetensors"))
    # decode after prefill reads what prefill wrote: not decode's output from the initial state
    alone = load_file(str(tmp_path / "shared_state" / "reference_decode.safetensors"))
    assert not torch.allclose(seq["step.1.output.0"], alone["output.0"])
    assert set(saved["files"]) == {
        "prog.pte",
        "aoti_cuda_blob.ptd",
        "reference_decode.safetensors",
        "reference_prefill.safetensors",
        "sequence_generate.safetensors",
    }
    assert mef.write_manifest(tmp_path) == ["shared_state", "three_methods"]
    assert (tmp_path / "MANIFEST").read_text() == "shared_state\nthree_methods\n"
    readme = (tmp_path / "README.md").read_text()
    assert (
        "| `three_methods` | encode, probe, encode_again | refused | refused |" in readme
        and "Duplicate key k " in readme
    )
    # packed as the device machine returns files: few parts, unpacked with cat | tar
    import io
    import tarfile

    parts = mef.pack(tmp_path, tmp_path.parent / f"{tmp_path.name}-out", part_bytes=2000)
    assert len(parts) > 1 and all(p.stat().st_size <= 2000 for p in parts)
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts)), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert f"{tmp_path.name}/three_methods/refusal.txt" in names and f"{tmp_path.name}/MANIFEST" in names
    # a rerun replaces what the last one wrote
    again = mef.run_program(mef.PROGRAMS["three_methods"], tmp_path, export=write)
    assert again["status"] == "exported" and not (tmp_path / "three_methods" / "refusal.txt").exists()


def test_the_script_needs_cuda_and_lists_without(capsys, monkeypatch):
    mef = script()
    assert mef.main(["--list"]) == 0
    assert "bart_encoder_decoder" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mef.main([]) == 2
    with pytest.raises(SystemExit):
        mef.main(["--only", "nope"])


def test_the_script_uses_executorchs_api_as_1_5_1_names_it():
    """The names export_methods() and ExporterRecord use exist in the executorch installed here,
    checked in a subprocess (importing executorch's CUDA backend patches Inductor for the whole
    process: our CPU builder then lays blobs out differently, measured).  Not an extra CI installs
    (the backend needs triton): there it skips, and the H200 run is the real check."""
    import subprocess
    import sys

    probe = f"""
import sys
sys.path.insert(0, {str(SCRIPT.parent)!r})
try:
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.backends.cuda import cuda_weight_collector
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
except ImportError as e:
    print("IMPORT", e)
    sys.exit(0)
spec = CudaBackend.generate_method_name_compile_spec("decode")
assert spec.key == "method_name" and spec.value == b"decode", spec
import make_executorch_fixtures as mef
rec = mef.ExporterRecord()
with rec.installed():
    assert rec.available, rec.note
    assert CudaBackend.__dict__["_preprocess_with_weight_collector"].__func__.__name__ == "pre"
    assert cuda_weight_collector.CudaWeightCollector._add_weight.__name__ == "add_weight"
preprocess = CudaBackend.__dict__["_preprocess_with_weight_collector"].__func__
assert preprocess.__name__ == "_preprocess_with_weight_collector"
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    if last.startswith("IMPORT"):
        pytest.skip(f"executorch's CUDA backend does not import here: {last[7:]}")
    assert last == "OK", out.stdout


_COLLECTOR_PROBE = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
try:
    from executorch.backends.cuda.cuda_weight_collector import (CudaWeightArtifact, CudaWeightCollector,
                                                              CudaWeightEntry, _storage_key)
    from executorch.exir._serialize._cord import FileBackedData
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import PreprocessResult
except ImportError as e:
    print(json.dumps({"import_error": str(e)}))
    sys.exit(0)
import make_executorch_fixtures as mef
methods = json.load(sys.stdin)
tmp = tempfile.mkdtemp()
collector, rec = CudaWeightCollector(), mef.ExporterRecord()
out = {"message": None}
with rec.installed():
    try:
        for m in methods:
            rec.methods.append({"method": m["name"], "so_key": None, "storages": []})
            store = NamedDataStore()
            store.add_named_data(m["so_key"], b"so", 1, None)
            entries, storages = [], {}
            for i, c in enumerate(m["constants"]):
                path = os.path.join(tmp, f"{m['name']}.{i}")
                with open(c["file"], "rb") as f:
                    f.seek(c["offset"])
                    data = f.read(c["nbytes"])
                with open(path, "wb") as f:
                    f.write(data)
                key = _storage_key(c["fqn"], 1)
                shape, strides = tuple(c["shape"]), tuple(c["strides"])
                entries.append(CudaWeightEntry(c["fqn"], key, len(data), 6, 1, 0, shape, strides))
                storages[key] = FileBackedData(path)
            result = PreprocessResult(processed_bytes=(m["so_key"] + "\n" + "w_weights_blob").encode(),
                                      debug_handle_map={}, data_store_output=store.get_named_data_store_output())
            collector.add_preprocess_result(result, CudaWeightArtifact(entries, storages), "cuda")
    except ValueError as e:
        out["message"] = str(e)
out["record"] = rec.methods
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, e in EXPECTED.items() if e.status == "refused"])
def test_executorchs_own_collector_refuses_what_fqn_weight_cache_predicts(name):
    """Without a GPU: the constants of our CPU build of the same modules, fed method by method to
    executorch 1.5.1's own CudaWeightCollector (its add_preprocess_result, as the exporter calls
    it after each method's compile, with the same .so key for every method of one graph), raise
    exactly the message fqn-weight-cache's dry run predicts.  Where the executorch extra is not
    installed (CI) this skips; the H200 export is then the check."""
    import subprocess
    import sys

    check = subprocess.run(
        [sys.executable, "-c", "import executorch.backends.cuda.cuda_weight_collector"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check.returncode != 0:  # before building anything
        pytest.skip(f"executorch's CUDA backend does not import here: {check.stderr.strip().splitlines()[-1]}")
    program = built_program(name)
    # the exporter's .so key is the sha256 of the CUDA .so; one graph, one .so: one key per distinct graph
    so_keys = {m.name: f"{program.files[m.so_file].sha256}_so_blob" for m in program.methods}
    payload = [
        {
            "name": m.name,
            "so_key": so_keys[m.name],
            "constants": [
                {
                    "fqn": c.fqn,
                    "file": str(program.path(c.file)),
                    "offset": c.offset,
                    "nbytes": c.nbytes,
                    "shape": list(c.shape),
                    "strides": list(c.strides),
                }
                for c in m.constants
            ],
        }
        for m in program.methods
    ]
    run = subprocess.run(
        [sys.executable, "-c", _COLLECTOR_PROBE, str(SCRIPT.parent)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if "import_error" in got:
        pytest.skip(f"executorch's CUDA backend does not import here: {got['import_error']}")
    a = dry_run(with_so_keys(program, so_keys), "fqn-weight-cache", device="cuda")
    assert got["message"] is not None, got["record"]
    assert (a.status, a.session.failed_stage) == ("failed", "export")
    assert a.session.error == got["message"]
    refused_at = [m["method"] for m in got["record"] if any(s["outcome"].startswith("refused") for s in m["storages"])]
    assert refused_at == [a.session.failed_method]


def test_an_export_of_some_programs_merges_into_the_committed_archive(tmp_path):
    import tarfile

    mef = script()
    root = tmp_path / "x" / "executorch-9.9-families"
    for name, status in (("kept", "exported"), ("replaced", "refused")):
        (root / name).mkdir(parents=True)
        (root / name / "result.json").write_text(json.dumps({"program": name, "status": status}))
    archive = tmp_path / "executorch-9.9-families-exports.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(root, arcname=root.name)
    fresh = tmp_path / "device" / "executorch-9.9-families"
    for name in ("replaced", "new"):
        (fresh / name).mkdir(parents=True)
        (fresh / name / "result.json").write_text(json.dumps({"program": name, "status": "exported"}))
        (fresh / name / "prog.pte").write_bytes(name.encode())
    parts = mef.pack(fresh, tmp_path / "out", part_bytes=100)  # several parts, as the device returns them
    assert len(parts) > 1
    assert mef.main(["--merge", *map(str, reversed(parts)), "--into", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "merged", filter="data")
    merged = tmp_path / "merged" / root.name
    assert (merged / "MANIFEST").read_text().split() == ["kept", "new", "replaced"]
    assert json.loads((merged / "replaced" / "result.json").read_text())["status"] == "exported"
    assert (merged / "new" / "prog.pte").read_bytes() == b"new" and not (merged / "kept" / "prog.pte").exists()
    assert "`replaced`" in (merged / "README.md").read_text() and not list(tmp_path.glob("*.part"))
    other = tmp_path / "device2" / "executorch-9.9-cuda"
    (other / "p").mkdir(parents=True)
    (other / "p" / "result.json").write_text("{}")
    with pytest.raises(SystemExit, match="the parts hold executorch-9.9-cuda/"):
        mef.merge_into(archive, mef.pack(other, tmp_path / "out2"))
