"""Whether the device digest's warm-up can hide behind a load: verified staging alone, and with
Triton imported (and the kernels loaded) in a thread beside it.

    python benchmarks/probes/warm_up_stall.py [--gib 0.5] [--device cpu|cuda] [--threads 1,2] [--runs 3] [--out DIR]

Each measurement is a fresh process (Triton must not be imported yet): one batch staged first (slots
pinned, pages touched, a 64 MiB-piece BLAKE3 record of a random blob in the page cache), then the
timed batch with the digest on the host, either alone (``alone``) or while a thread imports Triton
and the BLAKE3 kernels (``beside the import``); also the import alone in a fresh process.  Printed:
the staging's time both ways, the difference, and the import's own time.  A difference near the
import's time means the import stalls the staging threads for its whole length (importing Triton
loads a 500 MB shared library and unmarshals large modules, each one long call holding the GIL),
so a background warm-up costs the load what it was meant to hide.

Writes results/warm_up_stall/<date>-<machine>.csv into ``--out`` (else $OUT, else benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common  # noqa: E402

CHILD = """
import json, sys, threading, time
sys.path.insert(0, sys.argv[5])
import torch
import _common
from toolkit.integrity.records import file_record
from toolkit.upload.staging import stage_pieces

path, how, threads, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), torch.device(sys.argv[4])
if how == "import alone":
    t = time.perf_counter()
    import triton, toolkit.integrity.blake3_kernels
    print(json.dumps({"seconds": time.perf_counter() - t}))
    sys.exit(0)
size = __import__("os").path.getsize(path)
rec = file_record(path, 64 << 20)
specs = [_common.byte_constant(f"c{i}", at, min(64 << 20, size - at)) for i, at in enumerate(range(0, size, 64 << 20))]

def stage():
    outs = stage_pieces(path, rec, specs, device, threads=threads, device_digest=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return outs

stage()  # slots, pages and streams exist before the timed batch
beside = None
if how == "beside the import":
    beside = threading.Thread(target=lambda: (__import__("triton"), __import__("toolkit.integrity.blake3_kernels")))
    beside.start()
t = time.perf_counter()
stage()
seconds = time.perf_counter() - t
if beside is not None:
    beside.join()
print(json.dumps({"seconds": seconds, "bytes": size}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    fd, name = tempfile.mkstemp(prefix="warm-up-stall-", suffix=".bin")
    with os.fdopen(fd, "wb") as f:
        for _ in range(max(1, int(a.gib * 16))):
            f.write(os.urandom(64 << 20))
    bench = str(Path(__file__).resolve().parents[1])
    rows = []

    def child(how: str, threads: int) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, name, how, str(threads), a.device, bench],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            raise SystemExit(f"{how}: the child failed:\n{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    try:
        imports = [child("import alone", 1)["seconds"] for _ in range(a.runs)]
        rows += [{"what": "import alone", "seconds": s, "threads": None, "run": i} for i, s in enumerate(imports)]
        for threads in (int(x) for x in a.threads.split(",")):
            got: dict[str, list[float]] = {"alone": [], "beside the import": []}
            for run in range(a.runs):
                for how in got:  # alternating, so drift hits both alike
                    r = child(how, threads)
                    got[how].append(r["seconds"])
                    rows.append({"what": how, "threads": threads, "run": run, **r})
            alone, beside = statistics.median(got["alone"]), statistics.median(got["beside the import"])
            print(
                f"threads {threads}: staging alone {alone * 1e3:.0f} ms, beside the import {beside * 1e3:.0f} ms "
                f"(+{(beside - alone) * 1e3:.0f} ms); the import alone {statistics.median(imports) * 1e3:.0f} ms",
                flush=True,
            )
    finally:
        os.unlink(name)
    out = _common.write_results("warm_up_stall", rows, a.out or os.environ.get("OUT"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
