"""`scan` of a folder of synthetic programs, timed end to end, in one run.

    python benchmarks/scan_folder.py [--programs 100] [--constants 300] [--jobs 2] [--policies ...] [--out DIR]

Writes ``--programs`` synthetic programs (``toolkit.build.synthetic``: ``--constants`` per method, 2-4
methods each, drawn per program) into a folder under /tmp, then runs the CLI's ``scan`` on it
exactly as ``python -m toolkit scan FOLDER`` does (its worker processes, ``--jobs`` of them),
in a fresh process, and prints its wall-clock seconds, seconds per program and microseconds
per decision (programs x policies x constants), and the host's load average (on a shared
host, a load above its core count means the scan waited for the CPU).  Writes
results/scan_folder/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common
import pandas as pd


def main(argv=None) -> pd.DataFrame:
    from toolkit.build.synthetic import SyntheticSpec, write_synthetic
    from toolkit.core.policies import POLICIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--constants", type=int, default=300, help="per method")
    ap.add_argument("--jobs", type=int, default=2, help="scan's worker processes (the 2-core host: 2)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (default: every policy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="constshare-scan-", dir="/tmp"))
    try:
        methods = []
        for i in range(args.programs):
            n = rng.randint(2, 4)
            methods.append(n)
            write_synthetic(
                SyntheticSpec(methods=n, constants=args.constants, seed=i, name=f"p{i:03d}", hidden=256),
                folder / f"p{i:03d}",
            )
        policies = args.policies.split(",")
        decisions = sum(methods) * args.constants * len(policies)
        print(
            f"{args.programs} programs ({sum(methods)} methods, {args.constants} constants each) written to "
            f"{folder}; scan under {len(policies)} policies, {args.jobs} jobs",
            flush=True,
        )
        t = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "toolkit",
                "scan",
                str(folder),
                "--policies",
                args.policies,
                "--jobs",
                str(args.jobs),
                "--csv",
                str(folder / "scan.csv"),
            ],
            cwd=_common.REPO,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t
        if proc.returncode not in (0, 1):  # 1: some method would fail the gate, as synthetic collisions do
            raise RuntimeError(f"scan failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
        rows = pd.read_csv(folder / "scan.csv")
        assert rows["path"].nunique() == args.programs, "scan did not read every program"
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    df = pd.DataFrame(
        [
            {
                "programs": args.programs,
                "methods": sum(methods),
                "constants_per_method": args.constants,
                "policies": len(policies),
                "decisions": decisions,
                "jobs": args.jobs,
                "scan_exit_code": proc.returncode,
                "rows": len(rows),
                "wall_s": round(wall, 3),
                "load_average_1min": round(load, 2),
                "wall_s_per_program": round(wall / args.programs, 4),
                "wall_us_per_decision": round(wall / decisions * 1e6, 2),
            }
        ]
    )
    path = _common.write_results("scan_folder", df, args.out)
    r = df.iloc[0]
    print(
        f"scan of {args.programs} programs x {len(policies)} policies ({decisions:,} decisions, exit "
        f"{proc.returncode}): {r.wall_s:.1f} s wall ({r.wall_s_per_program:.3f} s per program, "
        f"{r.wall_us_per_decision:.1f} us per decision), load average {load:.1f} on {os.cpu_count()} cores; "
        f"written to {path}"
    )
    return df


if __name__ == "__main__":
    main()
