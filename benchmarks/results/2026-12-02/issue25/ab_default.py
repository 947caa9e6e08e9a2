"""Paired default-path loads, alternated in one run (this host is shared: pairing beats noise).

    python ab_default.py ROUNDS LABEL=TOOLKIT_ROOT:PROGRAM_DIR[:ENV=VALUE,...] ...

Each round runs, in a fresh process each and in turn, ``benchmarks/default_path.py --child
default`` (one whole ``load_program(dir, "fingerprint")``, integrity on) for every LABEL, with
TOOLKIT_ROOT first on PYTHONPATH and the given environment variables set, then the same with
``--child "integrity off"`` for the first LABEL.  Prints one JSON line per load and the median
seconds per label.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "benchmarks" / "default_path.py"


def child(setting, root, prog, env):
    e = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([root, str(REPO)])}
    out = subprocess.run([sys.executable, str(SCRIPT), "--child", setting, "--program-dir", prog, "--device", "cpu"],
                         capture_output=True, text=True, env=e, timeout=600)
    got = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    stray = [f for f in got["modules"].values() if not f.startswith(root)]
    assert not stray and got["status"] == "loaded", (stray[:3], got["status"], got["error"])
    return got


def main():
    rounds, specs = int(sys.argv[1]), []
    for arg in sys.argv[2:]:
        label, rest = arg.split("=", 1)
        parts = rest.split(":")
        env = dict(kv.split("=", 1) for kv in parts[2].split(",")) if len(parts) > 2 and parts[2] else {}
        specs.append((label, parts[0], parts[1], env))
    secs: dict[str, list[float]] = {}
    for r in range(rounds):
        runs = [(label, "default", root, prog, env) for label, root, prog, env in specs]
        runs.append((specs[0][0] + " integrity off", "integrity off", specs[0][1], specs[0][2], specs[0][3]))
        for label, setting, root, prog, env in (runs if r % 2 == 0 else runs[::-1]):
            got = child(setting, root, prog, env)
            secs.setdefault(label, []).append(got["seconds"])
            print(json.dumps({"round": r, "label": label, "seconds": round(got["seconds"], 4),
                              "bytes": got["bytes"], "toolkit": root, "program_dir": prog, "env": env}), flush=True)
    for label, v in secs.items():
        print(json.dumps({"label": label, "median_seconds": round(statistics.median(v), 4), "runs": len(v)}))


if __name__ == "__main__":
    main()
