"""What a method's load is recorded as: its enumerated slots, lookups, comparisons and decisions as events.

Each group is written as one batch of columns (:meth:`toolkit.core.events.EventLog.record_batch`),
not one record per constant: a method can hold tens of thousands of constants, and the tables
(:mod:`toolkit.engine.frames`) read the columns back as they are.  The decisions' records also
carry what the verdict finds wrong with each constant (:func:`toolkit.core.verdict.find_problem`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from toolkit.core import events as ev
from toolkit.core.cache import CacheEntry
from toolkit.core.model import ConstantSpec, shown
from toolkit.core.policies import LookupResult, Outcome, Plan
from toolkit.core.verdict import ConstantFinding, find_problem
from toolkit.core.vocab import ConstantKind, Decision, Lookup, Members
from toolkit.runtimes import Device

# a member read once per constant, as a plain attribute (vocab.Members says why)
_Decision = Members(Decision)

# an enum member's value, as a table shows it (a dict: a member's .value is a slow descriptor); None: ""
_VALUE: dict[Any, str] = {None: "", **{m: m.value for e in (ConstantKind, Lookup) for m in e}}


def record_enumerated(log: ev.EventLog, m: str, constants: Sequence[ConstantSpec]) -> None:
    """The constants of method ``m`` found in (or taken as) its compiled slots."""
    if constants:
        log.record_batch(
            ev.ConstantEnumerated,
            m,
            name=[c.name for c in constants],
            fqn=[c.fqn for c in constants],
            dtype=[c.dtype for c in constants],
        )


def record_lookups(log: ev.EventLog, m: str, lookups: Sequence[LookupResult]) -> None:
    """The cache lookups of a method's plan, as one record."""
    if lookups:
        log.record_batch(
            ev.CacheLookup,
            m,
            name=[lr.constant.name for lr in lookups],
            fqn=[lr.constant.fqn for lr in lookups],
            result=[lr.result for lr in lookups],
            cached_owner=[lr.entry.owner_method if lr.entry else "" for lr in lookups],
            storage_key=[lr.key for lr in lookups],
        )


def record_digests(log: ev.EventLog, m: str, outcome: Outcome) -> None:
    """The digest comparisons of a method's decisions, one record each (a refused export's)."""
    for d in outcome.decisions:
        if d.digest_comparison is not None:
            dc = d.digest_comparison
            log.record(
                ev.DigestCompared,
                m,
                name=d.constant.name,
                fqn=d.constant.fqn,
                cached=dc.cached,
                new=dc.new,
                equal=dc.equal,
            )


def record_comparisons(log: ev.EventLog, m: str, outcome: Outcome) -> None:
    """Every field and digest comparison of a method's decisions, in order, as one record."""
    f_name: list[str] = []
    f_fqn: list[str] = []
    f_field: list[Any] = []
    f_cached: list[str] = []
    f_new: list[str] = []
    f_equal: list[bool] = []
    d_rows: list[tuple[ConstantSpec, Any]] = []
    kinds: list[int] = []
    columns: dict[int, tuple] = {}  # id(comparisons) -> its kinds, its columns and itself
    for d in outcome.decisions:
        comps = d.comparisons
        if comps:  # the same few tuples repeat (compare_metadata is memoised): columns made once per tuple
            col = columns.get(id(comps))
            if col is None or col[5] is not comps:
                col = columns[id(comps)] = (
                    [0] * len(comps),
                    [x.field for x in comps],
                    [x.cached for x in comps],
                    [x.new for x in comps],
                    [x.equal for x in comps],
                    comps,
                )
            c, k = d.constant, len(comps)
            f_name += [c.name] * k
            f_fqn += [c.fqn] * k
            kinds += col[0]
            f_field += col[1]
            f_cached += col[2]
            f_new += col[3]
            f_equal += col[4]
        if d.digest_comparison is not None:
            d_rows.append((d.constant, d.digest_comparison))
            kinds.append(1)
    if not kinds:
        return
    log.record_rows(
        m,
        (ev.FieldCompared, ev.DigestCompared),
        kinds,
        {
            ev.FieldCompared: {
                "name": f_name,
                "fqn": f_fqn,
                "field": f_field,
                "cached": f_cached,
                "new": f_new,
                "equal": f_equal,
            },
            ev.DigestCompared: {
                "name": [c.name for c, _ in d_rows],
                "fqn": [c.fqn for c, _ in d_rows],
                "cached": [x.cached for _, x in d_rows],
                "new": [x.new for _, x in d_rows],
                "equal": [x.equal for _, x in d_rows],
            },
        },
    )


def record_decisions(
    log: ev.EventLog, m: str, device: Device, outcome: Outcome, plan: Plan, problems: Mapping[str, str]
) -> tuple[ConstantFinding, ...]:
    """Every decision of a method as one record (its columns); returns the method's findings.

    ``problems``: constant name -> what the out-of-bounds guard found wrong with its slot.
    """
    ds = outcome.decisions
    cs = [d.constant for d in ds]
    slot = [problems.get(c.name, "") for c in cs] if problems else [""] * len(ds)
    refs = []  # the cache entry each was given or checked against, None when none
    findings, data_problem = [], []
    lookup, shared = plan.lookup, _Decision.SHARED
    for d, c, sp in zip(ds, cs, slot):
        ref = d.shared_from
        if not ref:
            lr = lookup(c.name)
            ref = lr.entry if lr else None
        refs.append(ref)
        if ref:
            found = find_problem(
                method=m,
                name=c.name,
                fqn=c.fqn,
                decision=d.decision,
                digest=c.digest,
                mutated=c.mutated,
                storage=c.storage,
                slot_problem=sp,
                cached_method=ref.owner_method,
                cached_name=ref.name,
                # a view reads its own bytes of the storage its key names (one key, one content): the
                # cached view's digest covers other bytes of that storage
                cached_digest=c.digest if d.view_of else ref.digest,
                cached_mutated=ref.mutated,
                cached_storage=ref.storage,
            )
        else:
            found = find_problem(
                method=m,
                name=c.name,
                fqn=c.fqn,
                decision=d.decision,
                digest=c.digest,
                mutated=c.mutated,
                storage=c.storage,
                slot_problem=sp,
            )
        if found is not None:
            findings.append(found)
            data_problem.append(found.problem.value)
        else:
            data_problem.append("")
    if ds:
        log.record_batch(
            ev.Decided,
            m,
            device=[str(device)] * len(ds),
            name=[c.name for c in cs],
            fqn=[c.fqn for c in cs],
            constant_kind=[_VALUE[c.kind] for c in cs],
            mutated=[c.mutated for c in cs],
            lookup=[_VALUE[d.lookup] for d in ds],
            decision=[d.decision for d in ds],
            reason_code=[d.reason_code for d in ds],
            reason=[d.reason for d in ds],
            origin=[d.origin for d in ds],
            shared_from=[
                f"{d.shared_from.owner_method}/{d.shared_from.name}" if d.decision is shared and d.shared_from else ""
                for d in ds
            ],
            nbytes=[c.nbytes for c in cs],
            dtype=[c.dtype for c in cs],
            shape=[shown(c.shape) for c in cs],
            strides=[shown(c.strides) for c in cs],
            digest=[c.digest for c in cs],
            cached_method=[r.owner_method if r else "" for r in refs],
            cached_dtype=[r.meta.dtype if r else "" for r in refs],
            cached_shape=[shown(r.meta.shape) if r else "" for r in refs],
            cached_strides=[shown(r.meta.strides) if r else "" for r in refs],
            cached_digest=[r.digest if r else "" for r in refs],
            slot_problem=slot,
            storage_key=[d.key for d in ds],
            data_problem=data_problem,
            upstream_keeps=[d.upstream_keeps for d in ds],
        )
    return tuple(findings)


def record_left_upstream(log: ev.EventLog, m: str, outcome: Outcome) -> None:
    """The cache entries upstream keeps although the method's load failed, one record each."""
    for d in outcome.decisions:
        if d.upstream_keeps:
            log.record(ev.CacheEntryLeftUpstream, m, name=d.constant.name, fqn=d.constant.fqn, reason=d.reason)


def record_cache_added(log: ev.EventLog, m: str, added: Iterable[tuple[ConstantSpec, CacheEntry]]) -> None:
    """The cache entries a method's load added, as one record."""
    added = list(added)
    if added:
        log.record_batch(
            ev.CacheEntryAdded,
            m,
            name=[c.name for c, _ in added],
            fqn=[c.fqn for c, _ in added],
            owner_kind=[e.owner_kind for _, e in added],
        )
