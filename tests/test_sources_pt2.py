"""torch .pt2 AOTInductor packages into the program model, and every policy's dry run on them.

The packages (``pt2_packages.py``) are compiled on CPU once and cached on disk: three models
(``prefill``, ``decode``, ``prefill_again``) sharing one ``Linear`` and one buffer, each with
its own lifted table, in both on-disk constants formats.
"""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
from pt2_packages import MODELS, eager_tensors, modules, packages

from toolkit.core.errors import ProgramError
from toolkit.core.model import InputSpec, PerConstantStorages, required_nbytes
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import ConstantKind, ProgramFormat
from toolkit.sources import open_program, read_program_model
from toolkit.sources.pt2 import Pt2Location
from toolkit.workflows.dry_run import dry_run


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def pt2():
    return {fmt: open_program(path) for fmt, path in packages().items()}


@pytest.mark.parametrize("fmt", ["binary_blob", "pickle_weights"])
def test_a_package_opens_into_a_complete_model(pt2, fmt):
    p = pt2[fmt]
    path = packages()[fmt]
    raw = path.read_bytes()
    assert p.format is ProgramFormat.PT2 and p.root == path.parent and p.device == "cpu" and p.name == fmt
    assert p.method_names == list(MODELS)
    assert p.files == {path.name: type(p.files[path.name])(sha(raw), len(raw))}
    eager = eager_tensors()
    with zipfile.ZipFile(path) as z:
        so_members = {n.split("/")[3]: z.read(n) for n in z.namelist() if n.endswith(".wrapper.so")}
        so_names = {n.split("/")[3]: n for n in z.namelist() if n.endswith(".wrapper.so")}
        blobs = {n.split("/")[3]: (n, z.read(n)) for n in z.namelist() if n.endswith("_weights.blob")}
    for m in p.methods:
        loc = m.location
        assert isinstance(loc, Pt2Location) and loc.so.file == m.so_file == path.name
        so = raw[loc.so.offset : loc.so.offset + loc.so.size]
        assert so == so_members[m.name] and loc.so.key == so_names[m.name]  # the member's name in the zip
        assert {c.so_key for c in m.constants} == {sha(so) + "_so_blob"}  # the key ExecuTorch would give it
        assert (m.num_inputs, m.num_outputs, m.reference_file) == (1, 1, "")
        # each input as the generated wrapper's check_input_N checks it: the eager example's dtype and sizes
        x = modules()[m.name][1][0]
        assert loc.inputs == (InputSpec(str(x.dtype).removeprefix("torch."), tuple(x.shape)),)
        assert [c.fqn for c in m.constants] == ["lin.weight", "lin.bias", "buf", "_tensor_constant0"]
        assert [c.name for c in m.constants] == ["lin_weight", "lin_bias", "buf", "_tensor_constant0"]
        assert [c.kind for c in m.constants] == [
            ConstantKind.PARAMETER,
            ConstantKind.PARAMETER,
            ConstantKind.BUFFER,
            ConstantKind.LIFTED_CONSTANT,
        ]
        for c in m.constants:
            t = eager[m.name][c.fqn]
            assert (c.dtype, c.shape, c.strides) == ("float32", tuple(t.shape), tuple(t.stride()))
            assert c.nbytes == required_nbytes(c.dtype, c.shape, c.strides, c.storage_offset)
            # the bytes at the recorded absolute offset are the eager tensor's, and the digest is theirs
            assert raw[c.offset : c.offset + c.nbytes] == t.contiguous().numpy().tobytes(), (m.name, c.fqn)
            assert c.digest == sha(raw[c.offset : c.offset + c.nbytes]) and c.file == path.name
        if fmt == "binary_blob":
            w = loc.weights
            assert loc.weights_format == "binary_blob" and (w.key, raw[w.offset : w.offset + w.size]) == blobs[m.name]
            assert m.blob_bytes == loc.weights.size == 1024 + 64 + 64 + 1024  # CPU: every storage padded to 64 bytes
            assert all(loc.weights.offset <= c.offset < loc.weights.offset + m.blob_bytes for c in m.constants)
        else:
            assert loc.weights_format == "pickle_weights" and loc.weights == PerConstantStorages()
            assert m.blob_bytes == 2176
            assert all(c.storage_key.startswith("data/weights/weight_") for c in m.constants)
    assert read_program_model(path) == p


def test_pickle_weights_are_stored_once_per_compile_time_storage(pt2):
    """Packaging deduplicates by storage identity: the shared Linear and buffer are one file each."""
    ms = pt2["pickle_weights"].methods
    for i in range(3):
        assert len({(m.constants[i].storage_key, m.constants[i].offset) for m in ms}) == 1
    assert len({m.constants[3].storage_key for m in ms}) == 3
    dense = pt2["binary_blob"].methods  # each model's blob holds its own copy
    assert len({m.constants[0].offset for m in dense}) == 3
    assert len({m.constants[0].digest for m in dense}) == 1


def test_same_graph_same_so_key(pt2):
    """prefill_again is prefill's graph with another table: AOTInductor compiles the same .so."""
    for p in pt2.values():
        key = {m.name: m.constants[0].so_key for m in p.methods}
        assert key["prefill"] == key["prefill_again"] != key["decode"]


@pytest.mark.parametrize("fmt", ["binary_blob", "pickle_weights"])
def test_every_policy_on_a_package(pt2, fmt):
    p = pt2[fmt]
    for policy in POLICIES:
        a = dry_run(p, policy)
        d = {(r.method, r.name): r.decision for r in a.decisions.itertuples()}
        if policy == "fqn-weight-cache":
            # decode's table has its own .so key; prefill_again's shares prefill's key with other bytes
            assert a.status == "failed" and a.session.failed_method == "prefill_again"
            key = f"cuda_fqn_weight:cpu:{p.method('prefill').constants[0].so_key}:_tensor_constant0"
            assert a.session.error == (
                f"Duplicate key {key} with different data. Existing data size: 1024 bytes. New data size: 1024 bytes."
            )
            # the exporter refuses the whole program: nothing loads, every constant is refused
            assert a.session.failed_stage == "export" and a.device_bytes == 0
            assert set(d.values()) == {"refused"} and len(d) == 12
            assert {m.status for m in a.methods} == {"failed"}
            refused = a.decisions[a.decisions["reason_code"] == "export_refused"]
            assert list(zip(refused["method"], refused["name"], refused["cached_method"])) == [
                ("prefill_again", "_tensor_constant0", "prefill")
            ]
            assert list(refused["storage_key"]) == [key] and list(refused["fqn"]) == ["_tensor_constant0"]
            continue
        assert a.status == "loaded", (policy, a.session.error)
        later = [d[("decode", n)] for n in ("lin_weight", "lin_bias", "buf", "_tensor_constant0")]
        expected = {
            "no-sharing": ["private"] * 4,
            "fingerprint": ["shared"] * 3 + ["declined"],
            "content-dedup": ["shared"] * 3 + ["declined"],
        }.get(policy, ["shared"] * 4)
        assert later == expected, (policy, later)


def test_a_compressed_or_foreign_archive_is_refused(tmp_path, pt2):
    src = packages()["pickle_weights"]
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(tmp_path / "deflated.pt2", "w", zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            out.writestr(info.filename, z.read(info.filename))
    with pytest.raises(ProgramError, match="compressed"):
        open_program(tmp_path / "deflated.pt2")
    with zipfile.ZipFile(tmp_path / "other.pt2", "w") as out:
        out.writestr("x/archive_format", "pt2")
        out.writestr("x/data/aotinductor/model/weights_config.json", json.dumps({}))
    with pytest.raises(ProgramError, match="wrapper .so"):
        open_program(tmp_path / "other.pt2")
    (tmp_path / "junk.pt2").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ProgramError, match="not a readable zip archive"):
        open_program(tmp_path / "junk.pt2")
