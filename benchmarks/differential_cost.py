"""What the differential oracle costs: one verification against the unshared load vs one
against the eager references, at the 16 GiB-per-method scale of ``llm_scale.py``.

    python benchmarks/differential_cost.py [--program-dir DIR] [--policy fingerprint] [--reuse | --build-only]
                                           [--out DIR]
                                           [llm_scale.py's --layers/--hidden/--ffn/--vocab/--dtype]

Builds llm_scale's Llama-8B-shaped prefill/decode program (16.5 GiB of bf16 constants per method),
then in one fresh process per oracle: loads it under ``--policy``,
and times ``verify()`` (each method alone) and ``verify(sequence="generate")`` with
``oracle="reference"`` and with ``oracle="unshared"`` (each method also loaded on its own bytes,
method by method, freed as it goes; the sequence's methods together, holding the intended
shared state), with the peak device bytes in use (driver level, polled every millisecond) above
what the loaded session held.  Prints the differential's time and peak as ratios of the reference
verification's, and of one method's constants; writes results/differential_cost/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import _common
import llm_scale
import pandas as pd
import torch

GIB = _common.GIB


def child(args) -> dict:
    from toolkit import load_program, open_program

    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)
    s = load_program(open_program(args.program_dir), args.policy)
    torch.cuda.synchronize(dev)
    held = llm_scale.Peak(dev).used()
    out = {"oracle": args.child, "policy": args.policy, "status": str(s.status), "held_bytes": held}
    for what, kw in (("alone", {}), ("sequence", {"sequence": "generate"})):
        gc.collect()
        torch.cuda.empty_cache()
        with llm_scale.Peak(dev) as pk:
            t = time.perf_counter()
            frame = s.verify(oracle=args.child, **kw)
            torch.cuda.synchronize(dev)
            out[f"{what}_s"] = time.perf_counter() - t
        out[f"{what}_peak_above_held_bytes"] = pk.peak - held
        records = frame.to_dict("records")
        out[f"{what}_wrong"] = sorted({str(r["method"]) for r in records if r["ok"] is not pd.NA and not r["ok"]})
        # each row's figures (a disagreement between the oracles is then read off the CSV, not guessed)
        out[f"{what}_rows"] = [
            {
                k: (None if r.get(k) is pd.NA else r.get(k))
                for k in ("method", "step", "draw", "ok", "max_abs_err", "atol", "rtol", "reason")
                if k in r
            }
            for r in records
        ]
    s.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    llm_scale.program_arguments(ap, "/tmp/llm_scale")
    ap.add_argument("--policy", default="fingerprint")
    ap.add_argument("--reuse", action="store_true", help="keep a program already built in --program-dir")
    ap.add_argument("--build-only", action="store_true", help="build the program and stop (then run with --reuse)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return None
    shape = llm_scale.program_argv(args)
    if not (args.reuse and (Path(args.program_dir) / "manifest.json").is_file()):
        built = _common.run_child(llm_scale.__file__, ["build", *shape], timeout=900)
        print(f"build: {built['build_seconds']:.0f} s", flush=True)
    if args.build_only:
        return None
    from toolkit import open_program

    per = max(sum(c.nbytes for c in m.constants) for m in open_program(args.program_dir).methods)
    mine = ["--program-dir", args.program_dir, "--policy", args.policy]
    rows = [_common.run_child(__file__, [oracle, *mine], timeout=600) for oracle in ("reference", "unshared")]
    ref, diff = rows
    print(
        f"one method's constants: {per / GIB:.2f} GiB; session under {args.policy!r} holds "
        f"{ref['held_bytes'] / GIB:.2f} GiB"
    )
    for what in ("alone", "sequence"):
        t, p = diff[f"{what}_s"] / ref[f"{what}_s"], diff[f"{what}_peak_above_held_bytes"]
        p_ref = ref[f"{what}_peak_above_held_bytes"]
        print(
            f"  {what:>8}: differential {diff[f'{what}_s']:.2f} s = {t:.2f} x the reference verification's "
            f"{ref[f'{what}_s']:.2f} s; peak above the session {p / GIB:.2f} GiB = {p / per:.2f} x one method's "
            f"constants (reference: {p_ref / GIB:.2f} GiB); peak device use "
            f"{(ref['held_bytes'] + p) / max(ref['held_bytes'] + p_ref, 1):.2f} x the reference's; "
            f"wrong: differential "
            f"{diff[f'{what}_wrong']}, eager reference {ref[f'{what}_wrong']}",
            flush=True,
        )
    df = pd.DataFrame(rows)
    df["method_constant_bytes"] = per
    for c in ("alone_wrong", "sequence_wrong", "alone_rows", "sequence_rows"):
        df[c] = df[c].map(lambda v: json.dumps(v, default=str))
    for r in rows:
        for what in ("alone", "sequence"):
            for x in r[f"{what}_rows"]:
                print(f"    {r['oracle']:>9} {what:>8} {x}", flush=True)
    print(f"written to {_common.write_results('differential_cost', df, args.out)}")
    return df


if __name__ == "__main__":
    main()
