"""The dry run: every decision a load would take, and the memory floor, from the program model alone.

No device, no AOTInductor container, no torch: :func:`dry_run` is a load by the one
orchestrator (:class:`toolkit.engine.loader.ProgramLoad`) over the dry-run runtime
(:mod:`toolkit.runtimes.dry_run`), so its decisions, lookups, comparisons and events are
produced by exactly the code a real load runs.

"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

import pandas as pd

from toolkit.core.model import Program
from toolkit.core.options import LoadOptions
from toolkit.core.policies import Policy, get_policy
from toolkit.core.vocab import Integrity
from toolkit.engine.frames import DRY_RUN_COLUMNS, dry_run_frame
from toolkit.runtimes.dry_run import DryRunRuntime
from toolkit.sources import read_program_model

if TYPE_CHECKING:
    from toolkit.core.verdict import Verdict
    from toolkit.engine.loader import MethodResult
    from toolkit.engine.session import Session

FLOOR_COLUMNS = ["device", "method", "name", "fqn", "nbytes", "role", "counted"]
__all__ = ["DRY_RUN_COLUMNS", "DryRun", "MemoryFloor", "collector_paused", "dry_run", "memory_floor"]


@dataclass
class DryRun:
    """Result of :func:`dry_run`: the decisions table, per-method results, and the dry-run session."""

    policy: str
    decisions: pd.DataFrame
    methods: list["MethodResult"] = field(default_factory=list)
    session: "Session | None" = field(default=None, repr=False)

    @property
    def status(self) -> str:
        return self.session.status if self.session is not None else "loaded"

    @property
    def verdict(self) -> "Verdict":
        """The prediction: what would run wrong, why, and which constant (computed once)."""
        return self.session.verdict()

    @property
    def device_bytes(self) -> int:
        """Constant bytes the load would put on devices (whole blobs + own uploads), as the loader accounts."""
        return sum(m.device_bytes for m in self.methods)


def dry_run(
    program: "Program | str | Path",
    policy: "str | Policy" = "fingerprint",
    *,
    device: "str | Mapping[str, str] | None" = None,
    record: bool = True,
    progress: bool = False,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> DryRun:
    """Predict a load of ``program`` under ``policy``, method by method, in load order.

    The same orchestrator as :func:`toolkit.load_program`, over the program model alone.
    ``program`` is a :class:`Program` or a program path (its .so and blob files need not exist,
    but for one: a program directory's ``.so`` whose recorded sha256 keys lifted constants under
    ``fqn-weight-cache`` is read, never opened, and checked against that record first; a missing
    file, or a record that is not the file's, fails the dry run with an ``IntegrityError`` naming it;
    and where a share, or an export refusal, rests on two constants' digests, their bytes must bear
    the digests out, as in the real load: derived from the piece records where they tell, else read
    from the weights blobs and verified; a digest they contradict fails the dry run the same way,
    naming ``constants[<name>].digest``);
    ``device`` places methods as :func:`toolkit.load_program` does (a device string, or
    ``{method: device}``).  ``.decisions`` holds every decision, one row per constant: the
    loader's decisions table (``slot_problem`` is what its out-of-bounds guard would say) without
    ``seq``, plus ``policy``, ``whole_blob`` and ``method_status``.  A failed method stops the
    load, as the loader does: later methods are "not reached" and have no rows.  A program the
    modelled exporter refuses (``fqn-weight-cache``: one storage key with two contents) has every
    constant refused and nothing loaded (``.session.failed_stage`` is "export").
    ``progress``: a bar per constant (:func:`toolkit.display.progress.progress_bar`);
    ``on_progress(done, total, method)``: the constants predicted so far.
    """
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session

    model = read_program_model(program)
    pol = get_policy(policy)
    runtime = DryRunRuntime()
    devices = resolve_devices(model, device, runtime)
    with collector_paused():
        s = Session(
            model, pol, devices, record=record, options=LoadOptions(integrity=Integrity.OFF), runtime=runtime
        ).load(progress=progress, on_progress=on_progress)
        frame = dry_run_frame(s.log, s.results.values(), policy=pol.name.value)
    return DryRun(pol.name.value, frame, list(s.results.values()), s)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a dry run's pass, and what the pass made kept out of its young
    generations afterwards (reference counting still frees everything; cycles are still collected).

    The pass allocates millions of small objects and no reference cycles.  With the collector running,
    each of its full passes rescans everything allocated so far (40% of the time at 160,000 decisions).
    Merely turning it back on afterwards is not enough: the first allocation then starts a collection of
    the youngest generation, which holds every object the pass made and still alive (0.9 s at 400,000
    decisions, benchmarks/scaling.py), and two more generations rescan them later.  So they are moved to
    the oldest generation untraversed (``gc.freeze()`` then ``gc.unfreeze()``: what surviving two
    collections would do), where only a full collection visits them.  Skipped where the process holds
    frozen objects already (``gc.freeze()`` by its owner, before a fork): they stay frozen.  A collector
    the caller had turned off stays off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


# ------------------------------------------------------------------ the floor


@dataclass(frozen=True)
class MemoryFloor:
    """The physical minimum of constant bytes a correct load must hold on its devices.

    ``total_bytes`` = bytes of content-distinct constants that may be shared (counted once
    per device, keyed on content digest and metadata) + state: each buffer some method
    writes, once per eager buffer (provenance: a KV cache prefill fills and decode reads is
    one buffer), or once per method where provenance is unknown.  A same-name collision with other data or other
    metadata is distinct content, so each method's copy of it is counted by the first term.
    """

    total_bytes: int
    shareable_bytes: int  # content-distinct, non-mutated
    private_bytes: int  # state: one copy per eager buffer (per method where provenance is unknown)
    by_device: Mapping[str, int]
    constants: int
    distinct_shareable: int
    distinct_state: int  # eager state buffers counted once (provenance known)
    largest_constant_bytes: int
    naive_bytes: int  # every method's constants, nothing shared
    table: pd.DataFrame = field(repr=False, compare=False, default=None)  # one row per constant

    def __repr__(self) -> str:
        gib = 1 << 30
        lines = [
            f"memory floor M = {self.total_bytes:,} bytes ({self.total_bytes / gib:.3f} GiB)",
            f"  shareable, content-distinct: {self.shareable_bytes:,} bytes in {self.distinct_shareable} tensors",
            f"  state (each written buffer once; per method if provenance is unknown): {self.private_bytes:,} bytes",
            f"  nothing shared: {self.naive_bytes:,} bytes; largest constant: {self.largest_constant_bytes:,} bytes",
        ]
        lines += [f"  {d}: {b:,} bytes" for d, b in sorted(self.by_device.items())]
        return "\n".join(lines)


def memory_floor(program: "Program | str | Path", *, device: "str | Mapping[str, str] | None" = None) -> MemoryFloor:
    """The floor ``M`` for ``program`` placed on ``device`` (see :class:`MemoryFloor`).

    Physical accounting, independent of any policy: names do not matter, content does
    (the digest of the bytes a slot reads) together with the metadata a slot needs
    (dtype, shape, strides) and the device it lives on.  Constants with an empty FQN count
    as shareable by content too.  Allocator rounding and container overhead are not in it.
    """
    from toolkit.engine.devices import resolve_devices

    model = read_program_model(program)
    placement = resolve_devices(model, device, DryRunRuntime())
    seen: set[tuple] = set()
    states: set[tuple] = set()
    # buffers some method writes, by eager storage: one buffer is one copy, whoever reads it
    state_storage = {c.storage for m in model.methods for c in m.constants if c.mutated and c.storage}
    by_device: dict[str, int] = {}
    rows = []
    shareable = private = naive = largest = count = 0
    for spec in model.methods:
        dev = str(placement[spec.name])
        by_device.setdefault(dev, 0)
        for c in spec.constants:
            count += 1
            naive += c.nbytes
            largest = max(largest, c.nbytes)
            if c.storage and c.storage in state_storage:
                key = (dev, c.storage)
                role, counted = "state (one eager buffer)", key not in states
                if counted:
                    states.add(key)
                    private += c.nbytes
            elif c.mutated:
                role, counted = "private (mutated, provenance unknown)", True
                private += c.nbytes
            else:
                key = (dev, c.digest, c.dtype, c.shape, c.strides, c.storage_offset)
                counted = key not in seen
                role = "shareable"
                if counted:
                    seen.add(key)
                    shareable += c.nbytes
            if counted:
                by_device[dev] += c.nbytes
            rows.append((dev, spec.name, c.name, c.fqn, c.nbytes, role, counted))
    table = pd.DataFrame.from_records(rows, columns=FLOOR_COLUMNS) if rows else pd.DataFrame(columns=FLOOR_COLUMNS)
    return MemoryFloor(
        total_bytes=shareable + private,
        shareable_bytes=shareable,
        private_bytes=private,
        by_device=by_device,
        constants=count,
        distinct_shareable=len(seen),
        distinct_state=len(states),
        largest_constant_bytes=largest,
        naive_bytes=naive,
        table=table,
    )
