"""Greedy generation through a real KV cache under every policy (sample ``llama_static_cache``).

    python benchmarks/generation.py [--device cuda|cpu] [--policies a,b] [--runs 20] [--out [DIR]]

Builds (once, cached in ``~/.cache/constshare`` or ``$CONSTSHARE_CACHE``) the sample for the
device (CUDA if torch sees one, else the CPU), then per policy, in this one process: loads it,
verifies each method alone (``standalone``: state reset first) and each sequence
(``sequence``: ``generate`` is prefill then 4 greedy ``decode`` steps at explicit positions,
``generate_next`` the same with ``decode_next``, which takes its position from the cache's
counter; state carried), runs each sequence once more from the initial state to compare the
greedy tokens with eager's exactly, and times it ``--runs`` times (state reset before each
run, after one untimed warm-up; CUDA synchronized around every step; inputs already on the
device).  The same steps run on the eager modules (the sample's own, on the device) as
baseline rows.

Prints one row per (policy, sequence): standalone ok, sequence ok, the sequence's wrong
steps, the tokens and whether they equal eager's, the median time of prefill and of one
decode step (and the minimum), and what the load shared.  Exits 1 when a policy that shares
the cache does not reproduce eager's tokens, or no-sharing does.  ``--out`` writes
``generation/<date>-<machine>.csv`` (one row per policy and sequence, machine columns appended) into DIR,
by default ``benchmarks/results``.
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
from toolkit.build.samples import build_sample, sample_module
from toolkit.engine.verification import read_sequence_reference

SAMPLE = "llama_static_cache"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(step_fns, device: str, runs: int, reset) -> dict[str, list[float]]:
    """Seconds of every step, ``runs`` times over, state reset before each run, after one untimed
    warm-up run: {'prefill': [...], 'decode': [...]} (decode_next counts as a decode step)."""
    times: dict[str, list[float]] = {"prefill": [], "decode": []}
    reset()
    for _method, fn in step_fns:
        fn()
    for _ in range(runs):
        reset()
        for method, fn in step_fns:
            _sync(device)
            t = time.perf_counter()
            fn()
            _sync(device)
            times["prefill" if method == "prefill" else "decode"].append(time.perf_counter() - t)
    return times


def _summary(times: dict[str, list[float]]) -> dict[str, float]:
    out = {}
    for method in ("prefill", "decode"):
        xs = times.get(method) or [float("nan")]
        out[f"{method}_ms_median"] = 1e3 * statistics.median(xs)
        out[f"{method}_ms_min"] = 1e3 * min(xs)
    return out


def _blank(policy: str, sequence: str) -> dict:
    return {
        "policy": policy,
        "sequence": sequence,
        "loaded": False,
        "standalone_ok": pd.NA,
        "sequence_ok": pd.NA,
        "wrong_steps": "",
        "tokens": "",
        "tokens_equal_eager": pd.NA,
        **_summary({}),
        "shared": pd.NA,
        "private": pd.NA,
        "declined": pd.NA,
        "error": "",
    }


def eager_rows(device: str, references: dict, runs: int) -> list[dict]:
    """The same steps on the sample's own modules on ``device``: the baseline."""
    mod = sample_module(SAMPLE)
    core = mod.core().to(device)
    fns = {"prefill": mod.Prefill(core), "decode": mod.Decode(core), "decode_next": mod.DecodeNext(core)}
    initial = {n: b.detach().clone() for n, b in core.named_buffers()}

    def reset():
        with torch.no_grad():
            for n, b in core.named_buffers():
                b.copy_(initial[n])

    rows = []
    for sequence, (steps, want) in references.items():
        dev_steps = [(m, [x.to(device) for x in inputs]) for m, inputs, _ref in steps]
        with torch.no_grad():
            reset()
            got = [int(fns[m](*inputs)[1].reshape(-1)[0]) for m, inputs in dev_steps]
            times = _timed([(m, (lambda m=m, i=inputs: fns[m](*i))) for m, inputs in dev_steps], device, runs, reset)
        rows.append(
            {
                **_blank("eager (modules)", sequence),
                "loaded": True,
                "sequence_ok": got == want,
                "tokens": " ".join(map(str, got)),
                "tokens_equal_eager": got == want,
                **_summary(times),
            }
        )
    return rows


def policy_rows(program, policy: str, device: str, references: dict, runs: int) -> list[dict]:
    """One row per sequence: load once, verify each method alone and each sequence, compare the
    tokens, time the sequence."""
    s = toolkit.load_program(program, policy, device=device)
    try:
        d = s.decisions
        common = {
            "loaded": s.status == "loaded",
            "error": s.error or "",
            "shared": int((d["decision"] == "shared").sum()),
            "private": int((d["decision"] == "private").sum()),
            "declined": int((d["decision"] == "declined").sum()),
        }
        if s.status != "loaded":
            return [{**_blank(policy, q), **common} for q in references]
        common["standalone_ok"] = bool(s.verify()["ok"].fillna(False).all())
        rows = []
        for sequence, (steps, want) in references.items():
            row = {**_blank(policy, sequence), **common}
            q = s.verify(sequence=sequence)
            row["sequence_ok"] = bool(q["ok"].fillna(False).all())
            row["wrong_steps"] = " ".join(
                f"{i}:{m}" for i, m, ok in zip(q["step"], q["method"], q["ok"]) if ok is pd.NA or not bool(ok)
            )
            dev_steps = [(m, [x.to(device) for x in inputs]) for m, inputs, _ref in steps]
            s.reset_state()
            got = [int(s.run(m, inputs)[1].reshape(-1)[0]) for m, inputs in dev_steps]
            row["tokens"] = " ".join(map(str, got))
            row["tokens_equal_eager"] = got == want
            row.update(
                _summary(
                    _timed(
                        [(m, (lambda m=m, i=inputs: s.run(m, i))) for m, inputs in dev_steps],
                        device,
                        runs,
                        s.reset_state,
                    )
                )
            )
            s.reset_state()
            rows.append(row)
        return rows
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--policies", default=",".join(toolkit.POLICIES), help="comma-separated (default: all)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs of the whole sequence per policy")
    ap.add_argument(
        "--out",
        nargs="?",
        const="",
        default=None,
        help="write the CSV into this results folder (no value: benchmarks/results)",
    )
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
    references = {}
    for q in program.sequences:
        steps = read_sequence_reference(program, q.name)
        references[q.name] = (steps, [int(ref[1].reshape(-1)[0]) for _m, _i, ref in steps])
        print(
            f"{q.name}: {' -> '.join(st.method for st in q.steps)}; eager's greedy tokens "
            f"{' '.join(map(str, references[q.name][1]))}",
            flush=True,
        )

    rows = eager_rows(args.device, references, args.runs)
    for policy in policies:
        rows.extend(policy_rows(program, policy, args.device, references, args.runs))
        for r in rows[-len(references) :]:
            print(
                f"  {policy:20s} {r['sequence']:14s} standalone {r['standalone_ok']!s:5}  sequence "
                f"{r['sequence_ok']!s:5}  tokens {r['tokens']}  decode {r['decode_ms_median']:.3f} ms",
                flush=True,
            )
    frame = pd.DataFrame(rows)
    frame.insert(2, "device", torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu")
    shown = frame[
        [
            "policy",
            "sequence",
            "loaded",
            "standalone_ok",
            "sequence_ok",
            "wrong_steps",
            "tokens",
            "tokens_equal_eager",
            "prefill_ms_median",
            "decode_ms_median",
            "decode_ms_min",
            "shared",
            "private",
            "declined",
        ]
    ]
    print()
    print(
        f"policy x {{standalone, sequence}}: {SAMPLE} on {frame['device'].iloc[0]}, {args.runs} timed runs each, "
        f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        print(shown.to_string(index=False))
    if args.out is not None:
        print(f"wrote {_common.write_results('generation', frame, args.out or None)}")
    # exit 1 when a policy that shares the cache does not give eager's tokens (no-sharing must not)
    bad = sorted({r["policy"] for r in rows if (r["tokens_equal_eager"] is True) != (r["policy"] != "no-sharing")})
    if bad:
        print(f"unexpected token outcome under: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
