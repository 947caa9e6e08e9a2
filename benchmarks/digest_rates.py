"""Digest and copy rates for the integrity check: sha256 against BLAKE3, and the sealed copy.

    python benchmarks/digest_rates.py [--gib 1.0] [--threads N] [--repeats 3] [--out DIR] [--label NAME]

Writes a ``--gib`` GiB file of random bytes (in ``--dir``, default a temporary folder beside
the repository's ``.cache``), reads it once so it is in the page cache, then times, each the
best of ``--repeats`` runs over the whole file:

- ``read``: ``preadv`` into one reused 4 MiB buffer (page cache to user memory, nothing else);
- ``sha256 1 stream``: hashlib's sha256 over those reads (what formats 1-2 do);
- ``sha256 pieces``: the sha256 of each 64 MiB piece, pieces on N threads (format 3);
- ``blake3 1 thread`` and ``blake3 pieces``: the same with BLAKE3 (format 4: one thread per piece);
- ``blake3 whole N threads``: ``blake3(max_threads=N).update(mmap)`` (BLAKE3's own parallelism, one digest);
- ``memfd copy``: the sealed copy alone (toolkit.integrity.VerifiedCopy.read, nothing hashed), N threads;
- ``memfd copy + sha256 pieces`` / ``memfd copy + blake3 pieces``: the copy as a load makes it,
  hashing each piece as it arrives (the formats' real cost on a first load).

N is ``--threads`` (default every core: ``toolkit.integrity.hash_threads()``); each row is
also timed on 1 thread where that differs.  Prints GB/s (1e9 bytes/s) per row and ratios to
``sha256 1 stream``; writes results/digest_rates/<date>-<machine>[-<label>].csv.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common
import pandas as pd

PIECE = 64 << 20
BLOCK = 4 << 20


def _preadv_all(fd: int, size: int, update=None) -> None:
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    at = 0
    while at < size:
        n = os.preadv(fd, [view[: min(BLOCK, size - at)]], at)
        if update is not None:
            update(view[:n])
        at += n


def _pieces(fd: int, size: int, threads: int, new) -> list[str]:
    """Each PIECE's digest, pieces on ``threads`` threads, each read in BLOCK reads."""

    def one(start: int) -> str:
        h, buf = new(), bytearray(BLOCK)
        view, at, end = memoryview(buf), start, min(size, start + PIECE)
        while at < end:
            n = os.preadv(fd, [view[: min(BLOCK, end - at)]], at)
            h.update(view[:n])
            at += n
        return h.hexdigest()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(0, size, PIECE)))


def _copy(path: Path, fd: int, size: int, threads: int, new) -> None:
    from toolkit.integrity import VerifiedCopy

    pieces = [(s, min(PIECE, size - s)) for s in range(0, size, PIECE)]
    hashers = [new() if new else None for _ in pieces]
    copy = VerifiedCopy.read(fd, path, size, pieces, hashers, threads)
    del copy


def cases(path: Path, size: int, threads: int):
    import blake3

    b3 = lambda: blake3.blake3(max_threads=1)  # noqa: E731
    yield "read", 1, lambda fd: _preadv_all(fd, size)
    yield "sha256 1 stream", 1, lambda fd: _preadv_all(fd, size, hashlib.sha256().update)
    yield "blake3 1 thread", 1, lambda fd: _preadv_all(fd, size, b3().update)
    for n in dict.fromkeys((1, threads)):
        yield "sha256 pieces", n, lambda fd, n=n: _pieces(fd, size, n, hashlib.sha256)
        yield "blake3 pieces", n, lambda fd, n=n: _pieces(fd, size, n, b3)

        def whole(fd, n=n):
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
                blake3.blake3(max_threads=n).update(mm)

        yield "blake3 whole N threads", n, whole
        yield "memfd copy", n, lambda fd, n=n: _copy(path, fd, size, n, None)
        yield "memfd copy + sha256 pieces", n, lambda fd, n=n: _copy(path, fd, size, n, hashlib.sha256)
        yield "memfd copy + blake3 pieces", n, lambda fd, n=n: _copy(path, fd, size, n, b3)


def main(argv=None):
    from toolkit.integrity import hash_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=None, help="N (default: every core)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the test file is written (default: under .cache)")
    ap.add_argument("--label", default=None, help="ends the output file's name")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    threads = args.threads or hash_threads()
    size = int(args.gib * _common.GIB)
    where = Path(args.dir or _common.REPO / ".cache")
    where.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=where) as d:
        path = Path(d) / "digest_rates.bin"
        with open(path, "wb") as f:
            for _ in range(0, size, 64 << 20):
                f.write(os.urandom(min(64 << 20, size - f.tell())))
        fd = os.open(path, os.O_RDONLY)
        try:
            _preadv_all(fd, size)  # into the page cache
            for name, n, fn in cases(path, size, threads):
                best = min(_timed(fn, fd) for _ in range(args.repeats))
                rows.append(
                    {
                        "case": name,
                        "threads": n,
                        "bytes": size,
                        "seconds": round(best, 4),
                        "GBps": round(size / best / 1e9, 3),
                    }
                )
                print(f"{name:>28} on {n:>2} thread(s): {rows[-1]['GBps']:7.2f} GB/s ({best:.3f} s)", flush=True)
        finally:
            os.close(fd)
    df = pd.DataFrame(rows)
    ref = float(df[df.case == "sha256 1 stream"]["GBps"].iloc[0])
    df["x_sha256_1_stream"] = (df["GBps"] / ref).round(3)
    print(f"\nratios to sha256 1 stream ({ref:.2f} GB/s):")
    for r in df.itertuples():
        print(f"{r.case:>28} on {r.threads:>2}: {r.x_sha256_1_stream:6.2f} x")
    path = _common.write_results("digest_rates", df, args.out, args.label)
    print(f"written to {path}")
    return df


def _timed(fn, fd) -> float:
    t = time.perf_counter()
    fn(fd)
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
