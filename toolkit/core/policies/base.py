"""The policy interface: :class:`Policy`, and the upstream revision a policy reproduces.

A policy decides, per method, in two phases that mirror ExecuTorch's CUDA backend
(``backends/cuda/runtime/cuda_backend.cpp``): :meth:`Policy.plan` looks every constant up in the
shared cache and says whether the method's whole weights blob must be uploaded;
:meth:`Policy.decide` takes the metadata of the freshly extracted tensors (only when the blob was
uploaded) and decides every constant.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

from toolkit.core.model import TensorMeta
from toolkit.core.policies.decisions import CacheView, MethodView, Outcome, Plan
from toolkit.core.policies.exporter import ExportRefusal
from toolkit.core.vocab import PolicyName


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
    # its keys hold a method's .so digest (ConstantSpec.so_key): a load verifies the digests first
    reads_so_keys: ClassVar[bool] = False

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
