"""Can the device hash what it was sent?  BLAKE3 of 64 MiB pieces on the GPU.

    python benchmarks/probes/device_blake3_probe.py [--pieces 32] [--out DIR]

The loader's own kernels (``toolkit.integrity.device_digest``), timed alone.  A verified load is bounded
by the host's hashing rate while the host hashes every byte it reads.  If the device hashed its own copy
after the upload (its memory is private to the process: what is hashed is what is used), a verified load
could run at the unverified rate.  This measures whether that is fast and exact enough: a Triton BLAKE3
(chunk chaining values in one kernel, then one kernel per tree level, the last node of an odd level
carried up, as BLAKE3's left-complete tree), checked byte for byte against the ``blake3`` package on
edge-case lengths and on random 64 MiB pieces, then timed over ``--pieces`` pieces in device memory.

On a machine without CUDA, ``TRITON_INTERPRET=1`` runs the same kernels on the CPU (small lengths
only): ``--check-only``.  Writes results/device_blake3_probe/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import torch  # noqa: E402

from toolkit.integrity.device_digest import DeviceDigests  # noqa: E402


def blake3_on_device(buf, n: int) -> str:
    """BLAKE3 of the first ``n`` bytes of ``buf`` (a uint8 tensor; its length a multiple of 64,
    zeros past ``n``), computed where ``buf`` is by the loader's own kernels."""
    d = DeviceDigests(buf.device, 1)
    d.hash(buf, 0, n)
    return d.hexdigests()[0]


def padded(data: bytes, device):
    buf = torch.zeros(max(64, -(-len(data) // 64) * 64), dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf.to(device)


def main(argv=None):
    import blake3

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pieces", type=int, default=32)
    ap.add_argument("--check-only", action="store_true", help="edge-case lengths only (the CPU interpreter)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lengths = [0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 3073, 4096 * 3 + 5]
    if not args.check_only:
        lengths += [1 << 20, (5 << 20) + 77, 64 << 20]
    ok = True
    for n in lengths:
        data = os.urandom(n)
        got, want = blake3_on_device(padded(data, dev), n), blake3.blake3(data).hexdigest()
        ok &= got == want
        print(f"length {n:>10}: {'match' if got == want else 'MISMATCH ' + got + ' != ' + want}", flush=True)
    if not ok:
        raise SystemExit("the device's BLAKE3 differs from the blake3 package")
    if args.check_only:
        return
    import _common

    piece = 64 << 20
    bufs = [torch.randint(0, 256, (piece,), dtype=torch.uint8, device=dev) for _ in range(args.pieces)]
    want = [blake3.blake3(b.cpu().numpy().tobytes()).hexdigest() for b in bufs[:2]]
    rows = []
    for rep in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        got = [blake3_on_device(b, piece) for b in bufs]
        torch.cuda.synchronize()
        s = time.perf_counter() - t
        assert got[:2] == want, "64 MiB pieces differ"
        rows.append(
            {
                "case": "device BLAKE3, 64 MiB pieces, one after another",
                "run": rep,
                "pieces": args.pieces,
                "bytes": piece * args.pieces,
                "seconds": s,
                "GBps": piece * args.pieces / s / 1e9,
            }
        )
        print(
            f"run {rep}: {args.pieces} x 64 MiB hashed on the device in {s * 1e3:.1f} ms: "
            f"{piece * args.pieces / s / 1e9:.1f} GB/s",
            flush=True,
        )
    out = _common.write_results("device_blake3_probe", rows, args.out)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
