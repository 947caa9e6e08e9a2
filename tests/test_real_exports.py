"""Issue 26: real exports of payload generation 1 and of the model families users ship.

* ``fixtures/executorch-1.2.0-cuda-exports.tar.xz``: the programs of ``make_executorch_fixtures.py``
  exported by executorch 1.2.0's CUDA backend on the H200 (payload generation 1: ``<method>_so_blob`` /
  ``<method>_weights_blob``, the constant table only inside each ``.so``; ``constant_table.json`` is
  what each ``.so`` declared through its own container API, recorded at export);
* ``fixtures/executorch-1.5.1-families-exports.tar.xz``: ``model_families.py`` (Whisper with its
  caches, T5 with its tied ``shared``, a Llama with ``lm_head`` tied, torchao int8 weights) exported
  by executorch 1.5.1 on the H200, and a GPT-2 with ``lm_head`` tied and a vision tower beside a text
  decoder exported by 1.5.1 on an H100 (2026-12-06, loaded there: ``LATER_FAMILIES_MEASURED``);
* ``fixtures/executorch-1.2.0-families-exports.tar.xz``: the families exported by executorch 1.2.0
  (2026-12-05), among them a speculative-decoding target and its draft head, whose own layer has the
  target's first layer's names.

``benchmarks/results/executorch_programs/2026-12-01-h200-generations.csv`` is what loading each of them
under every policy on the H200 measured (``tests/fixtures/export_generations_on_device.sh``); the
CPU tests check that today's dry run predicts it, the GPU tests measure it again.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import executorch_fixtures as et
import pandas as pd
import pytest

import toolkit
from toolkit.core.policies import POLICIES

REPO = Path(__file__).resolve().parents[1]
GEN1 = et.unpacked("1.2.0")
FAMILIES = et.unpacked("1.5.1", "families")
MEASURED = REPO / "benchmarks" / "results" / "executorch_programs" / "2026-12-01-h200-generations.csv"
GEN1_PROGRAMS = (
    "bart_encoder_decoder",
    "llama_prefill_decode",
    "mutated_buffer",
    "no_constants",
    "shared_ok",
    "shared_state",
    "three_methods",
    "three_shared",
    "total_collision",
)
FAMILY_PROGRAMS = ("int8_weights", "llama_tied_head", "t5_tied", "whisper_cached")
# merged into the same archive later: exported by 1.5.1 on an H100 (2026-12-06) and loaded there
LATER_FAMILY_PROGRAMS = ("gpt2_tied", "vision_text")
LATER_FAMILIES_MEASURED = (
    REPO / "benchmarks" / "results" / "executorch_programs" / "2026-12-06-h100-80gb-hbm3-1.5.1-families.csv"
)
FOLDERS = [GEN1 / n for n in GEN1_PROGRAMS] + [FAMILIES / n for n in FAMILY_PROGRAMS]
# the families as executorch 1.2.0 exported them (2026-12-05): what its exporter did with each
GEN1_FAMILIES = et.unpacked("1.2.0", "families")
GEN1_FAMILY_EXPORTS = {
    "draft_head": "exported",
    "gpt2_tied": "missing fallback kernels (1 total): - aten::split_copy.Tensor",
    "llama_tied_head": "exported",
    "t5_tied": "exported",
    "vision_text": "was tagged to be consumed by the buffer, and was found to also contain a buffer mutation",
    "whisper_cached": "is neither a buffer nor a user input",
}
MEASURED_AT = {  # the H200 run that loaded each export set under every policy
    GEN1: MEASURED,
    FAMILIES: MEASURED,
    GEN1_FAMILIES: REPO / "benchmarks" / "results" / "executorch_programs" / "2026-12-05-h200-1.2.0-families.csv",
}
LATER_FAMILY_FOLDERS = [FAMILIES / n for n in LATER_FAMILY_PROGRAMS]
LATER_FOLDERS = [
    GEN1_FAMILIES / n for n, how in GEN1_FAMILY_EXPORTS.items() if how == "exported"
] + LATER_FAMILY_FOLDERS


def measured_at(folder: Path) -> Path:
    """The GPU run that loaded ``folder``'s export under every policy."""
    if folder.parent == FAMILIES and folder.name in LATER_FAMILY_PROGRAMS:
        return LATER_FAMILIES_MEASURED
    return MEASURED_AT[folder.parent]


def _benchmark(name: str):
    """A script of benchmarks/ as a module (they import their siblings by name)."""
    import importlib

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def _rows_module():
    return _benchmark("executorch_programs")


def _result(folder: Path) -> dict:
    return json.loads((folder / "result.json").read_text())


def _open(folder: Path):
    table = folder / "constant_table.json"
    return toolkit.open_program(
        folder / "prog.pte", constant_table=json.loads(table.read_text()) if table.is_file() else None
    )


def _slots(folder: Path) -> dict[str, list[dict]]:
    return _result(folder)["aoti"]["so_constants"]


def test_every_program_was_exported_and_is_listed():
    assert (GEN1 / "MANIFEST").read_text().split() == list(GEN1_PROGRAMS)
    assert (FAMILIES / "MANIFEST").read_text().split() == sorted(FAMILY_PROGRAMS + LATER_FAMILY_PROGRAMS)
    for folder in FOLDERS + LATER_FAMILY_FOLDERS:
        r = _result(folder)
        assert r["status"] == "exported", (folder.name, r.get("message"))
        assert (folder / "prog.pte").is_file() and (folder / "aoti_cuda_blob.ptd").is_file()
        gpu = "H100" if folder.name in LATER_FAMILY_PROGRAMS else "H200"
        assert r["environment"]["gpu"] and gpu in r["environment"]["gpu"], (folder.name, r["environment"]["gpu"])
    # 1.2.0 keys everything by method name: the programs 1.5.1 refuses ("Duplicate key ...") export
    assert {_result(GEN1 / n)["environment"]["executorch"] for n in GEN1_PROGRAMS} == {"1.2.0"}
    assert {_result(FAMILIES / n)["environment"]["executorch"] for n in FAMILY_PROGRAMS + LATER_FAMILY_PROGRAMS} == {
        "1.5.1"
    }


@pytest.mark.parametrize("name", GEN1_PROGRAMS)
def test_a_generation_1_export_opens_with_the_constant_table_its_so_declares(name):
    folder = GEN1 / name
    program = _open(folder)
    slots = _slots(folder)
    for m in program.methods:
        assert m.location.so.key == f"{m.name}_so_blob" and m.location.weights.key == f"{m.name}_weights_blob"
        declared = [s for s in slots[f"{m.name}_so_blob"] if not s["folded"]]
        assert [(c.name, c.fqn, c.dtype) for c in m.constants] == [(s["name"], s["fqn"], s["dtype"]) for s in declared]
    assert _result(folder)["constant_table_problems"] == {}


def test_without_its_constant_table_a_generation_1_export_says_what_is_missing(tmp_path):
    import shutil

    bare = shutil.copytree(GEN1 / "shared_state", tmp_path / "shared_state")
    (bare / "constant_table.json").unlink()  # (read from beside the .pte by default)
    with pytest.raises(toolkit.core.errors.ProgramError, match="constant_table"):
        toolkit.open_program(bare / "prog.pte")


def test_no_so_declares_an_empty_or_a_repeated_fqn_and_tied_weights_are_one_slot():
    """What AOTInductor reports as original FQNs in these real exports (issue 23 asks)."""
    for folder in FOLDERS:
        for key, slots in _slots(folder).items():
            fqns = [s["fqn"] for s in slots]
            assert "" not in fqns, (folder.name, key)
            assert not [f for f, n in collections.Counter(fqns).items() if n > 1], (folder.name, key)
            assert not any(s["folded"] for s in slots), (folder.name, key)
    # a tied tensor is one slot under ONE of its FQNs: torch.export lists every alias, AOTI keeps
    # lm_head.weight (T5: also in the encoder, which reads it as its embed_tokens)
    t5 = _result(FAMILIES / "t5_tied")
    assert {"model.shared.weight", "model.encoder.embed_tokens.weight", "model.lm_head.weight"} <= set(
        t5["aoti"]["export_constants"]["encoder"]
    )
    for slots in t5["aoti"]["so_constants"].values():
        tied = [
            s["fqn"] for s in slots if s["fqn"].endswith(("shared.weight", "embed_tokens.weight", "lm_head.weight"))
        ]
        assert tied == ["model.lm_head.weight"]
    for slots in _slots(FAMILIES / "llama_tied_head").values():
        assert "model.lm_head.weight" in [s["fqn"] for s in slots]
        assert not [s for s in slots if "embed_tokens" in s["fqn"]]
    # torchao's int8 weights: the subclass is flattened into two named slots per weight
    for slots in _slots(FAMILIES / "int8_weights").values():
        assert {(s["fqn"], s["dtype"]) for s in slots} >= {
            ("up.parametrizations.weight.original0", "int8"),
            ("up.parametrizations.weight.original1", "float32"),
        }


def test_the_whisper_caches_are_written_by_one_method_and_read_by_two():
    program = _open(FAMILIES / "whisper_cached")
    by_method = {m.name: {c.fqn: c for c in m.constants} for m in program.methods}
    for method in ("encode", "prefill", "decode"):
        assert {"cache.cross_k", "cache.cross_v"} <= set(by_method[method])
    assert "cache.self_k" in by_method["prefill"] and "cache.self_k" in by_method["decode"]
    assert "cache.self_k" not in by_method["encode"]
    assert [q.name for q in program.sequences] == ["transcribe"]


def _measured() -> pd.DataFrame:
    return pd.read_csv(MEASURED, keep_default_na=False)


def test_the_dry_run_predicts_what_the_h200_measured():
    rows = _rows_module()
    measured = _measured()
    assert set(measured["program"]) == set(GEN1_PROGRAMS + FAMILY_PROGRAMS)
    for folder in FOLDERS:
        for dry in rows.program_rows(folder, list(POLICIES), None):
            got = measured[(measured["program"] == folder.name) & (measured["policy"] == dry["policy"])]
            if got.empty or got.iloc[0]["status"] == "script error":  # (total_collision: see the closing note)
                continue
            row = got.iloc[0]
            assert dry["dry_status"] == row["status"], (folder.name, dry["policy"])
            if row["status"] == "loaded":
                assert dry["predicted_wrong"] == row["wrong_alone"], (folder.name, dry["policy"])
            assert str(row["decisions_match"]) == "True", (folder.name, dry["policy"])


def test_what_sharing_does_to_each_family_on_the_h200():
    """The recorded table, stated from what the modules are."""
    m = _measured().set_index(["program", "policy"])
    for policy in POLICIES:
        # genuinely shared weights (one model in every method): nothing runs on other data
        for name in FAMILY_PROGRAMS:
            assert m.loc[(name, policy), "wrong_alone"] == "-"
        # the Whisper caches must be shared to transcribe: only no-sharing splits them
        seq = m.loc[("whisper_cached", policy), "sequences"]
        assert seq == ("transcribe: wrong from step 1" if policy == "no-sharing" else "transcribe: ok"), policy
    # generation 1 records no storage key, so nothing in the file says whether a buffer both
    # methods name is one state or two: fingerprint and content-dedup never share a buffer a method
    # writes without provenance (right for mutated_buffer's two independent kv, wrong for
    # shared_state's one KV-like cache), the name-sharing policies always do (the reverse)
    for policy in ("fingerprint", "content-dedup"):
        assert m.loc[("mutated_buffer", policy), "sequences"] == "generate: ok"
        assert m.loc[("shared_state", policy), "sequences"] == "generate: wrong from step 1"
    for policy in ("name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always", "blind-share"):
        assert m.loc[("mutated_buffer", policy), "sequences"] == "generate: wrong from step 1"
        assert m.loc[("shared_state", policy), "sequences"] == "generate: ok"
    assert m.loc[("bart_encoder_decoder", "name-only"), "wrong_alone"] == "encoder"
    assert m.loc[("three_methods", "name-only"), "wrong_alone"] == "probe"


def test_executorch_1_2_0_exported_the_families_it_could_and_said_why_not_for_the_others():
    assert (GEN1_FAMILIES / "MANIFEST").read_text().split() == sorted(GEN1_FAMILY_EXPORTS)
    for name, how in GEN1_FAMILY_EXPORTS.items():
        r = _result(GEN1_FAMILIES / name)
        assert r["environment"]["executorch"] == "1.2.0" and "H200" in r["environment"]["gpu"]
        if how == "exported":
            assert r["status"] == "exported" and (GEN1_FAMILIES / name / "prog.pte").is_file(), name
        else:  # the exporter's own message, verbatim
            assert r["status"] == "refused" and how in " ".join(r["message"].split()), name
            assert (GEN1_FAMILIES / name / "refusal.txt").is_file() and not (GEN1_FAMILIES / name / "prog.pte").exists()


@pytest.mark.parametrize("folder", sorted(GEN1_FAMILIES / n for n in GEN1_FAMILY_EXPORTS), ids=lambda f: f.name)
def test_the_dry_run_predicts_what_the_h200_measured_of_the_1_2_0_families(folder):
    measured = pd.read_csv(MEASURED_AT[GEN1_FAMILIES], keep_default_na=False)
    for dry in _rows_module().program_rows(folder, list(POLICIES), None):
        row = measured[(measured["program"] == folder.name) & (measured["policy"] == dry["policy"])].iloc[0]
        assert dry["exporter"] == row["exporter"], dry["policy"]
        if row["exporter"] == "refused":
            continue
        assert dry["dry_status"] == row["status"], (folder.name, dry["policy"])
        assert str(row["decisions_match"]) == "True", (folder.name, dry["policy"])
        if row["status"] == "loaded":
            # the references and the differential oracle agree, and the dry run named the same methods
            assert dry["predicted_wrong"] == row["wrong_alone"] == row["oracle_wrong"], (folder.name, dry["policy"])


def test_a_draft_head_named_like_its_target_is_run_on_the_targets_weights_by_a_name_keyed_cache():
    """EAGLE-style: the draft's own decoder layer is ``model.layers.0.*``, as is the target's first."""
    m = pd.read_csv(MEASURED_AT[GEN1_FAMILIES], keep_default_na=False)
    m = m[m["program"] == "draft_head"].set_index("policy")
    for policy in ("name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always", "blind-share"):
        assert m.loc[policy, "wrong_alone"] == "target", policy  # same shapes: no metadata check catches it
    for policy in ("no-sharing", "fingerprint", "content-dedup"):
        assert m.loc[policy, "wrong_alone"] == "-", policy
    # 1.5.x keys the weights by FQN and refuses the second content: the load fails as its exporter does
    assert m.loc["fqn-weight-cache", "status"] == "failed"
    assert "Duplicate key cuda_fqn_weight:cuda:model.layers.0." in m.loc["fqn-weight-cache", "error"]
    program = _open(GEN1_FAMILIES / "draft_head")
    fqns = {mm.name: {c.fqn for c in mm.constants} for mm in program.methods}
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.up_proj.weight"} <= (
        fqns["target"] & fqns["draft"]
    )


@pytest.mark.parametrize("name", LATER_FAMILY_PROGRAMS)
def test_the_dry_run_predicts_what_the_h100_measured_of_the_later_1_5_1_families(name):
    measured = pd.read_csv(LATER_FAMILIES_MEASURED, keep_default_na=False)
    dry_rows = _rows_module().program_rows(FAMILIES / name, list(POLICIES), None)
    assert {d["policy"] for d in dry_rows} == set(measured[measured["program"] == name]["policy"]) == set(POLICIES)
    for dry in dry_rows:
        row = measured[(measured["program"] == name) & (measured["policy"] == dry["policy"])].iloc[0]
        assert (dry["exporter"], dry["dry_status"]) == (row["exporter"], row["status"]) == ("exported", "loaded")
        assert str(row["decisions_match"]) == "True", (name, dry["policy"])
        assert dry["predicted_wrong"] == row["wrong_alone"] == "-", (name, dry["policy"])


def test_what_sharing_does_to_a_tied_gpt2_and_to_an_image_encoder_beside_its_decoder():
    """``gpt2_tied``'s methods hold one model: sharing halves its bytes and changes nothing else.
    ``vision_text``'s ``encode_image`` writes the image tokens ``prefill`` reads: they must be shared."""
    m = pd.read_csv(LATER_FAMILIES_MEASURED, keep_default_na=False).set_index(["program", "policy"])
    unshared = m.loc[("gpt2_tied", "no-sharing"), "device_bytes"]
    for policy in POLICIES:
        assert m.loc[("gpt2_tied", policy), "device_bytes"] in (unshared, unshared // 2), policy
        caption = m.loc[("vision_text", policy), "sequences"]
        assert caption == ("caption: wrong from step 1" if policy == "no-sharing" else "caption: ok"), policy
    assert m.loc[("gpt2_tied", "fingerprint"), "device_bytes"] == unshared // 2
    program = _open(FAMILIES / "gpt2_tied")
    assert {c.fqn for c in program.methods[0].constants} == {c.fqn for c in program.methods[1].constants}


@pytest.mark.gpu
@pytest.mark.parametrize("folder", FOLDERS + LATER_FOLDERS, ids=lambda f: f"{f.parent.name}/{f.name}")
def test_every_export_loads_on_the_gpu_under_every_policy_as_its_dry_run_predicts(folder):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rows = _rows_module()
    measured = pd.read_csv(measured_at(folder), keep_default_na=False)
    for row in rows.program_rows(folder, list(POLICIES), "cuda"):
        assert row["status"] == row["dry_status"], (row["policy"], row["error"])
        assert row["decisions_match"] is True, row["policy"]
        if row["status"] == "loaded":
            assert row["wrong_alone"] == row["predicted_wrong"], row["policy"]
        before = measured[(measured["program"] == folder.name) & (measured["policy"] == row["policy"])]
        if len(before) and before.iloc[0]["status"] == "loaded":
            assert (row["wrong_alone"], row["sequences"]) == (
                before.iloc[0]["wrong_alone"],
                before.iloc[0]["sequences"],
            ), row["policy"]


def test_the_real_exports_page_holds_the_table_of_the_h200_runs():
    table = _benchmark("reports.real_exports_table").table()
    assert "`whisper_cached`" in table and "executorch 1.2.0 (generation 1)" in table
    assert table in (REPO / "docs" / "real-exports.md").read_text()
