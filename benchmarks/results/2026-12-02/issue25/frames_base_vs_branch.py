"""Every table of a dry run, base against branch: the same rows, values and dtypes.

    python frames_base_vs_branch.py --base <folder holding 54c1cc3's toolkit> --branch /work/wt/dryrun

For every policy and three synthetic programs (3 methods of 0, 50 and 300 constants; collisions,
state, lifted constants; cuda and cpu placement) each tree, in its own process, writes its analysis,
decisions, lookups, comparisons, memory (without ``time_s``), events (without ``time_s`` and
``seconds``: clocks) and method-result frames and its findings; then they are compared
(``assert_frame_equal`` exactly, dtypes and ``repr`` of every value).  Prints the mismatches; exit 1 if any.
"""
import argparse, os, pickle, subprocess, sys, tempfile

DUMP = r'''
import pickle, sys
from toolkit import POLICIES
from toolkit.workflows.dry_run import run_analysis
from toolkit.build.synthetic import SyntheticSpec, generate
out = {}
for pol in POLICIES:
    for n, dev in ((0, "cuda"), (50, "cuda"), (300, "cpu")):
        spec = SyntheticSpec(methods=3, constants=n, content_collision=0.1, metadata_collision=0.1, mutated=0.1,
                             lifted=0.05, device=dev, seed=4)
        a = run_analysis(generate(spec), pol)
        s = a.session
        out[(pol, n)] = (a.decisions, s.decisions, s.lookups, s.comparisons, s.memory.drop(columns=["time_s"]),
                         s.events.drop(columns=["time_s", "seconds"], errors="ignore"), s.method_results,
                         [r.findings for r in s.results.values()])
pickle.dump(out, open(sys.argv[1], "wb"))
'''

ap = argparse.ArgumentParser()
ap.add_argument("--base", required=True)
ap.add_argument("--branch", required=True)
a = ap.parse_args()
import pandas as pd

got = {}
with tempfile.TemporaryDirectory() as tmp:
    for tree, path in (("base", a.base), ("branch", a.branch)):
        f = os.path.join(tmp, tree + ".pkl")
        subprocess.run([sys.executable, "-c", DUMP, f], check=True, cwd=tmp, env={**os.environ, "PYTHONPATH": path})
        got[tree] = pickle.load(open(f, "rb"))
bad = 0
for key, base in got["base"].items():
    for i, (x, y) in enumerate(zip(base, got["branch"][key])):
        try:
            if isinstance(x, pd.DataFrame):
                assert [str(t) for t in x.dtypes] == [str(t) for t in y.dtypes], "dtypes"
                pd.testing.assert_frame_equal(x, y, check_exact=True)
                for c in x.columns:
                    assert [repr(v) for v in x[c]] == [repr(v) for v in y[c]], c
            else:
                assert x == y
        except AssertionError as e:
            bad += 1
            print(key, i, str(e)[:300])
print(f"{bad} mismatches in {sum(len(v) for v in got['base'].values())} tables and finding lists")
sys.exit(1 if bad else 0)
