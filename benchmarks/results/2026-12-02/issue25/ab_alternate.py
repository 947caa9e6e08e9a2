"""Base and branch alternated in one run: ``../../2026-12-01/issue25/ab_dry.py`` (best CPU us per decision of ``run_analysis``, every
event recorded) in a fresh process per tree, size and policy, the trees taking turns, ``--rounds`` times.

    python ab_alternate.py --base /tmp/base_tree --branch /work/wt/dryrun --out dry_run_base_vs_branch.jsonl

``--base`` / ``--branch``: folders holding a ``toolkit`` package (e.g. ``git archive 54c1cc3 toolkit | tar -x``).
Each line of the output: tree, round, load average, and ab_dry.py's figures.
"""
import argparse, json, os, subprocess, sys
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--base", required=True)
ap.add_argument("--branch", required=True)
ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
ap.add_argument("--policies", nargs="+", default=["fingerprint", "decline-on-mismatch"])
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--out", required=True)
a = ap.parse_args()
here = Path(__file__).resolve().parent
with open(a.out, "w") as f:
    for r in range(a.rounds):
        for k in a.sizes:
            for pol in a.policies:
                for tree, path in (("base", a.base), ("branch", a.branch)):
                    load = os.getloadavg()[0]
                    p = subprocess.run([sys.executable, str(here.parent.parent / "2026-12-01" / "issue25" / "ab_dry.py"), str(k), pol], capture_output=True,
                                       text=True, env={**os.environ, "PYTHONPATH": path}, check=True)
                    row = {"tree": tree, "round": r, "load_average_1min": load, **json.loads(p.stdout.splitlines()[-1])}
                    print(json.dumps(row), flush=True)
                    f.write(json.dumps(row) + "\n")
