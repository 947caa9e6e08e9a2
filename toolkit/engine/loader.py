"""The load orchestrator: one program, one policy, every method loaded through the shared cache.

:meth:`ProgramLoad.load_method` is the only place a method's load is written: lookups, the
policy's decision, uploads, the out-of-bounds guard, installation, cache bookkeeping and
every event.  It runs over a runtime (:mod:`toolkit.runtimes`): the real AOTInductor one
(:func:`toolkit.load_program`) or the dry run (:func:`toolkit.workflows.dry_run.analyze`), so the dry
run predicts the real load by construction.  Verification, blame and the verdict are
operations over a load, above it (:mod:`toolkit.engine.session`).  No torch is imported here.
"""

from __future__ import annotations

import time
import traceback
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from toolkit.core import events as ev
from toolkit.core.cache import CacheEntry, SharedConstantCache
from toolkit.core.errors import LoadError, ProgramError, ToolkitError
from toolkit.core.model import ConstantSpec, MethodSpec, Program, TensorMeta, shown
from toolkit.core.options import LoadOptions
from toolkit.core.policies import ExportRefusal, MethodView, Outcome, Plan, Policy, slot_problem
from toolkit.core.verdict import ConstantFinding, find_problem
from toolkit.core.vocab import ConstantKind, Decision, Lookup, Members, MethodStatus, SessionStatus, Stage, TensorOrigin
from toolkit.engine import frames as tables
from toolkit.integrity import check_files
from toolkit.runtimes import Device, MethodRuntime, Runtime, aligned_slot_bytes

# the members per-constant code reads, as plain attributes (vocab.Members: 0.12 us each off the enum on 3.11)
_Decision, _TensorOrigin = Members(Decision), Members(TensorOrigin)

if TYPE_CHECKING:
    import pandas as pd


def _blobs_only(specs, options: LoadOptions) -> list[str]:
    """The weights blobs whose pieces are verified as they are read (integrity.check_files'
    ``when_read``): not a file that also holds a method's .so (every .so byte is checked first),
    none with ``LoadOptions(hash_all=True)``."""
    code = {s.so_file for s in specs}
    return [] if options.hash_all else [s.blob_file for s in specs if s.blob_file not in code]


@dataclass
class MethodResult:
    """What the load did with one method; kept after the method is unloaded or the session closed."""

    method: str
    device: str
    status: MethodStatus = MethodStatus.NOT_REACHED
    whole_blob: bool = False  # its whole weights blob was uploaded
    blob_bytes: int = 0  # bytes of that whole-blob allocation (0 when none)
    own_upload_bytes: int = 0  # bytes of constants uploaded on their own
    runnable: bool = False
    problems: tuple[str, ...] = ()
    error: str = ""
    findings: tuple[ConstantFinding, ...] = ()  # constants it runs on other data for (verdict.find_problem)

    @property
    def device_bytes(self) -> int:
        """Constant bytes this method's load put on its device (accounted, not measured)."""
        return self.blob_bytes + self.own_upload_bytes if self.status is not MethodStatus.FAILED else 0

    def mark_failed(self, error: str) -> None:
        self.status, self.error, self.runnable = MethodStatus.FAILED, error, False


@dataclass
class LoadedMethod:
    """A method that is loaded now: its runtime handle and the tensors it owns."""

    spec: MethodSpec
    device: Device
    handle: MethodRuntime
    outcome: Outcome
    runnable: bool = True
    problems: list[str] = field(default_factory=list)
    own_tensors: dict[str, Any] = field(default_factory=dict)
    whole_blob_bytes: int = 0  # bytes of a whole-blob allocation this method keeps resident
    own_upload_bytes: int = 0
    tensors: dict[str, Any] = field(default_factory=dict)  # every constant -> the tensor it runs on

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device_bytes(self) -> int:
        return self.whole_blob_bytes + self.own_upload_bytes


# an enum member's value, as a table shows it (a dict: a member's .value is a slow descriptor); None: ""
_VALUE: dict[Any, str] = {None: "", **{m: m.value for e in (ConstantKind, Lookup) for m in e}}


def _holds(by_id: dict[int, tuple[Any, Any]], tensor: Any) -> bool:
    """``tensor`` has an entry (keyed by id, its weak reference first) and is that entry's tensor."""
    entry = by_id.get(id(tensor))
    return entry is not None and entry[0]() is tensor


@dataclass
class ResetCounts:
    """What :meth:`ProgramLoad.reset_state` did, summed over the session (benchmarks read it)."""

    resets: int = 0
    tensors_rewritten: int = 0
    bytes_rewritten: int = 0
    bytes_checked: int = 0  # checksummed on the device to find what a run wrote (records_mutation False)


class ProgramLoad:
    """One load of one program under one policy.  Constructing it does no I/O; :meth:`load` does.

    After the load its tables (:attr:`decisions`, :attr:`lookups`, :attr:`comparisons`,
    :attr:`events`, :attr:`memory`, :attr:`method_results`) stay available, also once
    :meth:`close` has released the device memory.  ``options`` (default ``LoadOptions()``): how
    bytes move and are checked; ``check_integrity``, when given, overrides it.
    """

    def __init__(
        self,
        program: Program,
        policy: Policy,
        devices: Mapping[str, Device],
        *,
        record: bool = True,
        check_integrity: bool | None = None,
        runtime: Runtime | None = None,
        options: LoadOptions | None = None,
    ):
        self.program = program
        self.policy = policy
        self.devices = dict(devices)
        options = options if options is not None else LoadOptions()
        self.options = options if check_integrity is None else replace(options, check_integrity=check_integrity)
        self.runtime = runtime if runtime is not None else default_runtime(self.options)
        self.log = ev.EventLog(enabled=record)
        self.cache = SharedConstantCache()
        self.methods: dict[str, LoadedMethod] = {}
        self._held = 0  # sum of device_bytes over self.methods, kept as they come and go
        self.results: dict[str, MethodResult] = {
            m.name: MethodResult(m.name, str(self.devices[m.name])) for m in program.methods
        }
        self.status = SessionStatus.NOT_LOADED
        self.load_outcome = SessionStatus.NOT_LOADED  # what load() came to; kept after close()
        self.error: str | None = None
        self.failed_method: str | None = None
        self.exception: ToolkitError | None = None  # what made the load fail, with its type
        # where the failure lies: LOAD (a method's load) or EXPORT (the modelled exporter refuses
        # the program, fqn-weight-cache: nothing of it exists, nothing is loaded); None while none
        self.failed_stage: Stage | None = None
        self._export_refusal: tuple[ExportRefusal | None] | None = None  # asked once per session
        self.load_seconds: float = 0.0
        self._peak = 0  # highest bytes in use seen during the method being loaded
        self._frames: dict[str, tuple[int, Any]] = {}
        self._bar: Any = None  # load()'s progress bar, advanced by _advance()
        self._on_progress: Callable[[int, int, str], None] | None = None  # load()'s on_progress
        self._progress_at = [0, 0, ""]  # constants done, of how many, the method being loaded
        self.resets = ResetCounts()
        self._touched: dict[int, tuple[Any, Any]] = {}  # id -> (weak ref, constant): what a run since the
        # last reset can have written (a swapped-out copy blame may install again included, while it lives)
        self._initial: dict[int, tuple[Any, Any]] = {}  # id -> (weak ref, checksum before its first run)

    @property
    def check_integrity(self) -> bool:
        return self.options.check_integrity

    # ------------------------------------------------------------------ loading
    def load(self, progress: bool = False, on_progress: Callable[[int, int, str], None] | None = None) -> "ProgramLoad":
        """Load every method not loaded yet, in order (see :class:`~toolkit.core.vocab.SessionStatus`).

        ``progress``: a bar (:func:`toolkit.display.progress.progress_bar`); ``on_progress(done, total,
        method)``, when given, is called where the bar moves (as each method begins, then per
        constant uploaded and once for the rest of the method) with the constants done so far.

        Refused (LoadError, nothing changed) once the session is loaded, failed or closed.
        After an interrupt the session is still "not loaded" and ``load()`` resumes.
        """
        from toolkit.display.progress import progress_bar

        if self.status is not SessionStatus.NOT_LOADED:
            raise LoadError(
                f"session of {self.program.name!r} under {self.policy.name.value!r} is "
                f"{self.status.value}: load a new session (toolkit.load_program) instead"
            )
        t0 = time.perf_counter()
        specs = [m for m in self.program.methods if m.name not in self.methods]
        # per constant, the method in the postfix: a 10,000-constant method moves while it loads
        total = sum(len(s.constants) for s in specs)
        self._on_progress, self._progress_at = on_progress, [0, total, ""]
        bar = progress_bar(
            total=total,
            enabled=progress,
            desc=f"{'loading' if self.runtime.can_run else 'dry run'} ({self.policy.name})",
            unit="constant",
        )
        self._bar = None if bar.disable else bar  # a bar that shows nothing is not advanced per constant
        try:
            refusal = self.export_refusal()
            if refusal is not None:  # no program was written: nothing is checked, opened or uploaded
                self._refuse_export(refusal)
                return self
            if self.check_integrity:
                # Opening a .so runs its code: check every file of every method before the
                # first .so is opened, so a tampered later method stops the whole load.
                # Every method's files at once (one file shared by two methods is checked once); a
                # failure is the first method's, in load order, that uses the failing file.
                try:
                    check_files(
                        self.program.root,
                        self.program.files,
                        [r for spec in specs for r in spec.files],
                        self.options,
                        when_read=_blobs_only(specs, self.options),
                    )
                except ToolkitError as e:
                    bad = getattr(e, "path", None)
                    spec = next(
                        (sp for sp in specs if any(str(self.program.root / r) == bad for r in sp.files)), specs[0]
                    )
                    self.log.record(ev.LoadFailed, spec.name, error=str(e))
                    self._fail(spec.name, e)
                    return self
            for spec in specs:
                bar.set_postfix_str(spec.name)
                self._progress_at[2] = spec.name
                self._advance(0)
                try:
                    self.load_method(spec.name)
                except ToolkitError as e:
                    self._fail(spec.name, e)
                    break
            else:
                self.status = self.load_outcome = SessionStatus.LOADED
        finally:
            bar.close()
            self._bar = self._on_progress = None
            self.load_seconds = time.perf_counter() - t0
        return self

    def _advance(self, constants: int) -> None:
        """The one progress point: ``constants`` more of the method being loaded are done."""
        if self._bar is not None:
            self._bar.update(constants)
        if self._on_progress is not None:
            at = self._progress_at
            at[0] += constants
            self._on_progress(at[0], at[1], at[2])

    def _fail(self, method: str, e: ToolkitError, stage: Stage = Stage.LOAD) -> None:
        self.status = self.load_outcome = SessionStatus.FAILED
        self.error, self.failed_method, self.exception, self.failed_stage = str(e), method, e, stage
        self.results[method].mark_failed(str(e))

    def _views(self) -> list[MethodView]:
        return [
            MethodView(m.name, self.devices[m.name].type, self.devices[m.name].index, m.constants)
            for m in self.program.methods
        ]

    def export_refusal(self) -> ExportRefusal | None:
        """The modelled exporter's refusal of this program (:meth:`Policy.export`), or None.

        Asked once per session, before anything is loaded: under ``fqn-weight-cache`` a program
        ExecuTorch 1.5.x would refuse to export never reaches a runtime."""
        if self._export_refusal is None:
            self._export_refusal = (self.policy.export(self._views()),)
        return self._export_refusal[0]

    def _refuse_export(self, refusal: ExportRefusal) -> None:
        """Record the refusal: every constant of every method refused, the offending one with
        what its key held; every method failed; nothing checked, opened, uploaded or sampled."""
        views = self._views()
        for view, outcome in zip(views, refusal.outcomes(views)):
            for d in outcome.decisions:
                if d.digest_comparison is not None:
                    dc = d.digest_comparison
                    self.log.record(
                        ev.DigestCompared,
                        view.name,
                        name=d.constant.name,
                        fqn=d.constant.fqn,
                        cached=dc.cached,
                        new=dc.new,
                        equal=dc.equal,
                    )
            self._record_decisions(view.name, self.devices[view.name], outcome, Plan(view, (), False, ""), {})
        self.log.record(ev.LoadFailed, refusal.method, error=refusal.message)
        for name in self.program.method_names:
            self.results[name].mark_failed(refusal.message)
        self._fail(refusal.method, LoadError(refusal.message), stage=Stage.EXPORT)

    def load_method(self, name: str) -> LoadedMethod:
        """Load one method; on failure the cache is exactly as before and LoadError is raised.

        "Exactly as before" holds for every exception, KeyboardInterrupt included.
        """
        spec = self.program.method(name)
        device = self.devices[name]
        if self.status is SessionStatus.CLOSED:
            raise LoadError(f"method {name!r}: the session is closed")
        refusal = self.export_refusal()
        if refusal is not None:  # the program does not exist: no method of it can be loaded
            self.results[name].mark_failed(refusal.message)
            self.log.record(ev.LoadFailed, name, error=refusal.message)
            raise LoadError(refusal.message)
        with self.cache.lock:
            # checked under the lock: two threads loading one method must not both pass
            if name in self.methods:
                raise LoadError(f"method {name!r} is already loaded")
            snap = self.cache.snapshot()
            try:
                loaded = self._load(spec, device)
            except BaseException as e:
                self.cache.restore(snap)
                # The traceback's frames hold the half-loaded container (and a whole blob on the
                # device) until the garbage collector runs: free their locals now.
                traceback.clear_frames(e.__traceback__)
                msg = str(e) if isinstance(e, ToolkitError) else f"{type(e).__name__}: {e}"
                self.results[name].mark_failed(msg)
                self.log.record(ev.LoadFailed, name, error=msg)
                if not isinstance(e, Exception) or isinstance(e, ToolkitError):
                    raise  # interrupts as they are; toolkit errors already name file and field
                raise LoadError(f"method {name!r}: {msg}") from e
            self.methods[name] = loaded
            self._held += loaded.device_bytes
            r = self.results[name]
            r.status, r.error, r.runnable, r.problems = MethodStatus.LOADED, "", loaded.runnable, tuple(loaded.problems)
            r.own_upload_bytes = loaded.own_upload_bytes
            return loaded

    # ------------------------------------------------------------ memory accounting
    def _held_bytes(self, pending: LoadedMethod | None) -> int:
        # The method being loaded is not in self.methods until it is done.
        return self._held + (pending.device_bytes if pending else 0)

    def _sample_memory(self, method: str, device: Device, phase: str, pending: LoadedMethod | None = None) -> bool:
        """Record the bytes in use on ``device``; True when the runtime measured them (not the accounting)."""
        measured = self.runtime.bytes_in_use(device, sync=True)
        used, measure = (
            measured if measured is not None else (self._held_bytes(pending), "constant bytes held by the loader")
        )
        self._peak = max(self._peak, used)
        self.log.record(ev.MemorySampled, method, device=str(device), phase=phase, bytes_in_use=used, measure=measure)
        return measured is not None

    def _probe_peak(self, device: Device, pending: LoadedMethod) -> None:
        """Note bytes in use after a step that allocates (a blob, one constant, the pairs).

        Read after each such step rather than from a sampling thread: AOTI's blob upload
        holds the GIL, so a Python thread could not sample inside it anyway.  No sync is
        needed: allocations are visible to cudaMemGetInfo when they return.
        """
        if self.log.enabled:
            measured = self.runtime.bytes_in_use(device, sync=False)
            self._peak = max(self._peak, measured[0] if measured is not None else self._held_bytes(pending))

    # ------------------------------------------------------------ one method
    def _load(self, spec: MethodSpec, device: Device) -> LoadedMethod:
        t_start = time.perf_counter()
        m = spec.name
        result = self.results[m]
        result.whole_blob, result.blob_bytes, result.own_upload_bytes, result.problems = False, 0, 0, ()
        so = self.program.path(spec.so_file) if self.program.root is not None else Path(spec.so_file)
        self.log.record(ev.LoadStarted, m, policy=self.policy.name.value, device=str(device), so_path=str(so))
        if self.check_integrity:  # a .so runs code when opened: check it first (free if load() just did)
            check_files(
                self.program.root,
                self.program.files,
                (spec.so_file, spec.blob_file),
                self.options,
                when_read=_blobs_only([spec], self.options),
            )
        self._peak = 0
        self._sample_memory(m, device, "before")
        t = time.perf_counter()
        handle = self.runtime.create(self.program, spec, device)
        self.log.record(ev.ContainerCreated, m, device=str(device), seconds=time.perf_counter() - t)
        self._check_against_compiled(spec, handle, so)

        view = MethodView(m, device.type, device.index, spec.constants)
        plan = self.policy.plan(view, self.cache)
        lookups = plan.lookups
        if lookups:  # one record for the method's lookups, as columns
            self.log.record_batch(
                ev.CacheLookup,
                m,
                name=[lr.constant.name for lr in lookups],
                fqn=[lr.constant.fqn for lr in lookups],
                result=[lr.result for lr in lookups],
                cached_owner=[lr.entry.owner_method if lr.entry else "" for lr in lookups],
                storage_key=[lr.key for lr in lookups],
            )

        loaded = LoadedMethod(spec, device, handle, outcome=Outcome(m, ()))
        extracted: Mapping[str, Any] = {}
        new_meta: dict[str, TensorMeta] | None = None
        if plan.upload_whole_blob and spec.constants:
            t = time.perf_counter()
            handle.upload_blob()
            loaded.whole_blob_bytes = result.blob_bytes = spec.blob_bytes
            result.whole_blob = True
            self._probe_peak(device, loaded)
            self.log.record(
                ev.BlobUploaded, m, bytes=spec.blob_bytes, seconds=time.perf_counter() - t, why=plan.blob_reason
            )
            extracted = handle.extract()
            self.log.record(ev.ConstantsExtracted, m, count=len(extracted))
            new_meta = {n: self.runtime.facts(x)[0] for n, x in extracted.items()}

        outcome = self.policy.decide(plan, new_meta, self.cache)
        loaded.outcome = outcome
        self._record_comparisons(m, outcome)
        if outcome.failure:
            self._record_decisions(m, device, outcome, plan, {})
            for d in outcome.decisions:
                if d.upstream_keeps:
                    self.log.record(
                        ev.CacheEntryLeftUpstream, m, name=d.constant.name, fqn=d.constant.fqn, reason=d.reason
                    )
            raise LoadError(outcome.failure)

        # Upload exactly the constants this method needs on its own (memory-optimal policies).
        own = [d.constant for d in outcome.decisions if d.origin is _TensorOrigin.OWN_UPLOAD]
        # one event per upload, recorded as it is done: an upload runs native code, and a worker streaming its
        # events (toolkit.workflows.isolation) keeps those before a crash; a runtime whose uploads run none (the dry run)
        # has them recorded as one batch once they are done (the same events, the batch's time)
        t = time.perf_counter()
        done: dict[str, list[Any]] | None = (
            None if self.runtime.native_uploads else {"name": [], "fqn": [], "bytes": [], "seconds": [], "path": []}
        )
        if done is not None:
            names, fqns, sizes, times, paths = (v.append for v in done.values())
        try:
            for c, tensor, how in handle.upload_constants(own):
                loaded.own_tensors[c.name] = tensor
                loaded.own_upload_bytes += c.nbytes
                self._probe_peak(device, loaded)
                now = time.perf_counter()
                if done is None:
                    self.log.record(
                        ev.ConstantUploaded, m, name=c.name, fqn=c.fqn, bytes=c.nbytes, seconds=now - t, path=how
                    )
                else:
                    names(c.name)
                    fqns(c.fqn)
                    sizes(c.nbytes)
                    times(now - t)
                    paths(how)
                t = now
                self._advance(1)
        finally:
            if done and done["name"]:  # what was uploaded, also when an upload raised
                self.log.record_batch(ev.ConstantUploaded, m, **done)

        # The out-of-bounds guard: AOTInductor checks nothing when a tensor is installed.
        install: dict[str, Any] = {}
        problems: dict[str, str] = {}
        runs: dict[str, Any] = {}  # the tensor each slot runs on (shared from this blob: another slot's)
        own_tensors, from_cache, uploaded, shared = (
            loaded.own_tensors,
            _TensorOrigin.CACHE,
            _TensorOrigin.OWN_UPLOAD,
            _Decision.SHARED,
        )
        for d in outcome.decisions:
            name, origin = d.constant.name, d.origin
            runs[name] = (
                d.shared_from.tensor
                if origin is from_cache
                else own_tensors[name]
                if origin is uploaded
                else extracted.get(d.shared_from.name if d.decision is shared else name)
            )
        facts, dtype, dindex = self.runtime.facts, device.type, device.index
        for d in outcome.install:
            tensor = runs[d.constant.name]
            have, have_bytes = facts(tensor)
            problem = slot_problem(have, have_bytes, d.constant, dtype, dindex)
            if problem:
                loaded.runnable = False
                loaded.problems.append(f"{d.constant.name}: {problem}")
                problems[d.constant.name] = problem
                self.log.record(ev.OutOfBoundsAlias, m, name=d.constant.name, fqn=d.constant.fqn, problem=problem)
                continue
            install[d.constant.name] = tensor
        for d in outcome.decisions:  # upstream leaves the slot empty: the method reads garbage
            if d.decision is _Decision.NEVER_FILLED:
                loaded.runnable = False
                loaded.problems.append(f"{d.constant.name}: never filled: {d.reason}")
                problems[d.constant.name] = f"never filled: {d.reason}"
        if outcome.first_container:
            self.cache.first_container = m
        self._record_decisions(m, device, outcome, plan, problems)
        loaded.tensors.update(runs)  # what each slot runs on: for state resets and blame
        if loaded.runnable:
            handle.install(install)
            self._probe_peak(device, loaded)
            self.log.record(ev.PairsInstalled, m, count=len(install), names=",".join(install))

        added: list[tuple[ConstantSpec, CacheEntry]] = []  # recorded as one batch
        try:
            for d in outcome.decisions:
                if d.enters_cache:
                    if d.origin is _TensorOrigin.WHOLE_BLOB:
                        tensor, keep = extracted[d.constant.name], handle
                    else:
                        tensor, keep = loaded.own_tensors[d.constant.name], None
                    entry = CacheEntry(
                        fqn=d.cache_key,
                        name=d.constant.name,
                        owner_method=m,
                        meta=self.runtime.facts(tensor)[0],
                        digest=d.constant.digest,
                        nbytes=d.constant.nbytes,
                        tensor=tensor,
                        keepalive=keep,
                        users={m},
                        mutated=d.constant.mutated,
                        storage=d.constant.storage,
                    )
                    self.cache.add(entry)
                    added.append((d.constant, entry))
                elif d.decision is _Decision.SHARED and d.origin is _TensorOrigin.CACHE:
                    self.cache.add_user(d.shared_from, m)
        finally:
            if added:
                self.log.record_batch(
                    ev.CacheEntryAdded,
                    m,
                    name=[c.name for c, _ in added],
                    fqn=[c.fqn for c, _ in added],
                    owner_kind=[e.owner_kind for _, e in added],
                )
        measured = self._sample_memory(m, device, "after", pending=loaded)
        self.log.record(
            ev.MemorySampled,
            m,
            device=str(device),
            phase="peak",
            bytes_in_use=self._peak,
            measure="max of cudaMemGetInfo after each allocating step"
            if measured
            else "max of constant bytes held by the loader",
        )
        self.log.record(ev.MethodLoaded, m, runnable=loaded.runnable, seconds=time.perf_counter() - t_start)
        self._advance(len(spec.constants) - len(loaded.own_tensors))  # the rest: shared, from the blob, ...
        return loaded

    def _check_against_compiled(self, spec: MethodSpec, handle: MethodRuntime, so: Path) -> None:
        """The compiled model's own slots are the truth: a program model that disagrees is refused.

        Names, FQNs, dtypes, byte sizes and blob offsets, before anything is uploaded or run,
        under every policy.  A slot smaller in the program than in the .so would be filled
        by a smaller tensor and read out of bounds (AOTInductor checks nothing when a
        tensor is installed); a shorter blob would be read past its end.
        """
        m = spec.name
        compiled = handle.compiled()
        if compiled.is_manifest:  # the dry run's: every check would compare the manifest with itself
            self._enumerated(m, spec.constants)
            return
        slots = compiled.constants
        declared = {c.name: c for c in spec.constants}
        if set(slots) != set(declared):
            raise ProgramError(
                f"method {m!r}: the .so's constants {sorted(set(slots) ^ set(declared))[:5]} differ from the manifest's",
                path=so,
                field=f"methods[{m}].constants",
            )
        if compiled.blob_bytes is not None and spec.constants and compiled.blob_bytes != spec.blob_bytes:
            raise ProgramError(
                f"method {m!r}: the .so reads a {compiled.blob_bytes}-byte weights blob, the "
                f"manifest says {spec.blob_bytes}",
                path=so,
                field=f"methods[{m}].blob_bytes",
            )
        checked: list[ConstantSpec] = []  # enumerated: recorded as one batch, also when one is refused
        try:
            self._check_slots(spec, slots, compiled, so, checked)
        finally:
            self._enumerated(m, checked)

    def _enumerated(self, m: str, constants: "list[ConstantSpec] | tuple[ConstantSpec, ...]") -> None:
        if constants:
            self.log.record_batch(
                ev.ConstantEnumerated,
                m,
                name=[c.name for c in constants],
                fqn=[c.fqn for c in constants],
                dtype=[c.dtype for c in constants],
            )

    @staticmethod
    def _check_slots(
        spec: MethodSpec, slots: Mapping[str, Any], compiled: Any, so: Path, checked: list[ConstantSpec]
    ) -> None:
        m = spec.name
        for c in spec.constants:
            slot = slots[c.name]
            where = f"methods[{m}].constants[{c.name}]"
            if slot.fqn != c.fqn:
                raise ProgramError(
                    f"constant {c.name!r}: .so says FQN {slot.fqn!r}, manifest says {c.fqn!r}",
                    path=so,
                    field=f"{where}.fqn",
                )
            # the .so's own dtype is the slot's truth; a manifest that disagrees would size uploads wrongly
            if slot.dtype != "?" and slot.dtype != c.dtype:
                raise ProgramError(
                    f"constant {c.name!r}: .so was compiled for {slot.dtype}, manifest says {c.dtype}",
                    path=so,
                    field=f"{where}.dtype",
                )
            # the .so reports the slot's size rounded to its 64-byte alignment (aligned_slot_bytes), or
            # unrounded where AOTInductor packs the blob without padding (every constant on CUDA: a
            # 16-byte counter's slot is 16 bytes, measured on the H200): a lie inside the last 63
            # bytes of a slot cannot be told from it, anything larger can
            if slot.nbytes is not None and slot.nbytes not in (c.nbytes, aligned_slot_bytes(c.nbytes)):
                raise ProgramError(
                    f"constant {c.name!r}: the .so's slot holds {slot.nbytes} bytes, the manifest's "
                    f"dtype/shape/strides {c.nbytes}",
                    path=so,
                    field=f"{where}.nbytes",
                )
            if slot.blob_offset is not None and compiled.blob_bytes is not None and slot.blob_offset != c.offset:
                raise ProgramError(
                    f"constant {c.name!r}: the .so reads it at blob offset {slot.blob_offset}, "
                    f"the manifest says {c.offset}",
                    path=so,
                    field=f"{where}.offset",
                )
            checked.append(c)

    def _record_comparisons(self, m: str, outcome: Outcome) -> None:
        """Every field and digest comparison of a method's decisions, in order, as one record."""
        f_name: list[str] = []
        f_fqn: list[str] = []
        f_field: list[Any] = []
        f_cached: list[str] = []
        f_new: list[str] = []
        f_equal: list[bool] = []
        d_rows: list[tuple[ConstantSpec, Any]] = []
        kinds: list[int] = []
        columns: dict[int, tuple] = {}  # id(comparisons) -> its kinds, its columns and itself
        for d in outcome.decisions:
            comps = d.comparisons
            if comps:  # the same few tuples repeat (compare_metadata is memoised): columns made once per tuple
                col = columns.get(id(comps))
                if col is None or col[5] is not comps:
                    col = columns[id(comps)] = (
                        [0] * len(comps),
                        [x.field for x in comps],
                        [x.cached for x in comps],
                        [x.new for x in comps],
                        [x.equal for x in comps],
                        comps,
                    )
                c, k = d.constant, len(comps)
                f_name += [c.name] * k
                f_fqn += [c.fqn] * k
                kinds += col[0]
                f_field += col[1]
                f_cached += col[2]
                f_new += col[3]
                f_equal += col[4]
            if d.digest_comparison is not None:
                d_rows.append((d.constant, d.digest_comparison))
                kinds.append(1)
        if not kinds:
            return
        self.log.record_rows(
            m,
            (ev.FieldCompared, ev.DigestCompared),
            kinds,
            {
                ev.FieldCompared: {
                    "name": f_name,
                    "fqn": f_fqn,
                    "field": f_field,
                    "cached": f_cached,
                    "new": f_new,
                    "equal": f_equal,
                },
                ev.DigestCompared: {
                    "name": [c.name for c, _ in d_rows],
                    "fqn": [c.fqn for c, _ in d_rows],
                    "cached": [x.cached for _, x in d_rows],
                    "new": [x.new for _, x in d_rows],
                    "equal": [x.equal for _, x in d_rows],
                },
            },
        )

    def _record_decisions(
        self, m: str, device: Device, outcome: Outcome, plan: Plan, problems: Mapping[str, str]
    ) -> None:
        """Every decision of a method as one record (its columns), and the method's findings."""
        ds = outcome.decisions
        cs = [d.constant for d in ds]
        slot = [problems.get(c.name, "") for c in cs] if problems else [""] * len(ds)
        refs = []  # the cache entry each was given or checked against, None when none
        findings, data_problem = [], []
        lookup, shared = plan.lookup, _Decision.SHARED
        for d, c, sp in zip(ds, cs, slot):
            ref = d.shared_from
            if not ref:
                lr = lookup(c.name)
                ref = lr.entry if lr else None
            refs.append(ref)
            if ref:
                found = find_problem(
                    method=m,
                    name=c.name,
                    fqn=c.fqn,
                    decision=d.decision,
                    digest=c.digest,
                    mutated=c.mutated,
                    storage=c.storage,
                    slot_problem=sp,
                    cached_method=ref.owner_method,
                    cached_name=ref.name,
                    cached_digest=ref.digest,
                    cached_mutated=ref.mutated,
                    cached_storage=ref.storage,
                )
            else:
                found = find_problem(
                    method=m,
                    name=c.name,
                    fqn=c.fqn,
                    decision=d.decision,
                    digest=c.digest,
                    mutated=c.mutated,
                    storage=c.storage,
                    slot_problem=sp,
                )
            if found is not None:
                findings.append(found)
                data_problem.append(found.problem.value)
            else:
                data_problem.append("")
        if ds:
            self.log.record_batch(
                ev.Decided,
                m,
                device=[str(device)] * len(ds),
                name=[c.name for c in cs],
                fqn=[c.fqn for c in cs],
                constant_kind=[_VALUE[c.kind] for c in cs],
                mutated=[c.mutated for c in cs],
                lookup=[_VALUE[d.lookup] for d in ds],
                decision=[d.decision for d in ds],
                reason_code=[d.reason_code for d in ds],
                reason=[d.reason for d in ds],
                origin=[d.origin for d in ds],
                shared_from=[
                    f"{d.shared_from.owner_method}/{d.shared_from.name}"
                    if d.decision is shared and d.shared_from
                    else ""
                    for d in ds
                ],
                nbytes=[c.nbytes for c in cs],
                dtype=[c.dtype for c in cs],
                shape=[shown(c.shape) for c in cs],
                strides=[shown(c.strides) for c in cs],
                digest=[c.digest for c in cs],
                cached_method=[r.owner_method if r else "" for r in refs],
                cached_dtype=[r.meta.dtype if r else "" for r in refs],
                cached_shape=[shown(r.meta.shape) if r else "" for r in refs],
                cached_strides=[shown(r.meta.strides) if r else "" for r in refs],
                cached_digest=[r.digest if r else "" for r in refs],
                slot_problem=slot,
                storage_key=[d.key for d in ds],
                data_problem=data_problem,
                upstream_keeps=[d.upstream_keeps for d in ds],
            )
        self.results[m].findings = tuple(findings)

    # ------------------------------------------------------------------ running
    def run(self, method: str, inputs: list) -> list:
        lm = self.methods.get(method)
        if lm is None:
            raise LoadError(f"method {method!r} is not loaded (session status: {self.status})")
        if not lm.runnable:
            raise LoadError(f"method {method!r} is not runnable: {'; '.join(lm.problems)}")
        if not self.runtime.can_run:
            raise LoadError(f"method {method!r} was loaded by a {self.runtime.name}: there is nothing to run")
        self._note_run(lm)
        return lm.handle.run(list(inputs))

    def _note_run(self, lm: LoadedMethod) -> None:
        """Remember the tensors this run can write, for the next :meth:`reset_state`: the mutated
        ones, or (a source that does not record mutation) all, each checksummed before its first run."""
        every = not self.program.records_mutation
        for c in lm.spec.constants:
            t = lm.tensors.get(c.name)
            if t is None or not (c.mutated or every) or _holds(self._touched, t):
                continue
            self._touched[id(t)] = (weakref.ref(t), c)
            if every and not _holds(self._initial, t):
                self._initial[id(t)] = (weakref.ref(t), self.runtime.checksum(t))

    def swap_constant(self, method: str, name: str, tensor: Any) -> Any:
        """Point constant ``name`` of loaded ``method`` at ``tensor``; returns the tensor it ran on.

        The one place, besides the load, that installs a tensor (blame's experiments swap and
        restore through it); no check is made, so the caller gives a tensor that fills the slot."""
        lm = self.methods[method]
        old = lm.tensors[name]
        lm.handle.install({name: tensor})
        lm.tensors[name] = tensor
        return old

    def own_copy(self, method: str, name: str) -> Any:
        """A fresh device tensor holding constant ``name`` of ``method`` as its own file stores it."""
        return self.own_copies(method, [name])[name]

    def own_copies(self, method: str, names: list[str]) -> dict[str, Any]:
        """:meth:`own_copy` of each of ``names``, uploaded as one batch (one pass over the pieces
        of the files they lie in, on every core): name -> fresh device tensor."""
        lm = self.methods[method]
        by_name = {c.name: c for c in lm.spec.constants}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise LoadError(f"method {method!r} has no constant {missing[0]!r}")
        return {c.name: t for c, t, _ in lm.handle.upload_constants([by_name[n] for n in dict.fromkeys(names)])}

    def reset_state(self) -> int:
        """Put back to its initial contents every tensor a run since the last reset can have written.

        A program whose source records which constants are written rewrites those of the methods
        that ran; one that does not (a ``.pte``, a ``.pt2``: ``records_mutation`` False) rewrites
        those of them whose checksum, taken on the device, changed since before their first run.
        A tensor two methods share is reset once.  Counted in :attr:`resets`; returns how many
        tensors were rewritten.
        """
        every = not self.program.records_mutation
        rewritten = 0
        for ref, c in self._touched.values():
            t = ref()
            if t is None:
                continue
            if every:
                self.resets.bytes_checked += c.nbytes
                if self.runtime.same_checksum(self.runtime.checksum(t), self._initial[id(t)][1]):
                    continue
            self.runtime.write_initial(t, self.program, c)
            rewritten += 1
            self.resets.bytes_rewritten += c.nbytes
        self._touched.clear()
        self.resets.resets += 1
        self.resets.tensors_rewritten += rewritten
        return rewritten

    # ------------------------------------------------------------------ lifetime
    def unload(self, method: str) -> None:
        """Drop a method. Cached tensors it produced stay alive while other methods use them."""
        with self.cache.lock:  # a load running in another thread reads self.methods
            lm = self.methods.pop(method, None)
            if lm is None:
                raise LoadError(f"method {method!r} is not loaded")
            self._held -= lm.device_bytes
            freed = self.cache.release(method)
            self.results[method].status = MethodStatus.UNLOADED
        self.log.record(ev.MethodUnloaded, method, released_entries=freed)
        del lm
        self._sample_memory(method, self.devices[method], "unloaded")

    def close(self) -> None:
        """Release every method and the runtime's resources; the results stay readable.

        Tables, :attr:`method_results` and the last :meth:`verify` answer outlive it.
        """
        for name in list(self.methods):
            self.unload(name)
        self.runtime.close()
        self.status = SessionStatus.CLOSED

    # ------------------------------------------------------------------ tables
    def _table(self, build: "Callable[[ev.EventLog], pd.DataFrame]") -> "pd.DataFrame":
        """Frames are built from the log once; rebuilt only when the log has grown since."""
        n = len(self.log)
        hit = self._frames.get(build.__name__)
        if hit is None or hit[0] != n:
            hit = self._frames[build.__name__] = (n, build(self.log))
        return hit[1].copy()

    @property
    def events(self) -> "pd.DataFrame":
        return self._table(tables.events_frame)

    @property
    def lookups(self) -> "pd.DataFrame":
        return self._table(tables.lookups_frame)

    @property
    def comparisons(self) -> "pd.DataFrame":
        return self._table(tables.comparisons_frame)

    @property
    def decisions(self) -> "pd.DataFrame":
        return self._table(tables.decisions_frame)

    @property
    def memory(self) -> "pd.DataFrame":
        return self._table(tables.memory_frame)

    @property
    def method_results(self) -> "pd.DataFrame":
        """One row per method: status, bytes it put on its device, runnable, problems."""
        return tables.method_results_frame(self.results.values(), policy=self.policy.name.value)

    @property
    def device_bytes(self) -> int:
        """Constant bytes this load put on its devices (accounted; kept after close)."""
        return sum(r.device_bytes for r in self.results.values())


def default_runtime(options: LoadOptions | None = None) -> Runtime:
    """The AOTInductor runtime, imported when first needed (a dry run never imports torch)."""
    from toolkit.runtimes.aoti import AotiRuntime

    return AotiRuntime(options)


def resolve_devices(
    program: Program, device: "str | Any | Mapping[str, str] | None", runtime: Runtime | None = None
) -> dict[str, Device]:
    """One device per method: ``None`` picks the program's own kind (cuda / cpu).

    ``device`` is a device ('cpu', 'cuda', 'cuda:1') or ``{method: device}`` (unnamed
    methods get the program's own kind).  A bare 'cuda' is placed as ``runtime`` places it
    (by default the AOTInductor runtime: the current CUDA device).
    """
    rt = runtime if runtime is not None else default_runtime()
    default = "cuda" if program.device == "cuda" else "cpu"
    if device is None:
        device = default
    if isinstance(device, Mapping):
        unknown = set(device) - set(program.method_names)
        if unknown:
            raise ValueError(f"device placement names unknown methods {sorted(unknown)}")
        return {m: rt.resolve(device.get(m, default)) for m in program.method_names}
    d = rt.resolve(device)
    return {m: d for m in program.method_names}
