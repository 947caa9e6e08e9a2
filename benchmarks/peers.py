"""Whole-program loads against what users would use instead, each in a fresh process, one run.

    python benchmarks/peers.py [--program-dir DIR] [--hidden 8192] [--device cuda] [--repeats 2] [--out DIR]

On the prefill/decode program of benchmarks/_program.py (built once; its files in the page
cache, as after a build or a first load), every figure from its own fresh process:

* ``pinned copy``: every constant of both methods from pinned host memory to the device
  (the rate every ratio is taken against);
* ``raw AOTInductor``: per method, create the container and ``update_constant_buffer_from_blob``
  (ExecuTorch's path; every method uploads its whole blob);
* ``containers alone``: create both methods' containers and nothing else; then the slot-table
  query (``read_compiled``) on its own;
* ``safetensors``: ``safetensors.torch.load_file(device="cuda")`` of the same constants;
* ``kvikio``: ``kvikio.CuFile.pread`` of every constant into a device tensor (if kvikio
  imports; its compatibility mode when GPUDirect Storage is unavailable);
* the toolkit: ``load_program(dir, "fingerprint")`` with integrity on (the default path) and
  off, under each first-load mode (``LoadOptions.first_load`` staged / locked / hybrid), and a
  reload in the same process; the load's phases from its events.

Then the goals as ratios: first load of a blob / pinned copy (>= 0.8); the whole
load against 2 x (its uploaded bytes at the pinned rate) + its containers created alone;
the default path against integrity off (<= 1.10) and the integrity check's GB/s (>= 10).
Writes results/peers/<date>-<machine>.csv and the plot beside it (``.png``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import _common
import _program
import pandas as pd
import torch

GB = 1e9


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _constants(prog):
    return [(m, c) for m in prog.methods for c in m.constants if c.nbytes]


def child(args) -> dict:
    from toolkit import open_program
    from toolkit.upload import read_constant_bytes

    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index or 0)
        torch.zeros(1, device=dev)
        _sync(dev)
    prog = open_program(args.program_dir)
    kind = args.child
    out: dict = {"kind": kind}
    if kind == "pinned copy":
        hosts = [(read_constant_bytes(prog.path(m.blob_file), c, pin=dev.type == "cuda")) for m, c in _constants(prog)]
        t = time.perf_counter()
        outs = []
        for h in hosts:
            d = torch.empty(h.numel(), dtype=torch.uint8, device=dev)
            d.copy_(h, non_blocking=True)
            outs.append(d)
        _sync(dev)
        out.update(seconds=time.perf_counter() - t, bytes=sum(h.numel() for h in hosts))
    elif kind in ("raw AOTInductor", "containers alone"):
        from toolkit.runtimes.aoti_container import AotiContainer, read_compiled

        made, ups, queries, held = 0.0, 0.0, 0.0, []
        t0 = time.perf_counter()
        for m in prog.methods:
            t = time.perf_counter()
            cont = AotiContainer.create(prog.path(m.so_file), dev)
            made += time.perf_counter() - t
            if kind == "raw AOTInductor":
                t = time.perf_counter()
                cont.upload_blob(prog.path(m.blob_file))
                _sync(dev)
                ups += time.perf_counter() - t
            held.append(cont)
        total = time.perf_counter() - t0
        if kind == "containers alone":
            for m in prog.methods:
                t = time.perf_counter()
                read_compiled(prog.path(m.so_file), dev)
                queries += time.perf_counter() - t
        out.update(
            seconds=total,
            container_s=made,
            upload_s=ups,
            query_s=queries,
            bytes=sum(m.blob_bytes for m in prog.methods) if kind == "raw AOTInductor" else 0,
        )
    elif kind == "safetensors":
        from safetensors.torch import load_file

        t = time.perf_counter()
        got = load_file(args.safetensors, device=str(dev))
        _sync(dev)
        out.update(seconds=time.perf_counter() - t, bytes=sum(v.numel() * v.element_size() for v in got.values()))
    elif kind == "kvikio":
        import kvikio

        outs, futs, nbytes = [], [], 0
        t = time.perf_counter()
        files = {}
        for m, c in _constants(prog):
            f = files.get(m.blob_file) or files.setdefault(m.blob_file, kvikio.CuFile(str(prog.path(m.blob_file)), "r"))
            d = torch.empty(c.nbytes, dtype=torch.uint8, device=dev)
            futs.append(f.pread(d, c.nbytes, c.offset))
            outs.append(d)
            nbytes += c.nbytes
        got = sum(f.get() for f in futs)
        _sync(dev)
        out.update(
            seconds=time.perf_counter() - t,
            bytes=nbytes,
            read_bytes=got,
            kvikio=getattr(kvikio, "__version__", "?"),
            compat_mode=os.environ.get("KVIKIO_COMPAT_MODE", "auto (the library's default)"),
        )
        for f in files.values():
            f.close()
    else:  # the toolkit: "toolkit <mode> integrity on|off"
        from dataclasses import replace

        from toolkit import load_program
        from toolkit.core.options import options_from_environment
        from toolkit.core.vocab import EventKind

        _, mode, _, integrity = kind.split()
        # the upload path _program.prepare chose (CONSTSHARE_UPLOAD), this first-load mode
        options = replace(options_from_environment(), first_load=mode, check_integrity=integrity == "on")
        for label in ("first", "reload"):
            t = time.perf_counter()
            s = load_program(args.program_dir, "fingerprint", options=options)
            sec = time.perf_counter() - t
            ups = [e for e in s.log if e.kind is EventKind.CONSTANT_UPLOADED]
            made = [e for e in s.log if e.kind is EventKind.CONTAINER_CREATED]
            out[f"{label}_seconds"] = sec
            out[f"{label}_status"] = str(s.status)
            out[f"{label}_upload_bytes"] = sum(e.bytes for e in ups)
            out[f"{label}_upload_s"] = sum(e.seconds for e in ups)
            out[f"{label}_container_s"] = sum(e.seconds for e in made)
            out[f"{label}_paths"] = ",".join(sorted({e.path for e in ups}))
            first_method = [e for e in ups if e.method == prog.methods[0].name]
            out[f"{label}_first_method_GBps"] = (
                sum(e.bytes for e in first_method) / max(sum(e.seconds for e in first_method), 1e-9) / GB
            )
            s.close()
            del s
            gc.collect()
            if label == "first":
                from toolkit.upload import host_locks

                host_locks().wait_until_locked()  # a true reload: the background locking is done
        out.update(seconds=out["first_seconds"], bytes=out["first_upload_bytes"])
    return out


def write_safetensors(prog, path: Path) -> Path:
    from safetensors.torch import save_file

    from toolkit.upload import read_constant_bytes

    if not path.is_file():
        save_file(
            {f"{m.name}.{c.name}": read_constant_bytes(prog.path(m.blob_file), c) for m, c in _constants(prog)},
            str(path),
        )
    return path


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = df.groupby("kind")["GBps"].median().sort_values()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(med) + 1.2), layout="constrained")
    ax.barh(med.index, med.values, color=["tab:blue" if k.startswith("toolkit") else "tab:gray" for k in med.index])
    for i, v in enumerate(med.values):
        ax.text(v, i, f" {v:.1f}", va="center")
    ax.set_xlabel("GB/s (1e9 bytes/s): bytes uploaded / seconds of the whole call")
    ax.set_title("Loading the 4.3 GB prefill/decode program, each in a fresh process")
    ax.set_xlim(0, med.max() * 1.15)
    fig.savefig(path, dpi=120)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program-dir", default="/tmp/bench_prefill_decode")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--modes", nargs="+", default=["staged", "locked", "hybrid"])
    ap.add_argument("--child-timeout", type=float, default=180)
    ap.add_argument("--safetensors", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return None
    dev, upload_path, prog, build_s, note = _program.prepare(args.device, args.program_dir, args.hidden)
    st = write_safetensors(prog, Path(args.program_dir).with_suffix(".safetensors"))
    kinds = ["pinned copy", "raw AOTInductor", "containers alone", "safetensors", "kvikio"]
    kinds += [f"toolkit {m} integrity {i}" for m in args.modes for i in ("off", "on")]
    rows = []
    for rep in range(args.repeats):
        for k in kinds:
            try:
                got = _run(args, st, k)
            except Exception as e:  # one peer failing (kvikio missing) keeps the others
                got = {"kind": k, "error": str(e)[-400:]}
                print(f"  {k}: failed: {got['error'][-200:]}", flush=True)
            got["repeat"] = rep
            if got.get("seconds") and got.get("bytes"):
                got["GBps"] = got.get("bytes", 0) / got["seconds"] / GB
            rows.append(got)
            if "error" not in got:
                print(f"  {k:>32}: {got['seconds']:.3f} s, {got.get('GBps', 0):6.2f} GB/s", flush=True)
    df = pd.DataFrame(rows)
    ok = df[df["GBps"].notna()] if "GBps" in df else df.iloc[0:0]
    med = ok.groupby("kind")["GBps"].median()
    sec = ok.groupby("kind")["seconds"].median()
    pinned = med.get("pinned copy")
    df["ratio_vs_pinned_copy"] = df["kind"].map(med / pinned) if pinned else None
    path = _common.write_results("peers", df, args.out)
    print(f"\nmedian of {args.repeats}, GB/s and ratio to the pinned copy ({pinned:.2f} GB/s):")
    for k, v in med.sort_values(ascending=False).items():
        print(f"  {k:>32}: {v:7.2f} GB/s  ratio {v / pinned:.3f}")
    containers = (
        df[df["kind"] == "containers alone"].dropna(subset=["container_s"]) if "container_s" in df else df.iloc[0:0]
    )
    made = statistics.median(containers["container_s"]) if len(containers) else float("nan")
    query = statistics.median(containers["query_s"]) if len(containers) else float("nan")
    print(f"containers alone: {made:.3f} s for {len(prog.methods)} methods; slot-table queries {query:.3f} s")
    for m in args.modes:
        on, off = f"toolkit {m} integrity on", f"toolkit {m} integrity off"
        if off not in sec or on not in sec:
            continue
        r = ok[ok["kind"] == off]
        upload_bytes = statistics.median(r["first_upload_bytes"])
        bound = 2 * upload_bytes / (pinned * GB) + made
        first_rate = statistics.median(r["first_first_method_GBps"])
        print(
            f"[{m}] first load of a blob (prefill's uploads): {first_rate:.2f} GB/s = {first_rate / pinned:.3f} "
            f"of the pinned copy (goal >= 0.8)"
        )
        print(
            f"[{m}] whole load, integrity off: {sec[off]:.3f} s against 2 x {upload_bytes / GB:.2f} GB at the "
            f"pinned rate + containers alone = {bound:.3f} s: ratio {sec[off] / bound:.3f} (goal <= 1); "
            f"reload {statistics.median(r['reload_seconds']):.3f} s"
        )
        print(
            f"[{m}] default path (integrity on) {sec[on]:.3f} s / integrity off {sec[off]:.3f} s = "
            f"{sec[on] / sec[off]:.3f} (goal <= 1.10)"
        )
    print(f"plot: {plot(ok, path.with_suffix('.png'))}\nwritten to {path}")
    return df


def _run(args, st, kind) -> dict:
    return _common.run_child(
        __file__,
        [kind, "--program-dir", args.program_dir, "--device", args.device, "--safetensors", str(st)],
        timeout=args.child_timeout,
    )


if __name__ == "__main__":
    main()
