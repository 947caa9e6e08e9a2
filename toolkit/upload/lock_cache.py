"""The process's page-locked blob pages, kept between loads within a budget.

Locked pages cannot be swapped out, so they are bounded (``LoadOptions.host_lock_bytes``, default a
quarter of physical memory); blobs nobody is loading are unlocked least recently used first.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path

from toolkit.upload.locking import LockedMapping, file_key


def lock_budget(budget_bytes: int | None) -> int:
    """A page-lock budget in bytes (:attr:`LoadOptions.host_lock_bytes`); None: a quarter of physical memory."""
    if budget_bytes is not None:
        return max(0, int(budget_bytes))
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):
        return 0


class HostLockCache:
    """Blob mappings whose locked pages outlive one load, up to ``budget_bytes`` in all.

    Loading a blob again (another policy, another session, the explorer) finds its pages still
    locked and copies at the device's full copy speed.  The locked pages are the page cache's
    own: no second host copy of any blob.  Mappings nobody uses are unlocked least recently
    used first once ``budget_bytes`` is exceeded (:func:`lock_budget`; 0: unlock each blob
    once its load is done).
    """

    def __init__(self, budget_bytes: int | None = None):
        self.budget_bytes = lock_budget(budget_bytes)
        self._maps: dict[tuple[int, int, int, int], LockedMapping] = {}
        self._lock = threading.Lock()
        self._clock = 0

    def acquire(self, path: Path) -> LockedMapping:
        key = file_key(path)
        with self._lock:
            lm = self._maps.get(key)
            if lm is None:
                lm = self._maps[key] = LockedMapping(path, key)
            lm.users += 1
            self._clock += 1
            lm.last_used = self._clock
            return lm

    def release(self, lm: LockedMapping, unlock: "ThreadPoolExecutor") -> list[Future]:
        """One user less; unlock (in ``unlock``) unused mappings over the budget, oldest first."""
        with self._lock:
            lm.users -= 1
            victims = []
            held = {m.key: m.held_bytes for m in self._maps.values()}
            total = sum(held.values())
            for m in sorted(self._maps.values(), key=lambda m: m.last_used):
                if m.users == 0 and (total > self.budget_bytes or not held[m.key]):  # over budget, or nothing held
                    total -= held[m.key]
                    victims.append(m)
                    del self._maps[m.key]
        return [unlock.submit(m.unlock_and_unmap) for m in victims]

    @property
    def locked_bytes(self) -> int:
        with self._lock:
            return sum(m.locked_bytes for m in self._maps.values())

    @property
    def mapped_files(self) -> list[Path]:
        """The blob files mapped now, least recently used first."""
        with self._lock:
            return [m.path for m in sorted(self._maps.values(), key=lambda m: m.last_used)]

    def wait_until_locked(self) -> None:
        """Wait for every lock still running (benchmarks and tests, to measure a true reload)."""
        with self._lock:
            maps = list(self._maps.values())
        for m in maps:
            with m.guard:
                futs = list(m.futures.values())
            for f in futs:
                try:
                    f.exception()
                except CancelledError:  # an eviction cancelled it: nothing to wait for
                    pass

    def clear(self) -> None:
        """Unlock and unmap every mapping nobody is using (now, on this thread)."""
        with self._lock:
            victims = [m for m in self._maps.values() if m.users == 0]
            for m in victims:
                del self._maps[m.key]
        for m in victims:
            m.unlock_and_unmap()


_PROCESS: dict[str, HostLockCache] = {}


def host_locks() -> HostLockCache:
    """The process's locked blob pages, shared by every session; created when first needed (each
    load's uploader sets its budget: :func:`~toolkit.upload.dispatch.make_uploader`).  ``setdefault``:
    one, even in a race."""
    return _PROCESS["host_locks"] if "host_locks" in _PROCESS else _PROCESS.setdefault("host_locks", HostLockCache())
