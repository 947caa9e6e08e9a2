"""Where a locked first load's time goes beyond locking and copying.

    python benchmarks/probes/first_load_probe.py [--gib 2.0] [--constant-mib 256] [--out DIR]

Each case in a fresh process (CUDA context created untimed), on one random file of ``--gib`` GiB in
the page cache, cut into constants of ``--constant-mib`` MiB, as ``_program.py``'s methods are:

* ``device alloc, per constant``: ``torch.empty`` on the device for every constant (the caching
  allocator's first ``cudaMalloc`` of each, as a fresh process's first load makes them);
* ``device alloc, one block``: one ``torch.empty`` of all of it;
* ``lock alone``: ``cudaHostRegister`` of the file's mapping in 64 MiB pieces, on one thread;
* ``lock + copy pipelined``: the loader's pattern without the loader: a thread locks piece k+1
  while piece k is copied into device memory allocated beforehand;
* ``lock + copy pipelined, allocating per constant``: the same, each constant's device tensor
  allocated when its first piece is copied (what a first load does).

GB/s = 1e9 bytes/s of the file.  Writes results/first_load_probe/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common  # noqa: E402

CASES = (
    "device alloc, per constant",
    "device alloc, one block",
    "lock alone",
    "lock + copy pipelined",
    "lock + copy pipelined, allocating per constant",
)
PIECE = 64 << 20


def child(case: str, path: str, constant: int) -> float:
    import mmap
    import threading
    import warnings

    import torch

    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    n = os.path.getsize(path)
    sizes = [min(constant, n - s) for s in range(0, n, constant)]
    if case.startswith("device alloc"):
        t = time.perf_counter()
        outs = (
            [torch.empty(k, dtype=torch.uint8, device=dev) for k in sizes]
            if case.endswith("constant")
            else [torch.empty(n, dtype=torch.uint8, device=dev)]
        )
        torch.cuda.synchronize()
        return time.perf_counter() - t
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mapped = torch.frombuffer(mm, dtype=torch.uint8)
    base, rt = mapped.data_ptr(), torch.cuda.cudart()
    pieces = [(s, min(s + PIECE, n)) for s in range(0, n, PIECE)]

    def register(s: int, e: int) -> int:  # whole pages, portable and read-only, as toolkit.upload locks them
        return int(rt.cudaHostRegister(base + s, -(-(e - s) // mmap.PAGESIZE) * mmap.PAGESIZE, 0x01 | 0x08))

    if case == "lock alone":
        t = time.perf_counter()
        errs = [register(s, e) for s, e in pieces]
        return time.perf_counter() - t if not any(errs) else float("nan")
    whole = None if case.endswith("per constant") else torch.empty(n, dtype=torch.uint8, device=dev)
    done = [threading.Event() for _ in pieces]

    def locker():
        for i, (s, e) in enumerate(pieces):
            register(s, e)
            done[i].set()

    t = time.perf_counter()
    th = threading.Thread(target=locker)
    th.start()
    outs = {}
    for i, (s, e) in enumerate(pieces):
        done[i].wait()
        if whole is not None:
            whole[s:e].copy_(mapped[s:e], non_blocking=True)
            continue
        c = s // constant
        if c not in outs:
            outs[c] = torch.empty(sizes[c], dtype=torch.uint8, device=dev)
        outs[c][s - c * constant : e - c * constant].copy_(mapped[s:e], non_blocking=True)
    torch.cuda.synchronize()
    th.join()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--constant-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps({"seconds": child(args.child, args.path, args.constant_mib << 20)}))
        return
    path = Path(args.dir) / "first_load_probe.bin"
    n = int(args.gib * _common.GIB)
    with open(path, "wb") as f:
        for s in range(0, n, 256 << 20):
            f.write(os.urandom(min(256 << 20, n - s)))
    rows = []
    for r in range(args.repeats):
        for case in CASES:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    case,
                    "--path",
                    str(path),
                    "--constant-mib",
                    str(args.constant_mib),
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                raise SystemExit(f"{case}: rc {proc.returncode}\n{proc.stderr[-2000:]}")
            sec = json.loads(lines[-1])["seconds"]
            rows.append(
                {
                    "case": case,
                    "run": r,
                    "seconds": sec,
                    "bytes": n,
                    "GBps": n / sec / 1e9,
                    "constant_mib": args.constant_mib,
                }
            )
            print(f"run {r} {case:>48}: {sec * 1e3:8.1f} ms  {n / sec / 1e9:6.2f} GB/s", flush=True)
    path.unlink()
    import pandas as pd

    df = pd.DataFrame(rows)
    print(df.groupby("case", sort=False)["seconds"].median().mul(1e3).round(1).rename("median ms").to_string())
    out = _common.write_results("first_load_probe", df, args.out)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
