"""Greedy generation through a real KV cache under every policy (sample ``llama_static_cache``).

    python benchmarks/generation.py [--device cuda|cpu] [--policies a,b] [--runs 20] [--out [DIR]]

Builds (once, cached in ``~/.cache/constshare`` or ``$CONSTSHARE_CACHE``) the sample for the
device (CUDA if torch sees one, else the CPU), then per policy, in this one process: loads it,
verifies each method alone (``standalone``: state reset first) and the ``generate`` sequence
(``sequence``: prefill, then 4 greedy decodes, state carried), runs ``generate`` once more from
the initial state to compare the greedy tokens with eager's exactly, and times it ``--runs``
times (state reset before each run; CUDA synchronized around every step; inputs already on the
device).  The same steps run on the eager modules (the sample's own, on the device) as a
baseline row.

Prints one row per policy: standalone ok, sequence ok, the sequence's wrong steps, the
tokens and whether they equal eager's, the median time of prefill and of one decode step
(and their minimum), and what the load shared.  ``--out`` writes generation.csv (one row per
policy, machine columns appended) into DIR, by default ``benchmarks/results/<UTC date>/``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
import time
import warnings

import _common  # noqa: F401  (puts the repository on sys.path)
import pandas as pd
import torch

import toolkit
from toolkit.samples import build_sample, sample_module
from toolkit.verification import read_sequence_reference

SAMPLE = "llama_static_cache"
SEQUENCE = "generate"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(step_fns, device: str, runs: int, reset) -> dict[str, list[float]]:
    """Seconds of every step, ``runs`` times over, state reset before each run: {'prefill': [...], 'decode': [...]}."""
    times: dict[str, list[float]] = {"prefill": [], "decode": []}
    reset()
    for _method, fn in step_fns:  # one untimed warm-up run
        fn()
    for _ in range(runs):
        reset()
        for method, fn in step_fns:
            _sync(device)
            t = time.perf_counter()
            fn()
            _sync(device)
            times.setdefault(method, []).append(time.perf_counter() - t)
    return times


def _summary(times: dict[str, list[float]]) -> dict[str, float]:
    out = {}
    for method in ("prefill", "decode"):
        xs = times.get(method) or [float("nan")]
        out[f"{method}_ms_median"] = 1e3 * statistics.median(xs)
        out[f"{method}_ms_min"] = 1e3 * min(xs)
    return out


def eager_row(device: str, steps, want: list[int], runs: int) -> dict:
    mod = sample_module(SAMPLE)
    core = mod.core().to(device)
    fns = {"prefill": mod.Prefill(core), "decode": mod.Decode(core)}
    initial = {n: b.detach().clone() for n, b in core.named_buffers()}

    def reset():
        with torch.no_grad():
            for n, b in core.named_buffers():
                b.copy_(initial[n])

    dev_steps = [(m, [x.to(device) for x in inputs]) for m, inputs, _ref in steps]
    with torch.no_grad():
        reset()
        got = [int(fns[m](*inputs)[1].reshape(-1)[0]) for m, inputs in dev_steps]
        times = _timed([(m, (lambda m=m, i=inputs: fns[m](*i))) for m, inputs in dev_steps], device, runs, reset)
    return {"policy": "eager (modules)", "loaded": True, "standalone_ok": pd.NA, "sequence_ok": got == want,
            "wrong_steps": "", "tokens": " ".join(map(str, got)), "tokens_equal_eager": got == want,
            **_summary(times), "shared": pd.NA, "private": pd.NA, "declined": pd.NA, "error": ""}


def policy_row(program, policy: str, device: str, steps, want: list[int], runs: int) -> dict:
    row = {"policy": policy, "loaded": False, "standalone_ok": pd.NA, "sequence_ok": pd.NA, "wrong_steps": "",
           "tokens": "", "tokens_equal_eager": pd.NA, "shared": pd.NA, "private": pd.NA, "declined": pd.NA,
           "error": "", **_summary({})}
    s = toolkit.load_program(program, policy, device=device)
    try:
        d = s.decisions
        row.update(loaded=s.status == "loaded", error=s.error or "", shared=int((d["decision"] == "shared").sum()),
                   private=int((d["decision"] == "private").sum()), declined=int((d["decision"] == "declined").sum()))
        if s.status != "loaded":
            return row
        v = s.verify()
        q = s.verify(sequence=SEQUENCE)
        row["standalone_ok"] = bool(v["ok"].fillna(False).all())
        row["sequence_ok"] = bool(q["ok"].fillna(False).all())
        row["wrong_steps"] = " ".join(f"{i}:{m}" for i, m, ok in zip(q["step"], q["method"], q["ok"])
                                  if ok is pd.NA or not bool(ok))
        dev_steps = [(m, [x.to(device) for x in inputs]) for m, inputs, _ref in steps]
        s.reset_state()
        got = [int(s.run(m, inputs)[1].reshape(-1)[0]) for m, inputs in dev_steps]
        row["tokens"] = " ".join(map(str, got))
        row["tokens_equal_eager"] = got == want
        row.update(_summary(_timed([(m, (lambda m=m, i=inputs: s.run(m, i))) for m, inputs in dev_steps],
                                   device, runs, s.reset_state)))
        s.reset_state()
        return row
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--policies", default=",".join(toolkit.POLICIES), help="comma-separated (default: all)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs of the whole sequence per policy")
    ap.add_argument("--out", nargs="?", const="", default=None,
                    help="write generation.csv here (no value: benchmarks/results/<UTC date>/)")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in toolkit.POLICIES]
    if unknown:
        ap.error(f"unknown policies {unknown}; known: {', '.join(toolkit.POLICIES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    warnings.filterwarnings("ignore", category=FutureWarning)

    t = time.perf_counter()
    program = build_sample(SAMPLE, device=args.device, progress=True)
    print(f"{SAMPLE} for {args.device}: {program.root} ({time.perf_counter() - t:.1f} s to build or open)", flush=True)
    steps = read_sequence_reference(program, SEQUENCE)
    want = [int(ref[1].reshape(-1)[0]) for _m, _i, ref in steps]
    print(f"eager's greedy tokens (prefill, then {len(steps) - 1} decodes): {' '.join(map(str, want))}", flush=True)

    rows = [eager_row(args.device, steps, want, args.runs)]
    for policy in policies:
        rows.append(policy_row(program, policy, args.device, steps, want, args.runs))
        r = rows[-1]
        print(f"  {policy:20s} standalone {r['standalone_ok']!s:5}  sequence {r['sequence_ok']!s:5}  "
              f"tokens {r['tokens']}  decode {r['decode_ms_median']:.3f} ms", flush=True)
    frame = pd.DataFrame(rows)
    frame.insert(1, "device", torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu")
    shown = frame[["policy", "loaded", "standalone_ok", "sequence_ok", "wrong_steps", "tokens", "tokens_equal_eager",
                   "prefill_ms_median", "decode_ms_median", "decode_ms_min", "shared", "private", "declined"]]
    print()
    print(f"policy x {{standalone, sequence}}: {SAMPLE} on {frame['device'].iloc[0]}, {args.runs} timed runs each, "
          f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        print(shown.to_string(index=False))
    if args.out is not None:
        out = args.out or _common.RESULTS / _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
        print(f"wrote {_common.write_csv(frame, 'generation.csv', out)}")
    # exit 1 when a policy that shares the cache does not give eager's tokens (no-sharing must not)
    bad = [r["policy"] for r in rows if (r["tokens_equal_eager"] is True) != (r["policy"] != "no-sharing")]
    if bad:
        print(f"unexpected token outcome under: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
