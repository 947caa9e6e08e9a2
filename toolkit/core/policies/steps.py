"""Decision steps several policies share: the lookups by FQN, upstream's first and last slot per FQN,
a slot upstream's pairs do not name, and a refused load's decisions.
"""

from __future__ import annotations

from toolkit.core.model import ConstantSpec
from toolkit.core.policies.decisions import CacheView, ConstantDecision, LookupResult, MethodView, Plan
from toolkit.core.vocab import Decision, Lookup, Members, Reason, TensorOrigin

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_Decision, _Lookup, _Reason, _TensorOrigin = (Members(e) for e in (Decision, Lookup, Reason, TensorOrigin))


def refuse_rest(plan: Plan, decided: list[ConstantDecision], why: str, origin: TensorOrigin) -> list[ConstantDecision]:
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


def fqn_slots(method: MethodView) -> tuple[dict[str, ConstantSpec], dict[str, ConstantSpec]]:
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


def unpointed(c: ConstantSpec, blob: bool, why: str) -> ConstantDecision:
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


def lookups_by_fqn(method: MethodView, cache: CacheView) -> tuple[LookupResult, ...]:
    """Every named constant looked up by its FQN."""
    return tuple(
        LookupResult(c, _Lookup.MISS if (e := cache.get(c.fqn)) is None else _Lookup.HIT, e)
        for c in method.constants
        if c.fqn
    )
