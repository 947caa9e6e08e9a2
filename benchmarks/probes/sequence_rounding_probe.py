"""Why the eager reference and the differential oracle can disagree on ``generate``.

    python benchmarks/probes/sequence_rounding_probe.py [--program-dir DIR] [llm_scale.py's shape options]
                                                       [--policy fingerprint] [--out DIR]

``differential_cost.py`` at the 16.5 GiB-per-method scale (``--compute float32``) can see, under
``fingerprint``, the eager reference call decode wrong in the ``generate`` sequence (prefill, decode,
decode) while the differential oracle calls it right, and both call every method right alone
(benchmarks/RESULTS.md).  Two readings are possible:

* **sharing broke**: at run time decode does not read the cache prefill filled (both loads of the
  differential oracle would then be equally wrong, and agree);
* **rounding**: the cache is a bfloat16 buffer that prefill fills from a float32 activation; where the
  compiled kernels' float32 value and eager's lie on either side of a bfloat16 rounding boundary, the
  stored element differs by one bfloat16 step (2**-8 relative), which no float32 tolerance absorbs,
  and decode adds that row to its output.

This probe tells them apart on one program, measured, not guessed: it loads the program under
``--policy``, checks that prefill's and decode's cache slots are one device tensor, runs compiled
prefill and eager prefill on the same prompt, counts the cache elements that differ and by how many
bfloat16 steps, and runs eager decode twice: on eager's cache and on the *compiled* cache.  If the
compiled decode output matches eager decode on the compiled cache (to float32 tolerance) but not on
eager's cache, the sequence error is the cache's rounding, and the differential oracle's "right" is
right.  Writes results/sequence_rounding_probe/<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers and llm_scale

import _common  # noqa: E402
import llm_scale  # noqa: E402
import torch  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    llm_scale.program_arguments(ap, "/tmp/sequence_rounding_probe", compute="float32", culprit="blocks.1.w2")
    ap.set_defaults(layers=32, hidden=1024, ffn=3584, vocab=32000)
    ap.add_argument("--policy", default="fingerprint")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--out", default=None, help="results folder (default $OUT, else benchmarks/results)")
    args = ap.parse_args(argv)
    if not (args.reuse and (Path(args.program_dir) / "manifest.json").is_file()):
        t = time.perf_counter()
        llm_scale.child_build(args)
        print(f"build: {time.perf_counter() - t:.1f} s", flush=True)

    from toolkit import load_program, open_program

    s = load_program(open_program(args.program_dir), args.policy)
    slot = {m: next(c.name for c in lm.spec.constants if c.fqn == "core.cache") for m, lm in s.methods.items()}
    cache = {m: s.methods[m].tensors[slot[m]] for m in s.methods}
    one_tensor = cache["prefill"].data_ptr() == cache["decode"].data_ptr()

    ms, seq = llm_scale.methods(args)  # the eager modules, the same seeds as the build
    (prompt,), (token,) = seq["generate"][0][1], seq["generate"][1][1]
    eager_prefill, eager_decode = ms["prefill"][0], ms["decode"][0]
    with torch.no_grad():
        s.reset_state()
        compiled_prefill_out = s.run("prefill", [prompt])[0]
        compiled_cache = cache["decode"].clone()  # what decode's slot holds after compiled prefill
        compiled_decode_out = s.run("decode", [token])[0]
        eager_prefill_out = eager_prefill(prompt)
        eager_cache = eager_prefill.core.cache.clone()
        eager_decode_on_eager_cache = eager_decode(token)
        eager_decode.core.cache.copy_(compiled_cache)
        eager_decode_on_compiled_cache = eager_decode(token)
    s.reset_state()

    def err(a, b) -> float:
        return float((a.float() - b.float()).abs().max())

    differ = compiled_cache != eager_cache
    row_differ = differ[-1]  # the row decode reads
    ulp = torch.finfo(torch.bfloat16).eps * eager_cache.float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    steps = ((compiled_cache.float() - eager_cache.float()).abs() / ulp)[differ]
    out = {
        "program": {
            "layers": args.layers,
            "hidden": args.hidden,
            "ffn": args.ffn,
            "vocab": args.vocab,
            "dtype": args.dtype,
            "compute": args.compute,
            "culprit": args.culprit,
            "policy": args.policy,
        },
        "cache_slots_one_device_tensor": bool(one_tensor),
        "cache_elements": int(differ.numel()),
        "cache_elements_differing": int(differ.sum()),
        "last_row_elements_differing": int(row_differ.sum()),
        "max_bf16_steps_apart": float(steps.max()) if steps.numel() else 0.0,
        "prefill_output_max_abs_err": err(compiled_prefill_out, eager_prefill_out),
        "decode_vs_eager_on_eager_cache_max_abs_err": err(compiled_decode_out, eager_decode_on_eager_cache),
        "decode_vs_eager_on_compiled_cache_max_abs_err": err(compiled_decode_out, eager_decode_on_compiled_cache),
        "decode_output_max_abs": float(eager_decode_on_eager_cache.abs().max()),
    }
    for oracle in ("reference", "unshared"):
        f = s.verify(sequence="generate", oracle=oracle)
        out[f"verify_{oracle}"] = [
            {
                "step": int(r["step"]),
                "method": r["method"],
                "ok": bool(r["ok"]),
                "max_abs_err": float(r["max_abs_err"]),
                "atol": float(r["atol"]),
                "rtol": float(r["rtol"]),
            }
            for r in f.to_dict("records")
        ]
    s.close()
    out.update(_common.machine())
    for k, v in out.items():
        print(f"  {k}: {v}", flush=True)
    where = _common.result_path("sequence_rounding_probe", ".json", args.out or os.environ.get("OUT"))
    where.write_text(json.dumps(out, indent=1, default=str))
    print(f"written to {where}")
    return out


if __name__ == "__main__":
    main()
