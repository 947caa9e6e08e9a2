"""The BLAKE3 kernels (:mod:`toolkit.integrity.blake3_kernels`) compiled ahead of time for the
architectures we ship them for, and launched through the CUDA driver without importing Triton.

A fresh process's first use of Triton costs about half a second, and a warm-up in a thread stalls
the staging threads for about as long (``benchmarks/probes/warm_up_stall.py``); loading a cubin
with ``cuModuleLoadData`` costs milliseconds.  So on a device whose architecture has cubins here
(``cubins/sm<NN>/``: H100 and H200 are sm90) the device digest is ready from the first batch of a
process.  The cubins are Triton's own output for a fixed, unspecialised signature (:data:`KERNELS`),
written by ``python -m toolkit.integrity.blake3_cubins --write`` on any machine with Triton (no GPU
needed: Triton ships ``ptxas``); ``meta.json`` records the Triton version, each kernel's launch
shape and the SHA-256 of the kernel source, which a test compares with the source today, so a
changed kernel cannot ship stale cubins.

The launch follows Triton's calling convention for a kernel it compiled: the arguments in order,
then its two scratch pointers (null: the kernels need no scratch, ``meta.json`` says so), one
block of ``num_warps * 32`` threads per program.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CUBINS = HERE / "cubins"
SOURCE = HERE / "blake3_kernels.py"
BLOCK = 128  # lanes per program: the constexpr the cubins are compiled with
# each kernel's arguments as Triton's signature spells them, BLOCK aside; the launch packs them alike
KERNELS = {
    "chunks_kernel": {"words": "*i32", "n": "i64", "nchunks": "i32", "out": "*i32"},
    "parents_kernel": {"cvs": "*i32", "nodes": "i32", "out": "*i32", "root": "i32"},
}
ARCHS = (90,)  # compute capabilities (major * 10 + minor) we ship cubins for
_C_TYPES = {"*i32": ctypes.c_uint64, "i64": ctypes.c_int64, "i32": ctypes.c_int32}


def source_sha256() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def folder(arch: int) -> Path:
    return CUBINS / f"sm{arch}"


def meta(arch: int) -> dict | None:
    """``meta.json`` of the cubins for ``arch``, or None when none ship for it."""
    path = folder(arch) / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else None


def pack_arguments(kernel: str, values: tuple) -> tuple[ctypes.Array, list]:
    """The ``void**`` array ``cuLaunchKernel`` takes for ``kernel``: its arguments in order as their
    C types, then the two null scratch pointers; returned with the values it points at (keep them
    alive until the launch returns)."""
    types = list(KERNELS[kernel].values())
    if len(values) != len(types):
        raise TypeError(f"{kernel} takes {len(types)} arguments ({', '.join(KERNELS[kernel])}), got {len(values)}")
    held = [_C_TYPES[t](int(v)) for t, v in zip(types, values)] + [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    array = (ctypes.c_void_p * len(held))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in held])
    return array, held


class DriverError(RuntimeError):
    pass


class _Driver:
    """The few CUDA driver calls a launch needs, from ``libcuda.so.1`` (loaded by the CUDA runtime already)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

    def check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            raise DriverError(f"{what}: {(name.value or b'CUDA error').decode()} ({result})")

    def primary_context(self, index: int) -> ctypes.c_void_p:
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuInit(0), "cuInit")
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        return ctx


@dataclass
class Loaded:
    """The kernels of one device, loaded into its primary context (the one PyTorch uses)."""

    driver: _Driver
    context: ctypes.c_void_p
    functions: dict[str, ctypes.c_void_p]
    threads: dict[str, int]
    shared: dict[str, int]

    def launch(self, kernel: str, programs: int, stream: int, *values) -> None:
        """Run ``kernel`` over ``programs`` programs on CUDA stream handle ``stream``."""
        args, _held = pack_arguments(kernel, values)
        d = self.driver
        d.check(d.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        fn, threads, shared = self.functions[kernel], self.threads[kernel], self.shared[kernel]
        d.check(d.lib.cuLaunchKernel(fn, programs, 1, 1, threads, 1, 1, shared, stream, args, None), kernel)


_LOADED: dict[int, Loaded] = {}
_LOCK = threading.Lock()


def load(index: int, arch: int) -> Loaded | None:
    """The kernels loaded on CUDA device ``index`` of compute capability ``arch``, once per process;
    None when no cubins ship for ``arch`` or they are stale (the caller then uses Triton)."""
    m = meta(arch)
    if m is None or m.get("source_sha256") != source_sha256():
        return None
    with _LOCK:
        if index not in _LOADED:
            driver = _Driver()
            ctx = driver.primary_context(index)
            driver.check(driver.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            functions = {}
            for name in KERNELS:
                module, fn = ctypes.c_void_p(), ctypes.c_void_p()
                image = (folder(arch) / f"{name}.cubin").read_bytes()
                driver.check(driver.lib.cuModuleLoadData(ctypes.byref(module), image), f"cuModuleLoadData({name})")
                driver.check(driver.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), name)
                functions[name] = fn
            k = m["kernels"]
            _LOADED[index] = Loaded(
                driver,
                ctx,
                functions,
                {n: k[n]["num_warps"] * 32 for n in KERNELS},
                {n: k[n]["shared"] for n in KERNELS},
            )
        return _LOADED[index]


def write(arch: int) -> Path:
    """Compile the kernels for ``arch`` with the installed Triton (no GPU needed) into ``cubins/sm<arch>/``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from toolkit.integrity import blake3_kernels

    out = folder(arch)
    out.mkdir(parents=True, exist_ok=True)
    kernels = {}
    for name, signature in KERNELS.items():
        src = ASTSource(
            fn=getattr(blake3_kernels, name), signature={**signature, "BLOCK": "constexpr"}, constexprs={"BLOCK": BLOCK}
        )
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
        md = compiled.metadata
        if md.global_scratch_size or md.profile_scratch_size:
            raise SystemExit(f"{name} needs scratch memory: the launch here passes none")
        (out / f"{name}.cubin").write_bytes(compiled.asm["cubin"])
        kernels[name] = {"num_warps": md.num_warps, "shared": md.shared, "signature": signature}
    record = {
        "triton_version": triton.__version__,
        "arch": arch,
        "block": BLOCK,
        "source_sha256": source_sha256(),
        "kernels": kernels,
    }
    (out / "meta.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m toolkit.integrity.blake3_cubins --write")
    for a in ARCHS:
        print(f"wrote {write(a)}")
