"""The default load path: ``load_program(path, "fingerprint")``, integrity checking on, timed whole.

    python benchmarks/default_path.py [--program-dir DIR] [--gib 2.0] [--device cuda] [--runs 3]
                                      [--toolkit PATH] [--label NAME] [--out DIR] [--settings ...] [--timeline]

Builds (once) the prefill/decode program of benchmarks/_program.py (``--gib`` GiB of
constants per method; 2.0 is the GPU benchmarks' hidden size 8192), then times ONE whole
``toolkit.load_program(program_dir, "fingerprint")`` call per fresh process: with default
arguments (every .so and reference file verified first, a weights blob's pieces as they are
read; per-constant uploads through verified staging: on CUDA each piece copied straight out of the
file's locked pages and hashed on the device where the device hashes every piece, else read into the
pinned slots, hashed and uploaded from there), and, for comparison, the same call with other options
(:data:`SETTINGS`, ``--settings`` picks them): ``default, pinned slots`` (``first_load=staged``: the
slots, the device digest), ``default, host digest`` (``device_digest=False``: every piece hashed
on the host in the slots), ``default, sealed copy`` (``integrity_staging=False``: the pieces read into the sealed
private copy, whose pages are then locked), ``integrity off`` (``check_integrity=False``,
``first_load=locked``) and ``integrity off, pipelined`` (the staging pipeline unhashed).  The
program is passed by path, so opening it (reading and validating the manifest) is in the time
wherever a version of the toolkit does it.

In the same run, each in fresh processes too, the two rates the goals are taken against:
``pinned copy`` (every constant of both methods from pinned host memory to the device) and
``page locking`` (``cudaHostRegister`` of every constant's pages of a mapped blob, alone).
Printed at the end: each integrity-on setting's rate (bytes it uploaded / seconds) / the pinned-copy
rate (goal: >= 0.5), each integrity-off setting's rate / the page-locking rate (goal: >= 0.9), and
the default's rate / integrity off's (goal: >= 0.9).

One fresh process per load: a second load in one process would find the blob's pages
still page-locked by the first (toolkit.upload.host_locks()) and .so files already mapped.
One untimed warm-up load comes first (it leaves every file in the page cache for all
timed runs alike); then ``--runs`` pairs, alternating which setting goes first.  Per run:
seconds of the call; per pair: default / integrity-off; and the ratio of the medians.

``--toolkit PATH``: a directory holding another ``toolkit/`` package (e.g. the code before
a refactor) goes first on sys.path here and on PYTHONPATH in every child, so the whole run,
build included, uses that version; each child reports the file of every toolkit module it
imported, and the run stops if one is not from PATH.  ``--device cpu`` runs it on the CPU
(AOTInductor compiles the program for the CPU: keep ``--gib`` small, e.g. 0.05) to check
the script.

Writes results/default_path/<date>-<machine>[-<label>].csv (one row per run, machine columns
appended); ``--timeline`` also writes ``...-timeline.json`` beside it (per setting, its first timed
load's events but the per-constant ones, and per method the span of its constant uploads: where the
time went).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common
import _program
import pandas as pd

POLICY = "fingerprint"
# setting -> LoadOptions fields changed from the environment's options (check_integrity alone: passed as load_program's
# keyword, which every toolkit version takes)
SETTINGS = {
    "default": {},  # verified staging: from the file's locked pages, every piece hashed on the device
    "default, pinned slots": {"first_load": "staged"},  # verified staging through the slots, device digest
    "default, host digest": {"device_digest": False},  # every piece hashed in the pinned slots
    "default, 4 MiB slots": {"staging_chunk_bytes": 4 << 20},  # slot sizes below the default's
    "default, 8 MiB slots": {"staging_chunk_bytes": 8 << 20},
    "default, 64 MiB slots": {"staging_chunk_bytes": 64 << 20},  # the slot size above the default's
    "default, sealed copy": {"integrity_staging": False},  # the private memfd copy, then locked
    "integrity off": {"check_integrity": False},  # first_load=locked: the file's pages locked as copied
    "integrity off, pipelined": {"check_integrity": False, "first_load": "pipelined"},
}  # staging, unhashed
RATES = ("pinned copy", "page locking")  # what the ratios are taken against, measured in this run


def hidden_for(gib: float) -> int:
    """The hidden size whose method holds about ``gib`` GiB: LAYERS + 1 float32 (hidden x hidden)
    weights (the adapter and vectors are small).  2.0 GiB gives 8192, the other benchmarks' size."""
    h = math.sqrt(gib * _common.GIB / (4 * (_program.LAYERS + 1)))
    return max(64, int(h) // 64 * 64)


def _toolkit_root(path: str | None) -> Path | None:
    """The directory to put on sys.path for ``--toolkit``: PATH itself, or its parent when PATH
    is the ``toolkit/`` package folder."""
    if path is None:
        return None
    p = Path(path).resolve()
    if p.name == "toolkit" and (p / "__init__.py").is_file():
        p = p.parent
    if not (p / "toolkit" / "__init__.py").is_file():
        raise SystemExit(f"--toolkit {path}: no toolkit/__init__.py there (nor is it the toolkit folder)")
    return p


def _toolkit_modules() -> dict[str, str]:
    """The file of every toolkit module this process imported."""
    return {
        k: m.__file__
        for k, m in list(sys.modules.items())
        if (k == "toolkit" or k.startswith("toolkit.")) and getattr(m, "__file__", None)
    }


def _check_toolkit(modules: dict[str, str], root: Path | None) -> None:
    """Stop unless every toolkit module came from ``root`` (or this checkout, with no --toolkit).

    Not only ``toolkit/__init__``: with the package installed editable, a module missing from
    the --toolkit folder is silently found in this checkout instead, mixing two versions.
    """
    want = ((root or _common.REPO) / "toolkit").resolve()
    stray = {k: f for k, f in modules.items() if not Path(f).resolve().is_relative_to(want)}
    if stray or "toolkit" not in modules:
        raise SystemExit(f"toolkit modules not imported from {want}: {stray or 'toolkit itself is missing'}")


def rate_child(kind: str, program_dir: str, dev) -> dict:
    """One of :data:`RATES`, timed over every constant of every method (bytes, seconds)."""
    import mmap

    import torch

    from toolkit import open_program
    from toolkit.upload import page_spans, read_constant_bytes

    prog = open_program(program_dir)
    consts = [(m, c) for m in prog.methods for c in m.constants if c.nbytes]
    nbytes = sum(c.nbytes for _, c in consts)
    if kind == "pinned copy":
        hosts = [read_constant_bytes(prog.path(m.blob_file), c, pin=dev.type == "cuda") for m, c in consts]
        t = time.perf_counter()
        outs = [torch.empty(h.numel(), dtype=torch.uint8, device=dev).copy_(h, non_blocking=True) for h in hosts]
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - t
        del outs
        return {"seconds": seconds, "bytes": nbytes, "status": "loaded", "error": ""}
    if dev.type != "cuda":
        return {"seconds": float("nan"), "bytes": nbytes, "status": "loaded", "error": "no CUDA: not measured"}
    maps, spans = [], []
    for blob in dict.fromkeys(m.blob_file for m, _ in consts):
        with open(prog.path(blob), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        base = torch.frombuffer(mm, dtype=torch.uint8).data_ptr()
        maps.append(mm)
        spans += [
            (base + s, e - s)
            for s, e in page_spans([(c.offset, c.offset + c.nbytes) for m, c in consts if m.blob_file == blob])
        ]
    rt = torch.cuda.cudart()
    t = time.perf_counter()
    errs = [int(rt.cudaHostRegister(p, n, 0x01 | 0x08)) for p, n in spans]  # portable, read-only (as upload.py)
    seconds = time.perf_counter() - t
    for p, _ in spans:
        rt.cudaHostUnregister(p)
    return {
        "seconds": seconds,
        "bytes": sum(n for _, n in spans),
        "status": "loaded" if not any(errs) else "failed",
        "error": f"cudaHostRegister errors {sorted(set(errs))}" if any(errs) else "",
    }


def child(args) -> None:
    """--child SETTING: one timed load_program call (or one of :data:`RATES`) in this (fresh)
    process; prints one JSON line."""
    import torch

    import toolkit
    from toolkit import load_program
    from toolkit.core.vocab import EventKind

    dev = torch.device(args.device)
    if dev.type == "cuda":  # the CUDA context is per process, not per load: create it untimed
        dev = torch.device("cuda", dev.index or 0)
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
    if args.child in RATES:
        out = {
            "setting": args.child,
            **rate_child(args.child, args.program_dir, dev),
            "toolkit": toolkit.__file__,
            "loader_load_seconds": None,
        }
        out["modules"] = _toolkit_modules()
        print(json.dumps(out))
        return
    fields = SETTINGS[args.child]
    if set(fields) <= {"check_integrity"}:
        kwargs = dict(fields)
    else:  # fields of newer toolkits: given as options (an older toolkit fails here: leave it out, --settings)
        from dataclasses import replace

        from toolkit.core.options import options_from_environment

        kwargs = {"options": replace(options_from_environment(), **fields)}
    t = time.perf_counter()
    s = load_program(args.program_dir, POLICY, **kwargs)  # no device: the default, the program's own
    seconds = time.perf_counter() - t
    uploaded = sum(e.bytes for e in s.log if e.kind in (EventKind.CONSTANT_UPLOADED, EventKind.BLOB_UPLOADED))
    out = {
        "setting": args.child,
        "seconds": seconds,
        "status": str(s.status),
        "error": s.error,
        "bytes": uploaded,
        "loader_load_seconds": getattr(s, "load_seconds", None),
        "claim_seconds": getattr(s, "claim_seconds", None),  # checking the constant digests shares rest on
        "toolkit": toolkit.__file__,
        "timeline": timeline(s.log),
    }
    s.close()
    out["modules"] = _toolkit_modules()  # after the load and close: whatever they imported lazily too
    print(json.dumps(out))


def timeline(log) -> list[dict]:
    """Where one load's time went, from its event log (seconds since the log began): every event
    but the per-constant ones, and per method the span of its constant uploads (from the start of the
    first, its event's time less its own seconds, to the last one's event; the bytes; the sum of the
    uploads' own seconds)."""
    per_constant = {
        "constant_enumerated",
        "cache_lookup",
        "field_compared",
        "digest_compared",
        "decided",
        "cache_entry_added",
        "constant_uploaded",
    }
    rows, spans = [], {}
    for e in log:
        kind = e.kind.value
        if kind == "constant_uploaded":
            sp = spans.setdefault(
                e.method,
                {"t": e.time_s - e.seconds, "end": e.time_s, "bytes": 0, "seconds": 0.0, "n": 0, "path": str(e.path)},
            )
            sp["end"], sp["bytes"], sp["seconds"], sp["n"] = (
                e.time_s,
                sp["bytes"] + e.bytes,
                sp["seconds"] + e.seconds,
                sp["n"] + 1,
            )
        elif kind not in per_constant:
            rows.append({"t": round(e.time_s, 5), "kind": kind, "method": e.method})
    rows += [
        {
            "t": round(sp["t"], 5),
            "kind": "constant uploads",
            "method": m,
            "end": round(sp["end"], 5),
            "uploads": sp["n"],
            "bytes": sp["bytes"],
            "upload_seconds": round(sp["seconds"], 5),
            "path": sp["path"],
        }
        for m, sp in spans.items()
    ]
    return sorted(rows, key=lambda r: r["t"])


def breakdown(rows: list[dict]) -> list[str]:
    """One line per method of a :func:`timeline`: where its load's time went, in ms (before its
    uploads: the container and what precedes; the uploads: their bytes, rate and path; after)."""
    lines = []
    for m in dict.fromkeys(r["method"] for r in rows if r.get("method")):
        mine = [r for r in rows if r.get("method") == m]
        start = next((r["t"] for r in mine if r["kind"] == "load_started"), mine[0]["t"])
        done = next((r["t"] for r in mine if r["kind"] == "method_loaded"), mine[-1]["t"])
        up = next((r for r in mine if r["kind"] == "constant uploads"), None)
        if up is None:
            lines.append(f"{m}: {1e3 * (done - start):.1f} ms, no upload")
            continue
        span = up["end"] - up["t"]
        rate = up["bytes"] / span / 1e9 if span > 0 else float("nan")
        lines.append(
            f"{m}: {1e3 * (done - start):.1f} ms = {1e3 * (up['t'] - start):.1f} before its uploads + "
            f"{1e3 * span:.1f} uploading {up['bytes'] / 1e9:.3f} GB ({rate:.1f} GB/s, {up['path']}) + "
            f"{1e3 * (done - up['end']):.1f} after"
        )
    return lines


def run_child(args, setting: str, root: Path | None) -> dict:
    """One child process (like _common.run_child, with ``--toolkit`` first on PYTHONPATH)."""
    path = [str(root)] if root else []
    path += [str(_common.REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    cmd = [sys.executable, __file__, "--child", setting, "--program-dir", args.program_dir, "--device", args.device]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=args.child_timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"child {setting!r} failed (rc {proc.returncode}):\n{tail}")
    got = json.loads(lines[-1])
    _check_toolkit(got["modules"], root)
    if got["status"] != "loaded":  # a failed load is fast: timing it would flatter the path
        raise RuntimeError(f"child {setting!r}: load {got['status']}: {got['error']}")
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--program-dir",
        default=None,
        help="where the program is built or reused (default .cache/bench_prefill_decode-<device>-h<hidden>)",
    )
    ap.add_argument("--gib", type=float, default=2.0, help="GiB of constants per method (2.0: hidden 8192)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=3, help="timed processes per setting")
    ap.add_argument(
        "--toolkit",
        default=None,
        metavar="PATH",
        help="a directory holding another toolkit/ package: first on sys.path and on the children's PYTHONPATH",
    )
    ap.add_argument(
        "--label", default=None, help="ends the output file's name (default: the --toolkit folder's name, else none)"
    )
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--timeline", action="store_true", help="also write where each setting's first load spent its time")
    ap.add_argument(
        "--settings",
        nargs="+",
        default=list(SETTINGS),
        choices=list(SETTINGS),
        help="the load settings timed (default all; 'default' and 'integrity off' always)",
    )
    ap.add_argument("--child-timeout", type=float, default=600)
    ap.add_argument("--child", default=None, choices=list(SETTINGS) + list(RATES), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # PYTHONPATH, set by the parent, already puts the chosen toolkit first
        return child(args)

    root = _toolkit_root(args.toolkit)
    if root is not None:
        if "toolkit" in sys.modules:
            raise SystemExit("toolkit was imported before --toolkit could take effect")
        sys.path.insert(0, str(root))
    import toolkit

    _check_toolkit(_toolkit_modules(), root)
    tag = args.label or (root.name if root else None)
    label = tag or "current"
    hidden = hidden_for(args.gib)
    devtype = args.device.split(":")[0]
    args.program_dir = args.program_dir or str(_common.REPO / ".cache" / f"bench_prefill_decode-{devtype}-h{hidden}")

    dev, upload_path, prog, build_s, note = _program.prepare(args.device, args.program_dir, hidden)
    # build() reuses whatever program the directory holds: make sure it is this one
    if getattr(prog, "device", dev.type) != dev.type or _program.hidden_of(prog) != hidden:
        raise SystemExit(
            f"{args.program_dir} holds a {getattr(prog, 'device', '?')} program of hidden size "
            f"{_program.hidden_of(prog)}, not {dev.type} {hidden} (--gib {args.gib}): "
            f"pass another --program-dir or remove it"
        )
    sizes = {m.name: sum(c.nbytes for c in m.constants) for m in prog.methods}
    # what the default path hashes, read from the disk (not the manifest: its layout may differ between versions)
    files = sum(p.stat().st_size for p in Path(args.program_dir).rglob("*") if p.is_file())
    print(
        f"toolkit {Path(toolkit.__file__).parent} ({label}); program {args.program_dir} built in {build_s:.1f}s "
        f"({note}), hidden {hidden}; constants per method: "
        + ", ".join(f"{k} {v / _common.GIB:.3f} GiB" for k, v in sizes.items())
        + f"; program files {files / _common.GIB:.3f} GiB; upload path {upload_path}",
        flush=True,
    )

    warm = run_child(args, "default", root)
    print(f"warm-up (not counted): default {warm['seconds']:.3f}s", flush=True)
    settings = list(dict.fromkeys(["default", "integrity off", *args.settings]))
    settings.sort(key=list(SETTINGS).index)
    rows, timelines = [], {}
    for run in range(args.runs):
        order = list(settings) if run % 2 == 0 else list(reversed(settings))
        order += list(RATES)
        for setting in order:
            got = run_child(args, setting, root)
            if run == 0 and got.get("timeline") is not None:
                timelines[setting] = got["timeline"]
            rows.append(
                {
                    "label": label,
                    "setting": setting,
                    "run": run,
                    "seconds": round(got["seconds"], 4),
                    "bytes": got["bytes"],
                    "GBps": got["bytes"] / got["seconds"] / 1e9,
                    "loader_load_seconds": got["loader_load_seconds"],
                    "claim_seconds": got.get("claim_seconds"),
                    "toolkit": str(Path(got["toolkit"]).parent),
                    "policy": POLICY,
                    "hidden": hidden,
                    "program_dir": args.program_dir,
                    "file_bytes": files,
                    "upload_path": upload_path,
                }
            )
            # bytes and rate on every line: a run stopped by its time limit still says what it measured
            print(
                f"run {run} {setting:>24}: {got['seconds']:.3f}s, {got['bytes'] / 1e9:.3f} GB, "
                f"{got['bytes'] / got['seconds'] / 1e9:.2f} GB/s"
                + (
                    f", digest claims {got['claim_seconds'] * 1e3:.2f} ms"
                    if got.get("claim_seconds") is not None
                    else ""
                ),
                flush=True,
            )
    df = pd.DataFrame(rows)
    rate = {k: statistics.median(df[df.setting == k]["GBps"]) for k in (*settings, *RATES)}
    targets = {
        f"{k} / pinned copy (goal >= 0.5)": rate[k] / rate["pinned copy"]
        for k in settings
        if not k.startswith("integrity off")
    }
    targets.update(
        {
            f"{k} / page locking (goal >= 0.9)": rate[k] / rate["page locking"]
            for k in settings
            if k.startswith("integrity off")
        }
    )
    targets["default / integrity off (goal >= 0.9)"] = rate["default"] / rate["integrity off"]  # what verifying costs
    by = {k: df[df.setting == k].sort_values("run")["seconds"].tolist() for k in settings}
    pairs = [round(d / o, 4) for d, o in zip(by["default"], by["integrity off"])]
    med = {k: statistics.median(v) for k, v in by.items()}
    ratio = round(med["default"] / med["integrity off"], 4)
    df["ratio_default_over_off"] = df["run"].map(dict(enumerate(pairs)))
    df["median_default_s"], df["median_off_s"], df["ratio_of_medians"] = med["default"], med["integrity off"], ratio
    _check_toolkit(_toolkit_modules(), root)  # the build and the upload-path check imported more
    path = _common.write_results("default_path", df, args.out, tag)
    summary = {
        "label": label,
        "toolkit": str(Path(toolkit.__file__).parent),
        "policy": POLICY,
        "program_dir": args.program_dir,
        "hidden": hidden,
        "constant_bytes_per_method": sizes,
        "file_bytes": files,
        "upload_path": upload_path,
        "warm_up_seconds": round(warm["seconds"], 4),
        "default_seconds": by["default"],
        "integrity_off_seconds": by["integrity off"],
        "ratio_default_over_off_per_run": pairs,
        "median_default_s": med["default"],
        "median_off_s": med["integrity off"],
        "ratio_of_medians": ratio,
        "median_seconds": {k: statistics.median(v) for k, v in by.items()},
        "median_GBps": rate,
        "targets": targets,
        **_common.machine(),
    }
    if args.timeline:  # where each setting's first timed load spent its time (the loader's events)
        tl_path = _common.result_path("default_path", "-timeline.json", args.out, tag)
        tl_path.write_text(json.dumps(timelines, indent=1) + "\n")
        print(f"timeline: {tl_path}")
        for setting, rows in timelines.items():  # the breakdown per stage, run 0 of each setting
            print(f"  {setting}:")
            for line in breakdown(rows):
                print(f"    {line}")
    print(
        f"median: default {med['default']:.3f}s, integrity off {med['integrity off']:.3f}s, "
        f"ratio {ratio:.3f}; per run {pairs}"
    )
    print("median GB/s: " + ", ".join(f"{k} {v:.2f}" for k, v in rate.items()))
    for k, v in targets.items():
        print(f"{k}: {v:.3f}")
    print(f"written to {path}")
    return summary


if __name__ == "__main__":
    main()
