"""Two-GPU placement: prefill on cuda:0, decode on cuda:1, every policy, memory per device.

    python benchmarks/placement.py [--program-dir DIR] [--hidden 8192] [--out DIR]

Needs two CUDA devices (the nvidia-h200-x2 kind).  A cached tensor on cuda:0 cannot serve
a slot on cuda:1: ExecuTorch's metadata check compares device_index on the miss path
(decline, or refuse before #21959); on the all-hit path nothing is compared, and the
loader's out-of-bounds guard must stop the cross-device alias.  Per policy and device:
bytes added (cudaMemGetInfo), the floor M for that device, decisions by reason for decode,
wrong and not-runnable methods.  Writes results/placement/<date>-<machine>.csv.
"""

from __future__ import annotations

import argparse
import gc
import os

import _common
import _program
import pandas as pd
import torch

from toolkit import POLICIES, load_program
from toolkit.engine.frames import wrong_methods
from toolkit.workflows.dry_run import dry_run, memory_floor


def _in_use(d) -> int:
    free, total = torch.cuda.mem_get_info(d)
    return int(total - free)


def _settle(devs) -> dict[str, int]:
    gc.collect()
    for d in devs:
        torch.cuda.synchronize(d)
    torch.cuda.empty_cache()
    return {str(d): _in_use(d) for d in devs}


def measure(prog, policy: str, devs, placement: dict[str, str], floor, upload_path: str) -> list[dict]:
    names = prog.method_names
    base = _settle(devs)
    s = load_program(prog, policy, device=placement, check_integrity=False)
    after = {str(d): _in_use(d) for d in devs}
    v = s.verify()
    wrong = wrong_methods(v)
    not_runnable = [k for k, lm in s.methods.items() if not lm.runnable]
    d = s.decisions
    second = d[d["method"] == names[1]]
    reasons = second.groupby(["decision", "reason_code"]).size()
    pd_ = dry_run(prog, policy, device=placement).decisions
    cols = ["method", "name", "decision", "reason_code"]
    same = pd_[cols].astype(str).values.tolist() == d[cols].astype(str).values.tolist()
    status, error = s.status, s.error or ""
    s.close()
    del s, v
    left = _settle(devs)
    rows = []
    for dev in devs:
        k = str(dev)
        rows.append(
            {
                "policy": policy,
                "device": k,
                "status": status,
                "added_bytes": after[k] - base[k],
                "M_device_bytes": floor.by_device.get(k, 0),
                "added_over_M": round((after[k] - base[k]) / max(1, floor.by_device.get(k, 0)), 4),
                "not_returned_bytes": left[k] - base[k],
                "decode_decisions": "; ".join(f"{a}/{b}: {n}" for (a, b), n in reasons.items()),
                "wrong_methods": ";".join(wrong),
                "not_runnable": ";".join(not_runnable),
                "dry_run_matches": same,
                "error": error[:200],
                "upload_path": upload_path,
            }
        )
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program-dir", default=str(_common.REPO / ".cache" / "bench_prefill_decode"))
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print(f"placement: needs 2 CUDA devices, this machine has {torch.cuda.device_count()}: not run")
        return None
    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    for d in devs:
        torch.zeros(1, device=d)  # contexts exist before any baseline
    if args.child:  # one measured load in this fresh process
        import json

        from toolkit import open_program

        prog = open_program(args.program_dir)
        for d in devs:
            _program.warm_up(d, _program.hidden_of(prog))
        names = prog.method_names
        placement = {names[0]: "cuda:0", names[1]: "cuda:1"}
        rows = measure(
            prog,
            args.child,
            devs,
            placement,
            memory_floor(prog, device=placement),
            os.environ.get("CONSTSHARE_UPLOAD", "mapped"),
        )
        print(json.dumps({"rows": rows}, default=int))
        return None
    prog, _, _ = _program.build(args.program_dir, "cuda", args.hidden)
    names = prog.method_names
    floor = memory_floor(prog, device={names[0]: "cuda:0", names[1]: "cuda:1"})
    rows = []
    for policy in args.policies:
        flags = ["--program-dir", args.program_dir]
        try:
            got = _common.run_child(__file__, [policy, *flags])["rows"]
        except Exception as e:
            print(f"{policy}: {e}")
            continue
        rows.extend(got)
        r0, r1 = got
        print(
            f"{policy:>20}: {r0['status']:>6} cuda:0 +{r0['added_bytes'] / _common.GIB:.3f} GiB "
            f"(M {floor.by_device.get('cuda:0', 0) / _common.GIB:.3f}), cuda:1 "
            f"+{r1['added_bytes'] / _common.GIB:.3f} GiB (M {floor.by_device.get('cuda:1', 0) / _common.GIB:.3f}); "
            f"wrong [{r0['wrong_methods']}] not runnable [{r0['not_runnable']}]; dry run matches: "
            f"{r0['dry_run_matches']}; not returned {r0['not_returned_bytes'] + r1['not_returned_bytes']}\n"
            f"{'':>22}decode: {r0['decode_decisions']}",
            flush=True,
        )
    df = pd.DataFrame(rows)
    path = _common.write_results("placement", df, args.out)
    print(f"written to {path}")
    return df


if __name__ == "__main__":
    main()
