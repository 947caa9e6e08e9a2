"""Verification, blame and the state reset at language-model scale.

    python benchmarks/verify_blame_scale.py [--program-dir DIR] [--layers 32 --hidden 4096 --ffn 14336
                                            --vocab 128256] [--culprit blocks.1.w2] [--device cuda]
                                            [--out DIR] [--reuse] [--no-pte]

The program is ``llm_scale.py``'s (built on the device by the same child, ``--compute float32`` so
verification compares float32 kernels) with one culprit: decode's ``--culprit`` weight holds other
data than prefill's, so a policy sharing by name alone (``name-only``) makes decode wrong.
Measured, in one run, each against its own reference:

* per method: ``verify()`` of that method alone against the method's own run (median of 3);
* the reset after a method ran alone and after the ``generate`` sequence (no reset runs between
  a sequence's steps: the state carries): bytes rewritten against every constant's bytes (what a
  reset of a program that does not record mutation rewrote before), under ``fingerprint``; and
  the same program loaded as if it did not record mutation (a ``.pte``'s case), where the reset
  checksums on the device what ran and rewrites what changed;
* ``blame()`` of decode under ``name-only`` (one culprit among every shared constant): seconds
  and experiments against one verification of decode; once as ``Session.blame`` runs it
  (suspects whose recorded sha256 matches cleared first), once group-testing every shared constant;
* the same on real ``.pte`` files of ExecuTorch 1.5.1 (CUDA only): ``llama_prefill_decode``
  (verify, reset), ``total_collision`` (blame of the wrong method), ``shared_state`` (blame of the
  ``generate`` sequence under ``no-sharing``).

Writes results/verify_blame_scale/<date>-<machine>.csv (one row per figure) into ``--out``, else ``$OUT``, else
benchmarks/results.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import _common
import llm_scale
import torch

rows: list[dict] = []


def record(
    program: str,
    policy: str,
    what: str,
    value: float,
    unit: str,
    against: float | None = None,
    against_what: str = "",
    **extra,
) -> None:
    ratio = value / against if against else None
    rows.append(
        {
            "program": program,
            "policy": policy,
            "what": what,
            "value": value,
            "unit": unit,
            "against": against,
            "against_what": against_what,
            "ratio": ratio,
            **extra,
        }
    )
    shown = f" = {ratio:.3f} x {against_what}" if ratio is not None else ""
    print(f"  {program:>22} {policy:>12}  {what}: {value:.4g} {unit}{shown}", flush=True)


def timed(fn, repeat: int = 3) -> float:
    """Median seconds of ``fn()`` (synchronised) after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def unique_bytes(s) -> int:
    """Bytes of every distinct constant tensor the load holds (what a full reset rewrites)."""
    seen = {}
    for lm in s.methods.values():
        for c in lm.spec.constants:
            t = lm.tensors.get(c.name)
            if t is not None:
                seen[id(t)] = c.nbytes
    return sum(seen.values())


def measure_verify_and_reset(label: str, program, policy: str, sequence: str | None) -> None:
    from toolkit import load_program
    from toolkit.engine import verification

    s = load_program(program, policy)
    assert s.status == "loaded", s.error
    every = unique_bytes(s)
    for m in s.methods:
        inputs, _ = s.reference(m)
        run_s = timed(lambda: s.run(m, inputs))
        verify_s = timed(lambda: verification.verify_session(s, methods=[m]))
        record(label, policy, f"verify {m}", verify_s, "s", run_s, f"the run of {m}")
        s.reset_state()
        s.run(m, inputs)
        before = dataclasses.replace(s.resets)
        t = time.perf_counter()
        s.reset_state()
        reset_s = time.perf_counter() - t
        record(
            label,
            policy,
            f"reset after {m} alone: bytes rewritten",
            s.resets.bytes_rewritten - before.bytes_rewritten,
            "B",
            every,
            "every constant's bytes",
            bytes_checked=s.resets.bytes_checked - before.bytes_checked,
            reset_s=reset_s,
        )
    if sequence:
        seq_s = timed(lambda: verification.verify_sequence(s, sequence), repeat=1)
        ok = bool(verification.verify_sequence(s, sequence)["ok"].all())
        before = dataclasses.replace(s.resets)
        s.reset_state()
        record(
            label,
            policy,
            f"reset after the {sequence!r} sequence: bytes rewritten",
            s.resets.bytes_rewritten - before.bytes_rewritten,
            "B",
            every,
            "every constant's bytes",
            bytes_checked=s.resets.bytes_checked - before.bytes_checked,
            sequence_s=seq_s,
            sequence_ok=ok,
        )
    s.close()


def measure_blame(label: str, program, policy: str, sequence: str | None, expected: set | None = None) -> None:
    from toolkit import load_program
    from toolkit.engine import blame as blame_ops
    from toolkit.engine import verification

    s = load_program(program, policy)
    assert s.status == "loaded", s.error
    v = s.verify(sequence=sequence)
    wrong = sorted(v.loc[v["ok"] == False, "method"])  # noqa: E712 (nullable booleans)
    if not wrong:
        print(f"  {label}: nothing wrong under {policy} ({sequence or 'alone'}): no blame to measure", flush=True)
        s.close()
        return
    one = timed(
        lambda: (
            verification.verify_session(s, methods=wrong[:1])
            if sequence is None
            else verification.verify_sequence(s, sequence)
        ),
        repeat=1,
    )
    for how, clear in (("as Session.blame runs it", True), ("every shared constant a suspect", False)):
        t = time.perf_counter()
        b = blame_ops.blame(s, sequence, v, clear_same_bytes=clear)
        sec = time.perf_counter() - t
        culprits = set(zip(b[b["fixes"]]["method"], b[b["fixes"]]["fqn"]))
        found = expected is None or culprits == expected
        what = f"blame {sequence or wrong[0]} ({how})"
        record(
            label,
            policy,
            what,
            sec,
            "s",
            one,
            f"one verification of {sequence or wrong[0]}",
            experiments=b.attrs["experiments"],
            suspects=len(b),
            culprits=";".join(sorted(map("/".join, culprits))),
            culprit_found=found,
        )
        record(label, policy, what + ": experiments", b.attrs["experiments"], "verifications", len(b), "suspects")
        if not found:
            print(f"  blame found {culprits or 'no culprit'}, expected {expected}", flush=True)
    s.close()


def pte_programs() -> Path | None:
    sys.path.insert(0, str(_common.REPO / "tests"))
    from executorch_fixtures import unpacked

    root = unpacked("1.5.1")
    return root if (root / "llama_prefill_decode" / "prog.pte").is_file() else None


def main(argv=None):
    from toolkit import open_program

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    llm_scale.program_arguments(ap, "/tmp/verify_blame_scale", compute="float32", culprit="blocks.1.w2")
    ap.add_argument(
        "--out", default=os.environ.get("OUT"), help="results folder (default $OUT, else benchmarks/results)"
    )
    ap.add_argument("--reuse", action="store_true", help="keep a program already built in --program-dir")
    ap.add_argument("--no-pte", action="store_true", help="skip the ExecuTorch .pte programs")
    ap.add_argument("--build-timeout", type=float, default=420)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if not (args.reuse and (Path(args.program_dir) / "manifest.json").is_file()):
        built = _common.run_child(
            llm_scale.__file__, ["build", *llm_scale.program_argv(args)], timeout=args.build_timeout
        )
        print(
            f"build: {built['build_seconds']:.1f} s, {max(built['method_constant_bytes'].values()) / _common.GIB:.2f}"
            f" GiB of constants per method",
            flush=True,
        )
    prog = open_program(args.program_dir)
    n = len(prog.methods[0].constants)
    print(f"8B-shaped program: {n} constants per method; culprit decode/core.{args.culprit}", flush=True)
    label = f"llm_scale {args.layers}L"
    steps = [
        (measure_verify_and_reset, label, lambda: prog, "fingerprint", "generate"),
        (
            measure_verify_and_reset,
            label + " as a .pte",
            lambda: dataclasses.replace(prog, records_mutation=False),
            "fingerprint",
            "generate",
        ),
        (measure_blame, label, lambda: prog, "name-only", None, {("decode", f"core.{args.culprit}")}),
    ]
    pte = None if args.no_pte or args.device == "cpu" else pte_programs()
    if pte is not None:
        steps += [
            (
                measure_verify_and_reset,
                "pte llama_prefill_decode",
                lambda: open_program(pte / "llama_prefill_decode"),
                "fingerprint",
                None,
            ),
            (measure_blame, "pte total_collision", lambda: open_program(pte / "total_collision"), "name-only", None),
            (measure_blame, "pte shared_state", lambda: open_program(pte / "shared_state"), "no-sharing", "generate"),
            (
                measure_verify_and_reset,
                "pte shared_state",
                lambda: open_program(pte / "shared_state"),
                "fingerprint",
                "generate",
            ),
        ]
    elif args.device != "cpu":
        print("the ExecuTorch fixtures are not here: the .pte part was not run", flush=True)
    for fn, name, opened, *rest in steps:
        try:
            fn(name, opened(), *rest)
        except Exception as e:  # keep the other measurements
            print(f"  {name}: {fn.__name__} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"program": name, "what": f"{fn.__name__} failed", "error": str(e)[:300]})
        path = _common.write_results("verify_blame_scale", rows, args.out)  # a cut-short run keeps it
    print(f"written to {path} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
