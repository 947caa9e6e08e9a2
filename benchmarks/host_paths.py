"""Where an upload from a weights file spends its time: each host-side step alone.

    python benchmarks/host_paths.py [--gib 2] [--threads 16] [--repeats 3] [--out DIR]

A file of ``--gib`` GiB of random bytes is written to ``--dir`` (so it sits in the page
cache, as a blob does after it was built or hashed), then, median of ``--repeats``:

* ``h2d_from_pinned``: device copy of bytes already in pinned memory (the benchmark's target);
* ``host_memcpy_pinned_to_pinned``: host memory bandwidth, torch's parallel copy;
* ``file_pread_to_pinned``: ``preadv`` by N threads from the page cache into pinned memory
  (what the loader's ``HostStager`` does per chunk);
* ``file_mmap_to_pinned_cold`` / ``_warm``: copy out of a fresh / an already-faulted mapping;
* ``mmap_register`` / ``h2d_from_registered_mmap`` / ``mmap_unregister``: ``cudaHostRegister``
  of the mapping, then a device copy straight from it, then unregistering;
* ``h2d_from_pageable``: a device copy from ordinary (not pinned) memory;
* ``h2d_from_pinned_while_host_copies``: the target copy while N threads copy host memory,
  i.e. whether a pipelined upload could reach the target at all;
* ``register_fresh_mapping*``: locking a mapping nobody touched yet, from 1 and N threads,
  and while a device copy runs (``*_during_a_*``, ``both_lock_and_copy_concurrently``);
* an uploader sweep: the loader's upload paths over 10 constants of the file, prefetch to
  release, against per-constant copies from pinned memory.

GB/s = 1e9 bytes/s.  Writes results/host_paths/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import threading
import time
import warnings
from pathlib import Path

import _common
import torch

REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def _pread_all(fd: int, dst: torch.Tensor, threads: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    view = memoryview(dst.numpy()).cast("B")
    n = len(view)
    step = -(-n // threads)

    def one(i):
        got = 0
        part = view[i : i + step]
        while got < len(part):
            got += os.preadv(fd, [part[got:]], i + got)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(0, n, step)))


def _fresh_mapping_steps(fd: int, n: int, threads: int) -> dict[str, float]:
    """cudaHostRegister on a mapping nobody has touched yet: alone, from several threads, and
    while a device copy runs (if the driver overlapped the two, both would take what they take alone)."""
    from concurrent.futures import ThreadPoolExecutor

    from toolkit import upload

    out = {}
    region = 64 << 20

    def fresh():
        mm = mmap.mmap(fd, n, access=mmap.ACCESS_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return mm, torch.frombuffer(mm, dtype=torch.uint8)

    cudart = torch.cuda.cudart()
    mm, t = fresh()
    out["register_fresh_mapping"] = _time(lambda: upload.locking.register(t.data_ptr(), n))
    cudart.cudaHostUnregister(t.data_ptr())
    t = None
    mm.close()
    # does locking overlap a device copy?  Lock a fresh mapping while 2 GiB copy from pinned memory
    mm, t = fresh()
    target = torch.empty(n, dtype=torch.uint8, device="cuda")
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    timing = {}

    def lock_timed():
        t0 = time.perf_counter()
        upload.locking.register(t.data_ptr(), n)
        timing["lock"] = time.perf_counter() - t0

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    target.copy_(src, non_blocking=True)
    th = threading.Thread(target=lock_timed)
    th.start()
    torch.cuda.synchronize()
    timing["copy"] = time.perf_counter() - t0
    th.join()
    out["both_lock_and_copy_concurrently"] = time.perf_counter() - t0
    out["register_fresh_mapping_during_a_copy"] = timing["lock"]
    out["h2d_from_pinned_during_a_lock"] = timing["copy"]
    cudart.cudaHostUnregister(t.data_ptr())
    del t, target, src
    mm.close()
    mm, t = fresh()
    base = t.data_ptr()
    with ThreadPoolExecutor(threads) as pool:
        out[f"register_fresh_mapping_{threads}_threads_64MiB"] = _time(
            lambda: list(pool.map(lambda s: upload.locking.register(base + s, min(region, n - s)), range(0, n, region)))
        )
    for s in range(0, n, region):
        cudart.cudaHostUnregister(base + s)
    t = None
    mm.close()
    return out


def uploader_sweep(path: Path, n: int, dev, pinned: torch.Tensor, repeats: int) -> list[dict]:
    """The loader's upload paths over 10 equal constants of the file, against the same
    per-constant copies from pinned memory: prefetch to release, everything inside the timing."""
    from toolkit import upload

    k = 10
    size = (n // k) // 4096 * 4096 - 64  # unaligned ends, like a real blob's constants
    specs = [_common.byte_constant(f"w{i}", i * (n // k) + 64, size, "0" * 64) for i in range(k)]
    total = k * size

    def plain():
        return [
            torch.empty(c.nbytes, dtype=torch.uint8, device=dev).copy_(
                pinned[c.offset : c.offset + c.nbytes], non_blocking=True
            )
            for c in specs
        ]

    def through(up):
        def go():
            if up is not None:
                up.prefetch(path, specs)
            outs = [upload.upload_constant(path, c, dev, up) for c in specs]
            if up is not None:
                up.release()
            return outs

        return go

    configs = {"plain_pinned_copy_per_constant": (plain, None), "stager": (None, upload.HostStager(dev))}
    for region_mib in (64, 256):
        locks = upload.HostLockCache(1 << 40)
        configs[f"mapped reload region={region_mib}MiB (pages locked after the warm-up pass)"] = (
            None,
            upload.MappedBlobUploader(dev, region_bytes=region_mib << 20, locks=locks),
        )
    rows = []
    for name, (fn, up) in configs.items():
        fn = fn or through(up)
        fn()  # warm-up
        if isinstance(up, upload.MappedBlobUploader):
            up.locks.wait_until_locked()
        times = [_time(fn) for _ in range(repeats)]
        if up is not None:
            if getattr(up, "disabled_reason", None):
                print(f"{name}: FELL BACK ({up.disabled_reason})")
            up.close()
            if isinstance(up, upload.MappedBlobUploader):
                up.locks.wait_until_locked()
                up.locks.clear()
        rows.append(
            {
                "kind": f"uploader: {name}",
                "bytes": total,
                "seconds": statistics.median(times),
                "GBps": total / statistics.median(times) / 1e9,
            }
        )
    base = rows[0]["seconds"]
    for r in rows:
        r["ratio_vs_plain"] = round(base / r["seconds"], 3)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 2))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else None
    n = int(args.gib * _common.GIB)
    path = Path(args.dir) / "constshare_host_paths.bin"
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    path.write_bytes(src.numpy().tobytes())
    pinned_a = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    pinned_b = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    pinned_a.copy_(src)
    pinned_b.fill_(0)
    target = torch.empty(n, dtype=torch.uint8, device=dev) if cuda else None
    rows: list[dict] = []

    def add(kind, sec):
        rows.append({"kind": kind, "bytes": n, "seconds": sec, "GBps": n / sec / 1e9, "threads": args.threads})

    fd = os.open(path, os.O_RDONLY)
    try:
        for rep in range(args.repeats + 1):  # the first pass warms up and is dropped
            keep = rep > 0
            m = {}
            if cuda:
                m["h2d_from_pinned"] = _time(lambda: target.copy_(pinned_a, non_blocking=True))
            m["host_memcpy_pinned_to_pinned"] = _time(lambda: pinned_b.copy_(pinned_a))
            m["file_pread_to_pinned"] = _time(lambda: _pread_all(fd, pinned_b, args.threads))
            mm = mmap.mmap(fd, n, access=mmap.ACCESS_READ)
            mapped = torch.frombuffer(mm, dtype=torch.uint8)
            m["file_mmap_to_pinned_cold"] = _time(lambda: pinned_b.copy_(mapped))
            m["file_mmap_to_pinned_warm"] = _time(lambda: pinned_b.copy_(mapped))
            if cuda:
                cudart = torch.cuda.cudart()
                ptr = mapped.data_ptr()
                t = time.perf_counter()
                err = cudart.cudaHostRegister(ptr, n, REGISTER_READ_ONLY)
                m["mmap_register"] = time.perf_counter() - t
                if int(err) == 0:
                    m["h2d_from_registered_mmap"] = _time(lambda: target.copy_(mapped, non_blocking=True))
                    t = time.perf_counter()
                    cudart.cudaHostUnregister(ptr)
                    m["mmap_unregister"] = time.perf_counter() - t
                else:
                    print(f"cudaHostRegister failed: {err}")
                m["h2d_from_pageable"] = _time(lambda: target.copy_(src))
                # the device copy while the host copies memory on every thread
                done = threading.Event()

                def hammer():
                    while not done.is_set():
                        pinned_b.copy_(src)

                th = threading.Thread(target=hammer)
                th.start()
                time.sleep(0.05)
                m["h2d_from_pinned_while_host_copies"] = _time(lambda: target.copy_(pinned_a, non_blocking=True))
                done.set()
                th.join()
            mapped = None
            mm.close()
            if cuda:
                m.update(_fresh_mapping_steps(fd, n, args.threads))
            if keep:
                for k, sec in m.items():
                    add(k, sec)
        sweep = uploader_sweep(path, n, dev, pinned_a, args.repeats) if cuda else []
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    med = df.groupby("kind")["seconds"].median()
    if sweep:
        df = pd.concat([df, pd.DataFrame(sweep)], ignore_index=True)
    base = med.get("h2d_from_pinned")
    out = _common.write_results("host_paths", df, args.out)
    print(f"{n / _common.GIB:.2f} GiB, {args.threads} threads, median of {args.repeats}:")
    for k, sec in med.sort_values().items():
        extra = f"  (time vs h2d_from_pinned {sec / base:.2f}x)" if base else ""
        print(f"  {k:>36}: {sec:7.4f} s  {n / sec / 1e9:7.2f} GB/s{extra}")
    if sweep:
        print("uploaders, 10 constants, prefetch..release, median of", args.repeats)
        for r in sorted(sweep, key=lambda r: r["seconds"]):
            print(f"  {r['kind']:>80}: {r['GBps']:7.2f} GB/s  ratio {r['ratio_vs_plain']:.3f}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
