"""What a policy is given and what it answers: the method and cache it sees, its plan and its decisions.

A policy sees a method (:class:`MethodView`) and the cache only through :class:`CacheView`, so the
loader's real cache and the dry run's serve alike.  Its answers are plain frozen records that the
loader carries out and records: the lookups and whether to upload the blob (:class:`Plan`), then
one :class:`ConstantDecision` per constant (:class:`Outcome`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

from toolkit.core.model import ConstantSpec, TensorMeta, quick_init
from toolkit.core.vocab import Decision, Lookup, Members, MetadataField, Reason, Stage, TensorOrigin

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_Decision, _TensorOrigin = Members(Decision), Members(TensorOrigin)


class CachedView(Protocol):
    """What a policy may know about a cache entry."""

    fqn: str
    name: str
    owner_method: str
    meta: TensorMeta
    digest: str
    mutated: bool  # state: the owner's graph writes it
    storage: str  # provenance ("" unknown)


class CacheView(Protocol):
    def get(self, fqn: str) -> CachedView | None: ...

    def find_content(self, digest: str, meta: TensorMeta) -> CachedView | None: ...

    def __len__(self) -> int: ...  # entries cached so far

    first_container: str  # blind-share: the method whose load set upstream's constants_extracted_ ("" none)


@dataclass(frozen=True)
class MethodView:
    name: str
    device_type: str
    device_index: int
    constants: tuple[ConstantSpec, ...]

    def meta(self, c: ConstantSpec) -> TensorMeta:
        return c.meta(self.device_type, self.device_index)


@quick_init
@dataclass(frozen=True)
class FieldComparison:
    field: MetadataField
    cached: str
    new: str

    @property
    def equal(self) -> bool:
        return self.cached == self.new


@quick_init
@dataclass(frozen=True)
class DigestComparison:
    cached: str
    new: str

    @property
    def equal(self) -> bool:
        return self.cached == self.new


@quick_init
@dataclass(frozen=True)
class LookupResult:
    constant: ConstantSpec
    result: Lookup
    entry: CachedView | None
    key: str = ""  # what the cache was asked for, when not the FQN (fqn-weight-cache: the storage key)

    @property
    def cache_key(self) -> str:
        return self.key or self.constant.fqn


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


@quick_init
@dataclass(frozen=True)
class ConstantDecision:
    constant: ConstantSpec
    lookup: Lookup | None
    decision: Decision
    reason_code: Reason
    reason: str
    origin: TensorOrigin  # where the bytes the method runs on come from
    shared_from: CachedView | None = None
    comparisons: tuple[FieldComparison, ...] = ()
    digest_comparison: DigestComparison | None = None
    enters_cache: bool = False
    key: str = ""  # the cache key it is looked up / cached under when not its FQN (fqn-weight-cache)
    upstream_keeps: bool = False  # a failed load's entry upstream leaves in its cache; the toolkit restores its own
    # the storage key whose storage it runs on through its own view (dtype, sizes, strides, storage offset), where
    # the tensor it is given is another view of that storage (fqn-weight-cache); "" when it runs on that tensor as is
    view_of: str = ""
    # what its own upload copies when more than the bytes it reads: the whole storage its view is taken of
    upload: ConstantSpec | None = None

    @property
    def cache_key(self) -> str:
        return self.key or self.constant.fqn

    @property
    def uploaded(self) -> ConstantSpec:
        """What its own upload copies: :attr:`upload`, else the constant."""
        return self.upload or self.constant

    @property
    def installed_user_managed(self) -> bool:
        """True when the container is pointed at a tensor not from its own blob, or (shared from another slot
        of this method, ``shared_from``) not from its own slot of it."""
        return self.decision is _Decision.SHARED or (
            self.origin is not _TensorOrigin.WHOLE_BLOB and self.decision is not _Decision.REFUSED
        )


@dataclass(frozen=True)
class Outcome:
    method: str
    decisions: tuple[ConstantDecision, ...]
    failure: str | None = None  # set when the policy fails the whole load
    # where the modelled system fails: LOAD (the runtime refuses the method) or EXPORT
    # (the exporter refuses the whole program: nothing of it would exist to load)
    stage: Stage = Stage.LOAD
    first_container: bool = False  # blind-share: this load sets upstream's constants_extracted_ flag

    @property
    def install(self) -> tuple[ConstantDecision, ...]:
        return tuple(d for d in self.decisions if d.installed_user_managed)


@dataclass(frozen=True)
class StoredConstant:
    """A constant as a :class:`CachedView` that is no cache entry: what an exporter stored under a key
    first (the entry a refused constant was checked against), or the first slot of an FQN repeated in a
    method whose tensor another slot of it is re-pointed at."""

    fqn: str  # the storage key
    name: str
    owner_method: str
    meta: TensorMeta
    digest: str
    mutated: bool
    storage: str
    nbytes: int
