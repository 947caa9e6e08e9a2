"""Every branch of every policy, on plain data: nothing is compiled or loaded."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import pytest

from toolkit.model import ConstantSpec, TensorMeta, required_nbytes
from toolkit.policies import (
    POLICIES, Fingerprint, MethodView, VerifyAlways, compare_metadata, get_policy, refusal_message,
)
from toolkit.vocab import ConstantKind, Decision, Lookup, MetadataField, PolicyName, Reason, Source


def const(name, shape=(4, 4), dtype="float32", strides=None, fqn=None, data="a", mutated=False,
          kind=ConstantKind.LIFTED_CONSTANT) -> ConstantSpec:
    strides = strides or tuple(int(s) for s in _contig(shape))
    return ConstantSpec(name=name, fqn=name if fqn is None else fqn, kind=kind, mutated=mutated, dtype=dtype,
                        shape=tuple(shape), strides=strides, storage_offset=0,
                        nbytes=required_nbytes(dtype, shape, strides), offset=0,
                        digest=hashlib.sha256(data.encode()).hexdigest())


def _contig(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


@dataclass
class Entry:
    fqn: str
    name: str
    owner_method: str
    meta: TensorMeta
    digest: str


class FakeCache:
    def __init__(self, *entries: Entry):
        self.by_fqn = {e.fqn: e for e in entries}

    def get(self, fqn):
        return self.by_fqn.get(fqn)

    def find_content(self, digest, meta):
        return next((e for e in self.by_fqn.values() if e.digest == digest and e.meta == meta), None)


def cached(c: ConstantSpec, owner="prefill", device=("cpu", -1)) -> Entry:
    return Entry(c.fqn, c.name, owner, c.meta(*device), c.digest)


def view(*constants, name="decode", device=("cpu", -1)) -> MethodView:
    return MethodView(name, device[0], device[1], tuple(constants))


def run(policy, method, cache, new_meta=None):
    pol = get_policy(policy)
    plan = pol.plan(method, cache)
    if plan.upload_whole_blob and new_meta is None:
        new_meta = {c.name: c.meta(method.device_type, method.device_index) for c in method.constants}
    return plan, pol.decide(plan, new_meta if plan.upload_whole_blob else None, cache)


def by_name(outcome):
    return {d.constant.name: d for d in outcome.decisions}


A = const("_tensor_constant0", data="prefill data")
A_OTHER_DATA = const("_tensor_constant0", data="decode data")
A_OTHER_SHAPE = const("_tensor_constant0", shape=(4, 8), data="decode data")
NEW = const("head.weight", fqn="head.weight", data="head", kind=ConstantKind.PARAMETER)


def test_policy_names_are_the_documented_ones():
    assert POLICIES == ("no-sharing", "name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always",
                        "fingerprint", "content-dedup")
    with pytest.raises(ValueError, match="unknown policy 'nope'.*fingerprint"):
        get_policy("nope")


def test_compare_metadata_reports_every_field_in_upstream_order():
    a = TensorMeta("float32", (4, 4), (4, 1), "cuda", 0)
    b = TensorMeta("float16", (4, 4), (1, 4), "cuda", 1)
    comps = compare_metadata(a, b)
    assert [c.field for c in comps] == list(MetadataField)
    assert {c.field: c.equal for c in comps} == {
        MetadataField.DTYPE: False, MetadataField.RANK: True, MetadataField.SIZES: True,
        MetadataField.STRIDES: False, MetadataField.DEVICE_TYPE: True, MetadataField.DEVICE_INDEX: False}


def test_no_sharing_uploads_blob_and_keeps_everything_private():
    plan, out = run("no-sharing", view(A, NEW), FakeCache(cached(A)))
    assert plan.upload_whole_blob and plan.lookups == ()
    assert {d.decision for d in out.decisions} == {Decision.PRIVATE}
    assert out.install == ()


def test_first_method_loads_everything_into_the_cache_under_every_policy():
    for policy in POLICIES:
        plan, out = run(policy, view(A, NEW, name="prefill"), FakeCache())
        if policy == "no-sharing":
            continue
        assert all(lr.result is Lookup.MISS for lr in plan.lookups)
        assert all(d.decision is Decision.LOADED and d.enters_cache for d in out.decisions), policy
        assert out.failure is None


@pytest.mark.parametrize("policy", ["name-only", "refuse-on-mismatch", "decline-on-mismatch"])
def test_all_hit_branch_shares_on_name_alone_without_a_blob(policy):
    plan, out = run(policy, view(A_OTHER_DATA), FakeCache(cached(A)))
    assert not plan.upload_whole_blob
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.NAME_HIT_UNCHECKED
    assert d.comparisons == () and d.source is Source.CACHE
    # even a shape mismatch is not seen in this branch: the documented hole
    plan, out = run(policy, view(A_OTHER_SHAPE), FakeCache(cached(A)))
    assert by_name(out)["_tensor_constant0"].decision is Decision.SHARED


def test_name_only_miss_path_shares_hits_without_comparing():
    plan, out = run("name-only", view(A_OTHER_SHAPE, NEW), FakeCache(cached(A)))
    assert plan.upload_whole_blob
    d = by_name(out)
    assert d["_tensor_constant0"].decision is Decision.SHARED and d["_tensor_constant0"].comparisons == ()
    assert d["head.weight"].decision is Decision.LOADED
    assert [x.constant.name for x in out.install] == ["_tensor_constant0"]


def test_refuse_on_mismatch_fails_the_load_with_the_upstream_message():
    plan, out = run("refuse-on-mismatch", view(A_OTHER_SHAPE, NEW), FakeCache(cached(A)))
    assert out.failure == refusal_message("_tensor_constant0", "decode")
    assert out.failure == ("Constant '_tensor_constant0' in method 'decode' is incompatible with the cached "
                           "version from a previous method. Refusing to share.")
    assert {d.decision for d in out.decisions} == {Decision.REFUSED}
    assert by_name(out)["_tensor_constant0"].reason_code is Reason.METADATA_MISMATCH
    assert by_name(out)["head.weight"].reason_code is Reason.LOAD_REFUSED


def test_refuse_on_mismatch_shares_a_matching_hit_on_the_miss_path():
    plan, out = run("refuse-on-mismatch", view(A_OTHER_DATA, NEW), FakeCache(cached(A)))
    assert out.failure is None
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.METADATA_MATCH
    assert len(d.comparisons) == 6 and all(c.equal for c in d.comparisons)


def test_decline_on_mismatch_keeps_own_copy_and_leaves_it_out_of_the_pairs():
    plan, out = run("decline-on-mismatch", view(A_OTHER_SHAPE, NEW), FakeCache(cached(A)))
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.DECLINED and d.source is Source.WHOLE_BLOB and not d.enters_cache
    # "a constant rejected after extraction has to be left out of the user-managed pairs" (#21959)
    assert "_tensor_constant0" not in [x.constant.name for x in out.install]
    assert out.failure is None


def test_decline_compares_extracted_metadata_not_the_manifest():
    meta = {"_tensor_constant0": TensorMeta("float32", (4, 4), (1, 4), "cpu", -1),
            "head.weight": NEW.meta("cpu", -1)}
    plan, out = run("decline-on-mismatch", view(A, NEW), FakeCache(cached(A)), new_meta=meta)
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.DECLINED
    assert [c.field for c in d.comparisons if not c.equal] == [MetadataField.STRIDES]


def test_device_index_mismatch_is_declined():
    c = const("w", data="same")
    plan, out = run("decline-on-mismatch", view(c, NEW, device=("cuda", 1)), FakeCache(cached(c, device=("cuda", 0))))
    d = by_name(out)["w"]
    assert d.decision is Decision.DECLINED
    assert [x.field for x in d.comparisons if not x.equal] == [MetadataField.DEVICE_INDEX]


def test_verify_always_reuploads_in_the_all_hit_branch_but_compares_metadata_only():
    plan, out = run("verify-always", view(A_OTHER_DATA), FakeCache(cached(A)))
    assert plan.upload_whole_blob and "#21706" in plan.blob_reason
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.METADATA_MATCH  # equal metadata: still shared
    plan, out = run("verify-always", view(A_OTHER_SHAPE), FakeCache(cached(A)))
    assert by_name(out)["_tensor_constant0"].decision is Decision.DECLINED


def test_verify_always_without_blob_entry_points_falls_back_to_name_sharing():
    pol = VerifyAlways(blob_available=False)
    plan = pol.plan(view(A_OTHER_SHAPE), FakeCache(cached(A)))
    assert not plan.upload_whole_blob
    out = pol.decide(plan, None, FakeCache(cached(A)))
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.NO_BLOB_TO_COMPARE


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
def test_fingerprint_declines_equal_metadata_with_different_content(policy):
    plan, out = run(policy, view(A_OTHER_DATA), FakeCache(cached(A)))
    assert not plan.upload_whole_blob
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.DECLINED and d.reason_code is Reason.CONTENT_MISMATCH
    assert d.source is Source.OWN_UPLOAD and d.digest_comparison is not None and not d.digest_comparison.equal
    assert all(c.equal for c in d.comparisons)


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
def test_fingerprint_shares_identical_constants_and_installs_everything(policy):
    plan, out = run(policy, view(A, NEW), FakeCache(cached(A)))
    d = by_name(out)
    assert d["_tensor_constant0"].decision is Decision.SHARED
    assert d["_tensor_constant0"].reason_code is Reason.FINGERPRINT_MATCH
    assert d["head.weight"].decision is Decision.LOADED and d["head.weight"].source is Source.OWN_UPLOAD
    # memory-optimal: every constant installed user-managed, nothing from a whole blob
    assert sorted(x.constant.name for x in out.install) == ["_tensor_constant0", "head.weight"]


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
def test_mutated_buffers_are_never_shared_or_looked_up(policy):
    kv = const("kv", fqn="kv", data="zeros", mutated=True, kind=ConstantKind.BUFFER)
    plan, out = run(policy, view(kv), FakeCache(cached(replace(kv, mutated=False))))
    assert plan.lookups == ()
    d = by_name(out)["kv"]
    assert d.decision is Decision.PRIVATE and d.reason_code is Reason.MUTATED_BUFFER and not d.enters_cache


def test_content_dedup_shares_identical_content_under_another_name():
    other = const("_tensor_constant3", data="prefill data")  # same bytes as A, other name
    plan, out = run("content-dedup", view(other), FakeCache(cached(A)))
    d = by_name(out)["_tensor_constant3"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.CONTENT_MATCH_OTHER_NAME
    assert d.shared_from.fqn == "_tensor_constant0"
    plan, out = run("fingerprint", view(other), FakeCache(cached(A)))
    assert by_name(out)["_tensor_constant3"].decision is Decision.LOADED


def test_content_dedup_rescues_a_declined_name_with_a_content_twin():
    twin = const("enc.w", fqn="enc.w", data="decode data")
    cache = FakeCache(cached(A), cached(twin))
    plan, out = run("content-dedup", view(A_OTHER_DATA), cache)
    d = by_name(out)["_tensor_constant0"]
    assert d.decision is Decision.SHARED and d.shared_from.fqn == "enc.w"


def test_empty_fqn_is_never_looked_up():
    c = const("folded", fqn="", data="x")
    for policy in ["decline-on-mismatch", "fingerprint"]:
        plan, out = run(policy, view(c), FakeCache())
        assert plan.lookups == ()
        assert by_name(out)["folded"].reason_code is Reason.EMPTY_FQN
        assert by_name(out)["folded"].decision is Decision.PRIVATE


def test_policy_objects_are_reusable_and_named():
    for name in POLICIES:
        p = get_policy(name)
        assert p.name is PolicyName(name) and get_policy(p) is p
    assert Fingerprint.memory_optimal and not get_policy("decline-on-mismatch").memory_optimal
