"""The event log's bytes of one dry-run load (fingerprint, 2 methods of K constants): what tracemalloc sees freed
when the log alone is dropped.  ``PYTHONPATH=<tree> python event_log_memory.py K`` (one JSON line)."""
import gc, tracemalloc, sys, json
from toolkit.build.synthetic import SyntheticSpec, generate
from toolkit.engine.loader import resolve_devices
from toolkit.engine.session import Session
from toolkit.core.policies import get_policy
from toolkit.runtimes.dry_run import DryRunRuntime
from toolkit.core.events import EventLog
import toolkit
k = int(sys.argv[1]); model = generate(SyntheticSpec(methods=2, constants=k)); n = 2 * k
tracemalloc.start(); gc.collect()
rt = DryRunRuntime()
s = Session(model, get_policy("fingerprint"), resolve_devices(model, None, rt), check_integrity=False, runtime=rt).load()
events = len(s.log); log, s.log = s.log, EventLog(); gc.collect()
before = tracemalloc.get_traced_memory()[0]; del log; gc.collect(); after = tracemalloc.get_traced_memory()[0]
print(json.dumps({"toolkit": toolkit.__file__, "k": k, "events": events, "log_bytes_per_event": round((before - after) / events, 1),
                  "log_bytes_per_decision": round((before - after) / n, 1)}))
