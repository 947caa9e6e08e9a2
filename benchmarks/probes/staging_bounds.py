"""The staging pipeline's stages alone, on one host: what bounds a verified first load.

    python benchmarks/probes/staging_bounds.py [--gib 2.0] [--device cuda] [--threads 1,2,4,8,16]
                                               [--chunk-mib 4,16,64] [--streams 1,2,4] [--out DIR]

One process, one random blob of ``--gib`` GiB in the page cache.  Each row is one stage over the
whole blob, measured in this run (GB/s of the blob's bytes, best of two passes):

* ``read``: ``os.preadv`` of the file into reused buffers (pinned on CUDA), ``threads`` workers each
  reading whole chunks of ``chunk_mib``;
* ``hash``: BLAKE3 (the ``blake3`` package, which releases the GIL) of the same buffers' bytes, no read;
* ``read+hash``: both, each worker hashing what it just read (the verified pipeline without the copy);
* ``copy`` (CUDA): one pinned buffer to the device in ``chunk_mib`` copies over ``streams`` streams;
* ``read+copy`` / ``read+hash+copy`` (CUDA): the whole pipeline, each worker copying its chunk out of
  one of its two slots on its own stream (``streams`` = workers) once the last copy out of that
  slot is done;
* ``read+hash+copy, 4 MiB blocks``: the same, but each chunk read in 4 MiB blocks, each hashed while
  still in the CPU cache (as the loader's ``read_range`` does), then copied whole: the hash's
  granularity apart from the copy's;
* ``loader verified`` / ``loader unhashed`` / ``loader device digest`` (CUDA): the toolkit's own
  ``stage_pieces`` over the blob (64 MiB constants; a BLAKE3 record of 64 MiB pieces, or none; the
  digest on the host, or on the device), at the same threads and chunk: the loader beside its bound.

Writes results/staging_bounds/<date>-<machine>.csv into ``--out`` (else $OUT, else benchmarks/results).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common  # noqa: E402
import torch  # noqa: E402


def _blob(gib: float) -> Path:
    """A random file of ``gib`` GiB, read once so that its pages are in the page cache."""
    n = int(gib * (1 << 30)) // (64 << 20) * (64 << 20)
    fd, name = tempfile.mkstemp(prefix="staging-bounds-", suffix=".bin")
    block = os.urandom(64 << 20)
    with os.fdopen(fd, "wb") as f:
        for _ in range(n // len(block)):
            f.write(block)
    with open(name, "rb") as f:
        while f.read(64 << 20):
            pass
    return Path(name)


_BUFFERS: dict = {}


def _buffers(workers: int, chunk: int, cuda: bool) -> list[list[torch.Tensor]]:
    """Two buffers per worker (pinned on CUDA), allocated once per (workers, chunk) in the run."""
    key = (workers, chunk, cuda)
    if key not in _BUFFERS:
        _BUFFERS.clear()  # one set at a time: 16 workers x 2 x 64 MiB is 2 GiB pinned
        _BUFFERS[key] = [
            [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)] for _ in range(workers)
        ]
    return _BUFFERS[key]


def _best(run, passes: int = 2) -> float:
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return min(times)


def pipeline(
    path: Path, size: int, threads: int, chunk: int, *, read: bool, hash_: bool, copy: bool, block: int | None = None
) -> float:
    """Seconds for ``threads`` workers to take the blob's chunks in turn and do the named stages; with
    ``block``, each chunk read and hashed ``block`` bytes at a time (else whole)."""
    import blake3

    cuda = torch.cuda.is_available()
    bufs = _buffers(threads, chunk, cuda)
    views = [[memoryview(b.numpy()).cast("B") for b in pair] for pair in bufs]
    dev = torch.empty(size, dtype=torch.uint8, device="cuda") if copy else None
    streams = [torch.cuda.Stream() for _ in range(threads)] if copy else None
    starts = list(range(0, size, chunk))
    fd = os.open(path, os.O_RDONLY)

    def worker(w: int) -> None:
        events: list = [None, None]
        for k, start in enumerate(starts[w::threads]):
            slot = k % 2
            if events[slot] is not None:
                events[slot].synchronize()
            n = min(chunk, size - start)
            step = block or n
            h = blake3.blake3() if hash_ else None
            for b in range(0, n, step):
                view = views[w][slot][b : min(n, b + step)]
                got = 0
                while read and got < len(view):
                    got += os.preadv(fd, [view[got:]], start + b + got)
                if h is not None:
                    h.update(view)
            if copy:
                with torch.cuda.stream(streams[w]):
                    dev[start : start + n].copy_(bufs[w][slot][:n], non_blocking=True)
                    events[slot] = torch.cuda.Event()
                    events[slot].record(streams[w])
        for e in events:
            if e is not None:
                e.synchronize()

    try:
        with ThreadPoolExecutor(threads) as pool:

            def run() -> None:
                list(pool.map(worker, range(threads)))

            run()  # the slots' pages and the streams exist before the timed passes
            return _best(run)
    finally:
        os.close(fd)


def loader(path: Path, size: int, threads: int, chunk: int, how: str, record, device: torch.device) -> float:
    """Seconds for the toolkit's ``stage_pieces`` to stage the blob as 64 MiB constants onto ``device``:
    ``how`` is "verified" (host digest), "device digest" or "unhashed" (no record)."""
    from toolkit.upload.staging import stage_pieces

    part = 64 << 20
    specs = [_common.byte_constant(f"c{i}", at, min(part, size - at)) for i, at in enumerate(range(0, size, part))]

    def run() -> None:
        outs = stage_pieces(
            path,
            None if how == "unhashed" else record,
            specs,
            device,
            threads=threads,
            chunk_bytes=chunk,
            device_digest=how == "device digest",
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        del outs

    run()  # the slots pinned, the kernels loaded, before the timed passes
    return _best(run)


def copy_only(size: int, chunk: int, streams: int) -> float:
    """Seconds to copy ``size`` bytes from one pinned buffer to the device, ``chunk`` bytes a copy,
    round-robin over ``streams`` streams."""
    src = torch.empty(min(size, 1 << 30), dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    ss = [torch.cuda.Stream() for _ in range(streams)]

    def run() -> None:
        for i, start in enumerate(range(0, size, chunk)):
            n = min(chunk, size - start)
            at = start % src.numel()
            n = min(n, src.numel() - at)
            with torch.cuda.stream(ss[i % streams]):
                dev[start : start + n].copy_(src[at : at + n], non_blocking=True)
        torch.cuda.synchronize()

    run()
    return _best(run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--chunk-mib", default="4,16,64")
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    threads = [int(x) for x in a.threads.split(",")]
    chunks = [int(x) << 20 for x in a.chunk_mib.split(",")]
    path = _blob(a.gib)
    size = path.stat().st_size
    from toolkit.integrity.records import file_record

    record = file_record(path, 64 << 20)  # BLAKE3 of 64 MiB pieces, as a program's manifest holds
    rows = []

    def row(what: str, seconds: float, **kw) -> None:
        rows.append({"what": what, "seconds": seconds, "bytes": size, "GBps": size / seconds / 1e9, **kw})
        r = rows[-1]
        print(
            f"{what:18s} threads {kw.get('threads', '-')!s:>3} chunk {kw.get('chunk_mib', '-')!s:>3} MiB "
            f"streams {kw.get('streams', '-')!s:>2}: {r['GBps']:6.1f} GB/s",
            flush=True,
        )

    try:
        stages = [("read", True, False, False), ("hash", False, True, False), ("read+hash", True, True, False)]
        if cuda:
            stages += [("read+copy", True, False, True), ("read+hash+copy", True, True, True)]
        for chunk in chunks:
            for t in threads:
                for what, r, h, c in stages:
                    row(what, pipeline(path, size, t, chunk, read=r, hash_=h, copy=c), threads=t, chunk_mib=chunk >> 20)
            for t in threads:
                if cuda:
                    seconds = pipeline(path, size, t, chunk, read=True, hash_=True, copy=True, block=4 << 20)
                    row("read+hash+copy, 4 MiB blocks", seconds, threads=t, chunk_mib=chunk >> 20)
                for how in ("verified", "unhashed", "device digest") if cuda else ("verified", "unhashed"):
                    seconds = loader(path, size, t, chunk, how, record, torch.device(a.device))
                    row(f"loader {how}", seconds, threads=t, chunk_mib=chunk >> 20)
            if cuda:
                for s in (int(x) for x in a.streams.split(",")):
                    row("copy", copy_only(size, chunk, s), chunk_mib=chunk >> 20, streams=s)
    finally:
        path.unlink()
    out = _common.write_results("staging_bounds", rows, a.out or os.environ.get("OUT"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
