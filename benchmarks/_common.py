"""Helpers shared by the benchmark scripts: the machine a figure was measured on, where its CSV goes, formatting.

Every benchmark writes its rows with :func:`write_results` to ``results/<benchmark>/<YYYY-MM-DD>-<machine>.csv``:
the file name says when and on what kind of machine (``h200``, ``2xh200``, ``cpu-2core``), never on which host,
and every row carries the machine, the date and the torch version, so a CSV read on its own still says where its
figures come from.  A later run on the same day and machine replaces the file; older runs live in git history.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
if str(REPO) not in sys.path:  # run as `python benchmarks/x.py` from anywhere
    sys.path.insert(0, str(REPO))

GIB = 1 << 30
MIB = 1 << 20


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> tuple[int, str]:
    """(number of CUDA devices, the first one's name); (0, "none") without CUDA or torch."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), torch.cuda.get_device_name(0)
    except Exception:  # a CPU-only benchmark may run where torch is absent
        pass
    return 0, "none"


def machine_name() -> str:
    """A short, host-independent name of this kind of machine: ``h200``, ``2xh200``, ``cpu-2core``."""
    count, name = _gpus()
    if count:
        short = re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia ")).strip("-")
        return short if count == 1 else f"{count}x{short}"
    return f"cpu-{os.cpu_count()}core"


def machine() -> dict[str, str]:
    """Where and when a figure was measured: the columns appended to every CSV row."""
    count, gpu = _gpus()
    try:
        import torch

        torch_version = torch.__version__
    except Exception:  # the dry-run benchmarks need no torch
        torch_version = "n/a"
    return {
        "machine": machine_name(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu_model": cpu_model(),
        "host_cpus": str(os.cpu_count()),
        "gpu": f"{count}x {gpu}" if count else "none",
        "torch": torch_version,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def result_path(benchmark: str, suffix: str = ".csv", out: str | Path | None = None, tag: str | None = None) -> Path:
    """``<out>/<benchmark>/<YYYY-MM-DD>-<machine>[-<tag>]<suffix>`` (``out``: the results folder by default);
    the folder is created."""
    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    folder = Path(out) if out else RESULTS
    folder = folder / benchmark
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{day}-{machine_name()}{f'-{tag}' if tag else ''}{suffix}"


def write_results(benchmark: str, rows, out: str | Path | None = None, tag: str | None = None) -> Path:
    """Write ``rows`` (a DataFrame or a list of dicts) with the :func:`machine` columns appended to
    :func:`result_path`; return the path."""
    import pandas as pd

    frame = pd.DataFrame(rows).copy()
    for k, v in machine().items():
        frame[k] = v
    path = result_path(benchmark, ".csv", out, tag)
    frame.to_csv(path, index=False)
    return path


def gib(n: float) -> str:
    return f"{n / GIB:.3f}"


def byte_constant(name: str, offset: int, nbytes: int, digest: str = "", kind: str = "parameter"):
    """A ``uint8`` constant of ``nbytes`` bytes at ``offset`` of a blob: what the upload benchmarks stage."""
    from toolkit.core.model import ConstantSpec
    from toolkit.core.vocab import ConstantKind

    return ConstantSpec(
        name=name,
        fqn=name,
        kind=ConstantKind(kind),
        mutated=False,
        dtype="uint8",
        shape=(nbytes,),
        strides=(1,),
        storage_offset=0,
        nbytes=nbytes,
        offset=offset,
        digest=digest,
    )


def run_child(script: str | Path, args: list[str], timeout: float = 120) -> dict:
    """Run ``python script --child ... args`` in a fresh process; return the JSON it printed last.

    One process per measured load: the CUDA caching allocator of an earlier load in the same
    process would otherwise serve later allocations from its cached segments and hide them
    from cudaMemGetInfo, and whatever an earlier load failed to free would shift baselines.
    """
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(script), "--child", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"child {Path(script).name} {args} failed (rc {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])
