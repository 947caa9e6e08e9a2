"""Every policy by name: :data:`POLICIES` (the names, in the vocabulary's order) and :func:`get_policy`."""

from __future__ import annotations

import difflib

from toolkit.core.errors import UnknownPolicyError
from toolkit.core.policies.base import Policy
from toolkit.core.policies.executorch import (
    BlindShare,
    DeclineOnMismatch,
    NameOnly,
    NoSharing,
    RefuseOnMismatch,
    VerifyAlways,
)
from toolkit.core.policies.fqn_weight_cache import FqnWeightCache
from toolkit.core.policies.ours import ContentDedup, Fingerprint
from toolkit.core.vocab import PolicyName, parse

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
