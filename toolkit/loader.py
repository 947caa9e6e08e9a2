"""Loading a program for real: one AOTInductor container per method, constants through
the shared cache exactly as the chosen policy decides, every step recorded.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from . import events as ev
from .cache import CacheEntry, SharedConstantCache
from .errors import LoadError, ProgramError, ToolkitError
from .manifest import MethodSpec, Program, TensorMeta
from .policies import ConstantDecision, MethodView, Outcome, Policy, get_policy, slot_problem
from .program import check_compatible, open_program
from .runtime import AotiContainer, cuda_in_use_bytes, device_index, dtype_name, parse_device, tensor_meta
from .upload import PATH_HOST, PATH_PINNED_EACH, make_uploader, upload_constant
from .vocab import Decision, Source

_STATUS_LOADED, _STATUS_FAILED, _STATUS_NEW = "loaded", "failed", "not loaded"


@dataclass
class LoadedMethod:
    spec: MethodSpec
    device: torch.device
    container: AotiContainer
    outcome: Outcome
    runnable: bool = True
    problems: list[str] = field(default_factory=list)
    own_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    whole_blob_bytes: int = 0  # bytes of a whole-blob allocation this method keeps resident
    own_upload_bytes: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device_bytes(self) -> int:
        """Constant bytes this method's load put on its device (accounted, not measured)."""
        return self.whole_blob_bytes + self.own_upload_bytes


def _fmt(v) -> str:
    return str(tuple(v)) if isinstance(v, (tuple, list)) else ("" if v is None else str(v))


def _slot_problem(t: torch.Tensor, d: ConstantDecision, device: torch.device) -> str | None:
    """Whether the live tensor ``t`` can fill the slot of ``d.constant`` (see policies.slot_problem)."""
    have_bytes = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    return slot_problem(tensor_meta(t), have_bytes, d.constant, device.type, device_index(device))


def dtype_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) fitting the output dtype: compiled kernels reorder reductions."""
    if dtype in (torch.bfloat16,):
        return 5e-2, 5e-2
    if dtype in (torch.float16,):
        return 1e-2, 1e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-3, 1e-3
    return 0.0, 0.0


class Session:
    """One load of one program under one policy.  Constructing it does no I/O; :meth:`load` does."""

    def __init__(self, program: Program, policy: Policy, devices: Mapping[str, torch.device],
                 *, record: bool = True, check_integrity: bool = True):
        self.program = program
        self.policy = policy
        self.devices = dict(devices)
        self.log = ev.EventLog(enabled=record)
        self.cache = SharedConstantCache()
        self.check_integrity = check_integrity
        self.methods: dict[str, LoadedMethod] = {}
        self.status: str = _STATUS_NEW
        self.error: str | None = None
        self.failed_method: str | None = None
        self.exception: ToolkitError | None = None  # what made the load fail, with its type
        self.load_seconds: float = 0.0
        self._uploaders: dict[torch.device, Any] = {}  # upload.make_uploader(), one per CUDA device
        self._peak = 0  # highest bytes in use seen during the method being loaded

    # ------------------------------------------------------------------ loading
    def load(self, progress: bool = False) -> "Session":
        from tqdm.auto import tqdm

        t0 = time.perf_counter()
        specs = list(self.program.methods)
        bar = tqdm(specs, desc=f"loading ({self.policy.name})", unit="method", disable=not progress)
        try:
            if self.check_integrity:
                # Opening a .so runs its code: check every file of every method before the
                # first .so is opened, so a tampered later method stops the whole load.
                for spec in specs:
                    try:
                        self.program.check_files([spec.so_file, spec.blob_file, spec.reference_file])
                    except ToolkitError as e:
                        self._record(ev.LoadFailed, spec.name, error=str(e))
                        self._fail(spec.name, e)
                        return self
            for spec in bar:
                bar.set_postfix_str(spec.name)
                try:
                    self.load_method(spec.name)
                except ToolkitError as e:
                    self._fail(spec.name, e)
                    break
            else:
                self.status = _STATUS_LOADED
        finally:
            bar.close()
            self.load_seconds = time.perf_counter() - t0
        return self

    def _fail(self, method: str, e: ToolkitError) -> None:
        self.status, self.error, self.failed_method, self.exception = _STATUS_FAILED, str(e), method, e

    def _record(self, etype, method: str, **kw) -> None:
        self.log.record(etype, method, **kw)

    def load_method(self, name: str) -> LoadedMethod:
        """Load one method; on failure the cache is exactly as before and LoadError is raised."""
        spec = self.program.manifest.method(name)
        device = self.devices[name]
        with self.cache.lock:
            # checked under the lock: two threads loading one method must not both pass
            if name in self.methods:
                raise LoadError(f"method {name!r} is already loaded")
            snap = self.cache.snapshot()
            try:
                loaded = self._load_locked(spec, device)
            except Exception as e:
                self.cache.restore(snap)
                # The traceback's frames hold the half-loaded container (and a whole blob on the
                # device) until the garbage collector runs: free their locals now.
                traceback.clear_frames(e.__traceback__)
                msg = str(e) if isinstance(e, ToolkitError) else f"{type(e).__name__}: {e}"
                self._record(ev.LoadFailed, name, error=msg)
                if isinstance(e, ToolkitError):
                    raise
                raise LoadError(f"method {name!r}: {msg}") from e
            self.methods[name] = loaded
            return loaded

    def _held_bytes(self, pending: "LoadedMethod | None") -> int:
        # CPU accounting: the method being loaded is not in self.methods until it is done.
        return sum(m.device_bytes for m in self.methods.values()) + (pending.device_bytes if pending else 0)

    def _sample_memory(self, method: str, device: torch.device, phase: str,
                       pending: "LoadedMethod | None" = None) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            used = cuda_in_use_bytes(device)
            self._peak = max(self._peak, used)
            self._record(ev.MemorySampled, method, device=str(device), phase=phase,
                         bytes_in_use=used, measure="cudaMemGetInfo total-free")
        else:
            held = self._held_bytes(pending)
            self._peak = max(self._peak, held)
            self._record(ev.MemorySampled, method, device="cpu", phase=phase, bytes_in_use=held,
                         measure="constant bytes held by the loader")

    def _probe_peak(self, device: torch.device, pending: "LoadedMethod") -> None:
        """Note bytes in use after a step that allocates (a blob, one constant, the pairs).

        Read after each such step rather than from a sampling thread: AOTI's blob upload
        holds the GIL, so a Python thread could not sample inside it anyway.  No sync is
        needed: allocations are visible to cudaMemGetInfo when they return.
        """
        if self.log.enabled:
            used = cuda_in_use_bytes(device) if device.type == "cuda" else self._held_bytes(pending)
            self._peak = max(self._peak, used)

    def _record_peak(self, method: str, device: torch.device) -> None:
        self._record(ev.MemorySampled, method, device=str(device), phase="peak", bytes_in_use=self._peak,
                     measure="max of cudaMemGetInfo after each allocating step" if device.type == "cuda"
                     else "max of constant bytes held by the loader")

    def _load_locked(self, spec: MethodSpec, device: torch.device) -> LoadedMethod:
        t_start = time.perf_counter()
        m = spec.name
        so, blob = self.program.path(spec.so_file), self.program.path(spec.blob_file)
        self._record(ev.LoadStarted, m, policy=self.policy.name.value, device=str(device), so_path=str(so))
        if self.check_integrity:  # a .so runs code when opened: check it first
            self.program.check_files([spec.so_file, spec.blob_file])
        self._peak = 0
        self._sample_memory(m, device, "before")
        t = time.perf_counter()
        container = AotiContainer.create(so, device)
        self._record(ev.ContainerCreated, m, device=str(device), seconds=time.perf_counter() - t)

        fqns = container.constant_fqns()
        declared = {c.name: c for c in spec.constants}
        if set(fqns) != set(declared):
            raise ProgramError(
                f"method {m!r}: the .so's constants {sorted(set(fqns) ^ set(declared))[:5]} differ from the manifest's",
                path=so, field=f"methods[{m}].constants")
        compiled_dtypes = container.constant_dtypes()
        for c in spec.constants:
            if fqns[c.name] != c.fqn:
                raise ProgramError(f"constant {c.name!r}: .so says FQN {fqns[c.name]!r}, manifest says {c.fqn!r}",
                                   path=so, field=f"methods[{m}].constants.fqn")
            # the .so's own dtype is the slot's truth; a manifest that disagrees would size uploads wrongly
            if compiled_dtypes.get(c.name, c.dtype) != c.dtype:
                raise ProgramError(f"constant {c.name!r}: .so was compiled for {compiled_dtypes[c.name]}, "
                                   f"manifest says {c.dtype}", path=so, field=f"methods[{m}].constants.dtype")
            self._record(ev.ConstantEnumerated, m, name=c.name, fqn=c.fqn, dtype=c.dtype)

        view = MethodView(m, device.type, device_index(device), spec.constants)
        plan = self.policy.plan(view, self.cache)
        for lr in plan.lookups:
            self._record(ev.CacheLookup, m, name=lr.constant.name, fqn=lr.constant.fqn, result=lr.result,
                         cached_owner=lr.entry.owner_method if lr.entry else "")

        loaded = LoadedMethod(spec, device, container, outcome=Outcome(m, ()))
        extracted: dict[str, torch.Tensor] = {}
        new_meta: dict[str, TensorMeta] | None = None
        if plan.upload_whole_blob and spec.constants:
            t = time.perf_counter()
            container.upload_blob(blob)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            loaded.whole_blob_bytes = spec.blob_bytes
            self._probe_peak(device, loaded)
            self._record(ev.BlobUploaded, m, bytes=spec.blob_bytes, seconds=time.perf_counter() - t,
                         why=plan.blob_reason)
            extracted = container.extract()
            self._record(ev.ConstantsExtracted, m, count=len(extracted))
            new_meta = {n: tensor_meta(x) for n, x in extracted.items()}

        outcome = self.policy.decide(plan, new_meta, self.cache)
        loaded.outcome = outcome
        for d in outcome.decisions:
            for fc in d.comparisons:
                self._record(ev.FieldCompared, m, name=d.constant.name, fqn=d.constant.fqn, field=fc.field,
                             cached=fc.cached, new=fc.new, equal=fc.equal)
            if d.digest_comparison is not None:
                dc = d.digest_comparison
                self._record(ev.DigestCompared, m, name=d.constant.name, fqn=d.constant.fqn, cached=dc.cached,
                             new=dc.new, equal=dc.equal)
        if outcome.failure:
            self._record_decisions(m, outcome, plan)
            raise LoadError(outcome.failure)

        # Upload exactly the constants this method needs on its own (memory-optimal policies).
        own = [d.constant for d in outcome.decisions if d.source is Source.OWN_UPLOAD]
        uploader = None
        if device.type == "cuda" and own:
            if device not in self._uploaders:
                self._uploaders[device] = make_uploader(device)
            uploader = self._uploaders[device]
        if uploader is not None:
            uploader.prefetch(blob, own)  # maps the blob: pages an earlier load locked are copied from directly
        try:
            for c in own:
                t = time.perf_counter()
                tensor = upload_constant(blob, c, device, uploader)
                loaded.own_tensors[c.name] = tensor
                loaded.own_upload_bytes += c.nbytes
                self._probe_peak(device, loaded)
                self._record(ev.ConstantUploaded, m, name=c.name, fqn=c.fqn, bytes=c.nbytes,
                             seconds=time.perf_counter() - t, path=uploader.last_path if uploader else
                             (PATH_HOST if device.type == "cpu" else PATH_PINNED_EACH))
        finally:
            if uploader is not None:
                uploader.release()

        install: dict[str, torch.Tensor] = {}
        for d in outcome.install:
            tensor = d.shared_from.tensor if d.source is Source.CACHE else loaded.own_tensors[d.constant.name]
            problem = _slot_problem(tensor, d, device)
            if problem:
                loaded.runnable = False
                loaded.problems.append(f"{d.constant.name}: {problem}")
                self._record(ev.OutOfBoundsAlias, m, name=d.constant.name, fqn=d.constant.fqn, problem=problem)
                continue
            install[d.constant.name] = tensor
        self._record_decisions(m, outcome, plan)
        if loaded.runnable:
            container.install(install)
            self._probe_peak(device, loaded)
            self._record(ev.PairsInstalled, m, count=len(install), names=",".join(install))

        for d in outcome.decisions:
            if d.enters_cache:
                if d.source is Source.WHOLE_BLOB:
                    tensor, keep = extracted[d.constant.name], container
                else:
                    tensor, keep = loaded.own_tensors[d.constant.name], None
                entry = CacheEntry(fqn=d.constant.fqn, name=d.constant.name, owner_method=m,
                                   meta=tensor_meta(tensor), digest=d.constant.digest, nbytes=d.constant.nbytes,
                                   tensor=tensor, keepalive=keep, users={m})
                self.cache.add(entry)
                self._record(ev.CacheEntryAdded, m, name=d.constant.name, fqn=d.constant.fqn,
                             owner_kind=entry.owner_kind)
            elif d.decision is Decision.SHARED and d.shared_from is not None:
                d.shared_from.users.add(m)
        self._sample_memory(m, device, "after", pending=loaded)
        self._record_peak(m, device)
        self._record(ev.MethodLoaded, m, runnable=loaded.runnable, seconds=time.perf_counter() - t_start)
        return loaded

    def _record_decisions(self, m: str, outcome: Outcome, plan) -> None:
        for d in outcome.decisions:
            c = d.constant
            lr = plan.lookup(c.name)
            ref = d.shared_from or (lr.entry if lr else None)
            self._record(
                ev.Decided, m, name=c.name, fqn=c.fqn, constant_kind=c.kind.value, mutated=c.mutated,
                lookup=d.lookup.value if d.lookup else "", decision=d.decision, reason_code=d.reason_code,
                reason=d.reason, source=d.source,
                shared_from=f"{d.shared_from.owner_method}/{d.shared_from.name}" if d.decision is Decision.SHARED and d.shared_from else "",
                nbytes=c.nbytes, dtype=c.dtype, shape=_fmt(c.shape), strides=_fmt(c.strides), digest=c.digest,
                cached_method=ref.owner_method if ref else "",
                cached_dtype=ref.meta.dtype if ref else "", cached_shape=_fmt(ref.meta.shape) if ref else "",
                cached_strides=_fmt(ref.meta.strides) if ref else "", cached_digest=ref.digest if ref else "",
            )

    # ------------------------------------------------------------------ running
    def reference(self, method: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        from safetensors.torch import load_file

        spec = self.program.manifest.method(method)
        path = self.program.path(spec.reference_file)
        try:
            data = load_file(str(path))
        except Exception as e:
            raise ProgramError(f"reference tensors cannot be read: {e}", path=path) from None
        try:
            inputs = [data[f"input.{i}"] for i in range(spec.num_inputs)]
            outputs = [data[f"output.{i}"] for i in range(spec.num_outputs)]
        except KeyError as e:
            raise ProgramError(f"reference tensor {e.args[0]!r} is missing", path=path) from None
        return inputs, outputs

    def run(self, method: str, inputs: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        lm = self.methods.get(method)
        if lm is None:
            raise LoadError(f"method {method!r} is not loaded (session status: {self.status})")
        if not lm.runnable:
            raise LoadError(f"method {method!r} is not runnable: {'; '.join(lm.problems)}")
        if inputs is None:
            inputs, _ = self.reference(method)
        return lm.container.run([x.to(lm.device) for x in inputs])

    def verify(self) -> "Any":
        """Run every loaded method on its reference inputs and compare with the eager outputs."""
        import pandas as pd

        rows = []
        for spec in self.program.methods:
            row: dict[str, Any] = {"method": spec.name, "ran": False, "max_abs_err": math.nan,
                                   "atol": math.nan, "rtol": math.nan, "ok": False, "reason": ""}
            lm = self.methods.get(spec.name)
            if lm is None:
                row["reason"] = "not loaded" + (f": {self.error}" if self.failed_method == spec.name else "")
            elif not lm.runnable:
                row["reason"] = "not runnable (would-be out-of-bounds alias): " + "; ".join(lm.problems)
            else:
                try:
                    inputs, expected = self.reference(spec.name)
                    outputs = [o.detach().cpu() for o in self.run(spec.name, inputs)]
                    row["ran"] = True
                    errs, ok = [], len(outputs) == len(expected)
                    atol, rtol = 0.0, 0.0
                    for o, e in zip(outputs, expected):
                        a, r = dtype_tolerance(e.dtype)
                        atol, rtol = max(atol, a), max(rtol, r)
                        if o.shape != e.shape or o.dtype != e.dtype:
                            ok = False
                            errs.append(math.inf)
                            continue
                        diff = (o.double() - e.double()).abs()
                        finite = torch.isfinite(e.double())
                        errs.append(float(diff.max()) if diff.numel() else 0.0)
                        ok &= bool(torch.allclose(o.double(), e.double(), atol=a, rtol=r, equal_nan=True)) and \
                            bool((torch.isfinite(o.double()) == finite).all())
                    row.update(max_abs_err=max(errs) if errs else 0.0, atol=atol, rtol=rtol, ok=ok,
                               reason="" if ok else "output differs from the eager reference")
                    if math.isnan(row["max_abs_err"]):
                        row["ok"] = False
                except ToolkitError as e:
                    row["reason"] = str(e)
                except RuntimeError as e:
                    row["reason"] = f"run failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            rows.append(row)
        return pd.DataFrame(rows, columns=["method", "ran", "max_abs_err", "atol", "rtol", "ok", "reason"])

    # ------------------------------------------------------------------ lifetime
    def unload(self, method: str) -> None:
        """Drop a method. Cached tensors it produced stay alive while other methods use them."""
        with self.cache.lock:  # a load running in another thread reads self.methods
            lm = self.methods.pop(method, None)
            if lm is None:
                raise LoadError(f"method {method!r} is not loaded")
            freed = self.cache.release(method)
        self._record(ev.MethodUnloaded, method, released_entries=freed)
        del lm
        if self.devices[method].type == "cuda":
            torch.cuda.synchronize(self.devices[method])
        self._sample_memory(method, self.devices[method], "unloaded")

    def close(self) -> None:
        for name in list(self.methods):
            self.unload(name)
        for uploader in self._uploaders.values():
            if uploader is not None:
                uploader.close()
        self._uploaders.clear()

    # ------------------------------------------------------------------ tables
    @property
    def events(self):
        from .tables import events_frame
        return events_frame(self.log)

    @property
    def lookups(self):
        from .tables import lookups_frame
        return lookups_frame(self.log)

    @property
    def comparisons(self):
        from .tables import comparisons_frame
        return comparisons_frame(self.log)

    @property
    def decisions(self):
        from .tables import decisions_frame
        return decisions_frame(self.log)

    @property
    def memory(self):
        from .tables import memory_frame
        return memory_frame(self.log)

    @property
    def device_bytes(self) -> int:
        return sum(m.device_bytes for m in self.methods.values())

    def summary(self) -> str:
        from .tables import session_summary
        return session_summary(self)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        from .tables import session_html
        return session_html(self)


def resolve_devices(program: Program, device: "str | torch.device | Mapping[str, str] | None") -> dict[str, torch.device]:
    """One device per method: ``None`` picks the program's own kind (cuda:0 / cpu)."""
    if device is None:
        device = "cuda" if program.device == "cuda" else "cpu"
    if isinstance(device, Mapping):
        unknown = set(device) - set(program.manifest.method_names)
        if unknown:
            raise ValueError(f"device placement names unknown methods {sorted(unknown)}")
        default = "cuda" if program.device == "cuda" else "cpu"
        return {m: parse_device(device.get(m, default)) for m in program.manifest.method_names}
    d = parse_device(device)
    return {m: d for m in program.manifest.method_names}


def load_program(program_or_path: "Program | str | Path", policy: "str | Policy" = "fingerprint",
                 device: "str | torch.device | Mapping[str, str] | None" = None, *, record: bool = True,
                 progress: bool = False, check_integrity: bool = True) -> Session:
    """Load every method of a program under ``policy`` and return the session.

    A method that fails leaves the session with ``status == "failed"`` and ``error`` set,
    not an exception, so the decisions up to the failure can be inspected.
    """
    program = open_program(program_or_path)
    pol = get_policy(policy)
    devices = resolve_devices(program, device)
    for d in set(devices.values()):
        check_compatible(program, d.type, torch.__version__)
        if d.type == "cuda" and not torch.cuda.is_available():
            raise LoadError("the program is for CUDA but torch sees no CUDA device")
    return Session(program, pol, devices, record=record, check_integrity=check_integrity).load(progress=progress)
