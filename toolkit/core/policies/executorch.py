"""ExecuTorch's name-keyed sharing, revision by revision: off, the first blind sharing, then
``weight_sharing_across_methods`` with its checks (``cuda_backend.cpp``).

Each class reproduces the revisions in its ``reproduces``; ``docs/upstream.md`` tells their story.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from toolkit.core.policies.base import Policy, UpstreamRevision
from toolkit.core.policies.checks import check_cached_constant_match, compare_metadata, decline_message, refusal_message
from toolkit.core.policies.decisions import ConstantDecision, Outcome, Plan, StoredConstant
from toolkit.core.policies.steps import fqn_slots, lookups_by_fqn, refuse_rest, unpointed
from toolkit.core.policies.unordered_map import unordered_map_order
from toolkit.core.vocab import Decision, Lookup, Members, PolicyName, Reason, TensorOrigin

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_Decision, _Lookup, _Reason, _TensorOrigin = (Members(e) for e in (Decision, Lookup, Reason, TensorOrigin))


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
        lookups = lookups_by_fqn(method, cache)  # upstream counts named constants only
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
        first_of, last_of = fqn_slots(m)
        for c in m.constants:
            lr = plan.lookup(c.name)
            if lr is None:  # constants with an empty FQN are skipped by the backend
                decisions.append(unpointed(c, plan.upload_whole_blob, "no original FQN: never looked up"))
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
                        unpointed(
                            c,
                            plan.upload_whole_blob,
                            (
                                f"{last_of[c.fqn].name!r} holds FQN {c.fqn!r} in upstream's FQN-to-name map "
                                "(the last wins)"
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
                    "all names hit; the blob and extraction are unavailable, so sharing rests on the name alone "
                    "(#21706)"
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
        out = refuse_rest(plan, decisions, f"method load failed: {failure}", _TensorOrigin.WHOLE_BLOB)
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
        lookups = lookups_by_fqn(method, cache)
        return Plan(method, lookups, True, "every method uploads its own full weights blob (#18667)")

    def decide(self, plan, new_meta, cache):
        m = plan.method
        # upstream's constants_extracted_: set by the first method with constants, named or not
        first = len(cache) == 0 and not cache.first_container
        first_of, last_of = fqn_slots(m)
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
                        unpointed(
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
