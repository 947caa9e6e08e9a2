"""ExecuTorch 1.5.x's per-FQN weight storages: keyed at export, reused per program and device at load."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from toolkit.core.model import ConstantSpec, TensorMeta, required_nbytes
from toolkit.core.policies.base import Policy, UpstreamRevision
from toolkit.core.policies.checks import (
    SLIM_SCALAR_TYPE,
    Comparisons,
    compare_metadata,
    device_label,
    mismatch_text,
)
from toolkit.core.policies.decisions import (
    CachedView,
    CacheView,
    ConstantDecision,
    DigestComparison,
    LookupResult,
    MethodView,
    Outcome,
    Plan,
    StoredConstant,
)
from toolkit.core.policies.exporter import FQN_WEIGHT_PREFIX, ExportRefusal, duplicate_key_message, fqn_weight_key
from toolkit.core.policies.steps import refuse_rest
from toolkit.core.vocab import ConstantKind, Decision, Lookup, Members, PolicyName, Reason, Stage, TensorOrigin

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_ConstantKind, _Decision, _Lookup, _Reason, _TensorOrigin = (
    Members(e) for e in (ConstantKind, Decision, Lookup, Reason, TensorOrigin)
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
    The runtime (``CudaWeightCache::load`` of the ``ETCUDAFQN3`` runtime) goes through a method's
    entries in order: each view must fit its storage, else "Invalid CUDA FQN view"; a storage key
    cached for this device (by an earlier method, or by an earlier entry of this method) reuses
    that storage, which must have the entry's size, else "Failed to load CUDA FQN storage"; a key
    not cached has its whole storage uploaded (``storage_bytes``) and cached.  Every entry then
    gets its own view (dtype, sizes, strides, storage offset) on the storage, bound user-managed;
    no whole blob is uploaded.  So the decisions say which is which: the same view as the cached
    tensor (``storage_key_hit``), another view of the cached storage (``view_of_storage``, its
    ``view_of`` the storage key), a storage another entry of this method acquired
    (``same_key_in_method``, a view where its layout differs).  The first holder of a key is
    cached under the key, holders on other devices under ``<key>@<device>``; that cache key is a
    decision's ``storage_key``.

    Where #21823's runtime (``ETCUDAFQN1``, ``refs/pull/21823/head``) and the ``ETCUDAFQN3``
    runtime agree, this follows them: a named constant of a dtype the manifest parser rejects
    (float64 and every dtype outside SlimTensor's nine) fails the method, "Malformed CUDA FQN
    weight manifest"; an unnamed parameter gets no pair, so the full-update bind fails it, "Failed
    to bind CUDA FQN weights"; an unnamed buffer or lifted constant is skipped by torch's
    ``assert_all_constants`` and nothing fills it (never filled).
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
    reads_so_keys = True  # lifted constants are namespaced by their .so's digest (fqn_weight_key)

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
                elif first[0] != content and first[1].digest != c.digest:  # identical bytes: stored once
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
        bad = next((c for c in m.constants if c.fqn and c.dtype not in SLIM_SCALAR_TYPE), None)
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
                tuple(refuse_rest(plan, [refusing], f"method load failed: {failure}", _TensorOrigin.OWN_UPLOAD)),
                failure,
            )
        out: list[ConstantDecision] = []
        loaded_here: dict[str, ConstantSpec] = {}  # cache key -> the constant of this method whose upload holds it
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
            # The session asks export() first, so a program the exporter refuses never gets here; this
            # guards a cache filled otherwise (one method loaded on its own).  A key read from its file
            # names one storage of that file: nothing to compare.
            if not c.storage_key.startswith(FQN_WEIGHT_PREFIX + ":"):
                if holder is not None and holder.digest != c.digest:
                    failure = duplicate_key_message(skey, _cached_bytes(holder), c.nbytes)
                elif holder is None and other is not None and other.digest != c.digest:
                    failure = duplicate_key_message(skey, other.storage_bytes, c.storage_bytes)
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
            refused = _runtime_refusal(c, skey, entry if entry is not None else other)
            if refused is not None:
                failure, why = refused
                out.append(
                    ConstantDecision(
                        c, lr.result, _Decision.REFUSED, _Reason.LOAD_REFUSED, why, _TensorOrigin.OWN_UPLOAD, key=ckey
                    )
                )
                out = refuse_rest(plan, out, f"method load failed: {failure}", _TensorOrigin.OWN_UPLOAD)
                return Outcome(m.name, tuple(out), failure)
            if entry is None and other is None:
                loaded_here[ckey] = c
                whole = c.storage_bytes
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
                        upload=replace(c, nbytes=whole) if whole != c.nbytes else None,
                    )
                )
            elif entry is None:
                # upstream's cache already holds the storage this method's earlier entry acquired: reused
                first = StoredConstant(
                    ckey, other.name, m.name, m.meta(other), other.digest, other.mutated, other.storage, other.nbytes
                )
                view = _other_view(m.meta(other), other.digest, m.meta(c), c.digest)
                out.append(
                    ConstantDecision(
                        c,
                        lr.result,
                        _Decision.SHARED,
                        _Reason.SAME_KEY_IN_METHOD,
                        (f"view of {skey!r}" if view else f"storage key {skey!r}")
                        + f": the storage {other.name!r} of this method loads, "
                        + (f"under its own view ({view})" if view else "as that slot views it"),
                        _TensorOrigin.OWN_UPLOAD,
                        first,
                        digest_comparison=DigestComparison(other.digest, c.digest),
                        key=ckey,
                        view_of=skey if view else "",
                    )
                )
            else:
                comps = compare_metadata(entry.meta, m.meta(c))
                dig = DigestComparison(entry.digest, c.digest)
                view = _other_view(entry.meta, entry.digest, m.meta(c), c.digest, comps)
                out.append(
                    ConstantDecision(
                        c,
                        _Lookup.HIT,
                        _Decision.SHARED,
                        _Reason.VIEW_OF_STORAGE if view else _Reason.STORAGE_KEY_HIT,
                        f"view of {skey!r}: its storage, cached for this device, under its own view ({view}); "
                        "nothing uploaded"
                        if view
                        else f"storage key {skey!r} cached for this device: its storage is "
                        "reused (one key, one content: the exporter checked)",
                        _TensorOrigin.CACHE,
                        entry,
                        comps,
                        dig,
                        key=ckey,
                        view_of=skey if view else "",
                    )
                )
        if failure is None:
            return Outcome(m.name, tuple(out))
        out = refuse_rest(plan, out, f"the exporter refuses the program: {failure}", _TensorOrigin.OWN_UPLOAD)
        return Outcome(m.name, tuple(out), failure, stage=Stage.EXPORT)


def _other_view(
    cached: TensorMeta, cached_digest: str, new: TensorMeta, new_digest: str, comps: Comparisons | None = None
) -> str:
    """How ``new`` views the storage otherwise than ``cached`` ("" when it is the same view).  Both read
    one storage from its start, so with equal dtype, sizes and strides, other bytes read mean another
    storage offset."""
    comps = comps if comps is not None else compare_metadata(cached, new)
    if not comps.all_equal:
        return mismatch_text(comps)
    return "" if cached_digest == new_digest else "another storage offset"


def _runtime_refusal(c: ConstantSpec, skey: str, source: "CachedView | ConstantSpec | None") -> tuple[str, str] | None:
    """(failure, why) where the runtime fails the method on ``c``'s manifest entry, else None: the view
    must fit its storage (``validate_view``), and a storage already acquired under the key must have
    the entry's size (``acquire_storage``)."""
    if c.nbytes > c.storage_bytes:
        return (
            f"Invalid CUDA FQN view '{c.fqn}'",
            f"CUDA FQN weight '{c.fqn}' requires {c.nbytes} bytes from a {c.storage_bytes}-byte storage",
        )
    have = _storage_bytes(source)
    if have is not None and have != c.storage_bytes:
        return (
            f"Failed to load CUDA FQN storage '{skey}'",
            f"CUDA FQN weight '{c.fqn}' has inconsistent allocation metadata: the storage under {skey!r} holds "
            f"{have} bytes, its entry says {c.storage_bytes}",
        )
    return None


def _storage_bytes(source: "CachedView | ConstantSpec | None") -> int | None:
    """Bytes of the storage a cache entry or a constant of this method holds (None: not known)."""
    if isinstance(source, ConstantSpec):
        return source.storage_bytes
    n = getattr(source, "nbytes", None)
    return n if isinstance(n, int) else None
