"""Device memory per policy on a large prefill/decode program, measured at the driver level.

    python benchmarks/gpu_memory.py [--program-dir DIR] [--hidden 8192] [--device cuda] [--out DIR]

Builds (once) the program of benchmarks/_program.py (>= 2 GiB of constants per method at
hidden 8192), then, per policy, in one process, one after another:

* resident bytes: cudaMemGetInfo (total - free) after the load minus before it.  AOTInductor
  allocates constants with plain cudaMalloc, invisible to torch.cuda.memory_allocated();
* peak bytes during the load: the larger of a background thread polling cudaMemGetInfo
  every millisecond and the loader's own 'peak' samples (taken after every allocating step);
* M (toolkit.workflows.dry_run.memory_floor), the largest constant, load seconds, the methods whose
  outputs differ from the eager reference, and bytes NOT returned after unloading (torch
  <= 2.13 leaks one reference per tensor installed user-managed: toolkit-owned uploads are
  never freed; see background.md) — each policy's baseline is measured afresh;
* per method: bytes the method added, whether it uploaded its whole blob, own uploads.

Writes results/gpu_memory/<date>-<machine>.csv, its per-method table (``-methods.csv``) and plot
(``.png``).  ``--device cpu`` runs the same code on the CPU (memory is then the loader's accounting),
to check the script.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from pathlib import Path

import _common
import _program
import pandas as pd
import torch

from toolkit import POLICIES, load_program
from toolkit.core.vocab import EventKind
from toolkit.engine.frames import wrong_methods
from toolkit.workflows.dry_run import dry_run, memory_floor

GIB = _common.GIB


class DeviceMemory:
    """Driver-level bytes in use on one device, plus a polling thread for peaks."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def in_use(self) -> int:
        if not self.cuda:
            return 0
        free, total = torch.cuda.mem_get_info(self.device)
        return int(total - free)

    def settle(self) -> int:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        return self.in_use()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self.in_use())
            time.sleep(0.001)

    def start(self) -> None:
        self._peak = self.in_use()
        self._stop.clear()
        if self.cuda:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        if self._thread:
            self._thread.join()
        return max(self._peak, self.in_use())


def _method_rows(s, prog, policy: str, wrong: list[str]) -> list[dict]:
    # A helper, so no LoadedMethod reference outlives it: one left in a local variable would keep
    # a container (and its whole blob) alive after close() and spoil the "not returned" figure.
    m = s.memory
    blob_methods = {e.method for e in s.log if e.kind is EventKind.BLOB_UPLOADED}
    rows = []
    for spec in prog.methods:
        mm = m[m["method"] == spec.name]
        lm = s.methods.get(spec.name)
        before_b = mm[mm["phase"] == "before"]["bytes_in_use"]
        after_b = mm[mm["phase"] == "after"]["bytes_in_use"]
        peak_b = mm[mm["phase"] == "peak"]["bytes_in_use"]
        rows.append(
            {
                "policy": policy,
                "method": spec.name,
                "loaded": lm is not None,
                "added_bytes": int(after_b.iloc[0] - before_b.iloc[0]) if len(after_b) and len(before_b) else 0,
                "peak_over_before_bytes": int(peak_b.iloc[0] - before_b.iloc[0])
                if len(peak_b) and len(before_b)
                else 0,
                "whole_blob_bytes": lm.whole_blob_bytes if lm else 0,
                "own_upload_bytes": lm.own_upload_bytes if lm else 0,
                "whole_blob_uploaded": spec.name in blob_methods,
                "blob_file_bytes": spec.blob_bytes,
                "wrong": spec.name in wrong,
                "runnable": bool(lm and lm.runnable),
            }
        )
    return rows


def measure_policy(prog, policy: str, dev: torch.device, floor, label: str | None = None) -> tuple[dict, list[dict]]:
    """One load, measured.  Run it in a fresh process (see --child) for clean baselines."""
    mem = DeviceMemory(dev)
    base = mem.settle()
    mem.start()
    t = time.perf_counter()
    s = load_program(prog, policy, device=str(dev), check_integrity=False)
    load_s = time.perf_counter() - t
    polled_peak = mem.stop()
    after = mem.in_use()
    m = s.memory
    loader_peak = int(m[m["phase"] == "peak"]["bytes_in_use"].max()) if len(m) else 0
    if not mem.cuda:  # CPU: the loader's accounting is the measurement
        after, base, polled_peak = s.device_bytes, 0, loader_peak
    peak = max(polled_peak, loader_peak if mem.cuda else 0)
    v = s.verify()
    wrong = wrong_methods(v)
    not_runnable = [k for k, lm in s.methods.items() if not lm.runnable]
    pred = dry_run(prog, policy, device=str(dev))
    label = label or policy
    methods = _method_rows(s, prog, label, wrong)
    decisions = s.decisions["decision"].value_counts().to_dict() if len(s.decisions) else {}
    status = s.status
    s.close()
    del s, v, m
    left = mem.settle() - base if mem.cuda else 0
    resident = after - base
    row = {
        "policy": label,
        "status": status,
        "M_bytes": floor.total_bytes,
        "resident_bytes": resident,
        "peak_bytes": peak - base if mem.cuda else peak,
        "resident_over_M": round(resident / floor.total_bytes, 4),
        "peak_minus_M_bytes": (peak - base if mem.cuda else peak) - floor.total_bytes,
        "largest_constant_bytes": floor.largest_constant_bytes,
        "accounted_bytes": pred.device_bytes,
        "load_seconds": round(load_s, 3),
        "wrong_methods": ";".join(wrong),
        "not_runnable": ";".join(not_runnable),
        "not_returned_after_unload_bytes": left,
        "shared": decisions.get("shared", 0),
        "declined": decisions.get("declined", 0),
        "loaded_constants": decisions.get("loaded", 0),
        "private": decisions.get("private", 0),
        "refused": decisions.get("refused", 0),
        "loader_peak_bytes": loader_peak - base if mem.cuda else loader_peak,
        "baseline_bytes": base,
        "measure": "cudaMemGetInfo total-free" if mem.cuda else "loader accounting (cpu)",
    }
    return row, methods


def child(args) -> None:
    """--child POLICY: one measured load in this (fresh) process; prints one JSON line."""
    import json

    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index or 0)
        torch.zeros(1, device=dev)
    label = args.child
    if args.no_alias:  # what torch <= 2.13 does to installed toolkit-owned tensors without the alias
        import toolkit.runtimes.aoti_container as runtime_mod

        runtime_mod.non_owning_alias = lambda t: t
        label = f"{args.child} [no alias: torch leak]"
    from toolkit import open_program

    prog = open_program(args.program_dir)
    _program.warm_up(dev, _program.hidden_of(prog))
    floor = memory_floor(prog, device=str(dev))
    row, methods = measure_policy(prog, args.child, dev, floor, label)
    print(json.dumps({"row": row, "methods": methods}, default=int))


def plot(df: pd.DataFrame, ax=None):
    """Resident, peak and not-returned device memory per policy against the floor M; returns the Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 5))
    else:
        fig = ax.figure
    x = list(range(len(df)))
    w = 0.27
    ax.bar([i - w for i in x], df["resident_bytes"] / GIB, width=w, label="resident after load")
    ax.bar(x, df["peak_bytes"] / GIB, width=w, label="peak during load")
    ax.bar([i + w for i in x], df["not_returned_after_unload_bytes"] / GIB, width=w, label="not returned after unload")
    m = df["M_bytes"].iloc[0] / GIB
    ax.axhline(m, color="k", ls="--", lw=1, label=f"floor M = {m:.3f} GiB")
    labels = []
    for _, r in df.iterrows():
        tag = (
            "FAILED"
            if r["status"] != "loaded"
            else (
                f"wrong: {r['wrong_methods']}"
                if isinstance(r["wrong_methods"], str) and r["wrong_methods"]
                else "correct"
            )
        )
        labels.append(f"{r['policy'].replace(' [', chr(10) + '[')}\n{tag}\n{r['resident_over_M']:.3f} M")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("GiB (cudaMemGetInfo, driver level)")
    info = {k: df[k].iloc[0] for k in ("gpu", "torch", "date_utc") if k in df} or _common.machine()
    ax.set_title(
        f"Constant memory per policy, prefill/decode program (2.0 GiB per method): {info['gpu']}, "
        f"torch {info['torch']}, {info['date_utc']} UTC",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program-dir", default=str(_common.REPO / ".cache" / "bench_prefill_decode"))
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--child-timeout", type=float, default=120)
    ap.add_argument("--plot-only", default=None, metavar="CSV", help="redraw the plot of a gpu_memory CSV (beside it)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-alias", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if args.plot_only:
        plot(pd.read_csv(args.plot_only)).savefig(Path(args.plot_only).with_suffix(".png"), dpi=120)
        return None

    dev, upload_path, prog, build_s, note = _program.prepare(args.device, args.program_dir, args.hidden)
    floor = memory_floor(prog, device=str(dev))
    sizes = {m.name: sum(c.nbytes for c in m.constants) for m in prog.methods}
    print(
        f"program built in {build_s:.1f}s ({note}); constants per method: "
        + ", ".join(f"{k} {v / GIB:.3f} GiB" for k, v in sizes.items())
    )
    print(floor)
    if dev.type == "cuda":  # per-process costs that must stay out of per-load figures
        mem = DeviceMemory(dev)
        a = mem.settle()
        _program.warm_up(dev, _program.hidden_of(prog))
        b = mem.settle()
        torch.cuda.Stream(dev)
        c = mem.settle()
        print(
            f"per-process, not per load: cuBLAS warm-up {(b - a) / (1 << 20):.1f} MiB, "
            f"torch's CUDA stream pool {(c - b) / (1 << 20):.1f} MiB (no upload path creates one)"
        )
    rows, mrows = [], []
    runs = [(p, []) for p in args.policies]
    if "fingerprint" in args.policies:
        runs.append(("fingerprint", ["--no-alias"]))
    for policy, extra in runs:
        flags = ["--program-dir", args.program_dir, "--device", args.device, *extra]
        try:
            got = _common.run_child(__file__, [policy, *flags], timeout=args.child_timeout)
        except Exception as e:  # one broken policy must not lose the others' figures
            print(f"{policy} {extra}: {e}")
            continue
        row, methods = got["row"], got["methods"]
        row["build_seconds"] = round(build_s, 1)
        row["program_note"] = note
        row["upload_path"] = upload_path
        rows.append(row)
        mrows.extend(methods)
        print(
            f"{row['policy']:>20}: {row['status']:>6}  resident {row['resident_bytes'] / GIB:7.3f} GiB "
            f"({row['resident_over_M']:.3f} M)  peak {row['peak_bytes'] / GIB:7.3f} GiB  "
            f"load {row['load_seconds']:6.2f}s  wrong [{row['wrong_methods']}]  "
            f"not returned {row['not_returned_after_unload_bytes'] / GIB:.3f} GiB",
            flush=True,
        )
    df = pd.DataFrame(rows)
    mdf = pd.DataFrame(mrows)
    p1 = _common.write_results("gpu_memory", df, args.out)
    _common.write_results("gpu_memory", mdf, args.out, tag="methods")
    plot(df).savefig(p1.with_suffix(".png"), dpi=120)
    print()
    print(
        mdf[
            ["policy", "method", "added_bytes", "whole_blob_uploaded", "whole_blob_bytes", "own_upload_bytes", "wrong"]
        ].to_string(index=False)
    )
    fp = df[df["policy"] == "fingerprint"]
    if len(fp):
        r = fp.iloc[0]
        print(
            f"\nfingerprint: resident {r['resident_over_M']:.4f} x M (target <= 1.02), peak - M = "
            f"{r['peak_minus_M_bytes'] / (1 << 20):.1f} MiB (target <= largest constant "
            f"{r['largest_constant_bytes'] / (1 << 20):.0f} MiB), wrong [{r['wrong_methods']}]"
        )
    print(f"written to {p1} (and -methods.csv, .png)")
    return df, mdf


if __name__ == "__main__":
    main()
