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
  allocated when its first piece is copied (what a first load does);
* ``N readers into pinned slots``: no locking: N threads each take the next ``--slot-mib`` chunk of
  the file, ``preadv`` it into one of two pinned slots of their own (pinned in the timed span, as a
  fresh process's first batch pins them) and copy it to the device on their own stream;
* ``lock + N readers beside``: both at once over one queue of 64 MiB pieces: a thread locks the next
  piece nobody has started and copies it from its locked pages, while N readers cut the next ones
  into chunks through their slots, so the copy engine is fed while the driver locks.

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
    "4 readers into pinned slots",
    "8 readers into pinned slots",
    "lock + 2 readers beside",
    "lock + 4 readers beside",
    "lock + 8 readers beside",
)
PIECE = 64 << 20


def child(case: str, path: str, constant: int, slot: int) -> float:
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

    if "readers" in case:
        return _shared_queue(case, path, n, pieces, mapped, register, dev, slot)
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


def _shared_queue(case, path, n, pieces, mapped, register, dev, slot) -> float:
    """The ``readers`` cases (see the module's docstring); checks that every byte landed."""
    import threading

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from toolkit.upload.slots import pinned_block

    readers = int(case.split()[2] if case.startswith("lock") else case.split()[0])
    whole = torch.empty(n, dtype=torch.uint8, device=dev)
    fd = os.open(path, os.O_RDONLY)
    guard = threading.Lock()
    nxt = [0]  # the next piece nobody has started
    part = [0, 0]  # the readers' piece being cut into chunks: its next byte, its end

    def take_piece():
        with guard:
            i = nxt[0]
            nxt[0] += 1
        return pieces[i] if i < len(pieces) else None

    def take_chunk():
        with guard:
            if part[0] >= part[1]:
                if nxt[0] >= len(pieces):
                    return None
                part[:] = pieces[nxt[0]]
                nxt[0] += 1
            s = part[0]
            part[0] = min(s + slot, part[1])
            return s, part[0]

    def locker():
        stream = torch.cuda.Stream(dev)
        with torch.cuda.stream(stream):
            while (p := take_piece()) is not None:
                s, e = p
                if register(s, e):
                    raise RuntimeError("cudaHostRegister failed")
                whole[s:e].copy_(mapped[s:e], non_blocking=True)
        stream.synchronize()

    def reader():
        block = pinned_block(2 * slot)
        slots = [block[:slot], block[slot:]]
        views = [memoryview(b.numpy()).cast("B") for b in slots]
        events = [None, None]
        stream = torch.cuda.Stream(dev)
        k = 0
        with torch.cuda.stream(stream):
            while (c := take_chunk()) is not None:
                s, e = c
                b = k % 2
                k += 1
                if events[b] is not None:
                    events[b].synchronize()  # the copy out of this slot is done
                got = 0
                while got < e - s:
                    n = os.preadv(fd, [views[b][got : e - s]], s + got)
                    if not n:
                        raise RuntimeError(f"{path} ended at byte {s + got}")
                    got += n
                whole[s:e].copy_(slots[b][: e - s], non_blocking=True)
                events[b] = torch.cuda.Event()
                events[b].record(stream)
        stream.synchronize()

    errors = []

    def run(fn):
        try:
            fn()
        except Exception as exc:  # a probe's failure is reported, not hidden
            errors.append(exc)

    t = time.perf_counter()
    jobs = [reader] * readers + ([locker] if case.startswith("lock") else [])
    threads = [threading.Thread(target=run, args=(fn,)) for fn in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    torch.cuda.synchronize()
    sec = time.perf_counter() - t
    os.close(fd)
    if errors:
        raise errors[0]
    with open(path, "rb") as f:  # every byte landed where it belongs
        for s in range(0, n, PIECE):
            want = torch.frombuffer(bytearray(f.read(min(PIECE, n - s))), dtype=torch.uint8)
            if not torch.equal(whole[s : s + len(want)].cpu(), want):
                raise RuntimeError(f"bytes at {s} differ")
    return sec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--constant-mib", type=int, default=256)
    ap.add_argument("--slot-mib", type=int, default=16, help="the readers' slot size")
    ap.add_argument("--cases", default=None, help="cases separated by semicolons (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cases = args.cases.split(";") if args.cases else list(CASES)
    if unknown := [c for c in cases if c not in CASES]:
        ap.error(f"--cases: unknown {unknown}; the cases are {list(CASES)}")
    if args.child:
        print(json.dumps({"seconds": child(args.child, args.path, args.constant_mib << 20, args.slot_mib << 20)}))
        return
    path = Path(args.dir) / "first_load_probe.bin"
    n = int(args.gib * _common.GIB)
    with open(path, "wb") as f:
        for s in range(0, n, 256 << 20):
            f.write(os.urandom(min(256 << 20, n - s)))
    rows = []
    for r in range(args.repeats):
        for case in cases:
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
                    "--slot-mib",
                    str(args.slot_mib),
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
                    "slot_mib": args.slot_mib,
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
