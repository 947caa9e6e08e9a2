"""The floor M of every sample program next to each policy's constant bytes (dry run, CPU).

    python benchmarks/sample_floors.py [--out DIR]

Builds the samples (cached) and, without loading anything, tabulates M
(toolkit.workflows.dry_run.memory_floor), bytes with nothing shared, and each policy's predicted
constant bytes (toolkit.workflows.dry_run.dry_run), and each as a ratio to M.  Writes
results/sample_floors/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import os

import _common
import pandas as pd

from toolkit import POLICIES, ToolkitError
from toolkit.build.samples import build_sample, sample_names
from toolkit.workflows.dry_run import dry_run, memory_floor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    os.environ.setdefault("CONSTSHARE_CACHE", str(_common.REPO / ".cache" / "programs"))
    rows = []
    for name in sample_names():
        try:
            prog = build_sample(name, progress=False)
        except ToolkitError as e:
            print(f"{name}: skipped ({e})")
            continue
        f = memory_floor(prog)
        row = {
            "sample": name,
            "M_bytes": f.total_bytes,
            "private_bytes": f.private_bytes,
            "nothing_shared_bytes": f.naive_bytes,
            "largest_constant_bytes": f.largest_constant_bytes,
        }
        for p in POLICIES:
            a = dry_run(prog, p)
            row[f"{p}_bytes"] = a.device_bytes if a.status == "loaded" else -1  # -1: the load fails
        rows.append(row)
    df = pd.DataFrame(rows)
    path = _common.write_results("sample_floors", df, args.out)
    print(df.drop(columns=["largest_constant_bytes"]).to_string(index=False))
    ratios = df.set_index("sample")[[f"{p}_bytes" for p in POLICIES]].div(df.set_index("sample")["M_bytes"], axis=0)
    ratios.columns = list(POLICIES)
    print("\nx M (below 1: something was shared that must not be; negative: the load fails):")
    print(ratios.round(3).to_string())
    print(f"(-1: that policy fails the load)  written to {path}")
    return df


if __name__ == "__main__":
    main()
