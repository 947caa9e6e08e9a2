import sys, time, json
from toolkit.build.synthetic import SyntheticSpec, generate
from toolkit.workflows.dry_run import run_analysis
import toolkit
k = int(sys.argv[1]); pol = sys.argv[2]
model = generate(SyntheticSpec(methods=2, constants=k))
run_analysis(generate(SyntheticSpec(methods=2, constants=500)), pol)
best = 1e9
for _ in range(2):
    c = time.process_time(); a = run_analysis(model, pol); best = min(best, time.process_time() - c)
print(json.dumps({"toolkit": toolkit.__file__, "k": k, "policy": pol, "us": best / len(a.decisions) * 1e6, "events": len(a.session.log)}))
