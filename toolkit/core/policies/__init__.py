"""Sharing policies: pure decision logic, no I/O, no torch.

A policy (:class:`~toolkit.core.policies.base.Policy`) decides, per method, in two phases that
mirror ExecuTorch's CUDA backend: :meth:`~Policy.plan` (the lookups, and whether to upload the
whole blob), then :meth:`~Policy.decide` (every constant).  The loader
(:mod:`toolkit.engine.loader`) carries a decision out against the real AOTInductor runtime;
:func:`toolkit.workflows.dry_run.dry_run` runs the same two calls on manifest data alone.  Both
see identical decisions because the logic lives only here: what a policy is given and answers
(:mod:`.decisions`), shared checks and steps (:mod:`.checks`, :mod:`.steps`), ExecuTorch's
revisions (:mod:`.executorch`, :mod:`.fqn_weight_cache` with its exporter, :mod:`.exporter`), ours
(:mod:`.ours`) and the registry (:mod:`.registry`).  This package offers the names other layers use.
"""

from toolkit.core.policies.base import Policy
from toolkit.core.policies.checks import slot_problem
from toolkit.core.policies.decisions import LookupResult, MethodView, Outcome, Plan
from toolkit.core.policies.exporter import ExportRefusal, fqn_weight_key
from toolkit.core.policies.registry import POLICIES, POLICY_CLASSES, get_policy

__all__ = [
    "POLICIES",
    "POLICY_CLASSES",
    "ExportRefusal",
    "LookupResult",
    "MethodView",
    "Outcome",
    "Plan",
    "Policy",
    "fqn_weight_key",
    "get_policy",
    "slot_problem",
]
