"""Issue 13's defects, one regression test each (the fuzzer, tests/test_fuzz.py, covers the
attack classes at volume: layout lies, resized blobs, interrupts at every event)."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
from test_errors import clone, edit_manifest, refresh_digests

from toolkit.cli import main as cli_main
from toolkit.core import events as ev
from toolkit.core.errors import IntegrityError, LoadError, ManifestError, ProgramError
from toolkit.core.policies import POLICIES, get_policy
from toolkit.engine.devices import resolve_devices
from toolkit.engine.session import Session, load_program
from toolkit.sources import open_program
from toolkit.sources.directory import MANIFEST_FILE

SAMPLE = "total_collision"


@pytest.fixture
def prog(built_sample, tmp_path) -> Path:
    return clone(built_sample(SAMPLE), tmp_path / "p")


def _shrink_decode_weight(root: Path) -> None:
    """decode's 64x64 float32 constant declared 32x64, digest recomputed: consistent, and a lie."""
    import hashlib

    def lie(d):
        m = d["methods"][1]
        c = m["constants"][0]
        blob = (root / m["blob_file"]).read_bytes()
        c.update(shape=[32, 64], strides=[64, 1], nbytes=32 * 64 * 4)
        c["digest"] = hashlib.sha256(blob[c["offset"] : c["offset"] + c["nbytes"]]).hexdigest()

    edit_manifest(root, lie)


# ---------------------------------------------------------------- 1, 2: the .so is the truth


def _check_shrunken_refused(s, policy: str) -> None:
    """Decode, whose weight the manifest shrank, failed before anything of it was uploaded."""
    assert s.status == "failed" and s.failed_method == "decode", s.error
    if policy == "fqn-weight-cache":  # 1.5.x's exporter refuses total_collision: no .so is even opened
        assert s.failed_stage == "export" and s.error.startswith("Duplicate key") and s.device_bytes == 0
    else:
        assert isinstance(s.exception, ProgramError) and s.exception.field.endswith(".nbytes")
        assert "the .so's slot holds 16384 bytes" in s.error
    kinds = [e.kind.value for e in s.log if e.method == "decode"]
    assert not {"blob_uploaded", "constant_uploaded", "pairs_installed"} & set(kinds), kinds


@pytest.mark.parametrize("policy", POLICIES)
def test_a_shrunken_constant_is_refused_before_anything_runs(prog, policy):
    _shrink_decode_weight(prog)
    s = load_program(prog, policy)
    _check_shrunken_refused(s, policy)
    v = s.verify().set_index("method")
    assert not v.loc["decode", "ran"]


@pytest.mark.parametrize("policy", ["no-sharing", "name-only", "fingerprint"])
def test_a_truncated_blob_is_refused_before_aoti_reads_it(prog, policy):
    blob = prog / "methods/prefill/weights.blob"  # the first method reads its blob under every policy
    blob.write_bytes(blob.read_bytes()[:100])
    s = load_program(prog, policy, check_integrity=False)  # integrity off: only the size check stands
    assert s.status == "failed" and s.failed_method == "prefill"
    assert isinstance(s.exception, IntegrityError) and s.exception.path == str(blob), s.error


def test_a_consistently_rewritten_blob_size_is_refused(prog):
    blob = prog / "methods/decode/weights.blob"
    blob.write_bytes(blob.read_bytes() + bytes(64))
    refresh_digests(prog)
    s = load_program(prog, "no-sharing")
    assert s.status == "failed" and "the .so reads a 16384-byte weights blob" in s.error


# ---------------------------------------------------------------- 9: session lifecycle


def test_session_states_and_transitions(built_sample):
    p = built_sample(SAMPLE)
    s = Session(p, get_policy("fingerprint"), resolve_devices(p, None))
    assert s.status == "not loaded"
    s.load()
    assert s.status == "loaded" and s.load_outcome == "loaded"
    rows = len(s.decisions)
    with pytest.raises(LoadError, match="is loaded: load a new session"):
        s.load()
    assert s.status == "loaded" and len(s.decisions) == rows and s.methods  # nothing changed
    s.close()
    assert s.status == "closed" and s.load_outcome == "loaded" and not s.methods
    with pytest.raises(LoadError, match="closed"):
        s.load()
    with pytest.raises(LoadError, match="closed"):
        s.load_method("prefill")
    s.close()  # twice is fine
    assert s.status == "closed" and len(s.decisions) == rows


def test_a_failed_session_refuses_load_and_closes(prog):
    _shrink_decode_weight(prog)
    s = load_program(prog, "fingerprint")
    assert s.status == "failed"
    with pytest.raises(LoadError, match="is failed"):
        s.load()
    s.close()
    assert s.status == "closed" and s.load_outcome == "failed" and len(s.cache) == 0


def test_close_after_an_interrupted_load_leaves_an_empty_cache(built_sample):
    p = built_sample(SAMPLE)
    s = Session(p, get_policy("name-only"), resolve_devices(p, None))

    def interrupting(start, stop):  # after every way of recording (one event, or a batch of them)
        last = s.log.event(stop - 1)
        if last.kind is ev.CacheEntryAdded.kind and last.method == "prefill":
            raise KeyboardInterrupt

    s.log.recorded = interrupting
    with pytest.raises(KeyboardInterrupt):
        s.load()
    assert not s.methods and len(s.cache) == 0
    del s.log.recorded
    s.close()
    assert len(s.cache) == 0 and s.status == "closed"


# ---------------------------------------------------------------- 5, 8: the command line


def test_cli_checks_arguments_before_any_work(built_sample, tmp_path, capsys, monkeypatch):
    import toolkit.engine.session as loader

    root = str(built_sample(SAMPLE).root)
    monkeypatch.setattr(loader, "load_program", lambda *a, **k: pytest.fail("loaded before checking arguments"))
    (tmp_path / "exists.csv").write_text("x")
    for argv, words in [
        (["report", root, "--device", "tpu"], "unsupported device 'tpu'"),
        (["compare", root, "--device", "tpu"], "unsupported device 'tpu'"),
        (["report", root, "--csv", str(tmp_path / "missing" / "x.csv")], "does not exist"),
        (["report", root, "--csv", str(tmp_path)], "is a folder"),
        (["report", root, "--csv", ""], "empty path"),
        (["report", root, "--csv", str(tmp_path / "exists.csv")], "--force"),
        (["compare", root, "--policies", "name-only,bogus"], "unknown policy 'bogus'"),
        (["build", "no_such_module_anywhere"], "not an importable module"),
    ]:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert (tmp_path / "exists.csv").read_text() == "x"


def test_cli_force_overwrites_and_prints_the_absolute_path(built_sample, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.csv").write_text("old")
    assert (
        cli_main(["report", str(built_sample(SAMPLE).root), "--policy", "fingerprint", "--csv", "r.csv", "--force"])
        == 0
    )
    assert str(tmp_path / "r.csv") in capsys.readouterr().out
    assert (tmp_path / "r.csv").read_text().startswith("program,")


def test_cli_prints_terminal_escapes_escaped(prog, capsys):
    evil = "decode\x1b]0;pwned\x07\x00"
    edit_manifest(prog, lambda d: d["methods"][1]["constants"][0].update(fqn=evil))
    cli_main(["report", str(prog), "--policy", "name-only"])
    out = capsys.readouterr()
    assert "\x1b" not in out.out + out.err and "\x00" not in out.out + out.err
    assert "\\x1b]0;pwned\\x07\\x00" in out.out + out.err


# ---------------------------------------------------------------- 7, 10, 13: the directory source


def test_a_symlink_out_of_the_program_directory_is_refused(prog, tmp_path):
    outside = tmp_path / "outside.blob"
    blob = prog / "methods/decode/weights.blob"
    shutil.copyfile(blob, outside)
    blob.unlink()
    os.symlink(outside, blob)
    with pytest.raises(ProgramError, match="leads out of the program directory") as ei:
        open_program(prog)
    assert ei.value.path == str(blob)


def test_a_symlink_inside_the_program_directory_is_fine(prog):
    blob = prog / "methods/decode/weights.blob"
    (prog / "methods/decode/real.blob").write_bytes(blob.read_bytes())
    blob.unlink()
    os.symlink("real.blob", blob)
    assert open_program(prog).name == SAMPLE


@pytest.mark.parametrize("make", ["dir", "fifo"])
def test_a_folder_or_fifo_in_place_of_a_file_is_named_as_such(prog, make):
    blob = prog / "methods/decode/weights.blob"
    blob.unlink()
    blob.mkdir() if make == "dir" else os.mkfifo(blob)
    with pytest.raises(ProgramError, match="not a regular file") as ei:
        open_program(prog)
    assert ei.value.path == str(blob)


def test_a_file_given_as_the_program_is_named_as_such(prog):
    with pytest.raises(ProgramError, match="not a program this toolkit can open"):
        open_program(prog / "methods/decode/weights.blob")


def test_a_huge_number_is_not_printed_whole(prog):
    edit_manifest(prog, lambda d: d["methods"][0]["constants"][0].update(offset=-int("9" * 400)))
    with pytest.raises(ManifestError) as ei:
        open_program(prog)
    assert ei.value.field == "methods[0].constants[0].offset" and len(str(ei.value)) < 400


def test_duplicate_keys_in_the_manifest_are_refused(prog):
    text = (prog / MANIFEST_FILE).read_text()
    (prog / MANIFEST_FILE).write_text(text.replace('"name":', '"name": "x", "name":', 1))
    with pytest.raises(ManifestError, match="appears twice"):
        open_program(prog)


def test_unknown_fields_are_refused(prog):
    edit_manifest(prog, lambda d: d["methods"][0]["constants"][0].update(shpae=[1]))
    with pytest.raises(ManifestError, match="unknown field") as ei:
        open_program(prog)
    assert ei.value.field == "methods[0].constants[0].shpae"


# ---------------------------------------------------------------- 11, 12


@pytest.mark.parametrize("bad", [-1, 0, math.nan, math.inf, "10", True])
def test_load_isolated_refuses_a_bad_timeout(built_sample, bad):
    from toolkit.workflows.isolation import load_isolated

    with pytest.raises(ValueError, match="timeout_s"):
        load_isolated(built_sample(SAMPLE), "fingerprint", timeout_s=bad)


def test_verify_checks_reference_files_like_the_load(prog):
    s = load_program(prog, "fingerprint")
    assert s.status == "loaded"
    ref_p, ref_d = prog / "methods/prefill/reference.safetensors", prog / "methods/decode/reference.safetensors"
    ref_d.write_bytes(ref_p.read_bytes())  # after the load: the manifest still records the old one
    v = s.verify().set_index("method")
    assert bool(v.loc["prefill", "ok"])
    assert not bool(v.loc["decode", "ran"]) and "does not match the program's record" in v.loc["decode", "reason"]


# ---------------------------------------------------------------- the same on the H200


@pytest.fixture
def cuda_prog(built_sample, tmp_path) -> Path:
    return clone(built_sample(SAMPLE, "cuda"), tmp_path / "p")


@pytest.mark.gpu
def test_every_cuda_sample_declares_the_layout_its_manifest_records(built_sample):
    """The .so's own slot table (torch 2.11 on the H200) agrees with every CUDA sample's manifest.
    Every constant of a CUDA sample is on CUDA, so the compiler reports each data size unpadded
    (llama_static_cache's 16-byte counter: 16) and the blob file is laid out unpadded."""
    import torch

    from toolkit.build.samples import sample_names
    from toolkit.runtimes.aoti_container import AotiContainer, read_compiled

    for name in sample_names():
        p = built_sample(name, "cuda")
        for m in p.methods:
            container = AotiContainer.create(p.path(m.so_file), torch.device("cuda", 0))
            got = read_compiled(container.so_path, container.device)
            assert got is not None, f"{name}/{m.name}: the .so does not answer the size queries"
            assert {c.name: (c.nbytes, c.offset, c.dtype) for c in m.constants} == {
                k: (v.nbytes, v.blob_offset, v.dtype) for k, v in got.constants.items()
            }, (name, m.name)
            assert got.blob_bytes == m.blob_bytes or not m.constants


@pytest.mark.gpu
@pytest.mark.parametrize("policy", POLICIES)
def test_a_shrunken_constant_is_refused_on_cuda_before_anything_runs(cuda_prog, policy):
    _shrink_decode_weight(cuda_prog)
    s = load_program(cuda_prog, policy)
    _check_shrunken_refused(s, policy)
    s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["no-sharing", "fingerprint"])
def test_a_truncated_blob_is_refused_on_cuda(cuda_prog, policy):
    blob = cuda_prog / "methods/prefill/weights.blob"
    blob.write_bytes(blob.read_bytes()[:100])
    s = load_program(cuda_prog, policy, check_integrity=False)
    assert s.status == "failed" and isinstance(s.exception, IntegrityError), s.error
    s.close()
