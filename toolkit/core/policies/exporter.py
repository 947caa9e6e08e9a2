"""The modelled ExecuTorch 1.5.x exporter: the keys it stores weights under, and its refusal of a program.

Every method's weights go into one store under :func:`fqn_weight_key`; one key met with two
contents makes the exporter raise, and no program is written (:class:`ExportRefusal`).  Only
``fqn-weight-cache`` models an exporter (:meth:`toolkit.core.policies.base.Policy.export`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from toolkit.core.model import ConstantSpec
from toolkit.core.policies.decisions import (
    ConstantDecision,
    DigestComparison,
    MethodView,
    Outcome,
    StoredConstant,
)
from toolkit.core.vocab import Decision, Members, Reason, Stage, TensorOrigin

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_Decision, _Reason, _TensorOrigin = Members(Decision), Members(Reason), Members(TensorOrigin)

FQN_WEIGHT_PREFIX = "cuda_fqn_weight"


def fqn_weight_key(c: ConstantSpec, method_name: str, device_type: str) -> str:
    """The ``.ptd`` key ExecuTorch 1.5.x stores ``c``'s storage under (``cuda_weight_collector.py``).

    ``cuda_fqn_weight:<cpu|cuda>:<fqn>``; an FQN starting with ``_tensor_constant`` (named by
    position in one compiled library) is namespaced by its method's ``.so`` key:
    ``cuda_fqn_weight:cuda:<so_key>:_tensor_constant0``; ``so_key`` is made of the ``.so``'s bytes
    (a ``.pte``'s or ``.pt2``'s source hashes them; a program directory's recorded sha256 is
    verified against them before any decision: :attr:`~toolkit.core.policies.base.Policy.reads_so_keys`).
    A constant that carries the key its file stored it under (a 1.5.x ``.pte``) keeps it.  Without
    an ``so_key`` (a program that exists only in memory) each method is taken to have its own
    ``.so``: ``<method>_so_blob``, the key ExecuTorch used before #20424.
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
