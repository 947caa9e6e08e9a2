"""Helpers shared by the benchmark scripts: machine description, CSV output, formatting."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
if str(REPO) not in sys.path:  # run as `python benchmarks/x.py` from anywhere
    sys.path.insert(0, str(REPO))

GIB = 1 << 30
MIB = 1 << 20


def machine() -> dict[str, str]:
    """Where and when a figure was measured: goes into every CSV row."""
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "host_cpus": str(os.cpu_count()),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
        else:
            info["gpu"] = "none"
    except Exception:  # the scaling benchmark needs no torch
        info["torch"] = "n/a"
        info["gpu"] = "n/a"
    return info


def write_csv(frame, name: str, out_dir: str | Path | None = None) -> Path:
    """Write ``frame`` with the machine columns appended, columns in a fixed order."""
    out = Path(out_dir) if out_dir else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    frame = frame.copy()
    for k, v in machine().items():
        frame[k] = v
    path = out / name
    frame.to_csv(path, index=False)
    return path


def gib(n: float) -> str:
    return f"{n / GIB:.3f}"


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
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"child {Path(script).name} {args} failed (rc {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])
