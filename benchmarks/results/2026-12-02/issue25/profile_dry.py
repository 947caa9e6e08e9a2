"""cProfile of one run_analysis: ``PYTHONPATH=<tree> python profile_dry.py K POLICY [SORT]`` (SORT: tottime, cumulative)."""
import sys, time, cProfile, pstats, gc
from toolkit.build.synthetic import SyntheticSpec, generate
from toolkit.workflows.dry_run import run_analysis
k = int(sys.argv[1]); pol = sys.argv[2]
model = generate(SyntheticSpec(methods=2, constants=k))
run_analysis(generate(SyntheticSpec(methods=2, constants=500)), pol)
c = time.process_time(); a = run_analysis(model, pol); t = time.process_time() - c
print(pol, k, "us/decision", t / len(a.decisions) * 1e6, "events", len(a.session.log))
if len(sys.argv) > 3:
    pr = cProfile.Profile(); pr.enable(); run_analysis(model, pol); pr.disable()
    st = pstats.Stats(pr); st.sort_stats(sys.argv[3]).print_stats(45)
