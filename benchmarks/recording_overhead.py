"""Event recording overhead: the same load with record=True and record=False, in one run.

    python benchmarks/recording_overhead.py [--program-dir DIR] [--policy fingerprint] [--repeats 5] [--out DIR]

Alternates the two settings (after one warm-up load of each), ``check_integrity=False`` so
file hashing does not drown the difference; ratio = median(record on) / median(record off),
goal <= 1.03.  Writes results/recording_overhead/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import gc
import statistics

import _common
import _program
import pandas as pd

from toolkit import load_program


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program-dir", default=str(_common.REPO / ".cache" / "bench_prefill_decode"))
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--policy", default="fingerprint")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    dev, upload_path, prog, _, _ = _program.prepare(args.device, args.program_dir, args.hidden)
    rows = []
    for rep in range(-1, args.repeats):  # rep -1: warm-up, not counted
        order = (True, False) if rep % 2 == 0 else (False, True)
        for record in order:
            s = load_program(prog, args.policy, device=str(dev), record=record, check_integrity=False)
            assert s.status == "loaded", s.error
            if rep >= 0:
                rows.append(
                    {
                        "policy": args.policy,
                        "record": record,
                        "repeat": rep,
                        "load_seconds": s.load_seconds,
                        "events": len(s.log),
                        "upload_path": upload_path,
                    }
                )
            s.close()
            del s
            gc.collect()
    df = pd.DataFrame(rows)
    on = statistics.median(df[df.record]["load_seconds"])
    off = statistics.median(df[~df.record]["load_seconds"])
    df["median_on_s"], df["median_off_s"], df["ratio_on_off"] = on, off, round(on / off, 4)
    path = _common.write_results("recording_overhead", df, args.out)
    print(df[["record", "repeat", "load_seconds", "events"]].to_string(index=False))
    print(
        f"median load: record on {on:.4f}s, off {off:.4f}s, ratio {on / off:.4f} (goal <= 1.03); "
        f"min ratio {df[df.record]['load_seconds'].min() / df[~df.record]['load_seconds'].min():.4f}"
    )
    print(f"written to {path}")
    return df


if __name__ == "__main__":
    main()
