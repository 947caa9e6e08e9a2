"""Sharing policies: pure decision logic, no I/O, no torch.

A policy decides, per method, in two phases that mirror ExecuTorch's CUDA backend
(``backends/cuda/runtime/cuda_backend.cpp``):

1. :meth:`Policy.plan` looks every constant up in the shared cache and says whether
   the method's whole weights blob must be uploaded.
2. :meth:`Policy.decide` takes the metadata of the freshly extracted tensors (only
   when the blob was uploaded) and decides every constant.

The loader (:mod:`toolkit.engine.loader`) carries a decision out against the real AOTInductor
runtime; :func:`toolkit.workflows.dry_run.analyze` runs the same two calls on manifest data
alone.  Both see identical decisions because the logic lives only here.
"""

from __future__ import annotations

import abc
import difflib
import functools
from dataclasses import dataclass, replace
from typing import ClassVar, Iterable, Mapping, Protocol, Sequence

from toolkit.core.errors import UnknownPolicyError
from toolkit.core.model import ConstantSpec, TensorMeta, quick_init, required_nbytes, shown
from toolkit.core.vocab import (
    ConstantKind,
    Decision,
    Lookup,
    Members,
    MetadataField,
    PolicyName,
    Reason,
    Stage,
    TensorOrigin,
    parse,
)

# the members per-constant code reads, as plain attributes (vocab.Members: 0.12 us each off the enum on 3.11)
_ConstantKind, _Decision, _Lookup, _Reason, _TensorOrigin = (
    Members(e) for e in (ConstantKind, Decision, Lookup, Reason, TensorOrigin)
)

# ------------------------------------------------------------------ inputs


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


# ------------------------------------------------------------------ outputs


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

    @property
    def cache_key(self) -> str:
        return self.key or self.constant.fqn

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


@dataclass(frozen=True)
class ExportRefusal:
    """The exporter refuses the program (stage "export"): nothing of it exists to load."""

    method: str  # the method whose constant the exporter raised on
    constant: ConstantSpec
    key: str  # the storage key met twice with different data
    message: str  # upstream's exact message
    first: StoredConstant  # what the key held already

    def outcomes(self, methods: Sequence[MethodView]) -> tuple[Outcome, ...]:
        """Every constant of every method, refused: the refusing one with its reason, the rest
        because no program was written.  One :class:`Outcome` per method, stage "export"."""
        out = []
        for m in methods:
            ds = []
            for c in m.constants:
                if m.name == self.method and c.name == self.constant.name:
                    ds.append(
                        ConstantDecision(
                            c,
                            None,
                            _Decision.REFUSED,
                            _Reason.EXPORT_REFUSED,
                            f"export refuses the program: {self.message}",
                            _TensorOrigin.OWN_UPLOAD,
                            self.first,
                            digest_comparison=DigestComparison(self.first.digest, c.digest),
                            key=self.key,
                        )
                    )
                else:
                    ds.append(
                        ConstantDecision(
                            c,
                            None,
                            _Decision.REFUSED,
                            _Reason.LOAD_REFUSED,
                            f"the exporter refuses the program ({self.method!r}, key "
                            f"{self.key!r}): nothing of it is loaded",
                            _TensorOrigin.OWN_UPLOAD,
                            key=fqn_weight_key(c, m.name, m.device_type) if c.fqn else "",
                        )
                    )
            out.append(Outcome(m.name, tuple(ds), self.message, stage=Stage.EXPORT))
        return tuple(out)


# ------------------------------------------------------------------ helpers


class Comparisons(tuple):
    """The field comparisons of two metadata, in order (a tuple), and whether every field is equal."""

    all_equal: bool

    def __new__(cls, items: Iterable[FieldComparison]) -> "Comparisons":
        self = super().__new__(cls, items)
        self.all_equal = all(x.equal for x in self)
        return self


@functools.lru_cache(maxsize=1 << 16)
def compare_metadata(cached: TensorMeta, new: TensorMeta) -> Comparisons:
    """Field by field, in cuda_backend.cpp's order: dtype, rank, sizes, strides, device type, index
    (memoised: a program's constants repeat a few shapes, and a dry run compares every hit)."""
    pairs = [
        (MetadataField.DTYPE, cached.dtype, new.dtype),
        (MetadataField.RANK, cached.rank, new.rank),
        (MetadataField.SIZES, cached.shape, new.shape),
        (MetadataField.STRIDES, cached.strides, new.strides),
        (MetadataField.DEVICE_TYPE, cached.device_type, new.device_type),
        (MetadataField.DEVICE_INDEX, cached.device_index, new.device_index),
    ]
    return Comparisons(FieldComparison(f, shown(a), shown(b)) for f, a, b in pairs)


def _mismatch_text(comps: Sequence[FieldComparison]) -> str:
    return "; ".join(f"{c.field.value}: cached {c.cached} vs new {c.new}" for c in comps if not c.equal)


def device_label(device_type: str, device_index: int) -> str:
    return "cpu" if device_type == "cpu" else f"{device_type}:{device_index}"


def slot_problem(
    have: TensorMeta, have_bytes: int, slot: ConstantSpec, device_type: str, device_index: int
) -> str | None:
    """Why a tensor (``have``, with ``have_bytes`` readable bytes) cannot fill ``slot``, or None.

    AOTInductor checks nothing when a tensor is installed user-managed: a smaller tensor
    is read out of bounds, another dtype is misread, another device faults.  The loader
    refuses to run such a method; the dry-run analysis predicts the same.
    """
    if (have.device_type, have.device_index) != (device_type, device_index):
        return (
            f"tensor on {device_label(have.device_type, have.device_index)} cannot fill a slot on "
            f"{device_label(device_type, device_index)}"
        )
    if have.dtype != slot.dtype:
        return f"dtype {have.dtype} cannot fill a {slot.dtype} slot"
    if have_bytes < slot.nbytes:
        return f"{have_bytes} bytes cannot fill a slot that reads {slot.nbytes} bytes (out-of-bounds read)"
    return None


# SlimTensor's c10::ScalarType and DeviceType (backends/aoti/slim/c10/core at 922adad721), as upstream prints them
_SLIM_SCALAR_TYPE = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "bool": 11,
    "bfloat16": 15,
}
_SLIM_DEVICE_TYPE = {"cpu": 0, "cuda": 1}


def check_cached_constant_match(fqn: str, cached: TensorMeta, new: TensorMeta) -> str | None:
    """The line upstream's ``check_cached_constant_match`` logs (922adad721, e4b18fa9aa, 144ce1bc77: one
    code), verbatim, or None on a match: only the first field that differs, in its order.  Dtype and device
    type are the integers of SlimTensor's enums (a dtype SlimTensor lacks: its name)."""
    pre = f"Constant '{fqn}': "
    if cached.dtype != new.dtype:
        dt = [_SLIM_SCALAR_TYPE.get(m.dtype, m.dtype) for m in (cached, new)]
        return f"{pre}dtype mismatch (cached={dt[0]}, new={dt[1]})"
    if cached.rank != new.rank:
        return f"{pre}dim mismatch (cached={cached.rank}, new={new.rank})"
    for what, a, b in (("size", cached.shape, new.shape), ("stride", cached.strides, new.strides)):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"{pre}{what} mismatch at dim {i} (cached={x}, new={y})"
    dev = [f"{_SLIM_DEVICE_TYPE.get(m.device_type, m.device_type)}:{m.device_index}" for m in (cached, new)]
    return None if dev[0] == dev[1] else f"{pre}device mismatch (cached={dev[0]}, new={dev[1]})"


def refusal_message(fqn: str, method: str) -> str:
    """The error 922adad721 logs after :func:`check_cached_constant_match`'s line, verbatim (it names the FQN)."""
    return (
        f"Constant '{fqn}' in method '{method}' is incompatible with the cached version "
        "from a previous method. Refusing to share."
    )


def decline_message(fqn: str, method: str) -> str:
    """What e4b18fa9aa and 144ce1bc77 log after :func:`check_cached_constant_match`'s line, verbatim."""
    return (
        f"Constant '{fqn}' in method '{method}' differs from the cached copy; "
        "using this method's own copy instead of sharing"
    )


def _refuse_rest(plan: Plan, decided: list[ConstantDecision], why: str, origin: TensorOrigin) -> list[ConstantDecision]:
    """A method's load refused: the refusing decision kept, every other constant, decided or not
    reached yet, refused with ``why`` (upstream returns at the refusal: nothing of it is used)."""
    done = {d.constant.name for d in decided}
    out = [
        d
        if d.decision is _Decision.REFUSED
        else ConstantDecision(d.constant, d.lookup, _Decision.REFUSED, _Reason.LOAD_REFUSED, why, origin, key=d.key)
        for d in decided
    ]
    for c in plan.method.constants:
        if c.name not in done:
            lr = plan.lookup(c.name)
            out.append(
                ConstantDecision(
                    c,
                    lr.result if lr else None,
                    _Decision.REFUSED,
                    _Reason.LOAD_REFUSED,
                    why,
                    origin,
                    key=lr.key if lr else "",
                )
            )
    return out


def _fqn_slots(method: MethodView) -> tuple[dict[str, ConstantSpec], dict[str, ConstantSpec]]:
    """Upstream's view of a method's named constants, per FQN: the first constant with it (whose
    tensor ``extract_constants_map`` returns: it ``emplace``s) and the last (the internal name
    ``fqn_to_name[fqn] = name`` keeps: the only slot ever re-pointed)."""
    first: dict[str, ConstantSpec] = {}
    last: dict[str, ConstantSpec] = {}
    for c in method.constants:
        if c.fqn:
            first.setdefault(c.fqn, c)
            last[c.fqn] = c
    return first, last


def _unpointed(c: ConstantSpec, blob: bool, why: str) -> ConstantDecision:
    """A slot upstream's pairs do not name: its own copy from the blob, or never filled when the
    all-hit branch skipped the blob."""
    if blob:
        return ConstantDecision(
            c,
            None,
            _Decision.PRIVATE,
            _Reason.EMPTY_FQN if not c.fqn else _Reason.SAME_KEY_IN_METHOD,
            f"{why}: its own copy from the method's blob",
            _TensorOrigin.WHOLE_BLOB,
        )
    return ConstantDecision(
        c,
        None,
        _Decision.NEVER_FILLED,
        _Reason.BLOB_SKIPPED,
        f"{why}, and every named constant hit: the blob is skipped, nothing fills this slot",
        _TensorOrigin.WHOLE_BLOB,
    )


def _lookups(method: MethodView, cache: CacheView) -> tuple[LookupResult, ...]:
    """Every named constant looked up by its FQN."""
    return tuple(
        LookupResult(c, _Lookup.MISS if (e := cache.get(c.fqn)) is None else _Lookup.HIT, e)
        for c in method.constants
        if c.fqn
    )


_M64 = (1 << 64) - 1
_HASH_MUL = 0xC6A4A7935BD1E995
# The bucket counts a libstdc++ unordered_map grows through as keys are inserted one at a time (its
# _Prime_rehash_policy: 13 at the first insert, then its listed prime >= twice the count), read from g++ 12.
_LIBSTDCXX_BUCKETS = (
    13,
    29,
    59,
    127,
    257,
    541,
    1109,
    2357,
    5087,
    10273,
    20753,
    42043,
    85229,
    172933,
    351061,
    712697,
    1447153,
    2938679,
    5967347,
    12117689,
    24607243,
)


def libstdcxx_string_hash(key: str) -> int:
    """``std::hash<std::string>`` of 64-bit libstdc++: ``_Hash_bytes`` (MurmurHash64A-like), seed 0xc70f6907."""
    data, mix = key.encode(), (lambda v: v ^ (v >> 47))
    n, whole = len(data), len(data) & ~7
    h = (0xC70F6907 ^ (n * _HASH_MUL)) & _M64
    for i in range(0, whole, 8):
        h = (
            (h ^ (mix(int.from_bytes(data[i : i + 8], "little") * _HASH_MUL & _M64) * _HASH_MUL & _M64)) * _HASH_MUL
        ) & _M64
    if n & 7:
        h = ((h ^ int.from_bytes(data[whole:], "little")) * _HASH_MUL) & _M64
    return mix(mix(h) * _HASH_MUL & _M64)


def unordered_map_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a libstdc++ ``std::unordered_map<std::string, T>`` after ``map[key] = ...`` for
    each key in turn (a key met again is not re-inserted).  A node goes to the front of its bucket, a node
    of an empty bucket to the front of the list; a rehash re-links the nodes in list order by the same rule.
    The C++ standard leaves this order to the implementation: this is GCC's (Linux builds); libc++ and MSVC
    iterate otherwise."""
    hashes: dict[str, int] = {}
    buckets: dict[int, list[str]] = {}  # each bucket's keys, front last
    fronts: list[int] = []  # the buckets, front last
    level = -1
    for key in keys:
        if key in hashes:
            continue
        if level < 0 or len(hashes) + 1 > _LIBSTDCXX_BUCKETS[level]:
            level += 1
            now = [k for b in reversed(fronts) for k in reversed(buckets[b])]
            buckets, fronts = {}, []
            for k in now:
                _link(k, hashes[k] % _LIBSTDCXX_BUCKETS[level], buckets, fronts)
        hashes[key] = libstdcxx_string_hash(key)
        _link(key, hashes[key] % _LIBSTDCXX_BUCKETS[level], buckets, fronts)
    return [k for b in reversed(fronts) for k in reversed(buckets[b])]


def _link(key: str, bucket: int, buckets: dict[int, list[str]], fronts: list[int]) -> None:
    if bucket in buckets:
        buckets[bucket].append(key)
    else:
        buckets[bucket] = [key]
        fronts.append(bucket)


# ------------------------------------------------------------------ policies


@dataclass(frozen=True)
class UpstreamRevision:
    """One pytorch/executorch change a policy reproduces (``docs/upstream.md`` tells its story)."""

    pr: int
    commit: str  # on main, 10 hex digits; "" where not established
    date: str  # ISO date of the commit (no commit established: of the PR branch's last one)
    note: str = ""  # what this revision is to the policy
    version: str = ""  # the release reproduced, where that is what is known ("1.5.x")

    def __str__(self) -> str:
        where = f"#{self.pr} ({self.commit or 'commit not established'}, {self.date})"
        return (f"{self.version} " if self.version else "") + where + (f": {self.note}" if self.note else "")


class Policy(abc.ABC):
    """One sharing policy.  Stateless: all state lives in the cache the loader owns."""

    name: ClassVar[PolicyName]
    summary: ClassVar[str]
    reproduces: ClassVar[tuple[UpstreamRevision, ...]] = ()  # the revision itself first; () for ours
    memory_optimal: ClassVar[bool] = False  # never uploads a whole blob; installs everything user-managed

    @abc.abstractmethod
    def plan(self, method: MethodView, cache: CacheView) -> Plan: ...

    def export(self, methods: Sequence[MethodView]) -> "ExportRefusal | None":
        """What the modelled revision's exporter says of the whole program, before any load.

        None: it writes the program (every revision before 1.5.x has no export-time check).
        An :class:`ExportRefusal` means no program exists: nothing of it can be loaded.
        """
        return None

    @abc.abstractmethod
    def decide(self, plan: Plan, new_meta: Mapping[str, TensorMeta] | None, cache: CacheView) -> Outcome: ...

    @classmethod
    def reproduces_text(cls) -> str:
        """:attr:`reproduces` as one line of prose, for tables and the explorer."""
        if not cls.reproduces:
            return "ours (no upstream revision)"
        return "ExecuTorch " + "; ".join(map(str, cls.reproduces))

    def __repr__(self) -> str:
        return f"<policy {self.name.value}>"


class NoSharing(Policy):
    name = PolicyName.NO_SHARING
    summary = "every method uploads its own blob"
    reproduces = (
        UpstreamRevision(
            18901, "922adad721", "2026-04-27", "runtime option weight_sharing_across_methods, off by default"
        ),
        UpstreamRevision(21959, "e4b18fa9aa", "2026-08-20", "weight_sharing_across_methods still off by default"),
        UpstreamRevision(
            18864, "875f7c8019", "2026-04-14", "compile spec share_kv_cache_across_methods, off by default"
        ),
        UpstreamRevision(18667, "266ff2d71d", "2026-04-10", "the first sharing: everything before it shares nothing"),
    )

    def plan(self, method, cache):
        return Plan(method, (), True, "sharing is off: every method uploads its own blob")

    def decide(self, plan, new_meta, cache):
        return Outcome(
            plan.method.name,
            tuple(
                ConstantDecision(
                    c,
                    None,
                    _Decision.PRIVATE,
                    _Reason.SHARING_DISABLED,
                    "sharing is disabled; the method uses its own blob",
                    _TensorOrigin.WHOLE_BLOB,
                )
                for c in plan.method.constants
            ),
        )


class _ExecuTorchPolicy(Policy):
    """cuda_backend.cpp's weight_sharing_across_methods path, parametrised by revision."""

    compare_on_miss_path: ClassVar[bool] = True
    refuse_on_mismatch: ClassVar[bool] = False  # before #21959: a mismatch fails the whole load
    verify_all_hit: ClassVar[bool] = False  # #21706: re-upload in the all-hit branch to compare

    def __init__(self, blob_available: bool = True):
        # #21706 keeps name-only sharing when blob/extract entry points are unavailable.
        self.blob_available = blob_available

    def plan(self, method, cache):
        lookups = _lookups(method, cache)  # upstream counts named constants only
        misses = {lr.constant.fqn for lr in lookups if lr.result is _Lookup.MISS}
        if misses:
            return Plan(method, lookups, True, f"{len(misses)} cache miss(es): upload the whole blob")
        if self.verify_all_hit and self.blob_available and method.constants:
            return Plan(method, lookups, True, "all names hit: re-upload the whole blob to compare (#21706)")
        return Plan(method, lookups, False, "all names hit: the blob is skipped")

    def decide(self, plan, new_meta, cache):
        m = plan.method
        decisions: list[ConstantDecision] = []
        mismatches: list[int] = []  # refuse-on-mismatch: the decisions whose hit mismatches
        first_of, last_of = _fqn_slots(m)
        for c in m.constants:
            lr = plan.lookup(c.name)
            if lr is None:  # constants with an empty FQN are skipped by the backend
                decisions.append(_unpointed(c, plan.upload_whole_blob, "no original FQN: never looked up"))
                continue
            if lr.result is _Lookup.MISS and first_of[c.fqn] is c:
                decisions.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.LOADED,
                        _Reason.FIRST_SEEN,
                        "first method with this FQN: loaded from its blob and cached",
                        _TensorOrigin.WHOLE_BLOB,
                        enters_cache=True,
                    )
                )
                continue
            if lr.result is _Lookup.MISS and last_of[c.fqn] is c and any(x.result is _Lookup.HIT for x in plan.lookups):
                # step 3 runs (a hit): the pair fqn_to_name[fqn] -> the cache's entry, just added from this blob
                first = first_of[c.fqn]
                decisions.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.SHARED,
                        _Reason.SAME_KEY_IN_METHOD,
                        f"{first.name!r} of this method cached FQN {c.fqn!r} from its blob; the method has a hit, so "
                        "upstream's pairs re-point this slot (the last name per FQN) at that tensor",
                        _TensorOrigin.WHOLE_BLOB,
                        StoredConstant(
                            c.fqn,
                            first.name,
                            m.name,
                            (new_meta or {}).get(first.name, m.meta(first)),
                            first.digest,
                            first.mutated,
                            first.storage,
                            first.nbytes,
                        ),
                    )
                )
                continue
            if last_of[c.fqn] is not c or lr.result is _Lookup.MISS:
                decisions.append(
                    replace(
                        _unpointed(
                            c,
                            plan.upload_whole_blob,
                            (
                                f"{last_of[c.fqn].name!r} holds FQN {c.fqn!r} in upstream's FQN-to-name map (the last wins)"
                                if last_of[c.fqn] is not c
                                else f"{first_of[c.fqn].name!r} of this method cached FQN {c.fqn!r}"
                            ),
                        ),
                        lookup=lr.result,
                    )
                )
                continue
            entry = lr.entry
            assert entry is not None
            if not plan.upload_whole_blob:
                why = (
                    "all names hit; the blob and extraction are unavailable, so sharing rests on the name alone (#21706)"
                    if self.verify_all_hit
                    else "every FQN of this method hit the cache: shared on the name alone, nothing compared"
                )
                code = _Reason.NO_BLOB_TO_COMPARE if self.verify_all_hit else _Reason.NAME_HIT_UNCHECKED
                decisions.append(
                    ConstantDecision(c, _Lookup.HIT, _Decision.SHARED, code, why, _TensorOrigin.CACHE, entry)
                )
                continue
            if not self.compare_on_miss_path:
                decisions.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.SHARED,
                        _Reason.NAME_HIT,
                        "name hit: shared without comparing",
                        _TensorOrigin.CACHE,
                        entry,
                    )
                )
                continue
            extracted = first_of[c.fqn].name  # extract_constants_map's tensor for this FQN
            if new_meta is None or extracted not in new_meta:
                raise ValueError(f"{self.name}: metadata of extracted constant {extracted!r} is required")
            comps = compare_metadata(entry.meta, new_meta[extracted])
            if comps.all_equal:
                decisions.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.SHARED,
                        _Reason.METADATA_MATCH,
                        "metadata equal to the cached tensor (data not compared)",
                        _TensorOrigin.CACHE,
                        entry,
                        comps,
                    )
                )
            elif self.refuse_on_mismatch:  # which mismatch upstream meets first: after the loop
                mismatches.append(len(decisions))
                decisions.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.REFUSED,
                        _Reason.METADATA_MISMATCH,
                        check_cached_constant_match(c.fqn, entry.meta, new_meta[extracted]),
                        _TensorOrigin.WHOLE_BLOB,
                        entry,
                        comps,
                    )
                )
            else:
                # #21959: keep this method's own copy; the rejected name must also stay out of
                # the user-managed pairs, or the container is pointed at a tensor it did not ask for.
                decisions.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.DECLINED,
                        _Reason.METADATA_MISMATCH,
                        f"{check_cached_constant_match(c.fqn, entry.meta, new_meta[extracted])}; then: "
                        f"{decline_message(c.fqn, m.name)}",
                        _TensorOrigin.WHOLE_BLOB,
                        entry,
                        comps,
                    )
                )
        if not mismatches:
            return Outcome(m.name, tuple(decisions))
        return self._refuse(plan, decisions, mismatches)

    @staticmethod
    def _refuse(plan: Plan, decisions: list[ConstantDecision], mismatches: list[int]) -> Outcome:
        """922's validation loop walks ``fqn_to_name`` in its ``unordered_map`` order (libstdc++'s,
        :func:`unordered_map_order`): each miss is added to the cache, and the first hit that mismatches
        returns the error.  The misses walked before it stay in upstream's cache (``upstream_keeps``), on
        the failed method's container, which upstream leaks; the hits after it are never checked."""
        m = plan.method
        order = {fqn: i for i, fqn in enumerate(unordered_map_order(c.fqn for c in m.constants if c.fqn))}
        refused = min(mismatches, key=lambda i: order[decisions[i].constant.fqn])
        d = decisions[refused]
        failure = refusal_message(d.constant.fqn, m.name)
        unchecked = [decisions[i].constant.fqn for i in mismatches if i != refused]
        decisions[refused] = replace(
            d,
            reason=f"{d.reason}; then: {failure}"
            + (
                f" (upstream checks FQNs in its unordered_map's order: {d.constant.fqn!r} first; "
                f"{', '.join(map(repr, unchecked))} mismatch too, never checked)"
                if unchecked
                else ""
            ),
        )
        for i in mismatches:
            if i != refused:
                decisions[i] = replace(decisions[i], decision=_Decision.DECLINED)  # refused with the rest below
        at = order[d.constant.fqn]
        kept = {x.constant.name for x in decisions if x.enters_cache and order[x.constant.fqn] < at}
        out = _refuse_rest(plan, decisions, f"method load failed: {failure}", _TensorOrigin.WHOLE_BLOB)
        out = [
            replace(
                x,
                upstream_keeps=True,
                reason=f"{x.reason}; upstream keeps it in its cache (added before "
                f"{d.constant.fqn!r} in its unordered_map's order), where the toolkit restores its cache",
            )
            if x.constant.name in kept
            else x
            for x in out
        ]
        return Outcome(m.name, tuple(out), failure)


class NameOnly(_ExecuTorchPolicy):
    name = PolicyName.NAME_ONLY
    summary = "share on name alone, never compare"
    reproduces = (
        UpstreamRevision(
            18901,
            "922adad721",
            "2026-04-27",
            "the unchecked core of weight_sharing_across_methods: no revision shipped exactly this",
        ),
    )
    compare_on_miss_path = False


class RefuseOnMismatch(_ExecuTorchPolicy):
    name = PolicyName.REFUSE_ON_MISMATCH
    summary = "compare metadata on the miss path; a mismatch fails the whole load; all-hit shares on name"
    reproduces = (
        UpstreamRevision(18901, "922adad721", "2026-04-27", "weight_sharing_across_methods, until #21959"),
        UpstreamRevision(20241, "182be0e26e", "2026-06-15", "comment only: unchanged"),
        UpstreamRevision(20424, "3a9abee4b2", "2026-06-22", "payload keys only: unchanged"),
    )
    refuse_on_mismatch = True


class DeclineOnMismatch(_ExecuTorchPolicy):
    name = PolicyName.DECLINE_ON_MISMATCH
    summary = (
        "compare metadata on the miss path; decline a mismatch (own copy, not in the pairs); all-hit shares on name"
    )
    reproduces = (UpstreamRevision(21959, "e4b18fa9aa", "2026-08-20", "main's dense-blob path"),)


class VerifyAlways(_ExecuTorchPolicy):
    name = PolicyName.VERIFY_ALWAYS
    summary = "like decline-on-mismatch, and re-upload the blob in the all-hit branch to compare metadata"
    reproduces = (UpstreamRevision(21706, "144ce1bc77", "2026-08-19", "closed, never merged"),)
    verify_all_hit = True


def _state_decision(c: ConstantSpec, lr: "LookupResult", meta: TensorMeta) -> "ConstantDecision | None":
    """Fingerprint's rule for state: a buffer some method writes is shared exactly when
    provenance says it is the same buffer of the eager program (a KV cache prefill fills and
    decode reads, issue #17496), and kept private otherwise, whatever its name and content.

    Applies when this constant is mutated or the cached one is.  ExecuTorch has no
    mutability bit at runtime; it comes from the export (buffers_to_mutate), provenance from
    the builder (which tensors of the modules given were one storage).  None: not state.
    """
    entry = lr.entry if lr is not None and lr.result is _Lookup.HIT else None
    if not c.mutated and not (entry is not None and entry.mutated):
        return None
    if lr is None:
        return ConstantDecision(
            c,
            None,
            _Decision.PRIVATE,
            _Reason.EMPTY_FQN,
            "a mutated buffer with no original FQN: never looked up",
            _TensorOrigin.OWN_UPLOAD,
        )
    if entry is None:
        return ConstantDecision(
            c,
            _Lookup.MISS,
            _Decision.LOADED,
            _Reason.FIRST_SEEN,
            "first method with this state: uploaded on its own and cached",
            _TensorOrigin.OWN_UPLOAD,
            enters_cache=True,
        )
    comps = compare_metadata(entry.meta, meta)
    dig = DigestComparison(entry.digest, c.digest)
    if c.storage and c.storage == entry.storage and comps.all_equal and dig.equal:
        return ConstantDecision(
            c,
            _Lookup.HIT,
            _Decision.SHARED,
            _Reason.SAME_STATE,
            "one buffer of the eager program (same storage at build time): shared as state",
            _TensorOrigin.CACHE,
            entry,
            comps,
            dig,
        )
    why = (
        "provenance unknown"
        if not c.storage or not entry.storage
        else "another buffer of the eager program"
        if c.storage != entry.storage
        else "metadata or content differs"
    )
    return ConstantDecision(
        c,
        _Lookup.HIT,
        _Decision.DECLINED,
        _Reason.OTHER_STATE,
        f"state (a method writes it) and {why}: declined, own copy uploaded",
        _TensorOrigin.OWN_UPLOAD,
        entry,
        comps,
        dig,
    )


class Fingerprint(Policy):
    """Ours: a hit is shared only if metadata and the build-time content digest match.

    Decided from the manifest, so no device round trip is needed to check the all-hit
    branch; every constant is uploaded on its own and installed user-managed, so no
    whole blob is ever resident.  State (a buffer some method writes) is shared exactly
    when provenance says it is one buffer of the eager program (:func:`_state_decision`).
    """

    name = PolicyName.FINGERPRINT
    summary = "share a hit only if metadata and content digest match; state only when it is one eager buffer"
    memory_optimal = True
    match_content_across_names: ClassVar[bool] = False

    def plan(self, method, cache):
        lookups = _lookups(method, cache)
        return Plan(method, lookups, False, "decided from the manifest: only needed constants are uploaded")

    def decide(self, plan, new_meta, cache):
        m = plan.method
        out: list[ConstantDecision] = []
        lookup, device_type, device_index = plan.lookup, m.device_type, m.device_index
        for c in m.constants:
            meta = c.meta(device_type, device_index)
            lr = lookup(c.name)
            state = _state_decision(c, lr, meta)
            if state is not None:
                out.append(state)
                continue
            if lr is None:
                out.append(
                    ConstantDecision(
                        c,
                        None,
                        _Decision.PRIVATE,
                        _Reason.EMPTY_FQN,
                        "no original FQN: never looked up",
                        _TensorOrigin.OWN_UPLOAD,
                    )
                )
                continue
            comps: tuple[FieldComparison, ...] = ()
            dig: DigestComparison | None = None
            if lr.result is _Lookup.HIT:
                entry = lr.entry
                assert entry is not None
                comps = compare_metadata(entry.meta, meta)
                dig = DigestComparison(entry.digest, c.digest)
                if comps.all_equal and dig.equal:
                    out.append(
                        ConstantDecision(
                            c,
                            _Lookup.HIT,
                            _Decision.SHARED,
                            _Reason.FINGERPRINT_MATCH,
                            "metadata and content digest equal to the cached tensor",
                            _TensorOrigin.CACHE,
                            entry,
                            comps,
                            dig,
                        )
                    )
                    continue
            twin = cache.find_content(c.digest, meta) if self.match_content_across_names else None
            if twin is not None and twin.mutated:  # equal bytes of someone's state are not this constant
                twin = None
            if twin is not None:
                out.append(
                    ConstantDecision(
                        c,
                        lr.result,
                        _Decision.SHARED,
                        _Reason.CONTENT_MATCH_OTHER_NAME,
                        f"identical content and metadata cached as {twin.fqn!r} by {twin.owner_method!r}",
                        _TensorOrigin.CACHE,
                        twin,
                        comps,
                        dig,
                    )
                )
            elif lr.result is _Lookup.MISS:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.LOADED,
                        _Reason.FIRST_SEEN,
                        "first method with this FQN: uploaded on its own and cached",
                        _TensorOrigin.OWN_UPLOAD,
                        enters_cache=True,
                    )
                )
            elif not comps.all_equal:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.DECLINED,
                        _Reason.METADATA_MISMATCH,
                        f"{_mismatch_text(comps)}: declined, own copy uploaded",
                        _TensorOrigin.OWN_UPLOAD,
                        lr.entry,
                        comps,
                        dig,
                    )
                )
            else:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.DECLINED,
                        _Reason.CONTENT_MISMATCH,
                        "same name and metadata but different data (digest differs): declined",
                        _TensorOrigin.OWN_UPLOAD,
                        lr.entry,
                        comps,
                        dig,
                    )
                )
        entering: set[str] = set()  # an FQN twice in one method: the cache takes the first, the rest upload their own
        for i, d in enumerate(out):
            if not d.enters_cache:
                continue
            if d.cache_key in entering:
                out[i] = ConstantDecision(
                    d.constant,
                    d.lookup,
                    _Decision.PRIVATE,
                    _Reason.SAME_KEY_IN_METHOD,
                    "another constant of this method enters the cache under this FQN: own copy uploaded",
                    _TensorOrigin.OWN_UPLOAD,
                )
            else:
                entering.add(d.cache_key)
        return Outcome(m.name, tuple(out))


class ContentDedup(Fingerprint):
    name = PolicyName.CONTENT_DEDUP
    summary = (
        "like fingerprint, and also share with any cached constant of identical content and metadata, whatever its name"
    )
    match_content_across_names = True


class BlindShare(Policy):
    """The first cross-method sharing: every method uploads its own full weights blob; each
    later method is pointed at the first method's tensor for every FQN they share
    (user-managed), nothing compared.  Only the first method's constants are ever shared.

    "The first method" is the first with constants, named or not (upstream's flag); only the last
    slot per FQN is re-pointed (upstream's map).  History: ``docs/upstream.md``.
    """

    name = PolicyName.BLIND_SHARE
    summary = "every method uploads its own blob; each FQN the first method has is re-pointed at its tensor, unchecked"
    reproduces = (
        UpstreamRevision(18667, "266ff2d71d", "2026-04-10", "the first sharing, inline in init(), always on"),
        UpstreamRevision(
            18864,
            "875f7c8019",
            "2026-04-14",
            "the same behind compile spec share_kv_cache_across_methods, set on every method",
        ),
    )

    def plan(self, method, cache):
        lookups = _lookups(method, cache)
        return Plan(method, lookups, True, "every method uploads its own full weights blob (#18667)")

    def decide(self, plan, new_meta, cache):
        m = plan.method
        # upstream's constants_extracted_: set by the first method with constants, named or not
        first = len(cache) == 0 and not cache.first_container
        first_of, last_of = _fqn_slots(m)
        out: list[ConstantDecision] = []
        for c in m.constants:
            lr = plan.lookup(c.name)
            if lr is None:
                out.append(
                    ConstantDecision(
                        c,
                        None,
                        _Decision.PRIVATE,
                        _Reason.EMPTY_FQN,
                        "no original FQN: never shared",
                        _TensorOrigin.WHOLE_BLOB,
                    )
                )
            elif first and first_of[c.fqn] is c:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.LOADED,
                        _Reason.FIRST_SEEN,
                        "first method: extracted from its blob, kept by FQN for the others",
                        _TensorOrigin.WHOLE_BLOB,
                        enters_cache=True,
                    )
                )
            elif first or (lr.result is _Lookup.HIT and last_of[c.fqn] is not c):
                out.append(
                    replace(
                        _unpointed(
                            c,
                            True,
                            f"{(first_of if first else last_of)[c.fqn].name!r} of this method holds FQN {c.fqn!r}",
                        ),
                        lookup=lr.result,
                    )
                )
            elif lr.result is _Lookup.HIT:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.SHARED,
                        _Reason.NAME_HIT,
                        f"the first method {lr.entry.owner_method!r} has this FQN: re-pointed at "
                        "its tensor, nothing compared (#18667)",
                        _TensorOrigin.CACHE,
                        lr.entry,
                    )
                )
            else:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.PRIVATE,
                        _Reason.NOT_IN_FIRST_METHOD,
                        "the first method has no constant with this FQN: own copy from the method's blob, never shared",
                        _TensorOrigin.WHOLE_BLOB,
                    )
                )
        return Outcome(m.name, tuple(out), first_container=first and bool(m.constants))


FQN_WEIGHT_PREFIX = "cuda_fqn_weight"


def fqn_weight_key(c: ConstantSpec, method_name: str, device_type: str) -> str:
    """The ``.ptd`` key ExecuTorch 1.5.x stores ``c``'s storage under (``cuda_weight_collector.py``).

    ``cuda_fqn_weight:<cpu|cuda>:<fqn>``; an FQN starting with ``_tensor_constant`` (named by
    position in one compiled library) is namespaced by its method's ``.so`` key:
    ``cuda_fqn_weight:cuda:<so_key>:_tensor_constant0``.  A constant that carries the key its
    file stored it under (a 1.5.x ``.pte``) keeps it.  Without an ``so_key`` (a program that
    exists only in memory) each method is taken to have its own ``.so``: ``<method>_so_blob``,
    the key ExecuTorch used before #20424.
    """
    if c.storage_key.startswith(FQN_WEIGHT_PREFIX + ":"):
        return c.storage_key
    device = "cpu" if device_type == "cpu" else "cuda"
    fqn = c.fqn
    if fqn.startswith("_tensor_constant"):
        fqn = f"{c.so_key or method_name + '_so_blob'}:{fqn}"
    return f"{FQN_WEIGHT_PREFIX}:{device}:{fqn}"


def duplicate_key_message(key: str, existing_bytes: int, new_bytes: int) -> str:
    """ExecuTorch's exporter refusal (``NamedDataStore``, executorch 1.5.1), verbatim."""
    return (
        f"Duplicate key {key} with different data. Existing data size: {existing_bytes} bytes. "
        f"New data size: {new_bytes} bytes."
    )


def _cached_bytes(entry: CachedView) -> int:
    n = getattr(entry, "nbytes", None)
    if isinstance(n, int):
        return n
    meta = entry.meta
    return required_nbytes(meta.dtype, meta.shape, meta.strides)


class FqnWeightCache(Policy):
    """ExecuTorch 1.5.x: per-FQN weight storages, keyed at export time, cached per program and device.

    :meth:`export` models the exporter: all methods' weights go into one store under
    :func:`fqn_weight_key`; one key with two contents refuses the program (stage "export").
    The runtime: a storage key cached for this device, with equal metadata, reuses its storage;
    otherwise that storage alone is uploaded; every constant is installed user-managed, no
    whole blob is uploaded.  The first holder of a key is cached under the key, holders on
    other devices under ``<key>@<device>``; that cache key is a decision's ``storage_key``.

    Where #21823's runtime (``ETCUDAFQN1``, ``refs/pull/21823/head``) and the ``ETCUDAFQN3``
    runtime agree, this follows them: a named constant of a dtype the manifest parser rejects
    (float64 and every dtype outside SlimTensor's nine) fails the method, "Malformed CUDA FQN
    weight manifest"; an unnamed parameter gets no pair, so the full-update bind fails it, "Failed
    to bind CUDA FQN weights"; an unnamed buffer or lifted constant is skipped by torch's
    ``assert_all_constants`` and nothing fills it (never filled).  One departure: upstream builds a
    hit under another view (same key, same storage bytes, other sizes/strides) as a view on the
    shared storage; here it gets its own upload (declined), because the program model holds the
    bytes each slot reads, not the storage a view reads from: same outputs, more memory.
    Approximations and what is not established: ``docs/upstream.md``.
    """

    name = PolicyName.FQN_WEIGHT_CACHE
    summary = (
        "per-FQN storages keyed at export (lifted constants namespaced by the .so); one key, one content "
        "or export fails; the runtime reuses a key's storage per program and device"
    )
    reproduces = (
        UpstreamRevision(
            21823,
            "",
            "2026-08-21",
            "'share AOTI weights by FQN across methods', merged "
            "after this date; payload ETCUDAFQN3 of the executorch 1.5.1 wheel",
            version="1.5.x",
        ),
    )
    memory_optimal = True

    def _key(self, c: ConstantSpec, method: MethodView, cache: CacheView) -> tuple[str, str, CachedView | None]:
        """(storage key, cache key for this method's device, entry under that cache key)."""
        skey = fqn_weight_key(c, method.name, method.device_type)
        first = cache.get(skey)
        if first is None or (first.meta.device_type, first.meta.device_index) == (
            method.device_type,
            method.device_index,
        ):
            return skey, skey, first
        ckey = f"{skey}@{device_label(method.device_type, method.device_index)}"
        return skey, ckey, cache.get(ckey)

    def plan(self, method, cache):
        lookups = []
        for c in method.constants:
            if not c.fqn:
                continue
            _, ckey, entry = self._key(c, method, cache)
            lookups.append(LookupResult(c, _Lookup.HIT if entry is not None else _Lookup.MISS, entry, key=ckey))
        return Plan(
            method, tuple(lookups), False, "per-FQN storages: only storages not cached for this device are uploaded"
        )

    def export(self, methods: Sequence[MethodView]) -> "ExportRefusal | None":
        """The 1.5.x exporter over the whole program: every method's weights go into one store
        under :func:`fqn_weight_key`, in load order; the first key met again with other bytes
        raises upstream's ``ValueError`` and no program is written.  Identical bytes under one
        key are stored once.  A constant whose key came from its file (an exported ``.pte``)
        is identified by the storage it points at: that program was exported, so its keys hold
        one content each."""
        stored: dict[str, tuple[tuple, ConstantSpec, str]] = {}
        for m in methods:
            for c in m.constants:
                if not c.fqn:
                    continue
                key = fqn_weight_key(c, m.name, m.device_type)
                content = (c.file, c.offset) if c.storage_key.startswith(FQN_WEIGHT_PREFIX + ":") else (c.digest,)
                first = stored.get(key)
                if first is None:
                    stored[key] = (content, c, m.name)
                elif first[0] != content:
                    held, owner = first[1], first[2]
                    return ExportRefusal(
                        m.name,
                        c,
                        key,
                        duplicate_key_message(key, held.nbytes, c.nbytes),
                        StoredConstant(
                            key, held.name, owner, m.meta(held), held.digest, held.mutated, held.storage, held.nbytes
                        ),
                    )
        return None

    def decide(self, plan, new_meta, cache):
        m = plan.method
        bad = next((c for c in m.constants if c.fqn and c.dtype not in _SLIM_SCALAR_TYPE), None)
        unbound = next((c for c in m.constants if not c.fqn and c.kind is _ConstantKind.PARAMETER and c.nbytes), None)
        if bad is not None or unbound is not None:  # init fails: the manifest's parse, else the full-update bind
            failure, c = (
                ("Malformed CUDA FQN weight manifest", bad)
                if bad is not None
                else ("Failed to bind CUDA FQN weights", unbound)
            )
            why = (
                f"{c.name!r} is {c.dtype}, a dtype the manifest parser rejects"
                if bad is not None
                else f"{c.name!r} is a parameter with no original FQN: no manifest entry binds it, and the "
                f"full-update check raises 'Cannot find constants {c.name} in constants_map!'"
            )
            refusing = ConstantDecision(
                c, None, _Decision.REFUSED, _Reason.LOAD_REFUSED, f"{why}; then: {failure}", _TensorOrigin.OWN_UPLOAD
            )
            return Outcome(
                m.name,
                tuple(_refuse_rest(plan, [refusing], f"method load failed: {failure}", _TensorOrigin.OWN_UPLOAD)),
                failure,
            )
        out: list[ConstantDecision] = []
        loaded_here: dict[str, ConstantSpec] = {}  # cache key -> the constant of this method that loads it
        failure: str | None = None
        for c in m.constants:
            lr = plan.lookup(c.name)
            if lr is None:
                out.append(
                    ConstantDecision(
                        c,
                        None,
                        _Decision.NEVER_FILLED,
                        _Reason.EMPTY_FQN,
                        f"no original FQN: no manifest entry binds it; torch's full-update check "
                        f"skips a {c.kind.value if c.nbytes else 'empty parameter'}, and no blob "
                        "is loaded: nothing fills this slot",
                        _TensorOrigin.WHOLE_BLOB,
                    )
                )
                continue
            skey, ckey, entry = self._key(c, m, cache)
            holder = cache.get(skey)  # the first holder of this storage key (any device)
            other = loaded_here.get(ckey)
            # The session asks export() first, so a program the exporter refuses never gets
            # here; this guards a cache filled otherwise (one method loaded on its own).
            if holder is not None and holder.digest != c.digest:
                failure = duplicate_key_message(skey, _cached_bytes(holder), c.nbytes)
            elif holder is None and other is not None and other.digest != c.digest:
                failure = duplicate_key_message(skey, other.nbytes, c.nbytes)
            if failure is not None:
                dig = DigestComparison((holder or other).digest, c.digest)
                out.append(
                    ConstantDecision(
                        c,
                        lr.result,
                        _Decision.REFUSED,
                        _Reason.EXPORT_REFUSED,
                        f"export refuses the program: {failure}",
                        _TensorOrigin.OWN_UPLOAD,
                        holder,
                        digest_comparison=dig,
                        key=ckey,
                    )
                )
                break
            if entry is None and other is None:
                loaded_here[ckey] = c
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.LOADED,
                        _Reason.FIRST_SEEN,
                        f"first method with storage key {skey!r} on this device: that storage is uploaded and cached",
                        _TensorOrigin.OWN_UPLOAD,
                        enters_cache=True,
                        key=ckey,
                    )
                )
            elif entry is None:
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.MISS,
                        _Decision.PRIVATE,
                        _Reason.SAME_KEY_IN_METHOD,
                        f"another constant of this method loads storage key {skey!r}: own "
                        "upload (upstream binds both names to one storage)",
                        _TensorOrigin.OWN_UPLOAD,
                        key=ckey,
                    )
                )
            else:
                comps = compare_metadata(entry.meta, m.meta(c))
                dig = DigestComparison(entry.digest, c.digest)
                if comps.all_equal:
                    out.append(
                        ConstantDecision(
                            c,
                            _Lookup.HIT,
                            _Decision.SHARED,
                            _Reason.STORAGE_KEY_HIT,
                            f"storage key {skey!r} cached for this device: its storage is "
                            "reused (one key, one content: the exporter checked)",
                            _TensorOrigin.CACHE,
                            entry,
                            comps,
                            dig,
                            key=ckey,
                        )
                    )
                else:
                    out.append(
                        ConstantDecision(
                            c,
                            _Lookup.HIT,
                            _Decision.DECLINED,
                            _Reason.METADATA_MISMATCH,
                            f"{_mismatch_text(comps)}: the same storage viewed otherwise; "
                            "upstream builds a view on the shared storage, here it is "
                            "uploaded on its own",
                            _TensorOrigin.OWN_UPLOAD,
                            entry,
                            comps,
                            dig,
                            key=ckey,
                        )
                    )
        if failure is None:
            return Outcome(m.name, tuple(out))
        out = _refuse_rest(plan, out, f"the exporter refuses the program: {failure}", _TensorOrigin.OWN_UPLOAD)
        return Outcome(m.name, tuple(out), failure, stage=Stage.EXPORT)


POLICY_CLASSES: dict[PolicyName, type[Policy]] = {
    cls.name: cls
    for cls in (
        NoSharing,
        NameOnly,
        RefuseOnMismatch,
        DeclineOnMismatch,
        VerifyAlways,
        Fingerprint,
        ContentDedup,
        BlindShare,
        FqnWeightCache,
    )
}
POLICIES: tuple[str, ...] = tuple(p.value for p in PolicyName)


def get_policy(policy: str | PolicyName | Policy) -> Policy:
    """A policy instance from a name (checked against :data:`POLICIES`) or an instance."""
    if isinstance(policy, Policy):
        return policy
    try:
        return POLICY_CLASSES[parse(PolicyName, policy, what="policy")]()
    except ValueError as e:
        close = difflib.get_close_matches(str(policy), POLICIES, n=1)
        raise UnknownPolicyError(f"{e}" + (f" (did you mean {close[0]!r}?)" if close else "")) from None
