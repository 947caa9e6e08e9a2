"""Per-constant upload throughput: our loader vs a plain pinned host-to-device copy, same run.

    python benchmarks/upload_throughput.py [--program-dir DIR] [--hidden 8192] [--repeats 3] [--out DIR]

Over the constants of the program's first method (>= 2 GiB), each repeat times:

* ``plain_pinned_copy``: the same bytes already in pinned host memory, one
  ``torch.empty`` + ``copy_(non_blocking=True)`` + synchronize per constant (the target);
* ``toolkit_stager``: ``runtime.upload_constant`` with the loader's ``HostStager``, reading
  each constant from the (page-cached) blob file: what the loader does;
* ``toolkit_unstaged``: ``runtime.upload_constant`` without a stager (a fresh pinned buffer
  per constant: the loader before the stager);
* ``file_to_pageable_copy``: read into pageable memory, then copy (the naive way);
* ``loader_fingerprint``: a real fingerprint load, from its ConstantUploaded events.

GB/s = 1e9 bytes per second; ratio = toolkit_stager / plain_pinned_copy (target >= 0.8).
Writes upload_throughput.csv.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import _common
import pandas as pd
import torch

import _program
from toolkit import load_program
from toolkit.runtime import HostStager, read_constant_bytes, upload_constant
from toolkit.vocab import EventKind


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_once(kind: str, prog, spec, dev, hosts, stager) -> tuple[int, float]:
    blob = prog.path(spec.blob_file)
    consts = [c for c in spec.constants if c.nbytes]
    outs = []
    _sync(dev)
    t = time.perf_counter()
    for c in consts:
        if kind == "plain_pinned_copy":
            d = torch.empty(c.nbytes, dtype=torch.uint8, device=dev)
            d.copy_(hosts[c.name], non_blocking=True)
            _sync(dev)
        elif kind == "toolkit_stager":
            d = upload_constant(blob, c, dev, stager)
        elif kind == "toolkit_unstaged":
            d = upload_constant(blob, c, dev, None)
        elif kind == "file_to_pageable_copy":
            d = read_constant_bytes(blob, c).to(dev)
            _sync(dev)
        else:
            raise ValueError(kind)
        outs.append(d)
    _sync(dev)
    sec = time.perf_counter() - t
    total = sum(c.nbytes for c in consts)
    del outs
    gc.collect()
    return total, sec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program-dir", default=str(_common.REPO / ".cache" / "bench_prefill_decode"))
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-sweep", action="store_true", help="skip the HostStager settings sweep")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev, upload_path, prog, _, _ = _program.prepare(args.device, args.program_dir, args.hidden)
    spec = prog.methods[0]
    blob = prog.path(spec.blob_file)
    pin = dev.type == "cuda"
    hosts = {c.name: read_constant_bytes(blob, c, pin=pin) for c in spec.constants if c.nbytes}
    stager = HostStager(dev) if upload_path == "HostStager" else None
    kinds = ["plain_pinned_copy", "toolkit_stager", "toolkit_unstaged", "file_to_pageable_copy"]
    if dev.type == "cuda" and stager is None:
        kinds.remove("toolkit_stager")
    for k in kinds:  # warm-up: page cache, pinned pools, allocator, CUDA streams
        run_once(k, prog, spec, dev, hosts, stager)
    rows = []
    for rep in range(args.repeats):
        for k in kinds:  # interleaved, so drift hits every kind alike
            nbytes, sec = run_once(k, prog, spec, dev, hosts, stager)
            rows.append({"kind": k, "repeat": rep, "bytes": nbytes, "seconds": sec, "GBps": nbytes / sec / 1e9})
    # the loader itself: a fingerprint load, first method's per-constant uploads
    for rep in range(args.repeats):
        s = load_program(prog, "fingerprint", device=str(dev), check_integrity=False)
        ups = [e for e in s.log if e.kind is EventKind.CONSTANT_UPLOADED and e.method == spec.name]
        nbytes, sec = sum(e.bytes for e in ups), sum(e.seconds for e in ups)
        rows.append({"kind": "loader_fingerprint", "repeat": rep, "bytes": nbytes, "seconds": sec,
                     "GBps": nbytes / sec / 1e9})
        s.close()
        del s
        gc.collect()
    if stager:
        stager.close()
    # HostStager settings around the default, each on its own stager (1 warm-up + 2 timed passes)
    if stager is not None and not args.no_sweep:
        import os

        cpus = os.cpu_count() or 2
        configs = [(t, c, 2) for t in (4, 8, 16, 24, 32) if t <= cpus for c in (32, 64, 128)] + [(16, 64, 3)]
        for threads, chunk_mib, slots in configs:
            st = HostStager(dev, chunk_bytes=chunk_mib << 20, slots=slots, read_threads=threads)
            run_once("toolkit_stager", prog, spec, dev, hosts, st)
            speeds = []
            for _ in range(2):
                nbytes, sec = run_once("toolkit_stager", prog, spec, dev, hosts, st)
                speeds.append(nbytes / sec / 1e9)
            st.close()
            rows.append({"kind": f"sweep threads={threads} chunk={chunk_mib}MiB slots={slots}", "repeat": 0,
                         "bytes": nbytes, "seconds": nbytes / 1e9 / statistics.median(speeds),
                         "GBps": statistics.median(speeds)})
    df = pd.DataFrame(rows)
    med = df.groupby("kind")["GBps"].median()
    base = med["plain_pinned_copy"]
    df["ratio_vs_plain_pinned_median"] = df["kind"].map(med / base).round(3)
    df["constants"] = sum(1 for c in spec.constants if c.nbytes)
    df["chunk_bytes"] = stager.chunk_bytes if stager else 0
    df["read_threads"] = stager.read_threads if stager else 0
    df["upload_path"] = upload_path
    path = _common.write_csv(df, "upload_throughput.csv", args.out)
    print(f"{df['bytes'].iloc[0] / _common.GIB:.3f} GiB in {df['constants'].iloc[0]} constants, "
          f"median of {args.repeats}:")
    for k, v in med.sort_values(ascending=False).items():
        print(f"  {k:>40}: {v:7.2f} GB/s  ratio {v / base:.3f}")
    print(f"ratio toolkit_stager / plain_pinned_copy = {med.get('toolkit_stager', float('nan')) / base:.3f} (target >= 0.8); "
          f"loader_fingerprint / plain = {med['loader_fingerprint'] / base:.3f}")
    print(f"written to {path}")
    return df


if __name__ == "__main__":
    main()
