"""ExecuTorch CUDA programs (.pte + .ptd) into the program model, and every policy's dry run on them.

Fixtures (``tests/fixtures``): the real exports of executorch 1.5.1 (``executorch-1.5.1-cuda``,
payload ETCUDAFQN3), and synthetic programs written by ExecuTorch's own serializers
(``make_synthetic_pte.py``) for the older payload generations (1, 2) and the multi-arch
payloads (ETCUDAFQN4, ETCUDAFQN5).  Nothing is compiled; nothing is loaded on a device.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from executorch_fixtures import unpacked
from safetensors.numpy import load_file

import toolkit
from toolkit.core.errors import ProgramError, ToolkitError
from toolkit.core.model import PerConstantStorages, required_nbytes
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import ConstantKind, ProgramFormat
from toolkit.sources import open_program, read_program_model
from toolkit.sources.executorch import AotiConstant, PteLocation, aoti_internal_names, open_pte
from toolkit.workflows.dry_run import dry_run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REAL = ["executorch-1.5.1-cuda/shared_ok", "executorch-1.5.1-cuda/identical"]
# payload generation 1, exported by executorch 1.2.0 on the H200 (absolute: FIXTURES / p is p)
GEN1 = str(unpacked("1.2.0") / "shared_ok")
SYNTHETIC = ["synthetic-gen2", "synthetic-fqn4", "synthetic-fqn5"]  # what no exporter we can run writes
ALL = REAL + [GEN1] + SYNTHETIC
GENERATION = {
    GEN1: "method keys",
    "synthetic-gen2": "so and weights keys",
    "synthetic-fqn4": "ETCUDAFQN4",
    "synthetic-fqn5": "ETCUDAFQN5",
}


def table(folder: str):
    p = FIXTURES / folder / "constant_table.json"
    return json.loads(p.read_text()) if p.is_file() else None


def open_fixture(folder: str, **kw):
    return open_program(FIXTURES / folder, constant_table=table(folder), **kw)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ------------------------------------------------------------------ the model of every fixture


@pytest.mark.parametrize("folder", ALL)
def test_every_fixture_opens_into_a_complete_model(folder):
    p = open_fixture(folder)
    root = FIXTURES / folder
    assert (
        p.format is ProgramFormat.PTE and p.root == root and p.device == "cuda" and p.name == root.name
    )  # prog.pte: named by its folder
    assert p.method_names == ["decode", "prefill"]  # the .pte's execution plans, in its order
    # a FileRecord of every file, computed from its bytes
    for rel, rec in p.files.items():
        data = (root / rel).read_bytes()
        assert rec.bytes == len(data) and rec.sha256 == sha(data), rel
    assert {"prog.pte", "aoti_cuda_blob.ptd"} <= set(p.files)
    pte = (root / "prog.pte").read_bytes()
    for m in p.methods:
        assert m.num_inputs == 1 and m.num_outputs == 1 and m.input_order == (0,)
        loc = m.location
        assert isinstance(loc, PteLocation) and loc.so.file == m.so_file == "prog.pte"
        so = (root / m.so_file).read_bytes()[loc.so.offset : loc.so.offset + loc.so.size]
        assert len(so) == loc.so.size > 0
        if folder != GEN1:  # content-hash keys from #20424 on
            assert loc.so.key == sha(so) + "_so_blob"
        else:
            assert loc.so.key == f"{m.name}_so_blob" and loc.weights.key == f"{m.name}_weights_blob"
        if folder in (GEN1, "synthetic-gen2"):  # a dense blob inside the .ptd, absolute offsets
            assert loc.weights.file == m.blob_file and loc.weights.size == m.blob_bytes
            assert [c.offset for c in m.constants] == [loc.weights.offset + o for o in (0, 16384, 16640)]
        else:
            assert loc.weights == PerConstantStorages()
        assert [c.fqn for c in m.constants] == ["lin.weight", "lin.bias", "_tensor_constant0"]
        assert [c.name for c in m.constants] == ["lin_weight", "lin_bias", "_tensor_constant0"]
        for c in m.constants:
            data = (root / c.file).read_bytes()
            assert c.dtype == "float32" and c.storage_offset == 0
            assert c.nbytes == required_nbytes(c.dtype, c.shape, c.strides, c.storage_offset)
            assert c.digest == sha(data[c.offset : c.offset + c.nbytes]), (m.name, c.name)
            assert c.so_key == loc.so.key
        assert m.constants[0].shape == (64, 64) and m.constants[0].strides == (64, 1)
        assert m.constants[1].shape == (64,)
        assert m.reference_file == f"reference_{m.name}.safetensors" or folder in SYNTHETIC
    assert len(pte) == p.files["prog.pte"].bytes


@pytest.mark.parametrize("folder", ALL)
def test_the_located_bytes_reproduce_the_eager_outputs(folder):
    """The constants' bytes, at the offsets and in the layouts the model says, give the eager
    outputs recorded beside the real export (the modules: lin(x) @ c, decode with relu)."""
    p = open_fixture(folder)
    refs = (
        p.root
        if (p.root / "reference_decode.safetensors").is_file()
        else FIXTURES / "executorch-1.5.1-cuda" / "shared_ok"
    )  # (the synthetic ones are shared_ok rewritten)
    for m in p.methods:
        t = {}
        for c in m.constants:
            raw = (p.root / c.file).read_bytes()[c.offset : c.offset + c.nbytes]
            t[c.fqn] = np.lib.stride_tricks.as_strided(
                np.frombuffer(raw, np.float32), c.shape, [s * 4 for s in c.strides]
            )
        ref = load_file(str(refs / f"reference_{m.name}.safetensors"))
        y = (ref["input.0"] @ t["lin.weight"].T + t["lin.bias"]) @ t["_tensor_constant0"]
        if m.name == "decode" and "shared_ok" in str(refs) and folder != "executorch-1.5.1-cuda/identical":
            y = np.maximum(y, 0)
        np.testing.assert_allclose(y, ref["output.0"], rtol=1e-4, atol=1e-4)


def test_shared_ok_keys_and_contents():
    p = open_fixture("executorch-1.5.1-cuda/shared_ok")
    d, f = (p.method(n) for n in ("decode", "prefill"))
    assert d.location.so.key != f.location.so.key  # two graphs, two .so files
    for i in (0, 1):  # lin.weight, lin.bias: one storage key, one storage, the same bytes
        assert d.constants[i].storage_key == f.constants[i].storage_key == f"cuda_fqn_weight:cuda:{d.constants[i].fqn}"
        assert (d.constants[i].offset, d.constants[i].digest) == (f.constants[i].offset, f.constants[i].digest)
    # the two _tensor_constant0: namespaced by their own .so's key, other data
    assert d.constants[2].storage_key == f"cuda_fqn_weight:cuda:{d.location.so.key}:_tensor_constant0"
    assert f.constants[2].storage_key == f"cuda_fqn_weight:cuda:{f.location.so.key}:_tensor_constant0"
    assert d.constants[2].digest != f.constants[2].digest
    assert d.location.weights == PerConstantStorages()
    assert d.blob_bytes == 2 * 64 * 64 * 4 + 64 * 4  # a dense blob would be 33024 B


def test_identical_has_one_so_and_one_set_of_storages():
    p = open_fixture("executorch-1.5.1-cuda/identical")
    d, f = p.methods
    assert d.location.so == f.location.so
    assert [(c.storage_key, c.offset, c.digest) for c in d.constants] == [
        (c.storage_key, c.offset, c.digest) for c in f.constants
    ]


def test_multi_arch_payloads_model_the_first_regular_variant():
    ref = open_fixture("executorch-1.5.1-cuda/shared_ok")
    for folder, label in (
        ("synthetic-fqn4", "ETCUDAFQN4 (sm80, sm90)"),
        ("synthetic-fqn5", "ETCUDAFQN5 (sm90, sm80+ptx80 fallback)"),
    ):
        p = open_fixture(folder)
        for m in p.methods:
            assert m.location.payload.startswith(label)
            so = (p.root / m.so_file).read_bytes()[m.location.so.offset : m.location.so.offset + m.location.so.size]
            assert b"sm80" in so if folder == "synthetic-fqn4" else b"sm90" in so  # not the PTX fallback
            assert [c.digest for c in m.constants] == [c.digest for c in ref.method(m.name).constants]


def test_generations_1_and_2_need_the_constant_table(tmp_path):
    for folder in (GEN1, "synthetic-gen2"):
        bare = shutil.copytree(FIXTURES / folder, tmp_path / Path(folder).name, ignore=shutil.ignore_patterns("*.json"))
        with pytest.raises(ProgramError, match="constant table only inside the .so") as e:
            open_program(bare)
        assert e.value.path.endswith("prog.pte") and "processed" in e.value.field
        # rows as AotiConstant records, or a callable given (method, .so bytes)
        rows = {
            m: [
                AotiConstant(
                    r["name"],
                    r["fqn"],
                    r["dtype"],
                    tuple(r["shape"]),
                    tuple(r["strides"]),
                    kind=ConstantKind(r["kind"]),
                )
                for r in rs
            ]
            for m, rs in table(folder).items()
        }
        seen = []
        p = open_program(FIXTURES / folder, constant_table=lambda m, so: seen.append((m, len(so))) or rows[m])
        assert p == open_fixture(folder) and [m for m, _ in seen] == ["decode", "prefill"]
        assert all(n == p.method(m).location.so.size for m, n in seen)
        # a table that is not this .so's does not lay out the blob
        short = {m: r[:2] for m, r in table(folder).items()}
        with pytest.raises(ProgramError, match="lays out 16640 bytes, the weights blob has 33024"):
            open_program(FIXTURES / folder, constant_table=short)
        with pytest.raises(ProgramError, match="no entry for method 'decode'"):
            open_program(FIXTURES / folder, constant_table={})


def test_internal_names_follow_aoti():
    assert aoti_internal_names(["lin.weight", "layers.0.w", "0.w", "a_b", "a.b", "_tensor_constant3"]) == [
        "lin_weight",
        "layers_0_w",
        "constant_0_w",
        "a_b",
        "a_b_0",
        "_tensor_constant3",
    ]


# ------------------------------------------------------------------ opening: paths and data files


def test_open_program_dispatch(tmp_path):
    folder = FIXTURES / "executorch-1.5.1-cuda/shared_ok"
    by_folder = open_program(folder)
    assert open_program(folder / "prog.pte") == by_folder == toolkit.open_program(folder)
    assert read_program_model(folder / "prog.pte") == by_folder == read_program_model(folder)
    # the .ptd given explicitly, from another folder
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(folder / "prog.pte", tmp_path / "a" / "prog.pte")
    shutil.copy(folder / "aoti_cuda_blob.ptd", tmp_path / "b" / "weights.ptd")
    with pytest.raises(ProgramError, match="cuda_fqn_weight:cuda:lin.weight.*no .ptd was found"):
        open_program(tmp_path / "a" / "prog.pte")
    p = open_program(tmp_path / "a" / "prog.pte", data=tmp_path / "b" / "weights.ptd")
    assert set(p.files) == {"prog.pte", "../b/weights.ptd"}
    assert p.path("../b/weights.ptd").resolve() == (tmp_path / "b" / "weights.ptd").resolve()
    assert [c.digest for m in p.methods for c in m.constants] == [
        c.digest for m in by_folder.methods for c in m.constants
    ]
    assert p.methods[0].reference_file == ""  # no reference beside this copy
    with pytest.raises(ProgramError, match="does not exist"):
        open_program(tmp_path / "a" / "prog.pte", data=tmp_path / "nope.ptd")
    with pytest.raises(ProgramError, match="holds only data"):
        open_program(folder / "aoti_cuda_blob.ptd")
    with pytest.raises(
        ProgramError,
        match=r"option data= is not one constshare-program takes \(it takes none\); "
        "it belongs to executorch-pte",
    ):
        open_program(tmp_path / "b", data=folder / "aoti_cuda_blob.ptd")
    with pytest.raises(
        ProgramError,
        match=r"option datas= is not one executorch-pte takes \(it takes data, "
        r"constant_table, so_table, reader\); it belongs to no format",
    ):
        open_program(folder / "prog.pte", datas=folder / "aoti_cuda_blob.ptd")
    # the same .ptd given twice: its keys clash
    with pytest.raises(ProgramError, match="is also in"):
        open_program(folder / "prog.pte", data=[folder / "aoti_cuda_blob.ptd", tmp_path / "b" / "weights.ptd"])


def test_executorch_reader_gives_the_same_model():
    try:
        import executorch.exir._serialize._program  # noqa: F401  (the extra's reader)
    except ImportError:
        pytest.skip("the executorch extra is not installed")
    for folder in ALL:
        assert open_fixture(folder, reader="executorch") == open_fixture(folder), folder


def test_executorch_reader_without_the_extra_names_it(monkeypatch):
    for name in ["executorch", *(m for m in sys.modules if m.startswith("executorch."))]:
        monkeypatch.setitem(sys.modules, name, None)  # import executorch... raises ImportError
    with pytest.raises(ToolkitError, match=r"optional extra 'executorch'.*constshare-toolkit\[executorch\]"):
        open_pte(FIXTURES / "executorch-1.5.1-cuda/shared_ok/prog.pte", reader="executorch")


# ------------------------------------------------------------------ every policy's dry run


def _decisions(p, policy):
    a = dry_run(p, policy)
    return a, {(r.method, r.name): r.decision for r in a.decisions.itertuples()}


DENSE = ("name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always")


@pytest.mark.parametrize("folder", ["executorch-1.5.1-cuda/shared_ok", GEN1, *SYNTHETIC])
def test_policies_on_shared_ok(folder):
    """prefill (loaded second) shares lin.weight/lin.bias with decode; its _tensor_constant0
    has the same name and metadata but other data."""
    p = open_fixture(folder)
    for policy in POLICIES:
        a, d = _decisions(p, policy)
        assert a.status == "loaded", (policy, a.session.error)
        assert {d[("decode", n)] for n in ("lin_weight", "lin_bias", "_tensor_constant0")} == (
            {"private"} if policy == "no-sharing" else {"loaded"}
        ), policy
        later = [d[("prefill", n)] for n in ("lin_weight", "lin_bias", "_tensor_constant0")]
        expected = {
            "no-sharing": ["private"] * 3,
            # every name hits: shared on the name alone, the colliding table included (the hole)
            **{pol: ["shared"] * 3 for pol in DENSE},
            "blind-share": ["shared"] * 3,
            "fingerprint": ["shared", "shared", "declined"],
            "content-dedup": ["shared", "shared", "declined"],
            # two .so keys: two storage keys for the tables, both cached
            "fqn-weight-cache": ["shared", "shared", "loaded"],
        }[policy]
        assert later == expected, (policy, later)
    a, _ = _decisions(p, "fqn-weight-cache")
    keys = set(a.decisions["storage_key"])  # the 1.5.x cache key in its own column; fqn stays the FQN
    assert set(a.decisions["fqn"]) == {"lin.weight", "lin.bias", "_tensor_constant0"}
    d, f = p.methods
    assert keys == {
        "cuda_fqn_weight:cuda:lin.weight",
        "cuda_fqn_weight:cuda:lin.bias",
        f"cuda_fqn_weight:cuda:{d.constants[2].so_key}:_tensor_constant0",
        f"cuda_fqn_weight:cuda:{f.constants[2].so_key}:_tensor_constant0",
    }
    assert {e.fqn for e in a.session.cache} == keys  # four storages, each cached once
    assert a.device_bytes == 2 * 16384 + 256 + 16384  # lin.weight, lin.bias, two tables


def test_policies_on_identical():
    p = open_fixture("executorch-1.5.1-cuda/identical")
    for policy in POLICIES:
        a, d = _decisions(p, policy)
        assert a.status == "loaded"
        later = {d[("prefill", n)] for n in ("lin_weight", "lin_bias", "_tensor_constant0")}
        assert later == ({"private"} if policy == "no-sharing" else {"shared"}), policy
    a, _ = _decisions(p, "fqn-weight-cache")
    assert a.device_bytes == 33024 and len({e.fqn for e in a.session.cache}) == 3  # one .so key, one set
    # the memory-optimal policies reach the floor; the dense-blob ones keep a whole blob per method
    floor = toolkit.memory_floor(p).total_bytes
    assert floor == 33024
    assert dry_run(p, "fingerprint").device_bytes == floor
    assert dry_run(p, "blind-share").device_bytes == 2 * 33024


def _copy_shared_ok(tmp_path: Path) -> Path:
    dst = tmp_path / "prog"
    shutil.copytree(FIXTURES / "executorch-1.5.1-cuda" / "shared_ok", dst)
    return dst


def _sequence_file(folder: Path, name: str, metadata: dict | None) -> Path:
    import torch
    from safetensors.torch import save_file

    p = folder / f"sequence_{name}.safetensors"
    save_file({"step.0.input.0": torch.ones(2), "step.0.output.0": torch.zeros(2)}, str(p), metadata=metadata)
    return p


def test_a_sequence_file_beside_the_pte_is_the_programs_sequence(tmp_path):
    d = _copy_shared_ok(tmp_path)
    steps = [
        {"method": "prefill", "num_inputs": 1, "num_outputs": 1},
        {"method": "decode", "num_inputs": 2, "num_outputs": 1},
    ]
    _sequence_file(d, "generate", {"steps": json.dumps(steps)})
    _sequence_file(d, "other", None)  # no steps in its header: not ours, left out
    prog = open_program(d / "prog.pte")
    assert [q.name for q in prog.sequences] == ["generate"]
    seq = prog.sequence("generate")
    assert [(st.method, st.num_inputs, st.num_outputs) for st in seq.steps] == [("prefill", 1, 1), ("decode", 2, 1)]
    assert seq.reference_file in prog.files and "sequence_other.safetensors" not in prog.files
    assert prog.files[seq.reference_file].sha256 == hashlib.sha256((d / seq.reference_file).read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "steps, says",
    [
        ('[{"method": "nope", "num_inputs": 1, "num_outputs": 1}]', "methods the .pte does not have: ['nope']"),
        ('[{"method": "decode"}]', "steps must be a JSON list"),
        ("not json", "steps must be a JSON list"),
        ("[]", "steps name no method"),
    ],
)
def test_a_malformed_sequence_file_names_the_file_and_field(tmp_path, steps, says):
    d = _copy_shared_ok(tmp_path)
    p = _sequence_file(d, "generate", {"steps": steps})
    with pytest.raises(ProgramError) as e:
        open_program(d / "prog.pte")
    assert says in str(e.value) and str(p) in str(e.value) and "__metadata__.steps" in str(e.value)


def test_a_truncated_sequence_file_is_refused_naming_it(tmp_path):
    d = _copy_shared_ok(tmp_path)
    p = _sequence_file(d, "generate", {"steps": "[]"})
    p.write_bytes(p.read_bytes()[:20])
    with pytest.raises(ProgramError) as e:
        open_program(d / "prog.pte")
    assert str(p) in str(e.value)
