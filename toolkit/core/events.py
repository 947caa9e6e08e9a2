"""The event schema and the one event log a load writes into.

Every step of a load is one event.  Events are plain frozen dataclasses; the only
place they become DataFrames is :mod:`toolkit.engine.frames`.
"""

from __future__ import annotations

import bisect
import functools
import threading
import time
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Iterator, Mapping, Sequence

from toolkit.core.vocab import Decision, EventKind, Lookup, MetadataField, Reason, TensorOrigin, UploadPath


@dataclass(frozen=True, slots=True)
class Event:
    kind: ClassVar[EventKind]
    seq: int
    time_s: float  # seconds since the log was created
    method: str

    def row(self) -> dict[str, Any]:
        d = {"seq": self.seq, "time_s": self.time_s, "kind": self.kind.value}
        for f in fields(self):
            if f.name in ("seq", "time_s"):
                continue
            v = getattr(self, f.name)
            d[f.name] = v.value if hasattr(v, "value") and isinstance(v, str) else v
        return d


@dataclass(frozen=True, slots=True)
class LoadStarted(Event):
    kind = EventKind.LOAD_STARTED
    policy: str
    device: str
    so_path: str


@dataclass(frozen=True, slots=True)
class ContainerCreated(Event):
    kind = EventKind.CONTAINER_CREATED
    device: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ConstantEnumerated(Event):
    kind = EventKind.CONSTANT_ENUMERATED
    name: str
    fqn: str
    dtype: str


@dataclass(frozen=True, slots=True)
class CacheLookup(Event):
    kind = EventKind.CACHE_LOOKUP
    name: str
    fqn: str
    result: Lookup
    cached_owner: str  # method whose tensor the cache holds; "" on a miss
    storage_key: str = ""  # the key looked up when it is not the FQN (fqn-weight-cache), else ""


@dataclass(frozen=True, slots=True)
class BlobUploaded(Event):
    kind = EventKind.BLOB_UPLOADED
    bytes: int
    seconds: float
    why: str


@dataclass(frozen=True, slots=True)
class ConstantsExtracted(Event):
    kind = EventKind.CONSTANTS_EXTRACTED
    count: int


@dataclass(frozen=True, slots=True)
class ConstantUploaded(Event):
    kind = EventKind.CONSTANT_UPLOADED
    name: str
    fqn: str
    bytes: int
    seconds: float
    path: UploadPath  # how the bytes travelled


@dataclass(frozen=True, slots=True)
class FieldCompared(Event):
    kind = EventKind.FIELD_COMPARED
    name: str
    fqn: str
    field: MetadataField
    cached: str
    new: str
    equal: bool


@dataclass(frozen=True, slots=True)
class DigestCompared(Event):
    kind = EventKind.DIGEST_COMPARED
    name: str
    fqn: str
    cached: str
    new: str
    equal: bool


@dataclass(frozen=True, slots=True)
class Decided(Event):
    kind = EventKind.DECIDED
    device: str  # where the method is placed ("cpu", "cuda:0")
    name: str
    fqn: str
    constant_kind: str
    mutated: bool
    lookup: str  # "hit", "miss" or "" when never looked up
    decision: Decision
    reason_code: Reason
    reason: str
    origin: TensorOrigin
    shared_from: str  # "method/name" of the tensor used when shared, else ""
    nbytes: int
    dtype: str
    shape: str
    strides: str
    digest: str
    cached_method: str  # the cache entry this constant was checked against, "" if none
    cached_dtype: str
    cached_shape: str
    cached_strides: str
    cached_digest: str
    slot_problem: str  # why the installed tensor cannot fill the slot (the out-of-bounds guard), else ""
    storage_key: str = ""  # the key it is cached under when not its FQN (fqn-weight-cache: its storage key)
    data_problem: str = ""  # why it runs on other data than its own (verdict.DataProblem), "" when it does not
    upstream_keeps: bool = False  # the load failed; upstream leaves this constant in its cache, the toolkit does not


@dataclass(frozen=True, slots=True)
class CacheEntryAdded(Event):
    kind = EventKind.CACHE_ENTRY_ADDED
    name: str
    fqn: str
    owner_kind: str  # "container" (aliases a container's blob) or "toolkit" (a tensor we own)


@dataclass(frozen=True, slots=True)
class CacheEntryLeftUpstream(Event):
    """A failed load's constant upstream leaves in its cache (on the leaked container); the toolkit restores its
    cache, so a later method shares with it under upstream only."""

    kind = EventKind.CACHE_ENTRY_LEFT_UPSTREAM
    name: str
    fqn: str
    reason: str


@dataclass(frozen=True, slots=True)
class OutOfBoundsAlias(Event):
    kind = EventKind.OUT_OF_BOUNDS_ALIAS
    name: str
    fqn: str
    problem: str


@dataclass(frozen=True, slots=True)
class PairsInstalled(Event):
    kind = EventKind.PAIRS_INSTALLED
    count: int
    names: str  # comma-separated internal names


@dataclass(frozen=True, slots=True)
class MethodLoaded(Event):
    kind = EventKind.METHOD_LOADED
    runnable: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class LoadFailed(Event):
    kind = EventKind.LOAD_FAILED
    error: str


@dataclass(frozen=True, slots=True)
class MemorySampled(Event):
    kind = EventKind.MEMORY_SAMPLED
    device: str
    phase: str  # "before", "peak", "after", "unloaded"
    bytes_in_use: int  # driver-level on CUDA; loader-held constant bytes on CPU
    measure: str  # how it was measured


@dataclass(frozen=True, slots=True)
class MethodUnloaded(Event):
    kind = EventKind.METHOD_UNLOADED
    released_entries: int


@dataclass(frozen=True, slots=True)
class CulpritTried(Event):
    """One blame experiment: ``name`` of ``method`` swapped for another tensor, the verification re-run."""

    kind = EventKind.CULPRIT_TRIED
    name: str
    fqn: str
    verification: str  # "standalone" or the sequence's name
    swap: str  # what was installed instead: "own copy" or "the writer's tensor"
    fixes: bool  # the verification passed with the swap: this decision is a culprit
    evidence: str


EVENT_TYPES: tuple[type[Event], ...] = (
    LoadStarted,
    ContainerCreated,
    ConstantEnumerated,
    CacheLookup,
    BlobUploaded,
    ConstantsExtracted,
    ConstantUploaded,
    FieldCompared,
    DigestCompared,
    Decided,
    CacheEntryAdded,
    CacheEntryLeftUpstream,
    OutOfBoundsAlias,
    PairsInstalled,
    MethodLoaded,
    LoadFailed,
    MemorySampled,
    MethodUnloaded,
    CulpritTried,
)


class _Batch:
    """Events recorded at once by one method, as columns: one list per field and event type, no row.

    ``types``: the event types it holds; ``kinds``: per row, the index of its type in ``types``
    (None when it holds one type); ``cols``: per type, field -> the values of that type's rows in
    order (a field of the type not given: its default).  Every row has the batch's time and method.
    """

    __slots__ = ("types", "kinds", "cols", "n", "time_s", "method", "_pos")

    def __init__(self, types, kinds, cols, n, time_s, method):
        self.types, self.kinds, self.cols, self.n, self.time_s, self.method = types, kinds, cols, n, time_s, method
        self._pos: list[int] | None = None  # per row, its position among the rows of its type (made when read)

    def offsets(self, t: int) -> list[int]:
        """The rows of type ``types[t]``, in order."""
        if self.kinds is None:
            return list(range(self.n))
        return [o for o, k in enumerate(self.kinds) if k == t]

    def at(self, o: int) -> tuple[type[Event], dict[str, Any]]:
        """Row ``o``: its type and payload."""
        if self.kinds is None:
            t, j = 0, o
        else:
            if self._pos is None:
                seen = [0] * len(self.types)
                pos = []
                for k in self.kinds:
                    pos.append(seen[k])
                    seen[k] += 1
                self._pos = pos
            t, j = self.kinds[o], self._pos[o]
        return self.types[t], {k: v[j] for k, v in self.cols[t].items()}


class EventLog:
    """An append-only, thread-safe, ordered log of events.

    ``record`` stores what happened (type, time, method, payload) and nothing more;
    ``record_batch`` and ``record_rows`` store many events of one method at once as columns (a
    method's decisions, lookups, comparisons: one list per field, benchmarks/scaling.py).  The
    :class:`Event` of a record is made the first time it is read, once; frames read the columns
    (:meth:`column`) without making events.  The events of one batch share its time.
    ``enabled=False`` keeps the log empty (used to measure recording overhead).
    """

    def __init__(self, enabled: bool = True, clock=time.perf_counter):
        self.enabled = enabled
        self._clock = clock
        self._t0 = clock()
        # an entry: one event, (type, time_s, method, payload keys, payload values) (a keys tuple is stored once
        # per distinct order, so a record takes the memory of its values), or a _Batch of events
        self._records: list[tuple[type[Event], float, str, tuple[str, ...], tuple[Any, ...]] | _Batch] = []
        self._starts: list[int] = []  # per entry, the seq of its first event
        self._n = 0
        self._keys: dict[tuple[type[Event], tuple[str, ...]], tuple[str, ...]] = {}
        self._made: dict[int, Event] = {}  # seq -> its Event, once read
        # event type -> the positions in _records of the entries holding it, for the first _indexed entries
        # (made when a column is read: a frame reads one type's few batches without passing over every entry)
        self._by_type: dict[type[Event], list[int]] = {}
        self._indexed = 0
        self._lock = threading.Lock()

    def record(self, event_type: type[Event], method: str, **payload: Any) -> None:
        if not self.enabled:
            return
        keys = self._keys.get(sig := (event_type, tuple(payload)))
        if keys is None:  # a payload of this order for the first time: checked against the event's fields
            keys = self._keys[sig] = _checked(event_type, sig[1])
        with self._lock:  # seq, time and position agree even when threads record at once
            start = self._n
            self._records.append((event_type, self._clock() - self._t0, method, keys, tuple(payload.values())))
            self._starts.append(start)
            self._n = start + 1
        self.recorded(start, start + 1)

    def record_batch(self, event_type: type[Event], method: str, **columns: list[Any]) -> None:
        """Record ``len`` of the columns events of ``event_type`` at once: ``columns`` maps each field
        given to its list of values, one per event, in order (the same fields as ``record`` takes)."""
        self.record_rows(method, [event_type], None, {event_type: columns})

    def record_rows(
        self,
        method: str,
        types: Sequence[type[Event]],
        kinds: list[int] | None,
        columns: Mapping[type[Event], Mapping[str, list[Any]]],
    ) -> None:
        """Record events of several types at once, in the order ``kinds`` gives (per event, the index
        of its type in ``types``; None: ``types`` is one type): ``columns[t]`` maps each field of type
        ``t`` to the values of its events, in order.  Nothing is recorded where no event is given."""
        if not self.enabled:
            return
        types = tuple(types)
        if kinds is None and (len(types) != 1 or not columns[types[0]]):
            raise ValueError("a batch without kinds holds one event type and at least one column")
        cols = []
        for i, t in enumerate(types):
            c = columns[t]
            _checked(t, tuple(c))  # the fields record() would accept, or TypeError
            n_t = len(next(iter(c.values()))) if kinds is None else kinds.count(i)
            if any(len(v) != n_t for v in c.values()):
                raise ValueError(
                    f"{t.__name__}: columns of {sorted({len(v) for v in c.values()})} values for {n_t} events"
                )
            cols.append(dict(c))
        n = len(kinds) if kinds is not None else n_t
        if n == 0:
            return
        with self._lock:
            start = self._n
            self._records.append(_Batch(types, kinds, tuple(cols), n, self._clock() - self._t0, method))
            self._starts.append(start)
            self._n = start + n
        self.recorded(start, start + n)

    def recorded(self, start: int, stop: int) -> None:
        """Called once events ``start`` to ``stop - 1`` are recorded (a subclass may stream them); nothing here."""

    def event(self, seq: int) -> Event:
        """The event at position ``seq`` (made on first read, once)."""
        e = self._made.get(seq)
        if e is None:
            event_type, time_s, method, payload = self._read(seq)
            e = self._made[seq] = event_type(seq, time_s, method, **payload)
        return e

    def _read(self, seq: int) -> tuple[type[Event], float, str, dict[str, Any]]:
        """The record of the event at ``seq``: its type, time, method and the payload given."""
        i = bisect.bisect_right(self._starts, seq) - 1
        r = self._records[i]
        if type(r) is tuple:
            event_type, time_s, method, keys, values = r
            return event_type, time_s, method, dict(zip(keys, values))
        event_type, payload = r.at(seq - self._starts[i])
        return event_type, r.time_s, r.method, payload

    def __iter__(self) -> Iterator[Event]:
        return iter([self.event(i) for i in range(self._n)])

    def __len__(self) -> int:
        return self._n

    def last(self) -> Event:
        return self.event(self._n - 1)

    def of_type(self, event_type: type[Event]) -> list[Event]:
        return [self.event(i) for i in self.seqs(event_type)]

    def column(self, event_type: type[Event], name: str, seqs: Sequence[int] | None = None) -> list[Any]:
        """Field ``name`` of the events of ``event_type`` (or of the records ``seqs``, all of that type),
        read from the records without making their events (how :mod:`toolkit.engine.frames` builds frames)."""
        if seqs is not None:
            return [self._value(s, name) for s in seqs]
        default = _defaults(event_type)[name]
        out: list[Any] = []
        where: dict[tuple[str, ...], int] = {}  # payload keys -> the position of ``name`` in them (-1: the default)
        starts, records = self._starts, self._records
        for i in self._entries_of(event_type):
            start, r = starts[i], records[i]
            if type(r) is tuple:
                if name == "seq":
                    out.append(start)
                elif name == "time_s" or name == "method":
                    out.append(r[1] if name == "time_s" else r[2])
                else:
                    keys = r[3]
                    at = where.get(keys)
                    if at is None:
                        at = where[keys] = keys.index(name) if name in keys else -1
                    out.append(r[4][at] if at >= 0 else default)
                continue
            t = r.types.index(event_type)
            if name == "seq":
                out.extend(range(start, start + r.n) if r.kinds is None else [start + o for o in r.offsets(t)])
                continue
            col = r.cols[t].get(name)
            if col is not None:
                out.extend(col)
            else:
                count = r.n if r.kinds is None else r.kinds.count(t)
                out.extend([r.time_s if name == "time_s" else r.method if name == "method" else default] * count)
        return out

    def _entries_of(self, event_type: type[Event]) -> list[int]:
        """The positions in the log's entries of those holding events of ``event_type``, in order
        (the index is brought up to date with the entries recorded since it was last read)."""
        with self._lock:
            records, by_type = self._records, self._by_type
            for i in range(self._indexed, len(records)):
                r = records[i]
                for t in (r[0],) if type(r) is tuple else r.types:
                    at = by_type.get(t)
                    if at is None:
                        at = by_type[t] = []
                    at.append(i)
            self._indexed = len(records)
            return list(by_type.get(event_type, ()))

    def _value(self, seq: int, name: str) -> Any:
        """Field ``name`` of the event at ``seq``, read from its record (its event is not made)."""
        if name == "seq":
            return seq
        event_type, time_s, method, payload = self._read(seq)
        if name in ("time_s", "method"):
            return time_s if name == "time_s" else method
        return payload[name] if name in payload else _defaults(event_type)[name]

    def seqs(self, event_type: type[Event]) -> list[int]:
        """The positions of every event of ``event_type``."""
        return self.column(event_type, "seq")


def _checked(event_type: type[Event], keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` when they name fields of ``event_type`` and every field without a default (as its
    constructor would require, so a wrong payload fails where it is recorded); else TypeError."""
    defaults = _defaults(event_type)
    given = {k: d for k, d in defaults.items() if k not in ("seq", "time_s", "method")}
    unknown = [k for k in keys if k not in given]
    missing = [k for k, d in given.items() if d is MISSING and k not in keys]
    if unknown or missing:
        raise TypeError(f"{event_type.__name__}: unknown fields {unknown}, missing fields {missing}")
    return keys


@functools.cache
def _defaults(event_type: type[Event]) -> dict[str, Any]:
    return {f.name: f.default for f in fields(event_type)}
