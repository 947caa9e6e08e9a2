"""The shared-constant cache: FQN -> one device tensor, with explicit lifetimes.

Tensors extracted from an AOTInductor container alias the container's memory and
own nothing (background.md).  An entry therefore holds a reference to whatever
keeps its bytes alive (the owning container, or nothing when the toolkit owns the
tensor), and records which methods use it.  An entry goes away only when no method
uses it any more, whichever method is unloaded first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from .model import TensorMeta


@dataclass
class CacheEntry:
    fqn: str
    name: str  # internal name in the owner method
    owner_method: str
    meta: TensorMeta
    digest: str
    nbytes: int
    tensor: Any  # torch.Tensor (None in dry-run analysis)
    keepalive: Any = None  # the container whose blob the tensor aliases, if any
    users: set[str] = field(default_factory=set)
    mutated: bool = False  # the owner method's graph writes it (state)
    storage: str = ""  # provenance: which tensor of the eager program it is ("" unknown)

    @property
    def owner_kind(self) -> str:
        return "container" if self.keepalive is not None else "toolkit"


class SharedConstantCache:
    """Process-wide in ExecuTorch; one per session here, so policies can be compared."""

    def __init__(self) -> None:
        self._by_fqn: dict[str, CacheEntry] = {}
        self._by_content: dict[tuple[str, TensorMeta], CacheEntry] = {}
        self.lock = threading.RLock()  # the upstream backend guards loads with a mutex
        self.first_container = ""  # blind-share: the method upstream's constants_extracted_ flag was set by

    # CacheView protocol (what policies see)
    def get(self, fqn: str) -> CacheEntry | None:
        return self._by_fqn.get(fqn)

    def find_content(self, digest: str, meta: TensorMeta) -> CacheEntry | None:
        return self._by_content.get((digest, meta))

    def add(self, entry: CacheEntry) -> None:
        if entry.fqn in self._by_fqn:
            raise KeyError(f"cache already holds {entry.fqn!r}")
        self._by_fqn[entry.fqn] = entry
        self._by_content.setdefault((entry.digest, entry.meta), entry)

    def __iter__(self) -> Iterator[CacheEntry]:
        return iter(list(self._by_fqn.values()))

    def __len__(self) -> int:
        return len(self._by_fqn)

    def snapshot(self) -> tuple[dict, dict, dict, str]:
        """State to restore if a method load fails half-way."""
        return (dict(self._by_fqn), dict(self._by_content), {id(e): set(e.users) for e in self._by_fqn.values()},
                self.first_container)

    def restore(self, snap: tuple[dict, dict, dict, str]) -> None:
        by_fqn, by_content, users, self.first_container = snap
        self._by_fqn = dict(by_fqn)
        self._by_content = dict(by_content)
        for e in self._by_fqn.values():
            e.users = set(users.get(id(e), set()))

    def release(self, method: str) -> int:
        """Drop ``method`` from every entry's users; free entries nobody uses. Returns how many."""
        freed = 0
        for fqn, e in list(self._by_fqn.items()):
            e.users.discard(method)
            if not e.users:
                del self._by_fqn[fqn]
                key = (e.digest, e.meta)
                if self._by_content.get(key) is e:
                    del self._by_content[key]
                    # another live entry with the same content may take over the content index
                    for other in self._by_fqn.values():
                        if (other.digest, other.meta) == key:
                            self._by_content[key] = other
                            break
                freed += 1
        return freed
