"""Synthetic programs: manifests of N methods x K constants, written without compiling anything.

For dry-run analysis at scale (:func:`toolkit.workflows.dry_run.dry_run` accepts them) and for the
scaling benchmark.  No .so, blob or reference file exists: the manifest's file records are
placeholders, so such a program can be analysed but never loaded.

Every constant slot ``i`` has one role across all methods, drawn once from the rates:

* ``shared``: same FQN, metadata and content in every method (genuine sharing);
* ``content_collision``: same FQN and metadata, other data in each method (ExecuTorch
  shares it silently);
* ``metadata_collision``: same FQN, a shape that differs between methods (ExecuTorch
  declines or refuses it);
* ``lifted``: ``_tensor_constant<N>`` named by position, other data in each method (how
  AOTInductor names lifted constants, background.md);
* ``mutated``: a buffer the graph writes (same FQN and initial content everywhere);
* ``unique``: an FQN only this method has.

Sizes follow a transformer's mix: 1-D norm weights and biases, square attention
projections, rectangular MLP weights, a few embeddings and tiny lifted tables.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.model import DTYPE_ITEMSIZE, ConstantSpec, FileRecord, MethodSpec, Program, aligned_slot_bytes
from toolkit.core.vocab import ConstantKind
from toolkit.sources.directory import MANIFEST_FILE, PLACEHOLDER_SHA256, manifest_json

ROLES = ("shared", "content_collision", "metadata_collision", "lifted", "mutated", "unique")


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate.  Rates are fractions of each method's constants; the rest are shared."""

    methods: int = 8
    constants: int = 2_000  # per method
    content_collision: float = 0.02
    metadata_collision: float = 0.01
    lifted: float = 0.01
    mutated: float = 0.005
    unique: float = 0.02
    hidden: int = 1024
    dtype: str = "bfloat16"
    device: str = "cuda"
    seed: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if self.methods < 1 or self.constants < 0 or self.hidden < 1:
            raise ValueError("methods >= 1, constants >= 0 and hidden >= 1 are required")
        rates = (self.content_collision, self.metadata_collision, self.lifted, self.mutated, self.unique)
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(f"rates must be >= 0 and sum to at most 1, got {rates}")
        if self.dtype not in DTYPE_ITEMSIZE:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _shape_mix(rng: random.Random, h: int) -> tuple[str, tuple[int, ...]]:
    """(suffix, shape) of one weight, in a transformer's proportions."""
    x = rng.random()
    if x < 0.30:
        return "norm.weight", (h,)
    if x < 0.65:
        return "attn.proj.weight", (h, h)
    if x < 0.95:
        return "mlp.weight", (4 * h, h) if rng.random() < 0.5 else (h, 4 * h)
    if x < 0.97:
        return "embed.weight", (8 * h, h)
    return "table", (16,)


def generate(spec: SyntheticSpec) -> Program:
    """A synthetic program (in memory; nothing is written).

    Every method's blob is one placeholder file, so a constant shared by all methods is one
    :class:`ConstantSpec` (same bytes, same place) and a million constants stay small.
    """
    rng = random.Random(spec.seed)
    item = DTYPE_ITEMSIZE[spec.dtype]
    h = spec.hidden
    cuts = []
    acc = 0.0
    for role, rate in zip(
        ROLES[1:], (spec.content_collision, spec.metadata_collision, spec.lifted, spec.mutated, spec.unique)
    ):
        acc += rate
        cuts.append((acc, role))

    def role_of(x: float) -> str:
        for cut, role in cuts:
            if x < cut:
                return role
        return "shared"

    # One slot layout shared by all methods: slot i is as large as its largest variant, so
    # a shared constant has the same offset everywhere and is one ConstantSpec object.
    slots = []  # (role, suffix, shapes per method)
    lifted_n = 0
    for _ in range(spec.constants):
        role = role_of(rng.random())
        suffix, shape = _shape_mix(rng, h)
        if role == "metadata_collision":
            alt = (shape[0] // 2 or 1,) + shape[1:]
            shapes = [shape if m % 2 == 0 else alt for m in range(spec.methods)]
        else:
            shapes = [shape] * spec.methods
        slots.append((role, suffix, shapes, lifted_n))
        if role == "lifted":
            lifted_n += 1
    offsets, off = [], 0
    for _, _, shapes, _ in slots:
        offsets.append(off)
        biggest = max(math.prod(s) for s in shapes) * item
        off += aligned_slot_bytes(biggest)
    blob_bytes = off

    shared_specs: dict[int, ConstantSpec] = {}
    methods = []
    blob = "weights.blob"
    files: dict[str, FileRecord] = {blob: FileRecord(PLACEHOLDER_SHA256, blob_bytes)}
    for m in range(spec.methods):
        mname = f"method_{m}"
        consts = []
        for i, (role, suffix, shapes, ln) in enumerate(slots):
            shape = shapes[m]
            strides = _contiguous(shape)
            nbytes = math.prod(shape) * item
            if role == "shared" and i in shared_specs:
                consts.append(shared_specs[i])
                continue
            if role == "lifted":
                name = fqn = f"_tensor_constant{ln}"
                kind = ConstantKind.LIFTED_CONSTANT
            elif role == "unique":
                fqn = f"{mname}.extra.{i}.{suffix}"
                name = fqn.replace(".", "_")
                kind = ConstantKind.PARAMETER
            elif role == "mutated":
                fqn = f"layers.{i}.cache"
                name = fqn.replace(".", "_")
                kind = ConstantKind.BUFFER
            else:
                fqn = f"layers.{i}.{suffix}"
                name = fqn.replace(".", "_")
                kind = ConstantKind.PARAMETER
            same_content = role in ("shared", "mutated")
            c = ConstantSpec(
                name=name,
                fqn=fqn,
                kind=kind,
                mutated=role == "mutated",
                dtype=spec.dtype,
                shape=shape,
                strides=strides,
                storage_offset=0,
                nbytes=nbytes,
                offset=offsets[i],
                digest=_digest(spec.seed, i, shape, "" if same_content else m),
                file=blob,
            )
            if role == "shared":
                shared_specs[i] = c
            consts.append(c)
        rel = f"methods/{mname}"
        so, ref = f"{rel}/model.so", f"{rel}/reference.safetensors"
        files[so] = FileRecord(PLACEHOLDER_SHA256, 0)
        files[ref] = FileRecord(PLACEHOLDER_SHA256, 0)
        methods.append(
            MethodSpec(
                name=mname,
                so_file=so,
                blob_file=blob,
                reference_file=ref,
                blob_bytes=blob_bytes,
                num_inputs=1,
                num_outputs=1,
                constants=tuple(consts),
            )
        )
    return Program(
        name=spec.name or f"synthetic-{spec.methods}x{spec.constants}",
        description=f"synthetic (no files): {spec}",
        device=spec.device,
        torch_version="synthetic",
        created_utc="",
        methods=tuple(methods),
        files=files,
    )


def write_synthetic(spec: SyntheticSpec, out_dir: str | Path) -> Path:
    """Write a synthetic program's manifest into ``out_dir``; returns the manifest's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST_FILE
    path.write_text(manifest_json(generate(spec), indent=None), encoding="utf-8")
    return path
