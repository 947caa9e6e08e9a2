"""Per-constant upload throughput: our loader vs a plain pinned host-to-device copy, same run.

    python benchmarks/upload_throughput.py [--program-dir DIR] [--hidden 8192] [--repeats 3] [--out DIR]

Over the constants of the program's first method (>= 2 GiB), each repeat times, from the
first byte read to the last byte on the device and every resource given back:

* ``plain_pinned_copy``: the same bytes already in pinned host memory, one
  ``torch.empty`` + ``copy_(non_blocking=True)`` + synchronize per constant (the target);
* ``toolkit_first_load``: the loader's default path, ``upload.MappedBlobUploader``, for a
  blob none of whose pages is locked: prefetch, one ``upload_constant`` per constant
  (staged through pinned buffers), release (which starts locking the pages in the
  background for the next load: timed on its own, outside this figure);
* ``toolkit_reload``: the same for a blob whose pages an earlier load left locked (the
  ``HostLockCache``), as when a program is loaded again (another policy, another session):
  every byte copied straight from the locked page cache;
* ``toolkit_first_load_locked`` / ``_hybrid``: the same first load with
  ``CONSTSHARE_FIRST_LOAD=locked`` (pages locked piece by piece while earlier pieces copy) /
  ``hybrid`` (that from the front, pinned staging from the back, at once);
* ``toolkit_stager``: ``upload_constant`` with a ``HostStager`` (``CONSTSHARE_UPLOAD=staged``);
* ``toolkit_unstaged``: a fresh pinned buffer per constant (``CONSTSHARE_UPLOAD=unstaged``);
* ``file_to_pageable_copy``: read into pageable memory, then copy (the naive way);
* ``loader_fingerprint_cold`` / ``_reload``: real fingerprint loads, summing their
  ConstantUploaded events, with no page locked yet / reloading the same program (after the
  first load's background locking finished).

The blob is in the page cache for all of these (it was just built or read), as it is when
a program is loaded after it was built or integrity-checked.  ``--cold`` adds one pass of
each file path after ``drop_caches`` (needs root): those measure the disk.

GB/s = 1e9 bytes per second; ratio = path / plain_pinned_copy (target >= 0.8).
Writes results/upload_throughput/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import _common
import _program
import pandas as pd
import torch

from toolkit import load_program
from toolkit.core.vocab import EventKind
from toolkit.upload import (
    HostLockCache,
    HostStager,
    MappedBlobUploader,
    host_locks,
    read_constant_bytes,
    upload_constant,
)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_once(kind: str, prog, spec, dev, hosts, uploaders) -> tuple[int, float]:
    blob = prog.path(spec.blob_file)
    consts = [c for c in spec.constants if c.nbytes]
    outs = []
    up = uploaders.get(kind)
    _sync(dev)
    t = time.perf_counter()
    if isinstance(up, MappedBlobUploader):
        up.prefetch(blob, consts)
    for c in consts:
        if kind == "plain_pinned_copy":
            d = torch.empty(c.nbytes, dtype=torch.uint8, device=dev)
            d.copy_(hosts[c.name], non_blocking=True)
            _sync(dev)
        elif kind == "file_to_pageable_copy":
            d = read_constant_bytes(blob, c).to(dev)
            _sync(dev)
        else:
            d = upload_constant(blob, c, dev, up)
        outs.append(d)
    if isinstance(up, MappedBlobUploader):
        up.release()  # starts the background locking of a first load; the reload locks nothing
        if up.disabled_reason:
            raise RuntimeError(f"{kind}: the mapped path fell back: {up.disabled_reason}")
    _sync(dev)
    sec = time.perf_counter() - t
    total = sum(c.nbytes for c in consts)
    del outs
    gc.collect()
    return total, sec


def drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program-dir", default=str(_common.REPO / ".cache" / "bench_prefill_decode"))
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-sweep", action="store_true", help="skip the MappedBlobUploader settings sweep")
    ap.add_argument("--cold", action="store_true", help="also one pass per file path after dropping the page cache")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    dev, upload_path, prog, _, _ = _program.prepare(args.device, args.program_dir, args.hidden)
    if dev.type != "cuda":
        raise SystemExit("upload throughput is a CUDA measurement")
    spec = prog.methods[0]
    blob = prog.path(spec.blob_file)
    hosts = {c.name: read_constant_bytes(blob, c, pin=True) for c in spec.constants if c.nbytes}
    uploaders = {"toolkit_stager": HostStager(dev), "toolkit_unstaged": None}
    kinds = ["plain_pinned_copy", "toolkit_stager", "toolkit_unstaged", "file_to_pageable_copy"]
    first_locks, reload_locks = HostLockCache(1 << 40), HostLockCache(1 << 40)
    first_mode_locks: dict[str, HostLockCache] = {}
    if upload_path == "mapped":
        uploaders["toolkit_first_load"] = MappedBlobUploader(dev, locks=first_locks)
        uploaders["toolkit_reload"] = MappedBlobUploader(dev, locks=reload_locks)
        kinds[1:1] = ["toolkit_reload", "toolkit_first_load"]
        for mode in ("locked", "hybrid"):  # first loads that lock pages while they copy (LoadOptions.first_load)
            k = f"toolkit_first_load_{mode}"
            first_mode_locks[k] = HostLockCache(1 << 40)
            uploaders[k] = MappedBlobUploader(dev, locks=first_mode_locks[k], first_load=mode)
            kinds.insert(kinds.index("toolkit_first_load") + 1, k)
    lock_rows = []

    def between(k):
        """Outside the timing: a first load starts with nothing locked; a reload with everything."""
        if k in first_mode_locks:
            first_mode_locks[k].wait_until_locked()
            first_mode_locks[k].clear()
        if k == "toolkit_first_load":
            t0 = time.perf_counter()
            first_locks.wait_until_locked()  # the previous pass's background locking
            lock_rows.append(time.perf_counter() - t0)
            first_locks.clear()
        elif k == "toolkit_reload":
            reload_locks.wait_until_locked()

    for k in kinds:  # warm-up: page cache, pinned pools, allocator, worker threads
        between(k)
        run_once(k, prog, spec, dev, hosts, uploaders)
    rows = []
    for rep in range(args.repeats):
        for k in kinds:  # interleaved, so drift hits every kind alike
            between(k)
            nbytes, sec = run_once(k, prog, spec, dev, hosts, uploaders)
            rows.append({"kind": k, "repeat": rep, "bytes": nbytes, "seconds": sec, "GBps": nbytes / sec / 1e9})
    # the loader itself: fingerprint loads, first method's per-constant uploads; the first load
    # of each pair starts with no page of the blob locked, the second reloads it
    if "toolkit_first_load" in uploaders:
        t0 = time.perf_counter()
        first_locks.wait_until_locked()
        lock_rows.append(time.perf_counter() - t0)
        # how long the background locking after a first load takes, timed on its own
        for rep in range(args.repeats):
            first_locks.clear()
            run_once("toolkit_first_load", prog, spec, dev, hosts, uploaders)
            t0 = time.perf_counter()
            first_locks.wait_until_locked()
            sec = time.perf_counter() - t0
            rows.append(
                {
                    "kind": "background locking after a first load (not in its upload time)",
                    "repeat": rep,
                    "bytes": sum(c.nbytes for c in spec.constants),
                    "seconds": sec,
                    "GBps": sum(c.nbytes for c in spec.constants) / sec / 1e9,
                }
            )
        first_locks.clear()
    for rep in range(args.repeats):
        host_locks().clear()
        for kind in ("loader_fingerprint_cold", "loader_fingerprint_reload"):
            s = load_program(prog, "fingerprint", device=str(dev), check_integrity=False)
            ups = [e for e in s.log if e.kind is EventKind.CONSTANT_UPLOADED and e.method == spec.name]
            nbytes, sec = sum(e.bytes for e in ups), sum(e.seconds for e in ups)
            rows.append(
                {
                    "kind": kind,
                    "repeat": rep,
                    "bytes": nbytes,
                    "seconds": sec,
                    "GBps": nbytes / sec / 1e9,
                    "note": ",".join(sorted({e.path for e in ups})),
                }
            )
            s.close()
            del s
            gc.collect()
            host_locks().wait_until_locked()  # the reload is a true reload
    host_locks().clear()
    # region size for reloads, each on its own uploader and lock cache (1 warm-up + 2 timed)
    if "toolkit_reload" in uploaders and not args.no_sweep:
        for region_mib in (16, 64, 256, 1024):
            locks = HostLockCache(1 << 40)
            up = MappedBlobUploader(dev, region_bytes=region_mib << 20, locks=locks)
            name = f"sweep reload region={region_mib}MiB"
            run_once(name, prog, spec, dev, hosts, {name: up})
            locks.wait_until_locked()
            speeds = []
            for _ in range(2):
                nbytes, sec = run_once(name, prog, spec, dev, hosts, {name: up})
                speeds.append(nbytes / sec / 1e9)
            up.close()
            locks.wait_until_locked()
            locks.clear()
            rows.append(
                {
                    "kind": name,
                    "repeat": 0,
                    "bytes": nbytes,
                    "seconds": nbytes / 1e9 / statistics.median(speeds),
                    "GBps": statistics.median(speeds),
                }
            )
    if args.cold:
        for k in [k for k in kinds if k not in ("plain_pinned_copy", "toolkit_reload")]:
            between(k)
            if not drop_page_cache():
                print("--cold: cannot drop the page cache (not root?); skipped")
                break
            nbytes, sec = run_once(k, prog, spec, dev, hosts, uploaders)
            rows.append({"kind": f"cold {k}", "repeat": 0, "bytes": nbytes, "seconds": sec, "GBps": nbytes / sec / 1e9})
    for up in uploaders.values():
        if up is not None:
            up.close()
    for locks in (first_locks, reload_locks, *first_mode_locks.values()):
        locks.wait_until_locked()
        locks.clear()
    df = pd.DataFrame(rows)
    med = df.groupby("kind")["GBps"].median()
    base = med["plain_pinned_copy"]
    df["ratio_vs_plain_pinned_median"] = df["kind"].map(med / base).round(3)
    df["constants"] = sum(1 for c in spec.constants if c.nbytes)
    df["upload_path"] = upload_path
    path = _common.write_results("upload_throughput", df, args.out)
    print(
        f"{df['bytes'].iloc[0] / _common.GIB:.3f} GiB in {df['constants'].iloc[0]} constants, median of {args.repeats}:"
    )
    for k, v in med.sort_values(ascending=False).items():
        print(f"  {k:>44}: {v:7.2f} GB/s  ratio {v / base:.3f}")
    for k in (
        "toolkit_reload",
        "toolkit_first_load",
        "toolkit_first_load_locked",
        "toolkit_first_load_hybrid",
        "toolkit_stager",
        "loader_fingerprint_reload",
        "loader_fingerprint_cold",
    ):
        if k in med:
            print(f"ratio {k} / plain_pinned_copy = {med[k] / base:.3f} (target >= 0.8)")
    print(f"written to {path}")
    return df


if __name__ == "__main__":
    main()
