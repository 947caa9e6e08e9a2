"""Our policies: share a hit only when metadata and the build-time content digest match.

Decided from the manifest, so no whole blob is uploaded and no device round trip is needed;
state (a buffer some method writes) is shared only when it is one buffer of the eager program.
"""

from __future__ import annotations

from typing import ClassVar

from toolkit.core.model import ConstantSpec, TensorMeta
from toolkit.core.policies.base import Policy
from toolkit.core.policies.checks import compare_metadata, mismatch_text
from toolkit.core.policies.decisions import (
    ConstantDecision,
    DigestComparison,
    FieldComparison,
    LookupResult,
    Outcome,
    Plan,
)
from toolkit.core.policies.steps import lookups_by_fqn
from toolkit.core.vocab import Decision, Lookup, Members, PolicyName, Reason, TensorOrigin

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_Decision, _Lookup, _Reason, _TensorOrigin = (Members(e) for e in (Decision, Lookup, Reason, TensorOrigin))


def _state_decision(c: ConstantSpec, lr: "LookupResult", meta: TensorMeta) -> "ConstantDecision | None":
    """Fingerprint's rule for state: a buffer some method writes is shared exactly when
    provenance says it is the same buffer of the eager program (a KV cache prefill fills and
    decode reads, ExecuTorch issue #17496), and kept private otherwise, whatever its name and content.

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
        lookups = lookups_by_fqn(method, cache)
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
                        f"{mismatch_text(comps)}: declined, own copy uploaded",
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
