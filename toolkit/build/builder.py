"""Build a multi-method program: torch.export + AOTInductor, weights kept out of the .so.

Per method, the output is what ExecuTorch's CUDA backend produces (a wrapper .so and a
``binary_blob`` weights file, ``backends/aoti/aoti_backend.py``), plus eager reference
inputs/outputs in safetensors and a manifest describing every constant.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import gc
import hashlib
import mmap
import os
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors.torch import save_file
from torch.utils import _pytree as pytree

from toolkit.core.errors import BuildError
from toolkit.core.model import (
    METHOD_NAME_RE,
    ConstantSpec,
    MethodSpec,
    Program,
    SequenceSpec,
    SequenceStep,
    required_nbytes,
)
from toolkit.core.vocab import ConstantKind
from toolkit.display.cells import one_line
from toolkit.integrity import file_record, hash_threads
from toolkit.runtimes.aoti import parse_device
from toolkit.runtimes.aoti_container import AotiContainer, dtype_name, read_compiled
from toolkit.sources.directory import MANIFEST_FILE, manifest_json

MethodsSpec = Mapping[str, "tuple[torch.nn.Module, tuple]"]
SequencesSpec = Mapping[str, "list[tuple[str, tuple]]"]  # name -> [(method, args), ...] in order

# The ExecuTorch CUDA backend's compile options (backends/cuda/cuda_backend.py).
AOTI_OPTIONS = {
    "aot_inductor.package": True,
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "binary_blob",
}
AOTI_CUDA_OPTIONS = {"aot_inductor.embed_kernel_binary": True}

# A compiler wrapper that links libstdc++ statically into the .so (as a CXX pointing at a
# separately installed gcc may) gives the process two libstdc++ copies, and the .so then
# segfaults in std::regex/locale code when its container is created.  The system g++
# matches the libstdc++ torch itself loaded.
SYSTEM_CXX = "/usr/bin/g++"
MOVE_BLOB_BYTES = 1 << 30  # blobs at least this large are moved out of AOTI's output, not copied


def _compiler() -> str | None:
    return SYSTEM_CXX if Path(SYSTEM_CXX).exists() else None


def check_shared_object(so_path: Path) -> None:
    """Refuse a .so that would load a second libstdc++ into the process.

    A good .so needs libstdc++.so.6 dynamically (one NEEDED line) and defines no
    std::locale symbols of its own.
    """
    if not shutil.which("readelf") or not shutil.which("nm"):
        warnings.warn(f"{so_path}: readelf/nm not found, libstdc++ linkage not checked", stacklevel=2)
        return
    dyn = subprocess.run(["readelf", "-d", str(so_path)], capture_output=True, text=True, check=False).stdout
    needed = [ln for ln in dyn.splitlines() if "NEEDED" in ln and "libstdc++" in ln]
    syms = subprocess.run(
        ["nm", "-D", "--defined-only", str(so_path)], capture_output=True, text=True, check=False
    ).stdout
    locale_syms = sum("_ZNSt6locale" in ln for ln in syms.splitlines())
    if len(needed) != 1 or locale_syms:
        raise BuildError(
            f"{so_path}: the compiled .so links libstdc++ statically (NEEDED libstdc++ lines: {len(needed)}, "
            f"std::locale symbols defined: {locale_syms}). Loading it beside torch's libstdc++ crashes. "
            f"Build with the system compiler ({SYSTEM_CXX}); never use -static-libstdc++."
        )


def _flatten_tensors(value, what: str) -> list[torch.Tensor]:
    leaves, _ = pytree.tree_flatten(value)
    bad = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    if bad:
        raise BuildError(f"{what}: only tensors are supported, found {sorted(set(bad))}")
    return leaves


def _aot_compile(module: torch.nn.Module, args: tuple, device: torch.device, workdir: Path) -> tuple[Path, Path]:
    opts = dict(AOTI_OPTIONS)
    if device.type == "cuda":
        opts.update(AOTI_CUDA_OPTIONS)
    patches = {}
    cxx = _compiler()
    if cxx:
        patches["cpp.cxx"] = (None, cxx)
    with torch._inductor.config.patch(patches):
        paths = torch._inductor.aot_compile(module, args, options=opts)
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    so = [p for p in map(str, paths) if p.endswith(".so")]
    blob = [p for p in map(str, paths) if p.endswith("_weights.blob") or p.endswith(".blob")]
    if len(so) != 1 or len(blob) > 1:
        raise BuildError(f"AOTInductor returned unexpected outputs: {paths}")
    # Copy immediately: a later method whose graph differs only in constant values hits the
    # same compile-cache entry and overwrites these paths.
    so_out, blob_out = workdir / "model.so", workdir / "weights.blob"
    shutil.copyfile(so[0], so_out)
    if blob and os.path.getsize(blob[0]) >= MOVE_BLOB_BYTES:
        # a large blob is moved, not copied: two copies of a blob of many GiB could fill the disk.  AOTI
        # writes the blob anew on every compile (cache hit or not), and the constants are then
        # checked against the module's own tensors (_describe_constants), so nothing is lost.
        shutil.move(blob[0], blob_out)
    elif blob:
        shutil.copyfile(blob[0], blob_out)
    else:  # no constants at all: an empty blob keeps every method uniform
        blob_out.write_bytes(b"")
    return so_out, blob_out


def _describe_constants(
    so: Path, blob: Path, device: torch.device, kinds: dict[str, ConstantKind], mutated: set[str], blob_file: str
) -> list[ConstantSpec]:
    """Read every constant's metadata and its byte offset inside the blob.

    A constant's offset in the file is where the .so's own whole-blob upload reads it
    (:func:`~toolkit.runtimes.aoti_container.read_compiled`: each constant after the previous one's
    data size).  Its pointer offset inside the uploaded allocation is not that: AOTI pads every slot
    of the allocation to 64 bytes, while an all-CUDA blob file is unpadded (after a 16-byte
    constant, every later one lies 48 bytes further into the allocation than into the file).  The
    pointer offset serves only where the .so cannot be asked.  Either way every constant's bytes
    are checked in the file where it is said to be.
    """
    container = AotiContainer.create(so, device)
    fqns = container.constant_fqns()
    if not fqns:
        return []
    compiled = read_compiled(container.so_path, device)
    file_offsets = {n: c.blob_offset for n, c in compiled.constants.items()} if compiled is not None else {}
    container.upload_blob(blob)
    tensors = container.extract()
    # without the .so's layout: one allocation per device, a constant's offset its pointer minus the lowest
    bases: dict[torch.device, int] = {}
    for t in tensors.values():
        ptr = t.untyped_storage().data_ptr()
        bases[t.device] = min(bases.get(t.device, ptr), ptr)
    # The blob is read through a private mapping, never whole into memory: a constant's bytes are
    # compared where they lie (on the device the constant is on) and hashed on every core at once.
    size = blob.stat().st_size
    with open(blob, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            whole = torch.frombuffer(mm, dtype=torch.uint8) if mm is not None else torch.empty(0, dtype=torch.uint8)
        found = []
        for name in fqns:
            if name not in tensors:
                raise BuildError(f"{so}: constant {name!r} is not in the extracted constants map")
            t = tensors[name]
            offset = file_offsets.get(name)
            how = "where its .so reads it"
            if offset is None:
                offset, how = t.untyped_storage().data_ptr() - bases[t.device], "its offset derived from its pointer"
            dt = dtype_name(t.dtype)
            nbytes = required_nbytes(dt, t.shape, t.stride(), t.storage_offset())
            if not _bytes_at(whole, offset, nbytes, t):
                raise BuildError(
                    f"{blob}: constant {name!r} ({dt}{list(t.shape)}, {nbytes} bytes, on {t.device}) is not at "
                    f"offset {offset} of the {size}-byte blob ({how}); devices of the constants: "
                    f"{sorted({str(x.device) for x in tensors.values()})}"
                )
            found.append((name, t, offset, dt, nbytes))
        found.sort(key=lambda x: x[2])
        with ThreadPoolExecutor(hash_threads(), thread_name_prefix="constshare-digest") as pool:
            digests = list(
                pool.map(
                    lambda x: hashlib.sha256(memoryview(mm)[x[2] : x[2] + x[4]] if mm is not None else b"").hexdigest(),
                    found,
                )
            )
        specs = []
        for (name, t, offset, dt, nbytes), digest in zip(found, digests):
            fqn = fqns[name]
            specs.append(
                ConstantSpec(
                    name=name,
                    fqn=fqn,
                    kind=kinds.get(fqn, ConstantKind.LIFTED_CONSTANT),
                    mutated=fqn in mutated,
                    dtype=dt,
                    shape=tuple(t.shape),
                    strides=tuple(t.stride()),
                    storage_offset=t.storage_offset(),
                    nbytes=nbytes,
                    offset=offset,
                    digest=digest,
                    file=blob_file,
                )
            )
    finally:
        del whole
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view is still alive: the mapping closes when it dies
                pass
    del tensors, container
    return specs


def _bytes_at(whole: torch.Tensor, offset: int, nbytes: int, t: torch.Tensor) -> bool:
    """Whether the blob holds ``t``'s bytes at ``offset`` (compared on ``t``'s device)."""
    if offset < 0 or offset + nbytes > whole.numel():
        return False
    if not t.numel():
        return True
    raw = whole[offset : offset + nbytes].to(t.device, copy=True)  # own storage: as_strided offsets are absolute
    got = raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
    return torch.equal(
        got.contiguous().reshape(-1).view(torch.uint8), t.detach().contiguous().reshape(-1).view(torch.uint8)
    )


def _on_device(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of ``module`` on ``device``, plain tensor attributes included.

    ``Module.to`` moves parameters and buffers only; a plain tensor attribute (which
    export lifts as ``_tensor_constantN``) would stay behind on the CPU.  The caller's
    module is left untouched.
    """
    if device.type == "cpu":
        return module.eval()
    module = copy.deepcopy(module).to(device).eval()
    for sub in module.modules():
        for key, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                setattr(sub, key, value.to(device))
    return module


def mutated_buffers(ep: "torch.export.ExportedProgram") -> set[str]:
    """FQNs of the buffers the exported graph writes, read from the graph as exported.

    ``torch.export.export`` returns a non-functional graph: a buffer written in place
    (``copy_``, ``index_copy_``, ``x[i] = ...``) appears as an op whose schema marks that
    argument written, on the buffer's placeholder or on a view of it, and
    ``graph_signature.buffers_to_mutate`` stays empty until the program is functionalized.
    Functionalizing (``run_decompositions``) fails on some real models (transformers'
    ``TorchExportableModuleWithStaticCache`` under torch 2.13: "expected compiled_fn to be
    GraphModule"), so the writes are found here: every op argument whose alias annotation
    says written, followed through views (an op returning an alias of its argument) and
    ``getitem`` of multi-output views.  A signature that already lists mutations (a
    functional program) is taken as well.  A lifted tensor constant written in place (what
    that transformers path makes of its cache tensors) is state too and is reported with them.
    """
    import operator

    sig = ep.graph_signature
    found = set(sig.buffers_to_mutate.values())
    state = {**sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    alias: dict[torch.fx.Node, str] = {}  # node -> the buffer it is (a view of)
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in state:
            alias[node] = state[node.name]
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args and node.args[0] in alias:
            alias[node] = alias[node.args[0]]
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        given = dict(zip((a.name for a in schema.arguments), node.args))
        given.update(node.kwargs)
        returned = {a for r in schema.returns if r.alias_info is not None for a in r.alias_info.before_set}
        for arg in schema.arguments:
            value = given.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if not isinstance(v, torch.fx.Node) or v not in alias or arg.alias_info is None:
                    continue
                if arg.alias_info.is_write:
                    found.add(alias[v])
                if returned & set(arg.alias_info.before_set):
                    alias[node] = alias[v]  # a view (or the written tensor itself, returned)
    return found


def _warn_single_element_state(method: str, ep: "torch.export.ExportedProgram", mutated: set[str]) -> None:
    """Warn about written buffers of one element: AOTInductor (torch 2.13, on CPU) compiles
    their reads as their initial value although the method writes them, so a counter held in one
    element never advances for the compiled method (eager's does); two elements are read as data."""
    for fqn in sorted(mutated):
        t = ep.state_dict.get(fqn, ep.constants.get(fqn))
        if isinstance(t, torch.Tensor) and t.numel() == 1:
            warnings.warn(
                f"method {method!r}: buffer {fqn!r} is written and has one element; AOTInductor may "
                "compile its reads as its initial value (measured with torch 2.13), so what the method "
                "wrote is never read back. Hold it in at least two elements.",
                stacklevel=3,
            )


def _build_method(name: str, module: torch.nn.Module, args: tuple, device: torch.device, mdir: Path) -> MethodSpec:
    if not isinstance(module, torch.nn.Module):
        raise BuildError(f"method {name!r}: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, tuple):
        raise BuildError(f"method {name!r}: example_args must be a tuple, got {type(args).__name__}")
    module = _on_device(module, device)
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    inputs = _flatten_tensors(args, f"method {name!r} inputs")
    # torch's own pytree internals warn (FutureWarning, "`isinstance(treespec, LeafSpec)` is
    # deprecated") while exporting and compiling; nothing the caller can act on.  Silenced here,
    # for that one warning and only around the export/compile, so no notebook shows the wall.
    with warnings.catch_warnings(), torch.no_grad():
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
        )
        outputs = _flatten_tensors(copy.deepcopy(module)(*copy.deepcopy(args)), f"method {name!r} outputs")
        try:
            ep = torch.export.export(module, args)
        except Exception as e:  # export errors are long; keep the first lines
            raise BuildError(
                f"method {name!r}: torch.export failed: {str(e).splitlines()[0] if str(e) else e!r}"
            ) from e
        sig = ep.graph_signature
        kinds = {fqn: ConstantKind.PARAMETER for fqn in sig.parameters}
        kinds.update({fqn: ConstantKind.BUFFER for fqn in sig.buffers})
        mutated = mutated_buffers(ep)
        so, blob = _aot_compile(ep.module(), args, device, mdir)
    _warn_single_element_state(name, ep, mutated)
    check_shared_object(so)
    rel = Path("methods") / name
    if device.type == "cuda":
        # AOTInductor's runtime takes its constants' memory from cudaMalloc, not from PyTorch's cache,
        # so the blocks the eager run and the compile left cached (a model's worth) are handed back first.
        del ep
        gc.collect()  # the exported and compiled graphs hold references in cycles
        torch.cuda.empty_cache()
    constants = _describe_constants(so, blob, device, kinds, mutated, str(rel / blob.name))
    ref = mdir / "reference.safetensors"
    tensors = {f"input.{i}": t.detach().cpu().contiguous().clone() for i, t in enumerate(inputs)}
    tensors.update({f"output.{i}": t.detach().cpu().contiguous().clone() for i, t in enumerate(outputs)})
    save_file(tensors, str(ref))
    return MethodSpec(
        name=name,
        so_file=str(rel / so.name),
        blob_file=str(rel / blob.name),
        reference_file=str(rel / ref.name),
        blob_bytes=blob.stat().st_size,
        num_inputs=len(inputs),
        num_outputs=len(outputs),
        constants=tuple(constants),
    )


def storage_keys(methods: MethodsSpec) -> dict[str, dict[str, str]]:
    """Provenance: method -> {FQN: key}, equal keys where the eager modules hold ONE tensor.

    Parameters and buffers are keyed by their storage (pointer, offset, shape, strides) in the
    modules as given, before any copy: a submodule instance used by two methods (a shared
    weight, a KV cache both read) gets one key, two instances with equal FQNs get two.
    """
    ids: dict[tuple, str] = {}
    out: dict[str, dict[str, str]] = {}
    for mname, (module, _args) in methods.items():
        keys = {}
        named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
        for fqn, t in named:
            ident = (
                t.untyped_storage().data_ptr(),
                t.storage_offset(),
                tuple(t.shape),
                tuple(t.stride()),
                t.device.type,
            )
            keys[fqn] = ids.setdefault(ident, f"t{len(ids)}")
        out[mname] = keys
    return out


def _run_sequence(methods: MethodsSpec, steps, seq: str) -> dict[str, torch.Tensor]:
    """The eager program's steps in order, on one deep copy of all the modules (so instances
    shared between methods stay shared and state carries), recorded as reference tensors."""
    copies = copy.deepcopy({m: mod for m, (mod, _a) in methods.items()})  # one memo: sharing kept
    tensors: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.filterwarnings("ignore", category=FutureWarning)
        for i, step in enumerate(steps):
            if not (isinstance(step, tuple) and len(step) == 2 and step[0] in copies and isinstance(step[1], tuple)):
                raise BuildError(f"sequence {seq!r} step {i}: expected (method name, args tuple), got {step!r:.80}")
            m, args = step
            inputs = _flatten_tensors(args, f"sequence {seq!r} step {i} inputs")
            outputs = _flatten_tensors(copies[m].eval()(*copy.deepcopy(args)), f"sequence {seq!r} step {i} outputs")
            tensors.update({f"step.{i}.input.{j}": t.detach().cpu().contiguous().clone() for j, t in enumerate(inputs)})
            tensors.update(
                {f"step.{i}.output.{j}": t.detach().cpu().contiguous().clone() for j, t in enumerate(outputs)}
            )
    return tensors


def build_program(
    methods: MethodsSpec,
    out_dir: str | Path,
    device: str = "cpu",
    *,
    name: str | None = None,
    description: str = "",
    progress: bool = True,
    overwrite: bool = False,
    on_method: Callable[[str, int, int], None] | None = None,
    sequences: SequencesSpec | None = None,
):
    """Export and compile every method, and write a program directory.

    ``methods`` is an ordered mapping ``method name -> (module, example_args)``; its order
    is the load order.  ``sequences`` maps a name to steps ``[(method, args), ...]`` run in
    order on the eager modules, state carried as eager carries it; each step's inputs and
    outputs become the reference of ``session.verify(sequence=name)``.  Which constants of
    different methods were one tensor of the eager modules is recorded per constant
    (:func:`storage_keys`).  The directory appears only once it is complete (built aside,
    then renamed), so a failed build leaves nothing half-written behind.
    """
    from toolkit.display.progress import progress_bar
    from toolkit.sources import open_program

    out = Path(out_dir)
    dev = parse_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BuildError("device='cuda' was asked for, but torch sees no CUDA device")
    items = list(methods.items())
    if not items:
        raise BuildError("no methods given")
    for mname, spec in items:
        if not isinstance(mname, str) or not METHOD_NAME_RE.match(mname):
            raise BuildError(f"method name {mname!r} is not a plain identifier")
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise BuildError(f"method {mname!r}: expected (module, example_args)")
    sequences = dict(sequences or {})
    for seq in sequences:
        if not isinstance(seq, str) or not METHOD_NAME_RE.match(seq):
            raise BuildError(f"sequence name {seq!r} is not a plain identifier")
        if not sequences[seq]:
            raise BuildError(f"sequence {seq!r} has no steps")
    provenance = storage_keys(methods)
    if out.exists() and any(out.iterdir()) if out.is_dir() else out.exists():
        if not overwrite:
            raise BuildError(f"{out}: already exists (pass overwrite=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        specs = []
        bar = progress_bar(items, enabled=progress, desc="building", unit="method")
        for i, (mname, (module, args)) in enumerate(bar):
            bar.set_description(f"compiling {one_line(mname)}")
            if on_method:
                on_method(mname, i, len(items))
            mdir = stage / "methods" / mname
            mdir.mkdir(parents=True)
            spec = _build_method(mname, module, args, dev, mdir)
            keys = provenance[mname]
            specs.append(
                dataclasses.replace(
                    spec, constants=tuple(dataclasses.replace(c, storage=keys.get(c.fqn, "")) for c in spec.constants)
                )
            )
        bar.close()
        seq_specs = []
        for seq, steps in sequences.items():
            tensors = _run_sequence(methods, list(steps), seq)
            rel = f"sequences/{seq}.safetensors"
            (stage / "sequences").mkdir(exist_ok=True)
            save_file(tensors, str(stage / rel))
            seq_specs.append(
                SequenceSpec(
                    seq,
                    tuple(
                        SequenceStep(
                            m,
                            sum(1 for k in tensors if k.startswith(f"step.{i}.input.")),
                            sum(1 for k in tensors if k.startswith(f"step.{i}.output.")),
                        )
                        for i, (m, _a) in enumerate(steps)
                    ),
                    rel,
                )
            )
        files = {}
        for p in sorted(stage.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(stage))] = file_record(p)
        program = Program(
            name=name or out.name,
            description=description,
            device=dev.type,
            torch_version=torch.__version__,
            created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            methods=tuple(specs),
            files=files,
            sequences=tuple(seq_specs),
        )
        (stage / MANIFEST_FILE).write_text(manifest_json(program), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return open_program(out)
