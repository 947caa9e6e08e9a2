"""Where the verified staging pipeline's time goes: ``upload.stage_pieces`` alone.

    python benchmarks/probes/staging_profile.py [--gib 2.0] [--device cuda] [--threads 8,16] [--chunk-mib 4,8,16]
                                                [--digest locked,device,host,none] [--out DIR]

One process, one random blob of ``--gib`` GiB in the page cache with its BLAKE3 piece record
(64 MiB pieces, as the builder records).  Measured, each in this one run:

* ``pinned alloc``: allocating buffers like the staging slots alone (two per worker, pinned on CUDA)
  with ``torch.empty(pin_memory=True)``, of sizes not used before in the process; on CUDA also
  ``slot pinning``: the toolkit's own (``upload.slots.pinned_block``, one block of two slots per worker);
* a fresh process's first uses, each alone: on CUDA the device digest's kernels loaded (precompiled
  or Triton's), and the batch's device tensors allocated;
* per (threads, slot size), ``--digest``: as the default CUDA load does (``locked``: the pieces copied
  straight out of the file's locked pages and hashed on the device, a lock cache of its own: the first
  batch locks them, the second finds them locked), through the slots with the device digest where
  ``auto`` uses it (``device``), hashed on the host, and unhashed (``first_load=pipelined``): the first
  batch (it pins its slots: the very first of these rows is a fresh process's first batch but for the
  uses above) and the second (slots reused), seconds and GB/s of the constants' bytes;
* ``read only``: the same pieces read into reused plain buffers on the same threads (no hash, no copy);
* ``pinned copy``: the same bytes from one pinned buffer to the device (the rate the default load
  path's goal is taken against).

Writes results/staging_profile/<date>-<machine>.csv into ``--out`` (else $OUT, else benchmarks/results).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common  # noqa: E402
import torch  # noqa: E402

from toolkit import upload  # noqa: E402
from toolkit.integrity import file_record  # noqa: E402


def spec(name: str, offset: int, nbytes: int):
    return _common.byte_constant(name, offset, nbytes, "0" * 64, "buffer")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", default="8,16")
    ap.add_argument("--chunk-mib", default="4,8,16")
    ap.add_argument("--path", default="/tmp/staging_profile.blob")
    ap.add_argument(
        "--digest",
        default="locked,device,host,none",
        help="batches timed, in order: locked (the default load's, CUDA only), device (the slots, auto), "
        "host (device_digest=False), none (unhashed)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    n = int(args.gib * _common.GIB)
    t = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    with open(args.path, "wb") as f:
        for s in range(0, n, 256 << 20):
            f.write(torch.randint(0, 256, (min(256 << 20, n - s),), dtype=torch.uint8, generator=g).numpy().tobytes())
    rec = file_record(args.path)
    print(f"blob {n / 1e9:.2f} GB written and recorded in {time.perf_counter() - t:.1f} s", flush=True)
    # constants like a model's: 16 of n/16 each, unaligned to the pieces
    k = 16
    step = n // k
    specs = [spec(f"w{i}", i * step + 4096, step - 8192) for i in range(k)]
    total = sum(c.nbytes for c in specs)
    rows = []

    def row(what: str, seconds: float, nbytes: int, **extra) -> None:
        rows.append(
            {
                "what": what,
                "seconds": seconds,
                "bytes": nbytes,
                "GBps": nbytes / seconds / 1e9 if seconds and nbytes else None,
                **extra,
                **_common.machine(),
            }
        )
        gb = f", {nbytes / seconds / 1e9:6.2f} GB/s" if seconds and nbytes else ""
        print(
            f"  {what:<44} {' '.join(f'{k}={v}' for k, v in extra.items()):<22} {seconds * 1e3:8.1f} ms{gb}", flush=True
        )

    # the device's first use (context, allocator) out of the way, as in a load
    torch.empty(1, device=device)
    sync(device)
    # a fresh process's other first uses, each alone: the device digest's kernels, the batch's tensors
    if device.type == "cuda":
        from toolkit.integrity import device_digest

        t = time.perf_counter()
        ready = device_digest.available(device)
        row(
            f"device digest kernels loaded ({'precompiled' if device_digest.precompiled(device) else 'Triton'})"
            if ready
            else "device digest kernels: none",
            time.perf_counter() - t,
            0,
        )
    t = time.perf_counter()
    outs = [torch.empty(c.nbytes, dtype=torch.uint8, device=device) for c in specs]
    sync(device)
    row("the batch's tensors allocated (first use of the sizes)", time.perf_counter() - t, total)
    del outs
    threads = [int(x) for x in args.threads.split(",")]
    chunks = [int(x) << 20 for x in args.chunk_mib.split(",")]
    # record, device_digest, from locked pages
    digests = {
        "locked": (rec, None, True),
        "device": (rec, None, False),
        "host": (rec, False, False),
        "none": (None, False, False),
    }
    label = {
        "locked": "from locked pages, device digest",
        "device": "hashed, device digest auto",
        "host": "hashed on the host",
        "none": "unhashed",
    }
    hows = [h for h in args.digest.split(",") if h != "locked" or device.type == "cuda"]
    for w in threads:
        for ch in chunks:
            for how in hows:
                record, on_device, from_locked = digests[how]
                locks = upload.HostLockCache(1 << 40) if from_locked else None
                for attempt in ("first", "second"):
                    sync(device)
                    t = time.perf_counter()
                    outs = upload.stage_pieces(
                        args.path,
                        record,
                        specs,
                        device,
                        threads=w,
                        chunk_bytes=ch,
                        device_digest=on_device,
                        locks=locks,
                    )
                    sync(device)
                    row(
                        f"stage_pieces {label[how]} ({attempt} batch)",
                        time.perf_counter() - t,
                        total,
                        threads=w,
                        chunk_mib=ch >> 20,
                    )
                    del outs
                if locks is not None:
                    locks.clear()  # unlocked: the next rows' pages as a fresh process finds them
    for w in threads:
        for ch in [c * 3 for c in chunks]:  # sizes not used above (the caching allocator)
            t = time.perf_counter()
            bufs = [torch.empty(ch, dtype=torch.uint8, pin_memory=device.type == "cuda") for _ in range(2 * w)]
            row(
                "pinned alloc (2 per worker, torch may hand back cached blocks)",
                time.perf_counter() - t,
                2 * w * ch,
                threads=w,
                chunk_mib=ch >> 20,
            )
            del bufs
            if device.type == "cuda":  # what the staging slots do now: one block per worker, on the workers
                t = time.perf_counter()
                with ThreadPoolExecutor(w) as pool:
                    pinned = sum(b.numel() for b in pool.map(lambda _: upload.slots.pinned_block(2 * ch), range(w)))
                row(
                    "slot pinning (toolkit: cudaHostRegister of huge-page memory, per worker)",
                    time.perf_counter() - t,
                    pinned,
                    threads=w,
                    chunk_mib=ch >> 20,
                )
    # reading alone: the same 64 MiB pieces on the same threads, into reused plain buffers
    fd = os.open(args.path, os.O_RDONLY)
    try:
        for w in threads:
            for ch in chunks:
                bufs = [bytearray(ch) for _ in range(w)]

                def read(i: int, piece: int) -> None:
                    view = memoryview(bufs[i])
                    for u in range(piece, min(piece + (64 << 20), n), ch):
                        os.preadv(fd, [view[: min(ch, n - u)]], u)

                pieces = list(range(0, n, 64 << 20))
                t = time.perf_counter()
                with ThreadPoolExecutor(w) as pool:
                    list(pool.map(lambda ip: read(ip[0] % w, ip[1]), enumerate(pieces)))
                row("read only (preadv into reused buffers)", time.perf_counter() - t, n, threads=w, chunk_mib=ch >> 20)
    finally:
        os.close(fd)
    if device.type == "cuda":
        host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(total, dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=True)
        sync(device)
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        sync(device)
        row("pinned copy (one buffer)", time.perf_counter() - t, total)
    os.unlink(args.path)
    path = _common.write_results("staging_profile", rows, args.out)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
