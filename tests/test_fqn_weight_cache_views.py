"""fqn-weight-cache on views and repeated keys: one storage per key and device, every slot its own view of it.

ExecuTorch 1.5.x's ``CudaWeightCache::load`` uploads a storage key's whole storage once per program
and device and builds each manifest entry's view (dtype, sizes, strides, storage offset) on it, in
later methods and in the same method alike.  These tests check the decisions, the bytes uploaded
(each storage counted once) and, on a real CPU load, that a view really is a view of the shared
tensor and that every method's outputs equal its eager reference.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import replace

import pytest

from toolkit.core.model import ConstantSpec, MethodSpec, Program, required_nbytes
from toolkit.core.policies import MethodView, get_policy
from toolkit.core.vocab import ConstantKind, Decision, Lookup, Reason, Stage, TensorOrigin
from toolkit.workflows.dry_run import dry_run

POLICY = "fqn-weight-cache"


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def storage_const(
    name: str,
    key: str,
    *,
    shape=(4, 8),
    strides=(8, 1),
    offset=0,
    storage_nbytes=128,
    fqn: str | None = None,
    dtype="float32",
) -> ConstantSpec:
    """A view on the storage named ``key`` of a 1.5.x ``.ptd`` (the key read from its file)."""
    need = required_nbytes(dtype, shape, strides, offset)
    return ConstantSpec(
        name=name,
        fqn=fqn or name,
        kind=ConstantKind.PARAMETER,
        mutated=False,
        dtype=dtype,
        shape=shape,
        strides=strides,
        storage_offset=offset,
        nbytes=need,
        offset=4096 * (abs(hash(key)) % 1000),
        digest=_digest(key, need),  # the first ``need`` bytes of the storage
        file="aoti_cuda_blob.ptd",
        storage_key=f"cuda_fqn_weight:cuda:{key}",
        storage_nbytes=storage_nbytes,
    )


def program(methods: dict[str, list[ConstantSpec]]) -> Program:
    specs = tuple(
        MethodSpec(
            name=m,
            so_file=f"{m}.so",
            blob_file="aoti_cuda_blob.ptd",
            reference_file="",
            blob_bytes=sum(c.nbytes for c in cs),
            num_inputs=1,
            num_outputs=1,
            constants=tuple(cs),
        )
        for m, cs in methods.items()
    )
    return Program(name="views", description="", device="cuda", torch_version="", created_utc="", methods=specs)


def decisions(p: Program):
    return dry_run(p, POLICY).decisions


# ------------------------------------------------------------------ the policy alone


class Cache(dict):
    def find_content(self, digest, meta):
        return None

    first_container = ""


def test_a_hit_under_another_view_is_a_view_of_the_cached_storage():
    w = storage_const("w", "W")
    wt = storage_const("wt", "W", shape=(8, 4), strides=(1, 8), fqn="w")
    policy = get_policy(POLICY)
    first = policy.decide(policy.plan(MethodView("a", "cuda", 0, (w,)), Cache()), None, Cache())
    (d,) = first.decisions
    assert (d.decision, d.reason_code, d.origin, d.enters_cache) == (
        Decision.LOADED,
        Reason.FIRST_SEEN,
        TensorOrigin.OWN_UPLOAD,
        True,
    )

    class Entry:
        fqn, name, owner_method, digest, mutated, storage, nbytes = (
            "cuda_fqn_weight:cuda:W",
            "w",
            "a",
            w.digest,
            False,
            "",
            128,
        )
        meta = w.meta("cuda", 0)

    cache = Cache({"cuda_fqn_weight:cuda:W": Entry()})
    out = policy.decide(policy.plan(MethodView("b", "cuda", 0, (wt,)), cache), None, cache)
    (d,) = out.decisions
    assert (d.decision, d.reason_code, d.origin, d.lookup) == (
        Decision.SHARED,
        Reason.VIEW_OF_STORAGE,
        TensorOrigin.CACHE,
        Lookup.HIT,
    )
    assert d.view_of == "cuda_fqn_weight:cuda:W" and d.reason.startswith("view of 'cuda_fqn_weight:cuda:W'")
    assert not d.enters_cache and d.shared_from is cache["cuda_fqn_weight:cuda:W"]


def test_the_view_must_fit_its_storage_and_the_storage_its_entry():
    policy = get_policy(POLICY)
    big = storage_const("w", "W", storage_nbytes=64)  # reads 128 bytes of a 64-byte storage
    out = policy.decide(policy.plan(MethodView("a", "cuda", 0, (big,)), Cache()), None, Cache())
    assert out.failure == "Invalid CUDA FQN view 'w'" and out.stage is Stage.LOAD
    assert out.decisions[0].reason == "CUDA FQN weight 'w' requires 128 bytes from a 64-byte storage"
    a, b = storage_const("a", "S"), storage_const("b", "S", storage_nbytes=256)
    out = policy.decide(policy.plan(MethodView("m", "cuda", 0, (a, b)), Cache()), None, Cache())
    assert out.failure == "Failed to load CUDA FQN storage 'cuda_fqn_weight:cuda:S'"
    assert {d.decision for d in out.decisions} == {Decision.REFUSED}
    assert "inconsistent allocation metadata" in out.decisions[1].reason


# ------------------------------------------------------------------ the dry run


def test_dry_run_views_across_methods_count_each_storage_once():
    w = storage_const("w", "W", storage_nbytes=160)  # a storage larger than any view of it
    tail = storage_const("w", "W", shape=(2, 8), offset=16, storage_nbytes=160)  # rows 2..3
    wt = storage_const("w", "W", shape=(8, 4), strides=(1, 8), storage_nbytes=160)
    head = storage_const("w", "W", shape=(2, 8), storage_nbytes=160)  # rows 0..1: fewer bytes read
    other = storage_const("v", "V", shape=(8,), strides=(1,), storage_nbytes=32)
    p = program({"full": [w, other], "tail": [tail], "tr": [wt], "head": [head, other]})
    df = decisions(p)
    got = {(r.method, r.name): (r.decision, r.reason_code) for r in df.itertuples()}
    assert got == {
        ("full", "w"): ("loaded", "first_seen"),
        ("full", "v"): ("loaded", "first_seen"),
        ("tail", "w"): ("shared", "view_of_storage"),
        ("tr", "w"): ("shared", "view_of_storage"),
        ("head", "w"): ("shared", "view_of_storage"),
        ("head", "v"): ("shared", "storage_key_hit"),
    }
    assert set(df["reason"][df["reason_code"] == "view_of_storage"].str[:31]) == {"view of 'cuda_fqn_weight:cuda:W"}
    assert (df["data_problem"] == "").all() and (df["slot_problem"] == "").all()
    result = dry_run(p, POLICY)
    uploaded = {m: r.own_upload_bytes for m, r in result.session.results.items()}
    assert uploaded == {"full": 160 + 32, "tail": 0, "tr": 0, "head": 0}  # each storage whole, once


def test_dry_run_two_slots_with_one_key_in_one_method_share_one_storage():
    a = storage_const("a", "S", fqn="a")
    b = storage_const("b", "S", fqn="b")  # the same storage, the same view
    bt = storage_const("bt", "S", fqn="bt", shape=(8, 4), strides=(1, 8))  # the same storage, another view
    p = program({"m": [a, b, bt], "n": [storage_const("c", "S", fqn="c", shape=(32,), strides=(1,))]})
    df = decisions(p).set_index("name")
    assert df.loc["a", ["decision", "reason_code"]].tolist() == ["loaded", "first_seen"]
    assert df.loc["b", ["decision", "reason_code", "shared_from"]].tolist() == ["shared", "same_key_in_method", "m/a"]
    assert df.loc["bt", ["decision", "reason_code"]].tolist() == ["shared", "same_key_in_method"]
    assert df.loc["bt", "reason"].startswith("view of ") and not df.loc["b", "reason"].startswith("view of ")
    assert df.loc["c", ["decision", "reason_code"]].tolist() == ["shared", "view_of_storage"]
    assert (df["data_problem"] == "").all() and (df["slot_problem"] == "").all()
    result = dry_run(p, POLICY)
    assert {m: r.own_upload_bytes for m, r in result.session.results.items()} == {"m": 128, "n": 0}


def test_no_sharing_uploads_every_view_on_its_own():
    """The reference the shared load is compared with: the same program, nothing shared."""
    w, wt = storage_const("w", "W"), storage_const("w", "W", shape=(8, 4), strides=(1, 8))
    r = dry_run(program({"a": [w], "b": [wt]}), "no-sharing")
    assert set(r.decisions["decision"]) <= {"loaded", "private"}


# ------------------------------------------------------------------ a real load on the CPU


def _modules():
    import torch

    torch.manual_seed(0)
    base = torch.randn(4, 8)

    class Full(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(base.clone(), requires_grad=False)

        def forward(self, x):
            return x @ self.w.t()

    full = Full()
    storage = full.w.data

    class Transposed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(storage.t(), requires_grad=False)  # (8, 4), strides (1, 8)

        def forward(self, x):
            return x @ self.w

    class Tail(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(storage[2:4], requires_grad=False)  # offset 16: reads the storage to its end

        def forward(self, x):
            return x @ self.w.t()

    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(storage, requires_grad=False)
            self.b = torch.nn.Parameter(storage.t(), requires_grad=False)

        def forward(self, x):
            return (x @ self.a.t()) + (x @ self.b) * 2

    x = torch.randn(2, 8)
    return {"full": (full, (x,)), "tr": (Transposed(), (x,)), "tail": (Tail(), (x,)), "pair": (Pair(), (x,))}


@pytest.fixture(scope="module")
def view_program():
    """The modules above built on the CPU (cached like the samples)."""
    import torch

    from toolkit.build import builder
    from toolkit.build.builder import build_program
    from toolkit.build.samples import cache_root
    from toolkit.sources import open_program

    key = hashlib.sha256(
        (inspect.getsource(_modules) + inspect.getsource(builder) + torch.__version__).encode()
    ).hexdigest()[:12]
    out = cache_root() / f"fqn-views-cpu-{key}"
    if (out / "manifest.json").is_file():
        try:
            return open_program(out)
        except Exception:
            pass
    return build_program(_modules(), out, name="fqn-views", progress=False, overwrite=True)


def _pair_one_key(p: Program) -> Program:
    """``pair``'s two FQNs under one storage key, as a 1.5.x manifest may name them: ``a`` and its
    transpose ``b``, one storage of the eager module (the exporter stores identical bytes once)."""
    m = p.method("pair")
    key = "cuda_fqn_weight:cpu:pair.storage"
    consts = tuple(replace(c, storage_key=key) for c in m.constants)
    return replace(p, methods=tuple(replace(x, constants=consts) if x.name == "pair" else x for x in p.methods))


def test_built_views_are_views(view_program):
    by = {(m.name, c.fqn): c for m in view_program.methods for c in m.constants}
    assert by[("tr", "w")].strides == (1, 8) and by[("tail", "w")].storage_offset == 16
    assert len({by[k].digest for k in (("full", "w"), ("tr", "w"), ("tail", "w"), ("pair", "a"), ("pair", "b"))}) == 1


def test_real_cpu_load_builds_views_on_the_shared_storage(view_program):
    import torch

    from toolkit.engine.session import load_program

    p = _pair_one_key(view_program)
    s = load_program(p, POLICY, "cpu")
    try:
        assert s.status == "loaded"
        df = s.decisions.set_index(["method", "name"])
        assert df.loc[("full", "w"), "decision"] == "loaded"
        for m in ("tr", "tail"):
            assert df.loc[(m, "w"), ["decision", "reason_code"]].tolist() == ["shared", "view_of_storage"]
        a, b = (next(c for c in p.method("pair").constants if c.strides == st) for st in ((8, 1), (1, 8)))
        assert df.loc[("pair", a.name), ["decision", "reason_code"]].tolist() == ["loaded", "first_seen"]
        assert df.loc[("pair", b.name), ["decision", "reason_code"]].tolist() == ["shared", "same_key_in_method"]
        assert df.loc[("pair", b.name), "reason"].startswith("view of 'cuda_fqn_weight:cpu:pair.storage'")
        assert (df["data_problem"] == "").all() and (df["slot_problem"] == "").all()
        # one storage per key on the device: every slot's tensor is a view of the upload of its key
        base = s.methods["full"].tensors["w"]
        for m in ("tr", "tail"):
            assert s.methods[m].tensors["w"].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        ta, tb = (s.methods["pair"].tensors[c.name] for c in (a, b))
        assert ta.untyped_storage().data_ptr() == tb.untyped_storage().data_ptr() and torch.equal(tb, ta.t())
        tail = s.methods["tail"].tensors["w"]
        assert tail.storage_offset() == 16 and torch.equal(tail, base[2:4])
        assert torch.equal(s.methods["tr"].tensors["w"], base.t())
        assert {m: r.own_upload_bytes for m, r in s.results.items()} == {"full": 128, "tr": 0, "tail": 0, "pair": 128}
        ver = s.verify()
        assert ver["ok"].all() and set(ver["method"]) == {"full", "tr", "tail", "pair"}
    finally:
        s.close()


def test_real_cpu_load_repeated_key_in_one_method(view_program):
    """``pair`` alone: its two slots of one key share the storage its first slot uploads."""
    from toolkit.engine.session import load_program

    p = _pair_one_key(view_program)
    p = replace(p, methods=(p.method("pair"),))
    s = load_program(p, POLICY, "cpu")
    try:
        df = s.decisions.set_index("name")
        assert sorted(df["decision"]) == ["loaded", "shared"]
        shared = df[df["decision"] == "shared"].iloc[0]
        assert shared["reason_code"] == "same_key_in_method" and shared["reason"].startswith("view of ")
        assert s.results["pair"].own_upload_bytes == 128
        ts = list(s.methods["pair"].tensors.values())
        assert ts[0].untyped_storage().data_ptr() == ts[1].untyped_storage().data_ptr()
        assert s.verify()["ok"].all()
        unshared = load_program(p, "no-sharing", "cpu")
        try:
            assert unshared.results["pair"].device_bytes > s.results["pair"].device_bytes
        finally:
            unshared.close()
    finally:
        s.close()
