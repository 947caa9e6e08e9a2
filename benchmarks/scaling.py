"""Dry-run analysis at scale: K = 2,000 / 20,000 / 200,000 constants per method, 8 methods.

    python benchmarks/scaling.py [--sizes 2000 20000 200000] [--methods 8] [--no-roundtrip]

Times, per size: generating the synthetic manifest (not part of the claim), the dry-run
analysis including the DataFrame (``toolkit.analysis.analyze``) under two policies, the
memory floor, and a JSON round trip of the manifest (write + read/validate).  Prints each
step's time ratio next to the size ratio and writes benchmarks/results/scaling.csv.
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import pandas as pd

from toolkit.analysis import memory_floor, run_analysis
from toolkit.sources import read_program_model
from toolkit.sources.directory import manifest_json
from toolkit.synthetic import SyntheticSpec, generate

POLICIES = ("fingerprint", "decline-on-mismatch")


def _timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000, 200_000])
    ap.add_argument("--methods", type=int, default=8)
    ap.add_argument("--no-roundtrip", action="store_true", help="skip the JSON write/read step")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)

    rows = []
    for k in args.sizes:
        repeats = 3 if k * args.methods <= 200_000 else 1  # best of 3 where it is cheap
        t_gen, manifest = _timed(lambda: generate(SyntheticSpec(methods=args.methods, constants=k)), 1)
        n = k * args.methods
        steps = {"generate": t_gen}
        for pol in POLICIES:
            t, a = _timed(lambda: run_analysis(manifest, pol), repeats)
            assert len(a.decisions) == n and a.status == "loaded", (pol, len(a.decisions), a.status)
            steps[f"analyze[{pol}]"] = t
            del a
        steps["memory_floor"], floor = _timed(lambda: memory_floor(manifest), repeats)
        if not args.no_roundtrip:
            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "manifest.json"
                t = time.perf_counter()
                path.write_text(manifest_json(manifest, indent=None), encoding="utf-8")
                steps["json_write"] = time.perf_counter() - t
                t = time.perf_counter()
                back = read_program_model(Path(d))
                steps["json_read_validate"] = time.perf_counter() - t
                assert back.methods[1].constants[-1] == manifest.methods[1].constants[-1]
                del back
        for step, sec in steps.items():
            rows.append({"constants_per_method": k, "methods": args.methods, "decisions": n, "step": step,
                         "seconds": round(sec, 4), "us_per_decision": round(sec / n * 1e6, 3),
                         "repeats": repeats if step.startswith(("analyze", "memory")) else 1})
        print(f"K={k:>7,}: " + ", ".join(f"{s} {v:.2f}s" for s, v in steps.items())
              + f"  (floor {floor.total_bytes / (1 << 30):.1f} GiB; peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB)", flush=True)
        del manifest, floor
    df = pd.DataFrame(rows)
    base = df["constants_per_method"].min()
    df["size_ratio"] = df["constants_per_method"] / base
    ref = df[df["constants_per_method"] == base].set_index("step")["seconds"]
    df["time_ratio"] = [round(s / ref[st], 2) for s, st in zip(df["seconds"], df["step"])]
    path = _common.write_csv(df, "scaling.csv", args.out)
    print()
    print(df.pivot(index="step", columns="constants_per_method", values="time_ratio")
          .rename(columns=lambda c: f"x{c // base} size").to_string())
    print(f"\ntime ratios vs the K={base:,} run; written to {path}")
    return df


if __name__ == "__main__":
    main()
