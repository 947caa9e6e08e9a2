"""Dry run of a synthetic program of N methods: ``python many_methods_dry_run.py N [-c] [-p]``.

``-c``: every method holds one constant of one FQN (all shared); ``-p``: print a profile.
"""
import cProfile
import pstats
import sys
import time

from toolkit.workflows.dry_run import run_analysis
from toolkit.core.model import ConstantSpec, MethodSpec, Program
from toolkit.core.vocab import ConstantKind

n = int(sys.argv[1])
c = ConstantSpec(name="w", fqn="w", kind=ConstantKind.PARAMETER, mutated=False, dtype="float32", shape=(4,),
                 strides=(1,), storage_offset=0, nbytes=16, offset=0, digest="0" * 64, file="blob.bin")
methods = tuple(MethodSpec(name=f"m{i}", so_file="a.so", blob_file="blob.bin", reference_file="", blob_bytes=16,
                           num_inputs=1, num_outputs=1, constants=(c,) if "-c" in sys.argv else ()) for i in range(n))
p = Program(name="many", description="", device="cpu", torch_version="2.13", created_utc="", methods=methods)
t = time.perf_counter()
if "-p" in sys.argv:
    cProfile.run("run_analysis(p, 'fingerprint').session.verdict()", "/tmp/many_methods.prof")
    pstats.Stats("/tmp/many_methods.prof").sort_stats("cumtime").print_stats(20)
else:
    run_analysis(p, "fingerprint").session.verdict()
print(f"{n} methods: {time.perf_counter() - t:.2f} s")
