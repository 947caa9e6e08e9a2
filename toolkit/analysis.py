"""Dry-run analysis: every decision a load would take, and the memory floor, from the manifest alone.

No device, no AOTInductor container, no torch: the decisions come from the same pure
policies the loader calls (:mod:`toolkit.policies`), run against the same cache class
(:class:`toolkit.cache.SharedConstantCache`, whose entries then hold no tensor).  Where the
loader reads the metadata of freshly extracted tensors (ExecuTorch policies, after a
whole-blob upload), the analysis uses the manifest's metadata of the same constants:
the builder recorded it from exactly those extracted tensors.

Layering: policies (pure) <- loader | analysis (this module) <- presentation.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from .cache import CacheEntry, SharedConstantCache
from .manifest import MANIFEST_FILE, MethodSpec, Program, ProgramManifest, TensorMeta, read_manifest_file
from .policies import ConstantDecision, MethodView, Outcome, Plan, Policy, device_label, get_policy, slot_problem
from .vocab import Decision, Source

# The loader's decisions table (toolkit.tables.DECISION_COLUMNS) without its event sequence
# number, plus what only a dry run states outright.
ANALYSIS_COLUMNS = [
    "policy", "method", "device", "name", "fqn", "constant_kind", "mutated", "lookup", "decision", "reason_code",
    "reason", "source", "shared_from", "nbytes", "dtype", "shape", "strides", "digest", "cached_method",
    "cached_dtype", "cached_shape", "cached_strides", "cached_digest", "whole_blob", "method_status",
    "slot_problem",
]
FLOOR_COLUMNS = ["device", "method", "name", "fqn", "nbytes", "role", "counted"]

_STATUS_LOADED, _STATUS_FAILED, _STATUS_NOT_REACHED = "loaded", "failed", "not reached"


# ------------------------------------------------------------------ inputs


def _as_manifest(program: "Program | ProgramManifest | str | Path") -> ProgramManifest:
    """A manifest, read without checking that the files it names exist (synthetic programs have none)."""
    if isinstance(program, ProgramManifest):
        return program
    if isinstance(program, Program):
        return program.manifest
    path = Path(program)
    return read_manifest_file(path / MANIFEST_FILE if path.is_dir() else path)


def _parse_device(spec: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', -1); 'cuda' -> ('cuda', 0); 'cuda:N' -> ('cuda', N).  No torch needed.

    Matches the loader: runtime.parse_device picks the current device (0 in a fresh process)
    for a bare 'cuda', and device_index() reports -1 for CPU.
    """
    s = str(spec).strip()
    kind, _, idx = s.partition(":")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {spec!r}: the toolkit loads on 'cpu' or 'cuda[:N]'")
    if kind == "cpu":
        return "cpu", -1
    if idx and not idx.isdigit():
        raise ValueError(f"unsupported device {spec!r}")
    return "cuda", int(idx) if idx else 0





def resolve_placement(manifest: ProgramManifest, device: "str | Mapping[str, str] | None" = None
                      ) -> dict[str, tuple[str, int]]:
    """One (device type, index) per method, as :func:`toolkit.loader.resolve_devices` places them."""
    default = "cuda" if manifest.device == "cuda" else "cpu"
    if device is None:
        device = default
    if isinstance(device, Mapping):
        unknown = set(device) - set(manifest.method_names)
        if unknown:
            raise ValueError(f"device placement names unknown methods {sorted(unknown)}")
        return {m: _parse_device(device.get(m, default)) for m in manifest.method_names}
    d = _parse_device(device)
    return {m: d for m in manifest.method_names}


class _Formatter:
    """The loader's formatting of shape/strides columns (loader._fmt), memoised.

    Shapes repeat across constants; one string object per distinct shape keeps a
    1.6-million-row table small and fast to build.
    """

    def __init__(self) -> None:
        self._memo: dict[Any, str] = {}

    def __call__(self, v: Any) -> str:
        try:
            return self._memo[v]
        except KeyError:
            out = str(tuple(v)) if isinstance(v, (tuple, list)) else ("" if v is None else str(v))
            self._memo[v] = out
            return out


# ------------------------------------------------------------------ analysis


@dataclass
class MethodPrediction:
    """What a load of one method would do, besides its decisions."""

    method: str
    device: str
    status: str  # "loaded", "failed" or "not reached" (an earlier method failed the load)
    whole_blob: bool
    blob_bytes: int
    own_upload_bytes: int
    error: str = ""


@dataclass
class Analysis:
    """Result of :func:`run_analysis`: the decisions table plus per-method predictions."""

    policy: str
    decisions: pd.DataFrame
    methods: list[MethodPrediction] = field(default_factory=list)

    @property
    def status(self) -> str:
        return _STATUS_FAILED if any(m.status == _STATUS_FAILED for m in self.methods) else _STATUS_LOADED

    @property
    def device_bytes(self) -> int:
        """Constant bytes the load would put on devices (whole blobs + own uploads), as the loader accounts."""
        return sum(m.blob_bytes + m.own_upload_bytes for m in self.methods if m.status == _STATUS_LOADED)

    def methods_frame(self) -> pd.DataFrame:
        cols = ["method", "device", "status", "whole_blob", "blob_bytes", "own_upload_bytes", "error"]
        return pd.DataFrame([{c: getattr(m, c) for c in cols} for m in self.methods], columns=cols)


def _slot_problem(d: ConstantDecision, kind: str, index: int) -> str:
    """The loader's out-of-bounds guard, predicted from the cache entry's metadata."""
    if d.source is not Source.CACHE or d.shared_from is None:
        return ""
    e = d.shared_from
    return slot_problem(e.meta, getattr(e, "nbytes", d.constant.nbytes), d.constant, kind, index) or ""


def _append_rows(cols: dict[str, list], fmt: _Formatter, policy: str, spec: MethodSpec, device: str, kind: str,
                 index: int, outcome: Outcome, plan: Plan, whole_blob: bool, status: str) -> None:
    """Append one row per decision, column-wise (a list per column: far less memory than dicts)."""
    a = {k: v.append for k, v in cols.items()}
    for d in outcome.decisions:
        c = d.constant
        lr = plan.lookup(c.name)
        ref = d.shared_from or (lr.entry if lr else None)
        a["policy"](policy); a["method"](spec.name); a["device"](device); a["name"](c.name); a["fqn"](c.fqn)
        a["constant_kind"](c.kind.value); a["mutated"](c.mutated); a["lookup"](d.lookup.value if d.lookup else "")
        a["decision"](d.decision.value); a["reason_code"](d.reason_code.value); a["reason"](d.reason)
        a["source"](d.source.value)
        a["shared_from"](f"{d.shared_from.owner_method}/{d.shared_from.name}"
                         if d.decision is Decision.SHARED and d.shared_from else "")
        a["nbytes"](c.nbytes); a["dtype"](c.dtype); a["shape"](fmt(c.shape)); a["strides"](fmt(c.strides))
        a["digest"](c.digest)
        if ref is not None:
            a["cached_method"](ref.owner_method); a["cached_dtype"](ref.meta.dtype)
            a["cached_shape"](fmt(ref.meta.shape)); a["cached_strides"](fmt(ref.meta.strides))
            a["cached_digest"](ref.digest)
        else:
            for k in ("cached_method", "cached_dtype", "cached_shape", "cached_strides", "cached_digest"):
                a[k]("")
        a["whole_blob"](whole_blob); a["method_status"](status); a["slot_problem"](_slot_problem(d, kind, index))


def run_analysis(program: "Program | ProgramManifest | str | Path", policy: "str | Policy" = "fingerprint", *,
                 device: "str | Mapping[str, str] | None" = None) -> Analysis:
    """Predict a load of ``program`` under ``policy``, method by method, in load order.

    Mirrors :meth:`toolkit.loader.Session._load_locked`: plan, (whole-blob metadata), decide;
    a failed method stops the load, and later methods are reported as not reached.
    """
    manifest = _as_manifest(program)
    pol = get_policy(policy)
    placement = resolve_placement(manifest, device)
    # The pass allocates millions of small objects and no reference cycles; with the cyclic
    # collector running, each of its full passes rescans the whole manifest, which measured
    # as 40% of the time at 160,000 decisions.  Reference counting still frees everything.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(manifest, pol, placement)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(manifest: ProgramManifest, pol: Policy, placement: dict[str, tuple[str, int]]) -> Analysis:
    cache = SharedConstantCache()
    cols: dict[str, list] = {c: [] for c in ANALYSIS_COLUMNS}
    fmt = _Formatter()
    preds: list[MethodPrediction] = []
    failed = False
    for spec in manifest.methods:
        kind, index = placement[spec.name]
        dev = device_label(kind, index)
        if failed:
            preds.append(MethodPrediction(spec.name, dev, _STATUS_NOT_REACHED, False, 0, 0))
            continue
        view = MethodView(spec.name, kind, index, spec.constants)
        plan = pol.plan(view, cache)
        whole_blob = bool(plan.upload_whole_blob and spec.constants)
        new_meta: dict[str, TensorMeta] | None = None
        if whole_blob:
            # The extracted tensors' metadata is what the builder recorded from them.
            new_meta = {c.name: c.meta(kind, index) for c in spec.constants}
        outcome = pol.decide(plan, new_meta, cache)
        status = _STATUS_FAILED if outcome.failure else _STATUS_LOADED
        _append_rows(cols, fmt, pol.name.value, spec, dev, kind, index, outcome, plan, whole_blob, status)
        own = sum(d.constant.nbytes for d in outcome.decisions if d.source is Source.OWN_UPLOAD)
        if outcome.failure:
            failed = True
            preds.append(MethodPrediction(spec.name, dev, status, whole_blob, spec.blob_bytes if whole_blob else 0,
                                          0, outcome.failure))
            continue  # the loader restores the cache: nothing of this method enters it
        preds.append(MethodPrediction(spec.name, dev, status, whole_blob, spec.blob_bytes if whole_blob else 0, own))
        for d in outcome.decisions:
            if d.enters_cache:
                c = d.constant
                cache.add(CacheEntry(fqn=c.fqn, name=c.name, owner_method=spec.name, meta=c.meta(kind, index),
                                     digest=c.digest, nbytes=c.nbytes, tensor=None, users={spec.name}))
            elif d.decision is Decision.SHARED and d.shared_from is not None:
                d.shared_from.users.add(spec.name)
    return Analysis(pol.name.value, pd.DataFrame(cols, columns=ANALYSIS_COLUMNS), preds)


def analyze(program: "Program | ProgramManifest | str | Path", policy: "str | Policy" = "fingerprint", *,
            device: "str | Mapping[str, str] | None" = None) -> pd.DataFrame:
    """Every decision a load of ``program`` under ``policy`` would take, one row per constant.

    ``program`` is a :class:`Program`, a :class:`ProgramManifest`, or a program directory /
    manifest path (its .so and blob files need not exist).  ``device`` places methods as
    :func:`toolkit.load_program` does (a device string, or ``{method: device}``).  Columns are
    the loader's decisions table plus ``policy``, ``device``, ``whole_blob`` (the method would
    upload its whole weights blob), ``method_status`` and ``slot_problem`` (what the loader's
    out-of-bounds guard would say).  A policy that fails a method's load stops there, as the
    loader does: later methods have no rows.
    """
    return run_analysis(program, policy, device=device).decisions


# ------------------------------------------------------------------ the floor


@dataclass(frozen=True)
class MemoryFloor:
    """The physical minimum of constant bytes a correct load must hold on its devices.

    ``total_bytes`` = bytes of content-distinct constants that may be shared (counted once
    per device, keyed on content digest and metadata) + every method's own copy of what
    must stay private (mutated buffers).  A same-name collision with other data or other
    metadata is distinct content, so each method's copy of it is counted by the first term.
    """

    total_bytes: int
    shareable_bytes: int  # content-distinct, non-mutated
    private_bytes: int  # mutated buffers, one copy per method
    by_device: Mapping[str, int]
    constants: int
    distinct_shareable: int
    largest_constant_bytes: int
    naive_bytes: int  # every method's constants, nothing shared
    table: pd.DataFrame = field(repr=False, compare=False, default=None)  # one row per constant

    def __repr__(self) -> str:
        gib = 1 << 30
        lines = [f"memory floor M = {self.total_bytes:,} bytes ({self.total_bytes / gib:.3f} GiB)",
                 f"  shareable, content-distinct: {self.shareable_bytes:,} bytes in {self.distinct_shareable} tensors",
                 f"  private (mutated buffers, one copy per method): {self.private_bytes:,} bytes",
                 f"  nothing shared: {self.naive_bytes:,} bytes; largest constant: {self.largest_constant_bytes:,} bytes"]
        lines += [f"  {d}: {b:,} bytes" for d, b in sorted(self.by_device.items())]
        return "\n".join(lines)


def memory_floor(program: "Program | ProgramManifest | str | Path", *,
                 device: "str | Mapping[str, str] | None" = None) -> MemoryFloor:
    """The floor ``M`` for ``program`` placed on ``device`` (see :class:`MemoryFloor`).

    Physical accounting, independent of any policy: names do not matter, content does
    (the digest of the bytes a slot reads) together with the metadata a slot needs
    (dtype, shape, strides) and the device it lives on.  Constants with an empty FQN count
    as shareable by content too.  Allocator rounding and container overhead are not in it.
    """
    manifest = _as_manifest(program)
    placement = resolve_placement(manifest, device)
    seen: set[tuple] = set()
    by_device: dict[str, int] = {}
    rows = []
    shareable = private = naive = largest = count = 0
    for spec in manifest.methods:
        kind, index = placement[spec.name]
        dev = device_label(kind, index)
        by_device.setdefault(dev, 0)
        for c in spec.constants:
            count += 1
            naive += c.nbytes
            largest = max(largest, c.nbytes)
            if c.mutated:
                role, counted = "private (mutated)", True
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
    return MemoryFloor(total_bytes=shareable + private, shareable_bytes=shareable, private_bytes=private,
                       by_device=by_device, constants=count, distinct_shareable=len(seen),
                       largest_constant_bytes=largest, naive_bytes=naive, table=table)
