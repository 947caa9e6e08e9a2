"""Putting a loaded program's state back: what runs can have written, rewritten to its initial contents.

A method's run writes its mutated constants (buffers it updates in place).  A program whose
source records which constants those are has exactly them rewritten; one that does not (a
``.pte``, a ``.pt2``: ``records_mutation`` False) has every constant of the methods that ran
checksummed on the device before its first run, and rewritten where the checksum changed.
Tensors are tracked by identity and weakly: one two methods share is reset once, and one
that is freed (a swapped-out copy blame no longer holds) is forgotten.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from toolkit.core.model import MethodSpec, Program
from toolkit.runtimes import Runtime


@dataclass
class ResetCounts:
    """What the resets of a session did, summed over the session (benchmarks read it)."""

    resets: int = 0
    tensors_rewritten: int = 0
    bytes_rewritten: int = 0
    bytes_checked: int = 0  # checksummed on the device to find what a run wrote (records_mutation False)


def _holds(by_id: dict[int, tuple[Any, Any]], tensor: Any) -> bool:
    """``tensor`` has an entry (keyed by id, its weak reference first) and is that entry's tensor."""
    entry = by_id.get(id(tensor))
    return entry is not None and entry[0]() is tensor


class StateResets:
    """The tensors runs since the last reset can have written, and the reset that rewrites them."""

    def __init__(self, program: Program, runtime: Runtime):
        self.program = program
        self.runtime = runtime
        self.counts = ResetCounts()
        self._touched: dict[int, tuple[Any, Any]] = {}  # id -> (weak ref, constant): what a run since the
        # last reset can have written (a swapped-out copy blame may install again included, while it lives)
        self._initial: dict[int, tuple[Any, Any]] = {}  # id -> (weak ref, checksum before its first run)

    def note_run(self, spec: MethodSpec, tensors: Mapping[str, Any]) -> None:
        """Remember the tensors a run of ``spec`` (``tensors``: constant -> what it runs on) can write:
        the mutated ones, or (a source that does not record mutation) all, each checksummed before its first run."""
        every = not self.program.records_mutation
        for c in spec.constants:
            t = tensors.get(c.name)
            if t is None or not (c.mutated or every) or _holds(self._touched, t):
                continue
            self._touched[id(t)] = (weakref.ref(t), c)
            if every and not _holds(self._initial, t):
                self._initial[id(t)] = (weakref.ref(t), self.runtime.checksum(t))

    def reset(self) -> int:
        """Rewrite what the runs noted since the last reset wrote; returns how many tensors were rewritten."""
        every = not self.program.records_mutation
        rewritten = 0
        counts = self.counts
        for ref, c in self._touched.values():
            t = ref()
            if t is None:
                continue
            if every:
                counts.bytes_checked += c.nbytes
                if self.runtime.same_checksum(self.runtime.checksum(t), self._initial[id(t)][1]):
                    continue
            self.runtime.write_initial(t, self.program, c)
            rewritten += 1
            counts.bytes_rewritten += c.nbytes
        self._touched.clear()
        counts.resets += 1
        counts.tensors_rewritten += rewritten
        return rewritten
