"""Every bad input the issue names gives a toolkit error that names the file and field.

All cases mutate a *copy* of one built sample; nothing is compiled here.  The helpers at
the top (``clone``, ``edit_manifest``, ``refresh_digests``) are reused by the other
reliability tests (test_integrity, test_isolation, test_fuzz).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from toolkit.core import events as ev
from toolkit.core.errors import (
    IncompatibleProgramError,
    IntegrityError,
    LoadError,
    ManifestError,
    ProgramError,
    ToolkitError,
)
from toolkit.core.policies import get_policy
from toolkit.engine.devices import resolve_devices
from toolkit.engine.session import Session, load_program
from toolkit.integrity import check_files, file_record
from toolkit.sources import open_program
from toolkit.sources.directory import MANIFEST_FILE


def check_program_files(program) -> None:
    check_files(program.root, program.files, program.files)


SAMPLE = "total_collision"  # two methods (prefill, decode), one 64x64 constant each


# ----------------------------------------------------------------------------- helpers


def clone(program, dst: Path) -> Path:
    """A private copy of a built program directory, to mutate."""
    shutil.copytree(program.root, dst)
    return dst


def read_json(root: Path) -> dict:
    return json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))


def write_json(root: Path, data) -> None:
    (root / MANIFEST_FILE).write_text(json.dumps(data), encoding="utf-8")


def edit_manifest(root: Path, fn: Callable[[dict], object]) -> Path:
    data = read_json(root)
    fn(data)
    write_json(root, data)
    return root


def refresh_digests(root: Path) -> Path:
    """Rewrite the manifest's file records (and blob sizes) to match the files on disk.

    This is what someone who tampers *consistently* does; integrity checking cannot catch
    it, since the manifest is the root of trust (hence isolation mode).
    """
    data = read_json(root)
    for rel, rec in data["files"].items():
        p = root / rel
        for kind in ("sha256", "blake3"):  # the piece digests of format 3 or 4, as the record has them
            if f"{kind}_chunks" in rec:
                new = file_record(p, digest=kind)
                rec["chunk_bytes"], rec[f"{kind}_chunks"] = new.chunk_bytes, list(new.chunks)
        new = file_record(p)
        rec["sha256"], rec["bytes"] = new.sha256, new.bytes
    for m in data["methods"]:
        m["blob_bytes"] = data["files"][m["blob_file"]]["bytes"]
    write_json(root, data)
    return root


def cache_state(cache) -> dict:
    """Everything observable about a cache, by identity: to prove it is exactly as before."""
    return {
        e.fqn: (
            id(e),
            e.owner_method,
            e.name,
            frozenset(e.users),
            id(e.tensor),
            id(e.keepalive),
            id(cache.find_content(e.digest, e.meta)),
        )
        for e in cache
    }


@pytest.fixture(scope="module")
def base(built_sample):
    return built_sample(SAMPLE)


@pytest.fixture
def prog(base, tmp_path) -> Path:
    return clone(base, tmp_path / "prog")


def manifest_error(root: Path) -> ManifestError:
    with pytest.raises(ManifestError) as ei:
        open_program(root)
    assert str(root / MANIFEST_FILE) in str(ei.value)
    return ei.value


# ----------------------------------------------------------------------- the manifest


def test_missing_program_directory(tmp_path):
    with pytest.raises(ProgramError, match="does not exist"):
        open_program(tmp_path / "nowhere")


def test_missing_manifest(prog):
    (prog / MANIFEST_FILE).unlink()
    with pytest.raises(ManifestError, match="manifest is missing") as ei:
        open_program(prog)
    assert ei.value.path == str(prog / MANIFEST_FILE)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        '{"format": "constshare-program", ',
        "[" * 100_000,  # nesting deeper than the JSON decoder's recursion limit
        '{"format_version": ' + "9" * 5000 + "}",  # an integer longer than Python converts
    ],
    ids=["syntax", "empty", "truncated", "deeply-nested", "huge-integer"],
)
def test_malformed_manifest_text(prog, text):
    (prog / MANIFEST_FILE).write_text(text, encoding="utf-8")
    err = manifest_error(prog)
    assert "not valid JSON" in str(err)


def test_manifest_not_utf8(prog):
    (prog / MANIFEST_FILE).write_bytes(b"\xff\xfe\x00garbage")
    assert "not valid JSON" in str(manifest_error(prog))


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.clear(), "format"),
        (lambda d: d.update(format="something-else"), "format"),
        (lambda d: d.update(format_version=5), "format_version"),
        (lambda d: d.update(format_version="1"), "format_version"),
        (lambda d: d.pop("methods"), "methods"),
        (lambda d: d.update(methods=[]), "methods"),
        (lambda d: d.update(device="tpu"), "device"),
        (lambda d: d.update(torch_version=""), "torch_version"),
        (lambda d: d.pop("files"), "files"),
        (lambda d: d["files"].pop("methods/decode/weights.blob"), "files"),
    ],
    ids=[
        "empty-object",
        "format",
        "unknown-version",
        "version-type",
        "no-methods",
        "empty-methods",
        "device",
        "torch-version",
        "no-files",
        "no-file-record",
    ],
)
def test_manifest_top_level_fields(prog, mutate, field):
    edit_manifest(prog, mutate)
    err = manifest_error(prog)
    assert err.field == field, err


def test_unknown_format_version_says_which_versions_are_read(prog):
    edit_manifest(prog, lambda d: d.update(format_version=99))
    err = manifest_error(prog)
    assert "unknown format version 99" in str(err) and "version 1" in str(err)


def test_top_level_not_an_object(prog):
    write_json(prog, [1, 2, 3])
    assert manifest_error(prog).field == "(top level)"


def _const(d, i=0, j=0) -> dict:
    return d["methods"][i]["constants"][j]


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: _const(d).update(offset=16), "methods[0].constants[0].offset"),  # [16, 16400) of a 16384-byte blob
        (lambda d: _const(d).update(offset=-1), "methods[0].constants[0].offset"),
        (lambda d: _const(d).update(dtype="float33"), "methods[0].constants[0].dtype"),
        (lambda d: _const(d).update(dtype=7), "methods[0].constants[0].dtype"),
        (lambda d: _const(d).update(shape=["64", 64]), "methods[0].constants[0].shape"),
        (lambda d: _const(d).update(shape=[64, -64]), "methods[0].constants[0].shape"),
        (lambda d: _const(d).update(shape=[1 << 30, 1 << 30]), "methods[0].constants[0].shape"),
        (lambda d: _const(d).update(shape=[1] * 65, strides=[1] * 65), "methods[0].constants[0].shape"),
        (lambda d: _const(d).update(strides=[64, 1.5]), "methods[0].constants[0].strides"),
        (lambda d: _const(d).update(strides=[1]), "methods[0].constants[0].strides"),
        (lambda d: _const(d).update(strides=[64, -1]), "methods[0].constants[0].strides"),
        (lambda d: _const(d).update(strides=[128, 1]), "methods[0].constants[0].nbytes"),  # layout needs more bytes
        (lambda d: _const(d).update(nbytes=4), "methods[0].constants[0].nbytes"),
        (lambda d: _const(d).update(kind="weight"), "methods[0].constants[0].kind"),
        (lambda d: _const(d).update(mutated="no"), "methods[0].constants[0].mutated"),
        (lambda d: _const(d).update(digest="abc"), "methods[0].constants[0].digest"),
        (lambda d: _const(d).pop("fqn"), "methods[0].constants[0].fqn"),
        (lambda d: d["methods"][0]["constants"].append(dict(_const(d))), "methods[0].constants[1].name"),
        # a wrong blob_bytes is blamed on itself (it disagrees with the file record), not on a constant
        (lambda d: d["methods"][1].update(blob_bytes=16000), "methods[decode].blob_bytes"),
        (
            lambda d: (
                d["methods"][1].update(blob_bytes=16000),
                d["files"]["methods/decode/weights.blob"].update(bytes=16000),
            ),
            "methods[1].constants[0].offset",
        ),
        (lambda d: d["methods"][1].update(blob_bytes=20000), "methods[decode].blob_bytes"),
        (lambda d: d["methods"][0].update(num_inputs=-1), "methods[0].num_inputs"),
        (lambda d: d["methods"][0].update(constants={}), "methods[0].constants"),
    ],
    ids=[
        "offset-outside-blob",
        "negative-offset",
        "unknown-dtype",
        "dtype-type",
        "shape-string",
        "shape-negative",
        "shape-implausible",
        "rank-implausible",
        "stride-float",
        "strides-rank",
        "stride-negative",
        "strides-need-more-bytes",
        "nbytes",
        "kind",
        "mutated",
        "digest",
        "no-fqn",
        "duplicate-constant",
        "blob-bytes-vs-record-first",
        "blob-smaller-than-constants",
        "blob-bytes-vs-record",
        "num-inputs",
        "constants-type",
    ],
)
def test_manifest_constant_fields(prog, mutate, field):
    edit_manifest(prog, mutate)
    err = manifest_error(prog)
    assert err.field == field, err


@pytest.mark.parametrize(
    "name",
    [
        "../evil",
        "..",
        "a/b",
        "a\\b",
        "/abs",
        "",
        "decode\x00",
        "x" * 200,
        "méthode",
        ".hidden",
    ],
)
def test_method_names_that_could_escape_the_program_directory(prog, name):
    edit_manifest(prog, lambda d: d["methods"][1].update(name=name))
    err = manifest_error(prog)
    assert err.field == "methods[1].name"
    assert "not a plain identifier" in str(err)


@pytest.mark.parametrize(
    "key, value",
    [
        ("so_file", "../../../../etc/passwd"),
        ("blob_file", "/etc/passwd"),
        ("reference_file", "methods/../../outside"),
        ("so_file", "methods\\decode\\model.so"),
        ("so_file", ""),
    ],
)
def test_file_paths_that_escape_the_program_directory(prog, key, value):
    edit_manifest(prog, lambda d: d["methods"][1].update({key: value}))
    err = manifest_error(prog)
    assert err.field == f"methods[1].{key}"


def test_file_record_outside_the_program_directory(prog):
    edit_manifest(prog, lambda d: d["files"].update({"../x": {"sha256": "0" * 64, "bytes": 1}}))
    assert manifest_error(prog).field == "files['../x']"


def test_duplicate_method_names(prog):
    edit_manifest(prog, lambda d: d["methods"][1].update(name="prefill"))
    err = manifest_error(prog)
    assert err.field == "methods[1].name" and "duplicate method name 'prefill'" in str(err)


def test_file_name_too_long_is_a_program_error(prog):
    """An over-long name makes the OS raise ENAMETOOLONG, not 'no such file'."""
    long = "methods/" + "x" * 300 + ".so"

    def mutate(d):
        d["methods"][1]["so_file"] = long
        d["files"][long] = d["files"].pop("methods/decode/model.so")

    edit_manifest(prog, mutate)
    with pytest.raises(ProgramError) as ei:
        open_program(prog)
    assert "x" * 300 in str(ei.value)


# ------------------------------------------------------------------------ the files


@pytest.mark.parametrize(
    "rel", ["methods/decode/model.so", "methods/prefill/weights.blob", "methods/decode/reference.safetensors"]
)
def test_missing_file(prog, rel):
    (prog / rel).unlink()
    with pytest.raises(ProgramError, match="missing") as ei:
        open_program(prog)
    assert ei.value.path == str(prog / rel)


@pytest.mark.parametrize(
    "change, word",
    [(lambda b: b[:-1], "truncated"), (lambda b: b[:100], "truncated"), (lambda b: b + b"\0", "oversized")],
)
def test_truncated_or_oversized_blob(prog, change, word):
    blob = prog / "methods/decode/weights.blob"
    blob.write_bytes(change(blob.read_bytes()))
    program = open_program(prog)  # sizes are checked right before loading, with the digests
    with pytest.raises(IntegrityError, match=word) as ei:
        check_program_files(program)
    assert ei.value.path == str(blob)
    s = load_program(program, "fingerprint")
    assert s.status == "failed" and s.failed_method == "decode"
    assert word in s.error and str(blob) in s.error
    assert not s.methods, "no method may load from a program with a damaged file"


def test_unreadable_file_is_an_integrity_error(prog):
    """A file that exists but cannot be read (here: a directory in its place)."""
    blob = prog / "methods/decode/weights.blob"
    program = open_program(prog)
    blob.unlink()
    blob.mkdir()
    with pytest.raises(IntegrityError) as ei:
        check_program_files(program)
    assert ei.value.path == str(blob)


# ------------------------------------------------------------- device, torch, reference


def test_program_for_another_device_kind(prog):
    edit_manifest(prog, lambda d: d.update(device="cuda"))
    with pytest.raises(IncompatibleProgramError, match="built for 'cuda'") as ei:
        load_program(prog, "fingerprint", device="cpu")
    assert ei.value.field == "device" and ei.value.path.endswith(MANIFEST_FILE)


@pytest.mark.parametrize("version", ["1.13.1", "2.0.0+cu118", "99.1", "not-a-version"])
def test_program_for_an_incompatible_torch_version(prog, version):
    edit_manifest(prog, lambda d: d.update(torch_version=version))
    with pytest.raises(IncompatibleProgramError, match="rebuild it") as ei:
        load_program(prog, "fingerprint")
    assert ei.value.field == "torch_version"


def test_same_torch_release_other_build_is_compatible(prog):
    major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    edit_manifest(prog, lambda d: d.update(torch_version=f"{major_minor}.99+local"))
    assert load_program(prog, "fingerprint").status == "loaded"


def test_reference_tensors_missing(prog):
    ref = prog / "methods/decode/reference.safetensors"
    tensors = load_file(str(ref))
    del tensors["output.0"]
    save_file(tensors, str(ref))
    refresh_digests(prog)
    s = load_program(prog, "fingerprint")
    assert s.status == "loaded"
    with pytest.raises(ProgramError, match="'output.0' is missing") as ei:
        s.reference("decode")
    assert ei.value.path == str(ref)
    v = s.verify().set_index("method")
    assert bool(v.loc["prefill", "ok"]) and not bool(v.loc["decode", "ok"])
    assert "'output.0' is missing" in v.loc["decode", "reason"]


def test_reference_file_not_safetensors(prog):
    ref = prog / "methods/prefill/reference.safetensors"
    ref.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    refresh_digests(prog)
    s = load_program(prog, "fingerprint")
    with pytest.raises(ProgramError, match="cannot be read") as ei:
        s.reference("prefill")
    assert ei.value.path == str(ref)
    assert "cannot be read" in s.verify().set_index("method").loc["prefill", "reason"]


def test_so_that_disagrees_with_the_manifest(prog):
    """The manifest names a constant the .so does not have: refused after opening, cache untouched."""
    edit_manifest(prog, lambda d: _const(d, 1).update(fqn="layers.0.weight"))
    s = load_program(prog, "fingerprint")
    assert s.status == "failed" and s.failed_method == "decode"
    assert "layers.0.weight" in s.error and "manifest" in s.error
    assert {e.owner_method for e in s.cache} <= {"prefill"}


# -------------------------------------------------- a failed method leaves the cache as it was


def _session(program, policy: str) -> Session:
    return Session(program, get_policy(policy), resolve_devices(program, None))


@pytest.mark.parametrize(
    "policy", ["name-only", "decline-on-mismatch", "verify-always", "fingerprint", "content-dedup", "no-sharing"]
)
def test_failed_method_load_leaves_the_cache_exactly_as_before(base, policy):
    """The failure is injected at the very last step of decode's load, after its cache
    entries were added and its shares recorded: everything must be rolled back."""
    s = _session(base, policy)
    s.load_method("prefill")
    before = cache_state(s.cache)
    real_record = s.log.record

    def failing_record(event_type, method, **payload):
        real_record(event_type, method, **payload)
        if event_type is ev.MethodLoaded and method == "decode":
            raise RuntimeError("injected failure after the cache was updated")

    s.log.record = failing_record
    with pytest.raises(LoadError, match="injected failure") as ei:
        s.load_method("decode")
    assert "decode" in str(ei.value)
    assert cache_state(s.cache) == before
    assert list(s.methods) == ["prefill"]
    failed = [e for e in s.log if e.kind is ev.EventKind.LOAD_FAILED]
    assert [e.method for e in failed] == ["decode"] and "injected failure" in failed[0].error
    # the cache is still usable: load decode for real, and both methods give their answers
    s.log.record = real_record
    s.load_method("decode")
    v = s.verify()
    assert v["ran"].all()


def test_session_names_the_failed_method_and_why(base, tmp_path):
    root = clone(base, tmp_path / "p")
    edit_manifest(root, lambda d: _const(d, 1).update(fqn="other.fqn"))
    s = load_program(root, "fingerprint")
    assert (s.status, s.failed_method) == ("failed", "decode")
    assert "other.fqn" in s.error
    assert "error in 'decode'" in s.summary()
    v = s.verify().set_index("method")
    assert v.loc["decode", "reason"].startswith("not loaded: ")


def test_every_error_is_a_toolkit_error():
    for cls in (ProgramError, ManifestError, IntegrityError, IncompatibleProgramError, LoadError):
        assert issubclass(cls, ToolkitError)


def test_manifest_dtype_that_contradicts_the_compiled_so(prog):
    """A manifest that lies consistently (dtype changed, same item size, digests refreshed)
    is caught against the dtype the .so was compiled for, before any byte is uploaded."""

    def lie(d):
        c = d["methods"][0]["constants"][0]
        assert c["dtype"] == "float32"
        c["dtype"] = "int32"

    edit_manifest(prog, lie)
    s = load_program(prog, "fingerprint")
    assert s.status == "failed" and s.failed_method == s.program.methods[0].name
    err = s.exception
    err = err() if callable(err) else err
    assert (
        isinstance(err, ProgramError)
        and err.field
        == f"methods[{s.program.methods[0].name}].constants[{s.program.methods[0].constants[0].name}].dtype"
    )
    assert "compiled for float32" in s.error and "int32" in s.error
    assert not any(e.kind.value == "constant_uploaded" for e in s.log)


# ------------------------------------------------------------------ hostile values (issue 21, item 3)

SHARED_OK = Path(__file__).resolve().parent / "fixtures" / "executorch-1.5.1-cuda" / "shared_ok"


@pytest.mark.parametrize(
    "value, says",
    [
        ("-1", "greater than or equal to 0"),
        ("2.7", "valid integer"),
        ("1e400", "valid integer"),
        ("Infinity", "valid integer"),
        ("9" * 5000, "Invalid JSON"),
        ("true", "valid integer"),
    ],
)
def test_sequence_steps_counts_are_whole_numbers_from_zero(tmp_path, value, says):
    """``num_inputs`` of -1 was accepted, 2.7 truncated to 2, 1e400 and Infinity an OverflowError."""
    d = tmp_path / "prog"
    shutil.copytree(SHARED_OK, d)
    steps = '[{"method": "prefill", "num_inputs": %s, "num_outputs": 1}]' % value
    p = d / "sequence_generate.safetensors"
    save_file({"step.0.input.0": torch.ones(2)}, str(p), metadata={"steps": steps})
    with pytest.raises(ProgramError) as e:
        open_program(d / "prog.pte")
    assert e.value.path == str(p) and e.value.field.startswith("__metadata__.steps"), str(e.value)
    assert says in str(e.value)
    if value in ("-1", "2.7"):
        assert e.value.field == "__metadata__.steps[0].num_inputs"


def test_report_error_is_a_toolkit_error_and_an_overlong_integer_is_one(tmp_path):
    from toolkit.core.errors import ReportError, ToolkitError
    from toolkit.reports.collision import REPORT_COLUMNS, REPORT_SCHEMA, read_report

    assert issubclass(ReportError, ToolkitError) and issubclass(ReportError, ValueError)
    col = next(c for c, kind in REPORT_SCHEMA.items() if kind == "int")
    row = {
        c: "0" if REPORT_SCHEMA[c] in ("int", "float") else ("True" if REPORT_SCHEMA[c] == "bool" else "")
        for c in REPORT_COLUMNS
    }
    row[col] = "1" + "0" * 24  # 25 digits: past int64 (it was an OverflowError)
    p = tmp_path / "report.csv"
    p.write_text(",".join(REPORT_COLUMNS) + "\n" + ",".join(row[c] for c in REPORT_COLUMNS) + "\n")
    with pytest.raises(ReportError, match=f"column {col!r}"):
        read_report(p)
