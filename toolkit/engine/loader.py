"""The load orchestrator: one program, one policy, every method loaded through the shared cache.

:meth:`ProgramLoad.load_method` is the only place a method's load is written: lookups, the
policy's decision, uploads, the out-of-bounds guard, installation, cache bookkeeping and
every event.  It runs over a runtime (:mod:`toolkit.runtimes`): the real AOTInductor one
(:func:`toolkit.load_program`) or the dry run (:func:`toolkit.workflows.dry_run.dry_run`), so the dry
run predicts the real load by construction.  Its steps live beside it: the checks against the
compiled model (:mod:`~toolkit.engine.checks`), the events (:mod:`~toolkit.engine.recording`),
memory samples (:mod:`~toolkit.engine.memory`) and state resets (:mod:`~toolkit.engine.resets`).
Verification, blame and the verdict are operations over a load, above it
(:mod:`toolkit.engine.session`).  No torch is imported here.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from toolkit.core import events as ev
from toolkit.core.cache import CacheEntry, SharedConstantCache
from toolkit.core.errors import LoadError, ToolkitError
from toolkit.core.model import ConstantSpec, MethodSpec, Program, TensorMeta
from toolkit.core.options import LoadOptions
from toolkit.core.policies import ExportRefusal, MethodView, Outcome, Plan, Policy
from toolkit.core.verdict import ConstantFinding
from toolkit.core.vocab import Decision, Members, MethodStatus, SessionStatus, Stage, TensorOrigin
from toolkit.display.cells import one_line
from toolkit.engine import frames as tables
from toolkit.engine import recording
from toolkit.engine.checks import check_against_compiled, guard_slots
from toolkit.engine.devices import default_runtime
from toolkit.engine.memory import MemoryGauge
from toolkit.engine.resets import ResetCounts, StateResets
from toolkit.integrity import check_claimed_sha256, check_content_claims, check_files
from toolkit.runtimes import Device, MethodRuntime, Runtime
from toolkit.sources.directory import content_claims, key_claims

# the members per-constant code reads, as plain attributes (vocab.Members says why)
_Decision, _TensorOrigin = Members(Decision), Members(TensorOrigin)

if TYPE_CHECKING:
    import pandas as pd


def _refusal_pair(refusal: ExportRefusal) -> tuple[str, str, str, str]:
    """The two constants an export refusal rests on (their digests differ), as :meth:`ProgramLoad.check_claims`
    takes them."""
    return refusal.method, refusal.constant.name, refusal.first.owner_method, refusal.first.name


def _blobs_only(specs, options: LoadOptions) -> list[str]:
    """The weights blobs whose pieces are verified as they are read (integrity.check_files'
    ``when_read``): not a file that also holds a method's .so (every .so byte is checked first),
    none with ``LoadOptions(integrity="files-first")``."""
    code = {s.so_file for s in specs}
    return [] if not options.integrity.blobs_when_read else [s.blob_file for s in specs if s.blob_file not in code]


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


class ProgramLoad:
    """One load of one program under one policy.  Constructing it does no I/O; :meth:`load` does.

    After the load its tables (:attr:`decisions`, :attr:`lookups`, :attr:`comparisons`,
    :attr:`events`, :attr:`memory`, :attr:`method_results`) stay available, also once
    :meth:`close` has released the device memory.  ``options`` (default ``LoadOptions()``): how
    bytes move and are checked.
    """

    def __init__(
        self,
        program: Program,
        policy: Policy,
        devices: Mapping[str, Device],
        *,
        record: bool = True,
        runtime: Runtime | None = None,
        options: LoadOptions | None = None,
    ):
        self.program = program
        self.policy = policy
        self.devices = dict(devices)
        self.options = options if options is not None else LoadOptions()
        self.runtime = runtime if runtime is not None else default_runtime(self.options)
        self.log = ev.EventLog(enabled=record)
        self.cache = SharedConstantCache()
        self.methods: dict[str, LoadedMethod] = {}
        self._gauge = MemoryGauge(self.runtime)  # bytes held by self.methods, kept as they come and go; peaks
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
        self._keys_checked = False  # check_keys() passed
        self.claim_seconds = 0.0  # spent in check_claims() (benchmarks/default_path.py shows it)
        self.load_seconds: float = 0.0
        self._frames: dict[str, tuple[int, Any]] = {}
        self._bar: Any = None  # load()'s progress bar, advanced by _advance()
        self._on_progress: Callable[[int, int, str], None] | None = None  # load()'s on_progress
        self._progress_at = [0, 0, ""]  # constants done, of how many, the method being loaded
        self._state = StateResets(program, self.runtime)

    @property
    def check_integrity(self) -> bool:
        """Whether this load checks files against their records (``options.integrity`` is not ``off``)."""
        return self.options.integrity.checks

    @property
    def resets(self) -> ResetCounts:
        """What :meth:`reset_state` did, summed over the session (benchmarks read it)."""
        return self._state.counts

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
            try:
                self.check_keys()
            except ToolkitError as e:
                self._fail_check(specs, e)
                return self
            refusal = self.export_refusal()
            if refusal is not None:  # no program was written: nothing is checked, opened or uploaded
                try:  # but the refusal rests on two digests differing: the bytes must bear that out
                    self.check_claims([_refusal_pair(refusal)])
                except ToolkitError as e:
                    self._fail_check(specs, e)
                    return self
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
                    self._fail_check(specs, e)
                    return self
            for spec in specs:
                bar.set_postfix_str(one_line(spec.name))  # a name cannot rewrite the terminal
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

    def _fail_check(self, specs: list[MethodSpec], e: ToolkitError) -> None:
        """A check of the program's files failed before anything was opened: the failure is the
        first method's, in load order, that uses the failing file."""
        bad = getattr(e, "path", None)
        spec = next((sp for sp in specs if any(str(self.program.root / r) == bad for r in sp.files)), specs[0])
        self.log.record(ev.LoadFailed, spec.name, error=str(e))
        self._fail(spec.name, e)

    def check_keys(self) -> None:
        """Verify, once and before the first decision, the recorded digests the policy's keys are
        made of (a program directory's ``.so`` sha256: :func:`~toolkit.sources.directory.key_claims`)
        against the files' bytes: a key must name the bytes that load.  A dry run verifies them too
        (reading the files, opening none); a load with ``integrity="off"`` trusts them."""
        if self._keys_checked or not self.policy.reads_so_keys or (self.runtime.can_run and not self.check_integrity):
            return
        check_claimed_sha256(self.program.root, self.program.files, key_claims(self.program), self.options)
        self._keys_checked = True

    def check_claims(self, pairs: list[tuple[str, str, str, str]]) -> None:
        """Verify the constant digests a decision rests on, each pair (method, constant, method of the
        cached or stored constant, its name), against the bytes: equal exactly when their digests are
        (:func:`~toolkit.integrity.check_content_claims`, over :func:`~toolkit.sources.directory.content_claims`:
        a program directory's digests are the manifest's claims).  A dry run verifies them too (from the
        piece records, else reading the files); a load with ``integrity="off"`` trusts them."""
        if self.runtime.can_run and not self.check_integrity:
            return
        claims = content_claims(self.program, pairs)
        if claims:
            t = time.perf_counter()
            try:
                check_content_claims(self.program.root, self.program.files, claims, self.options)
            finally:
                self.claim_seconds += time.perf_counter() - t

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
            recording.record_digests(self.log, view.name, outcome)
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
        try:
            self.check_keys()
        except ToolkitError as e:
            self.results[name].mark_failed(str(e))
            self.log.record(ev.LoadFailed, name, error=str(e))
            raise
        refusal = self.export_refusal()
        if refusal is not None:  # the program does not exist: no method of it can be loaded
            try:
                self.check_claims([_refusal_pair(refusal)])
            except ToolkitError as e:
                self.results[name].mark_failed(str(e))
                self.log.record(ev.LoadFailed, name, error=str(e))
                raise
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
            self._gauge.held += loaded.device_bytes
            r = self.results[name]
            r.status, r.error, r.runnable, r.problems = MethodStatus.LOADED, "", loaded.runnable, tuple(loaded.problems)
            r.own_upload_bytes = loaded.own_upload_bytes
            return loaded

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
        gauge = self._gauge
        gauge.peak = 0
        gauge.sample(self.log, m, device, "before")
        t = time.perf_counter()
        handle = self.runtime.create(self.program, spec, device)
        self.log.record(ev.ContainerCreated, m, device=str(device), seconds=time.perf_counter() - t)
        check_against_compiled(self.log, spec, handle, so)

        view = MethodView(m, device.type, device.index, spec.constants)
        plan = self.policy.plan(view, self.cache)
        recording.record_lookups(self.log, m, plan.lookups)

        loaded = LoadedMethod(spec, device, handle, outcome=Outcome(m, ()))
        extracted: Mapping[str, Any] = {}
        new_meta: dict[str, TensorMeta] | None = None
        if plan.upload_whole_blob and spec.constants:
            t = time.perf_counter()
            handle.upload_blob()
            loaded.whole_blob_bytes = result.blob_bytes = spec.blob_bytes
            result.whole_blob = True
            gauge.probe(self.log, device, loaded.device_bytes)
            self.log.record(
                ev.BlobUploaded, m, bytes=spec.blob_bytes, seconds=time.perf_counter() - t, why=plan.blob_reason
            )
            extracted = handle.extract()
            self.log.record(ev.ConstantsExtracted, m, count=len(extracted))
            new_meta = {n: self.runtime.facts(x)[0] for n, x in extracted.items()}

        outcome = self.policy.decide(plan, new_meta, self.cache)
        # a share is taken, and judged, on two constants' digests: the bytes bear them out first
        self.check_claims(
            [
                (m, d.constant.name, d.shared_from.owner_method, d.shared_from.name)
                for d in outcome.decisions
                if d.decision is _Decision.SHARED and d.shared_from is not None and not d.view_of
            ]
        )
        loaded.outcome = outcome
        recording.record_comparisons(self.log, m, outcome)
        if outcome.failure:
            self._record_decisions(m, device, outcome, plan, {})
            recording.record_left_upstream(self.log, m, outcome)
            raise LoadError(outcome.failure)

        # Upload exactly the constants this method needs on its own (memory-optimal policies).
        # (a slot shared from another slot's upload in this method is not uploaded again)
        self._upload_own(
            loaded,
            [
                d.uploaded
                for d in outcome.decisions
                if d.origin is _TensorOrigin.OWN_UPLOAD and d.decision is not _Decision.SHARED
            ],
        )

        runs: dict[str, Any] = {}  # the tensor each slot runs on (shared from this blob: another slot's)
        own_tensors, from_cache, uploaded, shared = (
            loaded.own_tensors,
            _TensorOrigin.CACHE,
            _TensorOrigin.OWN_UPLOAD,
            _Decision.SHARED,
        )
        for d in outcome.decisions:
            name, origin = d.constant.name, d.origin
            given = (
                d.shared_from.tensor
                if origin is from_cache
                else own_tensors[d.shared_from.name if d.decision is shared else name]
                if origin is uploaded
                else extracted.get(d.shared_from.name if d.decision is shared else name)
            )
            # another view of the storage it was given: its own dtype, sizes, strides and offset on that storage
            runs[name] = self.runtime.view(given, d.constant) if d.view_of else given
        # The out-of-bounds guard: AOTInductor checks nothing when a tensor is installed.
        install, problems, lines = guard_slots(self.log, m, outcome, runs, self.runtime.facts, device)
        if lines:
            loaded.runnable = False
            loaded.problems.extend(lines)
        if outcome.first_container:
            self.cache.first_container = m
        self._record_decisions(m, device, outcome, plan, problems)
        loaded.tensors.update(runs)  # what each slot runs on: for state resets and blame
        if loaded.runnable:
            handle.install(install)
            gauge.probe(self.log, device, loaded.device_bytes)
            self.log.record(ev.PairsInstalled, m, count=len(install), names=",".join(install))

        self._enter_cache(loaded, extracted)
        measured = gauge.sample(self.log, m, device, "after", loaded.device_bytes)
        gauge.record_peak(self.log, m, device, measured)
        self.log.record(ev.MethodLoaded, m, runnable=loaded.runnable, seconds=time.perf_counter() - t_start)
        self._advance(len(spec.constants) - len(loaded.own_tensors))  # the rest: shared, from the blob, ...
        return loaded

    def _upload_own(self, loaded: LoadedMethod, own: list[ConstantSpec]) -> None:
        """Upload the constants ``loaded`` needs on its own, each recorded as a ConstantUploaded event."""
        m, handle, device, gauge = loaded.name, loaded.handle, loaded.device, self._gauge
        # one event per upload, recorded as it is done: an upload runs native code, and a worker streaming its
        # events (toolkit.workflows.isolation) keeps those before a crash; a runtime whose uploads run none (the
        # dry run) has them recorded as one batch once they are done (the same events, the batch's time)
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
                gauge.probe(self.log, device, loaded.device_bytes)
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

    def _enter_cache(self, loaded: LoadedMethod, extracted: Mapping[str, Any]) -> None:
        """Add to the cache what the decisions of ``loaded`` put there, and register it as a user of what it shares."""
        m, handle = loaded.name, loaded.handle
        added: list[tuple[ConstantSpec, CacheEntry]] = []  # recorded as one batch
        try:
            for d in loaded.outcome.decisions:
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
                        nbytes=d.uploaded.nbytes,
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
            recording.record_cache_added(self.log, m, added)

    def _record_decisions(
        self, m: str, device: Device, outcome: Outcome, plan: Plan, problems: Mapping[str, str]
    ) -> None:
        """Every decision of a method as one record, and the method's findings."""
        self.results[m].findings = recording.record_decisions(self.log, m, device, outcome, plan, problems)

    # ------------------------------------------------------------------ running
    def run(self, method: str, inputs: list) -> list:
        lm = self.methods.get(method)
        if lm is None:
            raise LoadError(f"method {method!r} is not loaded (session status: {self.status})")
        if not lm.runnable:
            raise LoadError(f"method {method!r} is not runnable: {'; '.join(lm.problems)}")
        if not self.runtime.can_run:
            raise LoadError(f"method {method!r} was loaded by a {self.runtime.name}: there is nothing to run")
        self._state.note_run(lm.spec, lm.tensors)
        return lm.handle.run(list(inputs))

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
        return self._state.reset()

    # ------------------------------------------------------------------ lifetime
    def unload(self, method: str) -> None:
        """Drop a method. Cached tensors it produced stay alive while other methods use them."""
        with self.cache.lock:  # a load running in another thread reads self.methods
            lm = self.methods.pop(method, None)
            if lm is None:
                raise LoadError(f"method {method!r} is not loaded")
            self._gauge.held -= lm.device_bytes
            freed = self.cache.release(method)
            self.results[method].status = MethodStatus.UNLOADED
        self.log.record(ev.MethodUnloaded, method, released_entries=freed)
        del lm
        self._gauge.sample(self.log, method, self.devices[method], "unloaded")

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
