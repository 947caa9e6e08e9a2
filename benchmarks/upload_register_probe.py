"""Probe: can uploads skip the page-cache -> pinned-buffer copy?

Maps the weights blob read-only, registers the mapping with ``cudaHostRegister``
(``cudaHostRegisterReadOnly``) and copies straight from it, against a plain copy of bytes
already in pinned memory. Times include registering and unregistering. One command:

    python benchmarks/upload_register_probe.py [--program-dir DIR] [--hidden 4096]

An experiment for the next step on the upload-throughput target (RESULTS.md), not a
loader path.
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time

import torch

import _common
import _program

REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program-dir", default=str(_common.REPO / ".cache" / "bench_register_probe"))
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    dev, _, prog, _, _ = _program.prepare("cuda", args.program_dir, args.hidden)
    blob = prog.path(prog.methods[0].blob_file)
    n = blob.stat().st_size
    target = torch.empty(n, dtype=torch.uint8, device=dev)

    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    with open(blob, "rb") as f:
        f.readinto(memoryview(pinned.numpy()).cast("B"))
    plain = _timed(lambda: target.copy_(pinned, non_blocking=True), args.repeats)
    print(f"blob {n / 2**30:.3f} GiB; plain pinned copy {n / plain / 1e9:.2f} GB/s")

    cudart = torch.cuda.cudart()
    with open(blob, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        host = torch.frombuffer(mm, dtype=torch.uint8)
        ptr = host.data_ptr()

        def registered_copy():
            err = cudart.cudaHostRegister(ptr, n, REGISTER_READ_ONLY)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister failed: {err}")
            target.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            cudart.cudaHostUnregister(ptr)

        try:
            reg = _timed(registered_copy, args.repeats)
            print(f"registered mmap copy (register + copy + unregister) {n / reg / 1e9:.2f} GB/s, "
                  f"ratio {plain / reg:.3f}")
            ok = torch.equal(target.cpu(), pinned)
            print(f"bytes identical: {ok}")
        except Exception as e:  # report, do not hide: this is a probe
            print(f"registered mmap copy failed: {type(e).__name__}: {e}")
        del host
        mm.close()


if __name__ == "__main__":
    main()
