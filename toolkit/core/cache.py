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

from toolkit.core.model import TensorMeta


@dataclass(slots=True)  # slots: a dry run makes one per constant it caches (half the time to make)
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
        # what changed since snapshot(), undone by restore(): linear in a method's own changes, not in
        # the cache's size (100,000 methods sharing one constant must not copy its users per method)
        self._journal: list[tuple[str, CacheEntry, Any]] = []

    # CacheView protocol (what policies see)
    def get(self, fqn: str) -> CacheEntry | None:
        return self._by_fqn.get(fqn)

    def find_content(self, digest: str, meta: TensorMeta) -> CacheEntry | None:
        return self._by_content.get((digest, meta))

    def add(self, entry: CacheEntry) -> None:
        if entry.fqn in self._by_fqn:
            raise KeyError(f"cache already holds {entry.fqn!r}")
        self._by_fqn[entry.fqn] = entry
        indexed = self._by_content.setdefault((entry.digest, entry.meta), entry) is entry  # the first with it
        self._journal.append(("add", entry, indexed))

    def add_user(self, entry: CacheEntry, method: str) -> None:
        """``method`` now runs on ``entry``'s tensor too."""
        if method not in entry.users:
            entry.users.add(method)
            self._journal.append(("user", entry, method))

    def __iter__(self) -> Iterator[CacheEntry]:
        return iter(list(self._by_fqn.values()))

    def __len__(self) -> int:
        return len(self._by_fqn)

    def snapshot(self) -> tuple[int, str]:
        """A mark to restore to if a method load fails half-way (one load at a time, under ``lock``)."""
        self._journal.clear()
        return 0, self.first_container

    def restore(self, snap: tuple[int, str]) -> None:
        mark, self.first_container = snap
        while len(self._journal) > mark:
            kind, entry, what = self._journal.pop()
            if kind == "user":
                entry.users.discard(what)
                continue
            if self._by_fqn.get(entry.fqn) is entry:
                del self._by_fqn[entry.fqn]
            if what and self._by_content.get((entry.digest, entry.meta)) is entry:
                del self._by_content[(entry.digest, entry.meta)]

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
