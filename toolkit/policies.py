"""Sharing policies: pure decision logic, no I/O, no torch.

A policy decides, per method, in two phases that mirror ExecuTorch's CUDA backend
(``backends/cuda/runtime/cuda_backend.cpp``):

1. :meth:`Policy.plan` looks every constant up in the shared cache and says whether
   the method's whole weights blob must be uploaded.
2. :meth:`Policy.decide` takes the metadata of the freshly extracted tensors (only
   when the blob was uploaded) and decides every constant.

The loader (:mod:`toolkit.loader`) carries a decision out against the real AOTInductor
runtime; :func:`toolkit.analysis.analyze` runs the same two calls on manifest data
alone.  Both see identical decisions because the logic lives only here.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Protocol, Sequence

from .model import ConstantSpec, TensorMeta, shown
from .vocab import Decision, Lookup, MetadataField, PolicyName, Reason, Source, parse

# ------------------------------------------------------------------ inputs


class CachedView(Protocol):
    """What a policy may know about a cache entry."""

    fqn: str
    name: str
    owner_method: str
    meta: TensorMeta
    digest: str


class CacheView(Protocol):
    def get(self, fqn: str) -> CachedView | None: ...

    def find_content(self, digest: str, meta: TensorMeta) -> CachedView | None: ...


@dataclass(frozen=True)
class MethodView:
    name: str
    device_type: str
    device_index: int
    constants: tuple[ConstantSpec, ...]

    def meta(self, c: ConstantSpec) -> TensorMeta:
        return c.meta(self.device_type, self.device_index)


# ------------------------------------------------------------------ outputs


@dataclass(frozen=True)
class FieldComparison:
    field: MetadataField
    cached: str
    new: str

    @property
    def equal(self) -> bool:
        return self.cached == self.new


@dataclass(frozen=True)
class DigestComparison:
    cached: str
    new: str

    @property
    def equal(self) -> bool:
        return self.cached == self.new


@dataclass(frozen=True)
class LookupResult:
    constant: ConstantSpec
    result: Lookup
    entry: CachedView | None


@dataclass(frozen=True)
class Plan:
    method: MethodView
    lookups: tuple[LookupResult, ...]
    upload_whole_blob: bool
    blob_reason: str

    @functools.cached_property
    def _by_name(self) -> dict[str, LookupResult]:
        return {lr.constant.name: lr for lr in self.lookups}

    def lookup(self, name: str) -> LookupResult | None:
        """O(1): decide() asks once per constant, so a scan would make a method of K constants cost K^2."""
        return self._by_name.get(name)


@dataclass(frozen=True)
class ConstantDecision:
    constant: ConstantSpec
    lookup: Lookup | None
    decision: Decision
    reason_code: Reason
    reason: str
    source: Source
    shared_from: CachedView | None = None
    comparisons: tuple[FieldComparison, ...] = ()
    digest_comparison: DigestComparison | None = None
    enters_cache: bool = False

    @property
    def installed_user_managed(self) -> bool:
        """True when the container is pointed at a tensor not from its own blob."""
        return self.source is not Source.WHOLE_BLOB and self.decision is not Decision.REFUSED


@dataclass(frozen=True)
class Outcome:
    method: str
    decisions: tuple[ConstantDecision, ...]
    failure: str | None = None  # set when the policy fails the whole load

    @property
    def install(self) -> tuple[ConstantDecision, ...]:
        return tuple(d for d in self.decisions if d.installed_user_managed)


# ------------------------------------------------------------------ helpers


def compare_metadata(cached: TensorMeta, new: TensorMeta) -> tuple[FieldComparison, ...]:
    """Field by field, in cuda_backend.cpp's order: dtype, rank, sizes, strides, device type, index."""
    pairs = [
        (MetadataField.DTYPE, cached.dtype, new.dtype),
        (MetadataField.RANK, cached.rank, new.rank),
        (MetadataField.SIZES, cached.shape, new.shape),
        (MetadataField.STRIDES, cached.strides, new.strides),
        (MetadataField.DEVICE_TYPE, cached.device_type, new.device_type),
        (MetadataField.DEVICE_INDEX, cached.device_index, new.device_index),
    ]
    return tuple(FieldComparison(f, shown(a), shown(b)) for f, a, b in pairs)


def _mismatch_text(comps: Sequence[FieldComparison]) -> str:
    return "; ".join(f"{c.field.value}: cached {c.cached} vs new {c.new}" for c in comps if not c.equal)


def device_label(device_type: str, device_index: int) -> str:
    return "cpu" if device_type == "cpu" else f"{device_type}:{device_index}"


def slot_problem(have: TensorMeta, have_bytes: int, slot: ConstantSpec, device_type: str,
                 device_index: int) -> str | None:
    """Why a tensor (``have``, with ``have_bytes`` readable bytes) cannot fill ``slot``, or None.

    AOTInductor checks nothing when a tensor is installed user-managed: a smaller tensor
    is read out of bounds, another dtype is misread, another device faults.  The loader
    refuses to run such a method; the dry-run analysis predicts the same.
    """
    if (have.device_type, have.device_index) != (device_type, device_index):
        return (f"tensor on {device_label(have.device_type, have.device_index)} cannot fill a slot on "
                f"{device_label(device_type, device_index)}")
    if have.dtype != slot.dtype:
        return f"dtype {have.dtype} cannot fill a {slot.dtype} slot"
    if have_bytes < slot.nbytes:
        return f"{have_bytes} bytes cannot fill a slot that reads {slot.nbytes} bytes (out-of-bounds read)"
    return None


def refusal_message(name: str, method: str) -> str:
    """The error ExecuTorch printed before #21959, verbatim."""
    return (
        f"Constant '{name}' in method '{method}' is incompatible with the cached version "
        "from a previous method. Refusing to share."
    )


def _lookups(method: MethodView, cache: CacheView, eligible) -> tuple[LookupResult, ...]:
    out = []
    for c in method.constants:
        if not c.fqn or not eligible(c):
            continue
        entry = cache.get(c.fqn)
        out.append(LookupResult(c, Lookup.HIT if entry is not None else Lookup.MISS, entry))
    return tuple(out)


# ------------------------------------------------------------------ policies


class Policy(abc.ABC):
    """One sharing policy.  Stateless: all state lives in the cache the loader owns."""

    name: ClassVar[PolicyName]
    summary: ClassVar[str]
    reproduces: ClassVar[str]  # the upstream revision, or "ours"
    shares: ClassVar[bool] = True
    memory_optimal: ClassVar[bool] = False  # never uploads a whole blob; installs everything user-managed

    @abc.abstractmethod
    def plan(self, method: MethodView, cache: CacheView) -> Plan: ...

    @abc.abstractmethod
    def decide(self, plan: Plan, new_meta: Mapping[str, TensorMeta] | None, cache: CacheView) -> Outcome: ...

    def __repr__(self) -> str:
        return f"<policy {self.name.value}>"


class NoSharing(Policy):
    name = PolicyName.NO_SHARING
    summary = "every method uploads its own blob"
    reproduces = "ExecuTorch default (weight_sharing_across_methods off)"
    shares = False

    def plan(self, method, cache):
        return Plan(method, (), True, "sharing is off: every method uploads its own blob")

    def decide(self, plan, new_meta, cache):
        return Outcome(plan.method.name, tuple(
            ConstantDecision(c, None, Decision.PRIVATE, Reason.SHARING_DISABLED,
                             "sharing is disabled; the method uses its own blob", Source.WHOLE_BLOB)
            for c in plan.method.constants
        ))


class _ExecuTorchPolicy(Policy):
    """cuda_backend.cpp's weight_sharing_across_methods path, parametrised by revision."""

    compare_on_miss_path: ClassVar[bool]
    refuse_on_mismatch: ClassVar[bool]  # before #21959: a mismatch fails the whole load
    verify_all_hit: ClassVar[bool]  # #21706: re-upload in the all-hit branch to compare

    def __init__(self, blob_available: bool = True):
        # #21706 keeps name-only sharing when blob/extract entry points are unavailable.
        self.blob_available = blob_available

    def plan(self, method, cache):
        lookups = _lookups(method, cache, lambda c: True)
        has_unnamed = any(not c.fqn for c in method.constants)
        misses = [lr for lr in lookups if lr.result is Lookup.MISS]
        if misses or has_unnamed:
            return Plan(method, lookups, True, f"{len(misses)} cache miss(es): upload the whole blob")
        if self.verify_all_hit and self.blob_available and lookups:
            return Plan(method, lookups, True, "all names hit: re-upload the whole blob to compare (#21706)")
        return Plan(method, lookups, False, "all names hit: the blob is skipped")

    def decide(self, plan, new_meta, cache):
        m = plan.method
        decisions: list[ConstantDecision] = []
        failure: str | None = None
        for c in m.constants:
            lr = plan.lookup(c.name)
            if lr is None:  # constants with an empty FQN are skipped by the backend
                decisions.append(ConstantDecision(c, None, Decision.PRIVATE, Reason.EMPTY_FQN,
                                                  "no original FQN: never looked up", Source.WHOLE_BLOB))
                continue
            if lr.result is Lookup.MISS:
                decisions.append(ConstantDecision(c, Lookup.MISS, Decision.LOADED, Reason.FIRST_SEEN,
                                                  "first method with this FQN: loaded from its blob and cached",
                                                  Source.WHOLE_BLOB, enters_cache=True))
                continue
            entry = lr.entry
            assert entry is not None
            if not plan.upload_whole_blob:
                why = ("all names hit; the blob and extraction are unavailable, so sharing rests on the name alone (#21706)"
                       if self.verify_all_hit else
                       "every FQN of this method hit the cache: shared on the name alone, nothing compared")
                code = Reason.NO_BLOB_TO_COMPARE if self.verify_all_hit else Reason.NAME_HIT_UNCHECKED
                decisions.append(ConstantDecision(c, Lookup.HIT, Decision.SHARED, code, why, Source.CACHE, entry))
                continue
            if not self.compare_on_miss_path:
                decisions.append(ConstantDecision(c, Lookup.HIT, Decision.SHARED, Reason.NAME_HIT,
                                                  "name hit: shared without comparing", Source.CACHE, entry))
                continue
            if new_meta is None or c.name not in new_meta:
                raise ValueError(f"{self.name}: metadata of extracted constant {c.name!r} is required")
            comps = compare_metadata(entry.meta, new_meta[c.name])
            if all(x.equal for x in comps):
                decisions.append(ConstantDecision(
                    c, Lookup.HIT, Decision.SHARED, Reason.METADATA_MATCH,
                    "metadata equal to the cached tensor (data not compared)", Source.CACHE, entry, comps))
            elif self.refuse_on_mismatch:
                failure = refusal_message(c.name, m.name)
                decisions.append(ConstantDecision(c, Lookup.HIT, Decision.REFUSED, Reason.METADATA_MISMATCH,
                                                  f"{_mismatch_text(comps)}: {failure}", Source.WHOLE_BLOB,
                                                  entry, comps))
                break  # upstream returns at the first mismatch
            else:
                # #21959: keep this method's own copy; the rejected name must also stay out of
                # the user-managed pairs, or the container is pointed at a tensor it did not ask for.
                decisions.append(ConstantDecision(
                    c, Lookup.HIT, Decision.DECLINED, Reason.METADATA_MISMATCH,
                    f"{_mismatch_text(comps)}: declined, own copy kept", Source.WHOLE_BLOB, entry, comps))
        if failure is not None:
            decided = {d.constant.name for d in decisions}
            decisions = [d if d.decision is Decision.REFUSED else
                         ConstantDecision(d.constant, d.lookup, Decision.REFUSED, Reason.LOAD_REFUSED,
                                          f"method load failed: {failure}", Source.WHOLE_BLOB)
                         for d in decisions]
            decisions += [ConstantDecision(c, plan.lookup(c.name).result if plan.lookup(c.name) else None,
                                           Decision.REFUSED, Reason.LOAD_REFUSED,
                                           f"method load failed: {failure}", Source.WHOLE_BLOB)
                          for c in m.constants if c.name not in decided]
        return Outcome(m.name, tuple(decisions), failure)


class NameOnly(_ExecuTorchPolicy):
    name = PolicyName.NAME_ONLY
    summary = "share on name alone, never compare"
    reproduces = "the unchecked core of weight_sharing_across_methods"
    compare_on_miss_path = False
    refuse_on_mismatch = False
    verify_all_hit = False


class RefuseOnMismatch(_ExecuTorchPolicy):
    name = PolicyName.REFUSE_ON_MISMATCH
    summary = "compare metadata on the miss path; a mismatch fails the whole load; all-hit shares on name"
    reproduces = "ExecuTorch before #21959"
    compare_on_miss_path = True
    refuse_on_mismatch = True
    verify_all_hit = False


class DeclineOnMismatch(_ExecuTorchPolicy):
    name = PolicyName.DECLINE_ON_MISMATCH
    summary = "compare metadata on the miss path; decline a mismatch (own copy, not in the pairs); all-hit shares on name"
    reproduces = "ExecuTorch #21959 (main)"
    compare_on_miss_path = True
    refuse_on_mismatch = False
    verify_all_hit = False


class VerifyAlways(_ExecuTorchPolicy):
    name = PolicyName.VERIFY_ALWAYS
    summary = "like decline-on-mismatch, and re-upload the blob in the all-hit branch to compare metadata"
    reproduces = "ExecuTorch #21706 (closed)"
    compare_on_miss_path = True
    refuse_on_mismatch = False
    verify_all_hit = True


class Fingerprint(Policy):
    """Ours: a hit is shared only if metadata and the build-time content digest match.

    Decided from the manifest, so no device round trip is needed to check the all-hit
    branch; every constant is uploaded on its own and installed user-managed, so no
    whole blob is ever resident.  Mutated buffers are never shared: ExecuTorch has no
    mutability bit at runtime, we take it from the export's buffers_to_mutate.
    """

    name = PolicyName.FINGERPRINT
    summary = "share a hit only if metadata and content digest match; mutated buffers never shared"
    reproduces = "ours"
    memory_optimal = True
    match_content_across_names: ClassVar[bool] = False

    def plan(self, method, cache):
        lookups = _lookups(method, cache, lambda c: not c.mutated)
        return Plan(method, lookups, False, "decided from the manifest: only needed constants are uploaded")

    def decide(self, plan, new_meta, cache):
        m = plan.method
        out: list[ConstantDecision] = []
        for c in m.constants:
            meta = m.meta(c)
            lr = plan.lookup(c.name)
            if c.mutated:
                out.append(ConstantDecision(c, None, Decision.PRIVATE, Reason.MUTATED_BUFFER,
                                            "the graph mutates this buffer: never shared", Source.OWN_UPLOAD))
                continue
            if lr is None:
                out.append(ConstantDecision(c, None, Decision.PRIVATE, Reason.EMPTY_FQN,
                                            "no original FQN: never looked up", Source.OWN_UPLOAD))
                continue
            comps: tuple[FieldComparison, ...] = ()
            dig: DigestComparison | None = None
            if lr.result is Lookup.HIT:
                entry = lr.entry
                assert entry is not None
                comps = compare_metadata(entry.meta, meta)
                dig = DigestComparison(entry.digest, c.digest)
                if all(x.equal for x in comps) and dig.equal:
                    out.append(ConstantDecision(c, Lookup.HIT, Decision.SHARED, Reason.FINGERPRINT_MATCH,
                                                "metadata and content digest equal to the cached tensor",
                                                Source.CACHE, entry, comps, dig))
                    continue
            twin = cache.find_content(c.digest, meta) if self.match_content_across_names else None
            if twin is not None:
                out.append(ConstantDecision(c, lr.result, Decision.SHARED, Reason.CONTENT_MATCH_OTHER_NAME,
                                            f"identical content and metadata cached as {twin.fqn!r} by {twin.owner_method!r}",
                                            Source.CACHE, twin, comps, dig))
            elif lr.result is Lookup.MISS:
                out.append(ConstantDecision(c, Lookup.MISS, Decision.LOADED, Reason.FIRST_SEEN,
                                            "first method with this FQN: uploaded on its own and cached",
                                            Source.OWN_UPLOAD, enters_cache=True))
            elif not all(x.equal for x in comps):
                out.append(ConstantDecision(c, Lookup.HIT, Decision.DECLINED, Reason.METADATA_MISMATCH,
                                            f"{_mismatch_text(comps)}: declined, own copy uploaded",
                                            Source.OWN_UPLOAD, lr.entry, comps, dig))
            else:
                out.append(ConstantDecision(c, Lookup.HIT, Decision.DECLINED, Reason.CONTENT_MISMATCH,
                                            "same name and metadata but different data (digest differs): declined",
                                            Source.OWN_UPLOAD, lr.entry, comps, dig))
        return Outcome(m.name, tuple(out))


class ContentDedup(Fingerprint):
    name = PolicyName.CONTENT_DEDUP
    summary = "like fingerprint, and also share with any cached constant of identical content and metadata, whatever its name"
    reproduces = "ours"
    match_content_across_names = True


POLICY_CLASSES: dict[PolicyName, type[Policy]] = {
    cls.name: cls for cls in (NoSharing, NameOnly, RefuseOnMismatch, DeclineOnMismatch,
                              VerifyAlways, Fingerprint, ContentDedup)
}
POLICIES: tuple[str, ...] = tuple(p.value for p in PolicyName)


def get_policy(policy: str | PolicyName | Policy) -> Policy:
    """A policy instance from a name (checked against :data:`POLICIES`) or an instance."""
    if isinstance(policy, Policy):
        return policy
    return POLICY_CLASSES[parse(PolicyName, policy, what="policy")]()
