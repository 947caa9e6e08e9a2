"""Every branch of every policy, on plain data: nothing is compiled or loaded."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from toolkit.core.model import ConstantSpec, TensorMeta, required_nbytes
from toolkit.core.policies import POLICIES, MethodView, fqn_weight_key, get_policy
from toolkit.core.policies.checks import compare_metadata, refusal_message
from toolkit.core.policies.executorch import VerifyAlways
from toolkit.core.policies.ours import Fingerprint
from toolkit.core.vocab import ConstantKind, Decision, Lookup, MetadataField, PolicyName, Reason, Stage, TensorOrigin

REPO = Path(__file__).resolve().parents[1]


def const(
    name,
    shape=(4, 4),
    dtype="float32",
    strides=None,
    fqn=None,
    data="a",
    mutated=False,
    kind=ConstantKind.LIFTED_CONSTANT,
) -> ConstantSpec:
    strides = strides or tuple(int(s) for s in _contig(shape))
    return ConstantSpec(
        name=name,
        fqn=name if fqn is None else fqn,
        kind=kind,
        mutated=mutated,
        dtype=dtype,
        shape=tuple(shape),
        strides=strides,
        storage_offset=0,
        nbytes=required_nbytes(dtype, shape, strides),
        offset=0,
        digest=hashlib.sha256(data.encode()).hexdigest(),
    )


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
    mutated: bool = False
    storage: str = ""


class FakeCache:
    def __init__(self, *entries: Entry, first_container: str = ""):
        self.by_fqn = {e.fqn: e for e in entries}
        self.first_container = first_container

    def get(self, fqn):
        return self.by_fqn.get(fqn)

    def find_content(self, digest, meta):
        return next((e for e in self.by_fqn.values() if e.digest == digest and e.meta == meta), None)

    def __len__(self):
        return len(self.by_fqn)


def cached(c: ConstantSpec, owner="prefill", device=("cpu", -1)) -> Entry:
    return Entry(c.fqn, c.name, owner, c.meta(*device), c.digest, c.mutated, c.storage)


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
    assert POLICIES == (
        "no-sharing",
        "name-only",
        "refuse-on-mismatch",
        "decline-on-mismatch",
        "verify-always",
        "fingerprint",
        "content-dedup",
        "blind-share",
        "fqn-weight-cache",
    )
    with pytest.raises(ValueError, match="unknown policy 'nope'.*fingerprint"):
        get_policy("nope")


def test_compare_metadata_reports_every_field_in_upstream_order():
    a = TensorMeta("float32", (4, 4), (4, 1), "cuda", 0)
    b = TensorMeta("float16", (4, 4), (1, 4), "cuda", 1)
    comps = compare_metadata(a, b)
    assert [c.field for c in comps] == list(MetadataField)
    assert {c.field: c.equal for c in comps} == {
        MetadataField.DTYPE: False,
        MetadataField.RANK: True,
        MetadataField.SIZES: True,
        MetadataField.STRIDES: False,
        MetadataField.DEVICE_TYPE: True,
        MetadataField.DEVICE_INDEX: False,
    }


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
    assert d.comparisons == () and d.origin is TensorOrigin.CACHE
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
    assert out.failure == (
        "Constant '_tensor_constant0' in method 'decode' is incompatible with the cached "
        "version from a previous method. Refusing to share."
    )
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
    assert d.decision is Decision.DECLINED and d.origin is TensorOrigin.WHOLE_BLOB and not d.enters_cache
    # "a constant rejected after extraction has to be left out of the user-managed pairs" (#21959)
    assert "_tensor_constant0" not in [x.constant.name for x in out.install]
    assert out.failure is None


def test_decline_compares_extracted_metadata_not_the_manifest():
    meta = {"_tensor_constant0": TensorMeta("float32", (4, 4), (1, 4), "cpu", -1), "head.weight": NEW.meta("cpu", -1)}
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
    assert d.origin is TensorOrigin.OWN_UPLOAD and d.digest_comparison is not None and not d.digest_comparison.equal
    assert all(c.equal for c in d.comparisons)


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
def test_fingerprint_shares_identical_constants_and_installs_everything(policy):
    plan, out = run(policy, view(A, NEW), FakeCache(cached(A)))
    d = by_name(out)
    assert d["_tensor_constant0"].decision is Decision.SHARED
    assert d["_tensor_constant0"].reason_code is Reason.FINGERPRINT_MATCH
    assert d["head.weight"].decision is Decision.LOADED and d["head.weight"].origin is TensorOrigin.OWN_UPLOAD
    # memory-optimal: every constant installed user-managed, nothing from a whole blob
    assert sorted(x.constant.name for x in out.install) == ["_tensor_constant0", "head.weight"]


KV = const("kv", fqn="kv", data="zeros", mutated=True, kind=ConstantKind.BUFFER)


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
@pytest.mark.parametrize("writer_first", [True, False], ids=["writer-cached", "reader-cached"])
def test_state_is_shared_exactly_when_provenance_says_one_buffer(policy, writer_first):
    """A buffer one method writes and another uses: shared when both were one tensor of the eager
    program (a KV cache), declined when they were two (same name, same zeros: the accidental case)."""
    mine, theirs = replace(KV, storage="t7"), replace(KV, storage="t7", mutated=not writer_first)
    if not writer_first:
        mine = replace(mine, mutated=True)
    plan, out = run(policy, view(mine), FakeCache(cached(replace(theirs, mutated=writer_first))))
    d = by_name(out)["kv"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.SAME_STATE
    other = replace(mine, storage="t8")
    plan, out = run(policy, view(other), FakeCache(cached(replace(theirs, mutated=writer_first))))
    d = by_name(out)["kv"]
    assert (
        d.decision is Decision.DECLINED and d.reason_code is Reason.OTHER_STATE and d.origin is TensorOrigin.OWN_UPLOAD
    )
    assert "another buffer" in d.reason


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
def test_state_of_unknown_provenance_is_never_shared(policy):
    plan, out = run(policy, view(KV), FakeCache(cached(KV)))  # storage "" on both sides
    d = by_name(out)["kv"]
    assert d.decision is Decision.DECLINED and "provenance unknown" in d.reason
    plan, out = run(policy, view(KV), FakeCache())
    d = by_name(out)["kv"]
    assert d.decision is Decision.LOADED and d.enters_cache  # a later method may share it


def test_content_dedup_does_not_match_someones_state_by_content():
    zeros = const("zeros_table", fqn="zeros_table", data="zeros")  # equal bytes to KV, another name
    plan, out = run("content-dedup", view(zeros), FakeCache(cached(replace(KV, storage="t1"))))
    assert by_name(out)["zeros_table"].decision is Decision.LOADED


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


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_fqn_is_never_looked_up(policy):
    """Issue 23 class 2 under every policy: an unnamed slot is no hit and no miss, and what fills it is
    the policy's own rule (a blob copy, an own upload, or nothing where upstream loads no blob)."""
    c = const("folded", fqn="", data="x")
    plan, out = run(policy, view(c, NEW), FakeCache())
    assert [lr.constant.name for lr in plan.lookups] == ([] if policy == "no-sharing" else ["head.weight"])
    d = by_name(out)["folded"]
    assert d.lookup is None and not d.enters_cache and out.failure is None
    expected = {
        "no-sharing": (Decision.PRIVATE, Reason.SHARING_DISABLED),
        "fqn-weight-cache": (Decision.NEVER_FILLED, Reason.EMPTY_FQN),
    }.get(policy, (Decision.PRIVATE, Reason.EMPTY_FQN))
    assert (d.decision, d.reason_code) == expected


@pytest.mark.parametrize("policy", POLICIES)
def test_repeated_fqn_in_one_method_loads_under_every_policy(policy):
    """Issue 23 class 1: no KeyError from the cache, one entry per FQN, every slot decided (under
    fqn-weight-cache one key with two contents is the exporter's refusal, so the twins hold one content)."""
    twin = replace(TWIN, digest=BIAS.digest) if policy == "fqn-weight-cache" else TWIN
    _, out = run(policy, view(twin, BIAS, name="m0"), FakeCache())
    assert out.failure is None and [d.constant.name for d in out.decisions] == ["layers_0_bias_twin", "layers_0_bias"]
    assert [d.enters_cache for d in out.decisions] == ([False, False] if policy == "no-sharing" else [True, False])
    assert Decision.NEVER_FILLED not in {d.decision for d in out.decisions}  # a first method always fills its slots


# ------------------------------------------------------------------ upstream's edge cases (issue 23)
# cuda_backend.cpp builds fqn_to_name[fqn] = name over the named constants only (the last name per
# FQN wins), extract_constants_map emplaces (the first tensor per FQN wins), and the all-hit branch
# of 922/e4b skips the blob: a slot no pair names is then never filled.

DENSE = ["name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always"]
TWIN = const("layers_0_bias_twin", fqn="layers.0.bias", shape=(2, 4, 8), dtype="float16", data="twin")
BIAS = const("layers_0_bias", fqn="layers.0.bias", shape=(2, 4, 8), dtype="float16", data="bias")


def decisions(out):
    return {d.constant.name: (d.decision, d.reason_code) for d in out.decisions}


@pytest.mark.parametrize("policy", DENSE + ["blind-share"])
def test_repeated_fqn_in_the_first_method_keeps_both_copies_and_caches_the_first(policy):
    plan, out = run(policy, view(TWIN, BIAS, name="m0"), FakeCache())
    d = by_name(out)
    assert plan.upload_whole_blob and out.failure is None and out.install == ()
    assert d["layers_0_bias_twin"].decision is Decision.LOADED and d["layers_0_bias_twin"].enters_cache
    assert d["layers_0_bias"].decision is Decision.PRIVATE and not d["layers_0_bias"].enters_cache
    assert d["layers_0_bias"].reason_code is Reason.SAME_KEY_IN_METHOD


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup"])
def test_our_policies_cache_the_first_slot_of_a_repeated_fqn_and_upload_the_rest(policy):
    """Not a crash (the cache holds one entry per FQN): the second slot gets its own upload."""
    _plan, out = run(policy, view(TWIN, BIAS, name="m0"), FakeCache())
    d = by_name(out)
    assert out.failure is None and d["layers_0_bias_twin"].enters_cache and not d["layers_0_bias"].enters_cache
    assert (d["layers_0_bias"].decision, d["layers_0_bias"].reason_code) == (
        Decision.PRIVATE,
        Reason.SAME_KEY_IN_METHOD,
    )
    assert d["layers_0_bias"].origin is TensorOrigin.OWN_UPLOAD


@pytest.mark.parametrize("policy", DENSE + ["blind-share"])
def test_repeated_fqn_in_a_later_method_re_points_only_the_last_slot(policy):
    cache = FakeCache(cached(TWIN, owner="m0"), first_container="m0")
    plan, out = run(policy, view(TWIN, BIAS, name="m1"), cache)
    d = by_name(out)
    assert [x.constant.name for x in out.install] == ["layers_0_bias"]
    assert d["layers_0_bias"].decision is Decision.SHARED
    if plan.upload_whole_blob:  # blind-share, verify-always (#21706 re-uploads): the twin keeps its copy
        assert d["layers_0_bias_twin"].decision is Decision.PRIVATE
    else:  # the all-hit branch of 922/e4b: the blob is skipped, nothing fills the twin
        assert d["layers_0_bias_twin"].decision is Decision.NEVER_FILLED
        assert policy in ("name-only", "refuse-on-mismatch", "decline-on-mismatch")
    # with a miss the blob is uploaded under every policy: the twin keeps its own copy
    plan, out = run(policy, view(TWIN, BIAS, NEW, name="m1"), cache)
    assert plan.upload_whole_blob and by_name(out)["layers_0_bias_twin"].decision is Decision.PRIVATE
    assert by_name(out)["layers_0_bias"].decision is Decision.SHARED


def test_repeated_fqn_is_compared_through_the_first_slot_upstream_extracts():
    """check_cached_constant_match gets extracted_map[fqn]: the first slot's tensor, not the last's."""
    other_shape = replace(TWIN, shape=(4, 4, 8), strides=(32, 8, 1), nbytes=256)
    cache = FakeCache(cached(TWIN, owner="m0"))
    _, out = run("decline-on-mismatch", view(other_shape, BIAS, NEW, name="m1"), cache)
    assert by_name(out)["layers_0_bias"].decision is Decision.DECLINED
    _, out = run("refuse-on-mismatch", view(other_shape, BIAS, NEW, name="m1"), cache)
    assert out.failure == refusal_message("layers.0.bias", "m1")


B16 = const("b", fqn="layers.1.bias", shape=(16, 4), data="m0")
B32 = const("b", fqn="layers.1.bias", shape=(32, 4), data="m1")
X = const("x", fqn="", shape=(4, 8), data="x")


def test_refusal_names_the_fqn_after_the_first_mismatching_field_as_922_logs_them():
    _, out = run("refuse-on-mismatch", view(B32, NEW, name="m1"), FakeCache(cached(B16, owner="m0")))
    assert out.failure == (
        "Constant 'layers.1.bias' in method 'm1' is incompatible with the cached version from a "
        "previous method. Refusing to share."
    )
    assert by_name(out)["b"].reason == (
        f"Constant 'layers.1.bias': size mismatch at dim 0 (cached=16, new=32); then: {out.failure}"
    )
    for policy in ("decline-on-mismatch", "verify-always"):  # e4b and 144: one log line
        _, out = run(policy, view(B32, NEW, name="m1"), FakeCache(cached(B16, owner="m0")))
        assert by_name(out)["b"].reason == (
            "Constant 'layers.1.bias': size mismatch at dim 0 (cached=16, new=32); then: Constant 'layers.1.bias' in "
            "method 'm1' differs from the cached copy; using this method's own copy instead of sharing"
        )


def test_mismatch_line_reports_only_the_first_field_in_upstream_order():
    from toolkit.core.policies.checks import check_cached_constant_match as line

    a = TensorMeta("float32", (4, 4), (4, 1), "cuda", 0)
    assert line("w", a, a) is None
    assert line("w", a, replace(a, dtype="bfloat16", shape=(4,))) == "Constant 'w': dtype mismatch (cached=6, new=15)"
    assert line("w", a, replace(a, shape=(4,), strides=(1,))) == "Constant 'w': dim mismatch (cached=2, new=1)"
    assert line("w", a, replace(a, shape=(4, 8), strides=(1, 4))) == (
        "Constant 'w': size mismatch at dim 1 (cached=4, new=8)"
    )
    assert line("w", a, replace(a, strides=(1, 4))) == "Constant 'w': stride mismatch at dim 0 (cached=4, new=1)"
    assert line("w", a, replace(a, device_index=1)) == "Constant 'w': device mismatch (cached=1:0, new=1:1)"


def test_refusal_names_the_first_mismatch_in_libstdcxx_unordered_map_order():
    """g++ 12 iterates {layers.1.bias, enc.w} (inserted in that order) as enc.w, layers.1.bias: 922 names enc.w."""
    w16, w32 = const("w", fqn="enc.w", shape=(16, 4), data="a"), const("w", fqn="enc.w", shape=(32, 4), data="b")
    _, out = run(
        "refuse-on-mismatch",
        view(B32, w32, NEW, name="m1"),
        FakeCache(cached(B16, owner="m0"), cached(w16, owner="m0")),
    )
    assert out.failure == refusal_message("enc.w", "m1")
    assert by_name(out)["w"].reason.endswith(
        "(upstream checks FQNs in its unordered_map's order: 'enc.w' first; "
        "'layers.1.bias' mismatch too, never checked)"
    )
    assert by_name(out)["b"].reason_code is Reason.LOAD_REFUSED
    _, out = run("refuse-on-mismatch", view(B32, NEW, name="m1"), FakeCache(cached(B16, owner="m0")))
    assert "unordered_map" not in by_name(out)["b"].reason


# Iteration orders printed by g++ 12.2 (libstdc++) for std::unordered_map<std::string, std::string> after
# map[k] = ... for each key in turn; the 30 keys cross both rehashes (13 -> 29 -> 59 buckets).
LIBSTDCXX_ORDERS = [
    (["layers.1.bias", "enc.w"], ["enc.w", "layers.1.bias"]),
    (["enc.w", "layers.1.bias", "enc.b", "dec.w"], ["dec.w", "enc.b", "layers.1.bias", "enc.w"]),
    (
        ["layers.1.bias", "enc.w", "enc.b", "dec.w", "dec.b", "head.w"],
        ["head.w", "dec.b", "dec.w", "enc.b", "enc.w", "layers.1.bias"],
    ),
    (
        [f"w{i}" for i in range(30)],
        "w29 w10 w14 w11 w16 w6 w5 w24 w19 w4 w3 w8 w22 w27 w7 w12 w13 w1 w9 w26 w0 "
        "w21 w15 w18 w17 w20 w23 w28 w2 w25".split(),
    ),
    (
        ["layers.1.bias", *(f"w{i}" for i in range(29))],
        "w28 w10 w14 w11 w16 w6 w5 w24 w19 w4 w3 w8 w22 w27 w7 w1 "
        "w9 w26 layers.1.bias w0 w21 w13 w12 w15 w18 w17 w20 w23 "
        "w2 w25".split(),
    ),
]


@pytest.mark.parametrize("keys,iterated", LIBSTDCXX_ORDERS)
def test_unordered_map_order_is_libstdcxx_s(keys, iterated):
    from toolkit.core.policies.unordered_map import libstdcxx_string_hash, unordered_map_order

    assert libstdcxx_string_hash("layers.0.bias") == 12144026510823220176  # std::hash<std::string> of g++ 12
    assert unordered_map_order(keys + keys[:3]) == iterated  # a key met again is not re-inserted


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++ (the fixed orders above always run)")
def test_unordered_map_order_agrees_with_gxx_on_random_keys(tmp_path):
    import random
    import subprocess

    from toolkit.core.policies.unordered_map import unordered_map_order

    src = tmp_path / "order.cpp"
    src.write_text(
        "#include <unordered_map>\n#include <string>\n#include <iostream>\nint main(){std::string l;"
        'std::unordered_map<std::string,std::string> m;while(std::getline(std::cin,l)){if(l=="--"){'
        'for(auto&p:m)std::cout<<p.first<<"\\n";std::cout<<"--\\n";'
        "m=std::unordered_map<std::string,std::string>();continue;}m[l]=l;}}"
    )
    subprocess.run(["g++", "-O1", "-std=c++17", str(src), "-o", str(tmp_path / "order")], check=True)
    rng = random.Random(7)
    sets = [
        [
            rng.choice(
                [
                    f"layers.{rng.randrange(300)}.weight",
                    f"_tensor_constant{rng.randrange(900)}",
                    "x" * rng.randrange(1, 20),
                ]
            )
            for _ in range(rng.choice([1, 5, 13, 14, 29, 30, 200, 700]))
        ]
        for _ in range(60)
    ]
    got = subprocess.run(
        [str(tmp_path / "order")],
        input="".join("\n".join(s) + "\n--\n" for s in sets),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("--\n")
    assert [g.splitlines() for g in got[:-1]] == [unordered_map_order(s) for s in sets]


def test_922_failed_init_records_the_misses_upstream_keeps_in_its_cache():
    """m1 = [enc.w (miss), b (hit, shape differs), enc.b, dec.w]: g++ walks dec.w, enc.b, layers.1.bias, enc.w, so
    upstream caches dec.w and enc.b before it refuses, and never reaches enc.w."""
    enc_w, enc_b, dec_w = (const(n.replace(".", "_"), fqn=n, data="m1") for n in ("enc.w", "enc.b", "dec.w"))
    _, out = run("refuse-on-mismatch", view(enc_w, B32, enc_b, dec_w, name="m1"), FakeCache(cached(B16, owner="m0")))
    assert out.failure == refusal_message("layers.1.bias", "m1")
    assert {n for n, d in by_name(out).items() if d.upstream_keeps} == {"enc_b", "dec_w"}
    assert all(d.decision is Decision.REFUSED for d in out.decisions)
    assert "upstream keeps it in its cache (added before 'layers.1.bias'" in by_name(out)["dec_w"].reason
    for policy in POLICIES:  # only 922's failed init leaves entries behind
        if policy != "refuse-on-mismatch":
            _, out = run(policy, view(enc_w, B32, enc_b, dec_w, name="m1"), FakeCache(cached(B16, owner="m0")))
            assert not any(d.upstream_keeps for d in out.decisions), policy


def test_dry_run_records_what_upstream_keeps_after_a_failed_init_and_restores_its_own_cache():
    from toolkit.core import events as ev
    from toolkit.workflows.dry_run import dry_run

    enc_w, enc_b, dec_w = (const(n.replace(".", "_"), fqn=n, data="m1") for n in ("enc.w", "enc.b", "dec.w"))
    a = dry_run(_program(("m0", [B16]), ("m1", [enc_w, B32, enc_b, dec_w]), ("m2", [enc_b])), "refuse-on-mismatch")
    assert a.session.failed_method == "m1"
    a.session.load_method("m2")  # a caller who goes on loading
    rows = a.session.decisions.set_index(["method", "name"])
    assert rows["upstream_keeps"].to_dict() == {
        ("m0", "b"): False,
        ("m1", "enc_w"): False,
        ("m1", "b"): False,
        ("m1", "enc_b"): True,
        ("m1", "dec_w"): True,
        ("m2", "enc_b"): False,
    }
    left = a.session.log.of_type(ev.CacheEntryLeftUpstream)
    assert [(e.method, e.name, e.fqn) for e in left] == [("m1", "enc_b", "enc.b"), ("m1", "dec_w", "dec.w")]
    # the toolkit's cache is restored: m2 loads enc.b itself, where upstream would share m1's leaked tensor
    assert rows.loc[("m2", "enc_b"), "decision"] == "loaded"


@pytest.mark.parametrize("policy", DENSE + ["blind-share"])
def test_an_unnamed_constant_is_no_miss_and_is_never_filled_in_the_all_hit_branch(policy):
    plan, out = run(policy, view(B32, X, name="m1"), FakeCache(cached(B16, owner="m0"), first_container="m0"))
    got = decisions(out)
    assert out.failure is None  # 922 does not refuse: the hit is never compared
    if policy == "verify-always":  # #21706 re-uploads: x gets its copy, b's shape mismatch declines it
        assert got == {"b": (Decision.DECLINED, Reason.METADATA_MISMATCH), "x": (Decision.PRIVATE, Reason.EMPTY_FQN)}
    elif policy == "blind-share":  # every method has its own blob; b re-pointed, unchecked
        assert got == {"b": (Decision.SHARED, Reason.NAME_HIT), "x": (Decision.PRIVATE, Reason.EMPTY_FQN)}
    else:
        assert not plan.upload_whole_blob
        assert got["b"][0] is Decision.SHARED and got["x"] == (Decision.NEVER_FILLED, Reason.BLOB_SKIPPED)
    # a method with no named constant at all takes the all-hit branch too
    plan, out = run(policy, view(X, name="m1"), FakeCache())
    assert by_name(out)["x"].decision is (Decision.NEVER_FILLED if policy in DENSE[:3] else Decision.PRIVATE)
    plan, out = run(VerifyAlways(blob_available=False), view(X, name="m1"), FakeCache())
    assert by_name(out)["x"].decision is Decision.NEVER_FILLED


def test_blind_share_first_container_is_the_first_with_constants_named_or_not():
    t0 = const("t0", fqn="", data="m0")
    _, out = run("blind-share", view(t0, name="m0"), FakeCache())
    assert out.first_container  # upstream sets constants_extracted_ though nothing was extracted by FQN
    _, out = run("blind-share", view(name="m0"), FakeCache())
    assert not out.first_container  # num_constants == 0: the flag stays unset
    named = const("t0", fqn="_tensor_constant0", data="m1")
    _, out = run("blind-share", view(named, name="m1"), FakeCache(first_container="m0"))
    assert decisions(out) == {"t0": (Decision.PRIVATE, Reason.NOT_IN_FIRST_METHOD)} and not out.first_container


def _program(*methods):
    from toolkit.core.model import FileRecord, MethodSpec, Program
    from toolkit.sources.directory import PLACEHOLDER_SHA256

    files = {"weights.blob": FileRecord(PLACEHOLDER_SHA256, 0)}
    specs = []
    for name, consts in methods:
        files[f"{name}.so"] = FileRecord(PLACEHOLDER_SHA256, 0)
        specs.append(
            MethodSpec(
                name=name,
                so_file=f"{name}.so",
                blob_file="weights.blob",
                reference_file="",
                blob_bytes=sum(c.nbytes for c in consts),
                num_inputs=1,
                num_outputs=1,
                constants=tuple(replace(c, file="weights.blob") for c in consts),
            )
        )
    return Program(
        name="edge",
        description="issue 23",
        device="cpu",
        torch_version="synthetic",
        created_utc="",
        methods=tuple(specs),
        files=files,
    )


@pytest.mark.parametrize("policy", ["name-only", "refuse-on-mismatch", "decline-on-mismatch"])
def test_dry_run_says_a_never_filled_slot_is_not_runnable(policy):
    from toolkit.core.vocab import DataProblem, MethodOutcome
    from toolkit.workflows.dry_run import dry_run

    a = dry_run(_program(("m0", [B16]), ("m1", [B32, X])), policy)
    assert a.status == "loaded"
    v = {m.method: m for m in a.verdict.methods}
    assert v["m1"].outcome is MethodOutcome.NOT_RUNNABLE and "never filled" in v["m1"].reason
    row = a.decisions.set_index(["method", "name"]).loc[("m1", "x")]
    assert row["decision"] == "never filled" and row["data_problem"] == DataProblem.SLOT_NEVER_FILLED.value
    # the repeated FQN loads (no KeyError from the cache) and the twin is never filled in m1
    a = dry_run(_program(("m0", [TWIN, BIAS]), ("m1", [TWIN, BIAS])), policy)
    assert a.status == "loaded"
    assert {m.method: m.outcome for m in a.verdict.methods}["m1"] is MethodOutcome.NOT_RUNNABLE


def test_dry_run_blind_share_shares_nothing_after_an_unnamed_first_method():
    from toolkit.workflows.dry_run import dry_run

    t1, t2 = (const("t0", fqn="_tensor_constant0", data=d) for d in ("m1", "m2"))
    a = dry_run(_program(("m0", [const("t0", fqn="", data="m0")]), ("m1", [t1]), ("m2", [t2])), "blind-share")
    assert set(a.decisions["decision"]) == {"private"}


def test_policy_objects_are_reusable_and_named():
    for name in POLICIES:
        p = get_policy(name)
        assert p.name is PolicyName(name) and get_policy(p) is p
    assert Fingerprint.memory_optimal and not get_policy("decline-on-mismatch").memory_optimal


# ------------------------------------------------------------------ blind-share (#18667)


def test_blind_share_first_method_caches_everything_later_ones_share_unchecked():
    plan, out = run("blind-share", view(A, NEW, name="prefill"), FakeCache())
    assert plan.upload_whole_blob and all(d.enters_cache and d.origin is TensorOrigin.WHOLE_BLOB for d in out.decisions)
    other = const("other.weight", fqn="other.weight", data="x", kind=ConstantKind.PARAMETER)
    plan, out = run("blind-share", view(A_OTHER_SHAPE, other), FakeCache(cached(A)))
    assert plan.upload_whole_blob and "#18667" in plan.blob_reason  # its own full blob, always
    d = by_name(out)
    # a shape mismatch is not looked at: re-pointed at the first method's tensor
    assert d["_tensor_constant0"].decision is Decision.SHARED and d["_tensor_constant0"].comparisons == ()
    assert d["_tensor_constant0"].origin is TensorOrigin.CACHE and d["_tensor_constant0"].reason_code is Reason.NAME_HIT
    # not in the first method: own copy, never cached, never shared later
    assert d["other.weight"].decision is Decision.PRIVATE and not d["other.weight"].enters_cache
    assert d["other.weight"].reason_code is Reason.NOT_IN_FIRST_METHOD
    assert [x.constant.name for x in out.install] == ["_tensor_constant0"]


def test_blind_share_empty_fqn_and_mutated_buffers():
    folded = const("folded", fqn="", data="x")
    kv = const("kv", fqn="kv", data="zeros", mutated=True, kind=ConstantKind.BUFFER)
    plan, out = run("blind-share", view(folded, kv), FakeCache(cached(kv)))
    d = by_name(out)
    assert d["folded"].decision is Decision.PRIVATE and d["folded"].reason_code is Reason.EMPTY_FQN
    assert d["kv"].decision is Decision.SHARED  # KV-cache sharing was the point of #18667


# ------------------------------------------------------------------ fqn-weight-cache (1.5.x)


def test_fqn_weight_keys():
    w = const("lin_weight", fqn="lin.weight", kind=ConstantKind.PARAMETER)
    t = replace(const("_tensor_constant0"), so_key="abc_so_blob")
    assert fqn_weight_key(w, "decode", "cuda") == "cuda_fqn_weight:cuda:lin.weight"
    assert fqn_weight_key(w, "decode", "cpu") == "cuda_fqn_weight:cpu:lin.weight"
    assert fqn_weight_key(t, "decode", "cuda") == "cuda_fqn_weight:cuda:abc_so_blob:_tensor_constant0"
    # no .so key known (a program in memory): each method its own library
    assert (
        fqn_weight_key(const("_tensor_constant0"), "decode", "cuda")
        == "cuda_fqn_weight:cuda:decode_so_blob:_tensor_constant0"
    )
    # the key a .pte recorded wins
    assert fqn_weight_key(replace(w, storage_key="cuda_fqn_weight:cuda:x"), "decode", "cpu") == "cuda_fqn_weight:cuda:x"


def _keyed(c, owner="prefill", device=("cpu", -1)):
    e = cached(c, owner, device)
    e.fqn = fqn_weight_key(c, owner, device[0])
    return e


def test_fqn_weight_cache_shares_a_storage_key_and_never_uploads_a_blob():
    w = const("lin_weight", fqn="lin.weight", data="w", kind=ConstantKind.PARAMETER)
    pol = get_policy("fqn-weight-cache")
    assert pol.memory_optimal
    plan, out = run("fqn-weight-cache", view(w, name="prefill"), FakeCache())
    d = by_name(out)["lin_weight"]
    assert not plan.upload_whole_blob
    assert d.decision is Decision.LOADED and d.enters_cache and d.origin is TensorOrigin.OWN_UPLOAD
    assert d.key == "cuda_fqn_weight:cpu:lin.weight"  # what the 1.5.x runtime caches it under
    assert d.constant.fqn == "lin.weight"  # the FQN stays the FQN
    plan, out = run("fqn-weight-cache", view(w), FakeCache(_keyed(w)))
    d = by_name(out)["lin_weight"]
    assert d.decision is Decision.SHARED and d.reason_code is Reason.STORAGE_KEY_HIT and d.origin is TensorOrigin.CACHE
    assert d.digest_comparison.equal


def test_fqn_weight_cache_refuses_at_export_one_key_with_other_data():
    w = const("lin_weight", fqn="lin.weight", data="encoder", kind=ConstantKind.PARAMETER)
    w2 = replace(w, digest=const("x", data="decoder").digest)
    plan, out = run("fqn-weight-cache", view(w2, NEW), FakeCache(_keyed(w)))
    assert out.stage is Stage.EXPORT
    assert out.failure == (
        "Duplicate key cuda_fqn_weight:cpu:lin.weight with different data. "
        "Existing data size: 64 bytes. New data size: 64 bytes."
    )
    assert {d.decision for d in out.decisions} == {Decision.REFUSED}
    assert by_name(out)["lin_weight"].reason_code is Reason.EXPORT_REFUSED
    assert by_name(out)["head.weight"].reason_code is Reason.LOAD_REFUSED


def test_fqn_weight_cache_lifted_constants_are_namespaced_by_their_so():
    mine = replace(A_OTHER_DATA, so_key="decode_lib_so_blob")
    theirs = replace(A, so_key="prefill_lib_so_blob")
    plan, out = run("fqn-weight-cache", view(mine), FakeCache(_keyed(theirs)))
    d = by_name(out)["_tensor_constant0"]
    assert out.failure is None and d.decision is Decision.LOADED and d.enters_cache
    assert d.key == "cuda_fqn_weight:cpu:decode_lib_so_blob:_tensor_constant0"
    # the same .so (one graph compiled twice): one key, other data: the exporter refuses
    same = replace(A_OTHER_DATA, so_key="prefill_lib_so_blob")
    plan, out = run("fqn-weight-cache", view(same), FakeCache(_keyed(theirs)))
    assert out.failure.startswith(
        "Duplicate key cuda_fqn_weight:cpu:prefill_lib_so_blob:_tensor_constant0 with different data"
    )


def test_fqn_weight_cache_per_device_and_other_views():
    w = const("w", fqn="w", data="same", kind=ConstantKind.PARAMETER)
    plan, out = run("fqn-weight-cache", view(w, device=("cuda", 1)), FakeCache(_keyed(w, device=("cuda", 0))))
    d = by_name(out)["w"]
    assert d.decision is Decision.LOADED and d.key == "cuda_fqn_weight:cuda:w@cuda:1"
    other = replace(w, digest=const("x", data="other").digest)  # the export check spans devices
    plan, out = run("fqn-weight-cache", view(other, device=("cuda", 1)), FakeCache(_keyed(w, device=("cuda", 0))))
    assert out.stage is Stage.EXPORT and out.failure.startswith("Duplicate key cuda_fqn_weight:cuda:w with")
    # the same bytes viewed otherwise: a view of the cached storage, nothing uploaded
    t = replace(w, strides=(1, 4))
    plan, out = run("fqn-weight-cache", view(t), FakeCache(_keyed(w)))
    d = by_name(out)["w"]
    assert (d.decision, d.reason_code, d.origin) == (Decision.SHARED, Reason.VIEW_OF_STORAGE, TensorOrigin.CACHE)
    assert d.view_of == "cuda_fqn_weight:cpu:w" and not d.enters_cache
    # two slots of one key in one method: one storage, the cache one entry
    w_again = replace(w, name="w_0")
    plan, out = run("fqn-weight-cache", view(w, w_again, name="prefill"), FakeCache())
    assert [d.decision for d in out.decisions] == [Decision.LOADED, Decision.SHARED]
    assert out.decisions[1].reason_code is Reason.SAME_KEY_IN_METHOD and out.decisions[1].shared_from.name == "w"
    assert [d.enters_cache for d in out.decisions] == [True, False]


def test_fqn_weight_cache_fails_a_dtype_the_manifest_parser_rejects():
    """is_supported_cuda_fqn_dtype (ETCUDAFQN1 and ETCUDAFQN3) knows SlimTensor's nine dtypes: float64 is not one."""
    w = const("w", fqn="w", data="a", kind=ConstantKind.PARAMETER)
    d64 = const("d", fqn="lin.scale", dtype="float64", data="d", kind=ConstantKind.PARAMETER)
    plan, out = run("fqn-weight-cache", view(w, d64, name="prefill"), FakeCache())
    assert out.failure == "Malformed CUDA FQN weight manifest" and out.stage is Stage.LOAD
    assert by_name(out)["d"].reason.startswith("'d' is float64, a dtype the manifest parser rejects")
    assert {x.decision for x in out.decisions} == {Decision.REFUSED} and not any(x.enters_cache for x in out.decisions)
    _, out = run("fqn-weight-cache", view(w, replace(d64, dtype="int16"), name="prefill"), FakeCache())
    assert out.failure is None


def test_fqn_weight_cache_an_unnamed_parameter_fails_the_bind_an_unnamed_buffer_is_never_filled():
    """No manifest entry names it; torch's assert_all_constants raises for a parameter, skips a buffer or tensor
    constant (and an empty parameter), and the FQN path loads no blob."""
    w = const("w", fqn="w", data="a", kind=ConstantKind.PARAMETER)
    p = const("p", fqn="", data="p", kind=ConstantKind.PARAMETER)
    _, out = run("fqn-weight-cache", view(w, p, name="prefill"), FakeCache())
    assert out.failure == "Failed to bind CUDA FQN weights"
    assert "'Cannot find constants p in constants_map!'" in by_name(out)["p"].reason
    assert {x.decision for x in out.decisions} == {Decision.REFUSED}
    for kind in (ConstantKind.BUFFER, ConstantKind.LIFTED_CONSTANT):
        _, out = run("fqn-weight-cache", view(w, replace(p, kind=kind), name="prefill"), FakeCache())
        assert out.failure is None
        assert decisions(out) == {
            "w": (Decision.LOADED, Reason.FIRST_SEEN),
            "p": (Decision.NEVER_FILLED, Reason.EMPTY_FQN),
        }
        assert by_name(out)["p"].origin is not TensorOrigin.OWN_UPLOAD  # nothing is uploaded for it


def test_dry_run_of_fqn_weight_cache_says_an_unnamed_buffer_is_not_runnable():
    from toolkit.core.vocab import MethodOutcome
    from toolkit.workflows.dry_run import dry_run

    w = const("w", fqn="w", data="a", kind=ConstantKind.PARAMETER)
    a = dry_run(_program(("m0", [w, const("b", fqn="", data="b", kind=ConstantKind.BUFFER)])), "fqn-weight-cache")
    assert {m.method: m.outcome for m in a.verdict.methods} == {"m0": MethodOutcome.NOT_RUNNABLE}
    a = dry_run(_program(("m0", [w, const("p", fqn="", data="p", kind=ConstantKind.PARAMETER)])), "fqn-weight-cache")
    assert a.session.failed_method == "m0" and a.session.error == "Failed to bind CUDA FQN weights"


def test_fqn_weight_cache_export_refuses_the_whole_program_before_any_load():
    """1.5.x's exporter collects every method into one store, in order: the first key met again
    with other bytes refuses the program; identical bytes under one key are stored once."""
    pol = get_policy("fqn-weight-cache")
    w = const("lin_weight", fqn="lin.weight", data="encoder", kind=ConstantKind.PARAMETER)
    w_other = replace(w, digest=const("x", data="decoder").digest)
    b = const("lin_bias", fqn="lin.bias", data="b", kind=ConstantKind.PARAMETER)
    methods = [view(w, b, name="encoder"), view(b, w_other, name="decoder"), view(w, name="third")]
    refusal = pol.export(methods)
    assert refusal is not None and refusal.method == "decoder" and refusal.constant.name == "lin_weight"
    assert refusal.key == "cuda_fqn_weight:cpu:lin.weight" and refusal.first.owner_method == "encoder"
    assert refusal.message == (
        "Duplicate key cuda_fqn_weight:cpu:lin.weight with different data. "
        "Existing data size: 64 bytes. New data size: 64 bytes."
    )
    outcomes = refusal.outcomes(methods)
    assert [o.method for o in outcomes] == ["encoder", "decoder", "third"]
    assert all(o.stage == "export" and o.failure == refusal.message for o in outcomes)
    assert all(d.decision is Decision.REFUSED for o in outcomes for d in o.decisions)
    culprit = by_name(outcomes[1])["lin_weight"]
    assert culprit.reason_code is Reason.EXPORT_REFUSED and culprit.shared_from is refusal.first
    assert not culprit.digest_comparison.equal and culprit.key == refusal.key
    assert {d.reason_code for o in outcomes for d in o.decisions if d is not culprit} == {Reason.LOAD_REFUSED}
    # identical bytes under one key (the shared bias), and lifted constants of two .so files: exported
    t1, t2 = replace(A, so_key="one_so_blob"), replace(A_OTHER_DATA, so_key="two_so_blob")
    assert pol.export([view(w, b, t1, name="p"), view(b, t2, name="d")]) is None
    assert (
        pol.export([view(t1, name="p"), view(replace(t2, so_key="one_so_blob"), name="d")]).key
        == "cuda_fqn_weight:cpu:one_so_blob:_tensor_constant0"
    )
    # a key read from an exported .pte names its storage: two views of one storage are one content
    keyed = replace(w, storage_key="cuda_fqn_weight:cuda:lin.weight", file="a.ptd", offset=128)
    view2 = replace(keyed, digest=w_other.digest, shape=(2, 4), nbytes=32)
    assert pol.export([view(keyed, name="p"), view(view2, name="d")]) is None
    assert pol.export([view(keyed, name="p"), view(replace(view2, offset=256), name="d")]) is not None
    # no other policy models an export stage
    assert all(get_policy(p).export(methods) is None for p in POLICIES if p != "fqn-weight-cache")


def test_every_policy_says_what_it_reproduces():
    from toolkit.core.policies import POLICY_CLASSES
    from toolkit.core.policies.base import UpstreamRevision

    for name, cls in POLICY_CLASSES.items():
        assert cls.summary and cls.reproduces_text(), name
        for r in cls.reproduces:
            assert isinstance(r, UpstreamRevision) and r.pr > 0, name
            assert r.commit == "" or re.fullmatch(r"[0-9a-f]{10}", r.commit), (name, r)
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r.date), (name, r)
    blind = POLICY_CLASSES[PolicyName.BLIND_SHARE].reproduces[0]
    assert (blind.pr, blind.commit, blind.date) == (18667, "266ff2d71d", "2026-04-10")
    fqn = POLICY_CLASSES[PolicyName.FQN_WEIGHT_CACHE].reproduces[0]
    assert (fqn.pr, fqn.commit, fqn.version) == (21823, "", "1.5.x")  # the merge commit is not established
    assert "commit not established" in POLICY_CLASSES[PolicyName.FQN_WEIGHT_CACHE].reproduces_text()
    assert POLICY_CLASSES[PolicyName.DECLINE_ON_MISMATCH].reproduces[0].commit == "e4b18fa9aa"
    assert "#21706 (144ce1bc77, 2026-08-19)" in POLICY_CLASSES[PolicyName.VERIFY_ALWAYS].reproduces_text()
    assert POLICY_CLASSES[PolicyName.FINGERPRINT].reproduces == ()
    assert POLICY_CLASSES[PolicyName.FINGERPRINT].reproduces_text().startswith("ours")


def _policy_rows(readme: str) -> dict[str, str]:
    """The README's policy table: policy name -> its row."""
    rows = {}
    for line in readme.splitlines():
        m = re.match(r"\| `([a-z-]+)` \|", line)
        if m:
            rows.setdefault(m.group(1), line)
    return rows


def test_the_docs_name_every_revision_the_policies_reproduce():
    """docs/upstream.md names every PR and commit of every policy's ``reproduces``; the README's
    policy table names each policy's own revision (its PR, and its commit where established)."""
    from toolkit.core.policies import POLICY_CLASSES

    docs = (REPO / "docs" / "upstream.md").read_text(encoding="utf-8")
    rows = _policy_rows((REPO / "README.md").read_text(encoding="utf-8"))
    named_in_docs = set(re.findall(r"#(\d+)", docs)) | set(re.findall(r"`([0-9a-f]{10})`", docs))
    for name, cls in POLICY_CLASSES.items():
        for r in cls.reproduces:
            assert str(r.pr) in named_in_docs, (name, r.pr)
            assert not r.commit or r.commit in named_in_docs, (name, r.commit)
        row = rows[name.value]
        if cls.reproduces:
            own = cls.reproduces[0]
            assert f"#{own.pr}" in row and own.commit in row, (name, row)
        else:
            assert "ours" in row, (name, row)


@pytest.mark.slow
def test_fqn_weight_cache_on_our_samples_refuses_what_1_5_1_refuses(built_sample):
    """Our directories' .so key is ExecuTorch's: sha256 of the .so + "_so_blob", from the file
    record.  total_collision's two methods are one graph: AOTInductor compiles byte-identical
    .so files (compiled separately), so both lifted tables get one key with other data, and
    1.5.1's exporter refuses (docs/upstream.md, "the seed's case")."""
    from toolkit.workflows.dry_run import dry_run

    prog = built_sample("total_collision")
    so = {m.name: prog.files[m.so_file].sha256 for m in prog.methods}
    assert so["prefill"] == so["decode"]

    def lifted_keys(p):
        return {m.name: {c.so_key for c in m.constants if c.fqn.startswith("_tensor_constant")} for m in p.methods}

    assert lifted_keys(prog) == {m.name: {f"{so[m.name]}_so_blob"} for m in prog.methods}
    a = dry_run(prog, "fqn-weight-cache")
    key = f"cuda_fqn_weight:cpu:{so['prefill']}_so_blob:_tensor_constant0"
    assert a.status == "failed" and a.session.failed_method == "decode"
    assert (
        a.session.error == f"Duplicate key {key} with different data. Existing data size: 16384 bytes. "
        "New data size: 16384 bytes."
    )
    other = built_sample("partial_collision_shape")  # two graphs, two .so files: two keys
    assert len(set().union(*lifted_keys(other).values())) == 2
    assert dry_run(other, "fqn-weight-cache").status == "loaded"


@pytest.mark.parametrize("policy", DENSE)
def test_repeated_fqn_that_misses_beside_a_hit_re_points_the_last_slot_at_the_first_slots_tensor(policy):
    """Step 3 runs when the method has a hit: fqn_to_name's last slot gets the entry just cached from its blob."""
    cache = FakeCache(cached(B16, owner="m0"))
    plan, out = run(policy, view(B16, TWIN, BIAS, name="m1"), cache)
    d = by_name(out)
    assert plan.upload_whole_blob and out.failure is None
    assert d["layers_0_bias_twin"].decision is Decision.LOADED and d["layers_0_bias_twin"].enters_cache
    bias = d["layers_0_bias"]
    assert (bias.decision, bias.reason_code, bias.origin) == (
        Decision.SHARED,
        Reason.SAME_KEY_IN_METHOD,
        TensorOrigin.WHOLE_BLOB,
    )
    assert (bias.shared_from.owner_method, bias.shared_from.name) == ("m1", "layers_0_bias_twin")
    assert not bias.enters_cache and "layers_0_bias" in [x.constant.name for x in out.install]
    # no hit: step 3 is skipped, both slots keep their own copies
    _, out = run(policy, view(TWIN, BIAS, NEW, name="m1"), FakeCache(cached(B16, owner="m0")))
    assert by_name(out)["layers_0_bias"].decision is Decision.PRIVATE


@pytest.mark.parametrize("policy", DENSE)
def test_dry_run_of_the_re_pointed_twin_runs_on_the_first_slots_data(policy):
    from toolkit.core.vocab import DataProblem, MethodOutcome
    from toolkit.workflows.dry_run import dry_run

    a = dry_run(_program(("m0", [B16]), ("m1", [B16, TWIN, BIAS])), policy)
    assert a.status == "loaded"
    assert {m.method: m.outcome for m in a.verdict.methods}["m1"] is MethodOutcome.WRONG
    row = a.decisions.set_index(["method", "name"]).loc[("m1", "layers_0_bias")]
    assert (row["decision"], row["shared_from"]) == ("shared", "m1/layers_0_bias_twin")
    assert row["data_problem"] == DataProblem.CONTENT_DIFFERS.value
