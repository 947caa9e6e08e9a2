"""A dry run of a synthetic program of N methods: whether a dry run stays linear in the number of methods.

    python benchmarks/probes/many_methods_dry_run.py N [-c] [-p]

``-c``: every method holds one constant of one FQN (all shared, so the shared cache's entry has N users);
without it the methods hold no constants.  ``-p``: print a profile (cumulative time, 20 rows) instead of
only the seconds.  The program exists only in memory (no files); prints the seconds of
``dry_run(program, "fingerprint").session.verdict()``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from toolkit.core.model import ConstantSpec, MethodSpec, Program
from toolkit.core.vocab import ConstantKind
from toolkit.workflows.dry_run import dry_run


def program(n: int, shared_constant: bool) -> Program:
    c = ConstantSpec(
        name="w",
        fqn="w",
        kind=ConstantKind.PARAMETER,
        mutated=False,
        dtype="float32",
        shape=(4,),
        strides=(1,),
        storage_offset=0,
        nbytes=16,
        offset=0,
        digest="0" * 64,
        file="blob.bin",
    )
    methods = tuple(
        MethodSpec(
            name=f"m{i}",
            so_file="a.so",
            blob_file="blob.bin",
            reference_file="",
            blob_bytes=16,
            num_inputs=1,
            num_outputs=1,
            constants=(c,) if shared_constant else (),
        )
        for i in range(n)
    )
    return Program(name="many", description="", device="cpu", torch_version="2.13", created_utc="", methods=methods)


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", type=int)
    ap.add_argument("-c", "--shared-constant", action="store_true", help="one constant of one FQN in every method")
    ap.add_argument("-p", "--profile", action="store_true", help="print a profile (cumulative time)")
    args = ap.parse_args(argv)
    p = program(args.methods, args.shared_constant)
    t = time.perf_counter()
    if args.profile:
        with tempfile.TemporaryDirectory() as d:
            out = str(Path(d) / "many_methods.prof")
            cProfile.runctx("dry_run(p, 'fingerprint').session.verdict()", globals(), {"p": p}, out)
            pstats.Stats(out).sort_stats("cumtime").print_stats(20)
    else:
        dry_run(p, "fingerprint").session.verdict()
    seconds = time.perf_counter() - t
    print(f"{args.methods} methods: {seconds:.2f} s")
    return seconds


if __name__ == "__main__":
    main()
