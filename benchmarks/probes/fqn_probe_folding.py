"""The constants AOTInductor's runtime constant folding adds: their original FQN, and whether
``extract_constants_map`` returns them.

    python benchmarks/probes/fqn_probe_folding.py

Compiles two small modules on the CPU with ``aot_inductor.use_runtime_constant_folding`` on (torch's
own ``aot_compile``, no toolkit) and prints what the container runner reports.  Findings:
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse

import torch
import torch._inductor.config as ic


class Folded(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.w = torch.nn.Parameter(torch.randn(64, 64))
        s.register_buffer("scale", torch.rand(64))

    def forward(s, x):
        return x @ (s.w * s.scale[:, None] + 1).t()


class TiedLM(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.embed = torch.nn.Embedding(64, 16)
        s.lm_head = torch.nn.Linear(16, 64, bias=False)
        s.lm_head.weight = s.embed.weight

    def forward(s, ids):
        return s.lm_head(s.embed(ids))


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    cases = [("folded", Folded(), (torch.randn(2, 64),)), ("tied", TiedLM(), (torch.randint(0, 64, (1, 4)),))]
    for name, m, inputs in cases:
        ep = torch.export.export(m, inputs)
        with ic.patch({"aot_inductor.use_runtime_constant_folding": True}):
            files = torch._inductor.aot_compile(ep.module(), inputs, options={"aot_inductor.package": True})
        so = [f for f in files if str(f).endswith(".so")][0]
        r = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
        fqns = r.get_constant_names_to_original_fqns()
        print(name, "constants -> original FQN:", dict(fqns))
        try:
            print("  from extract_constants_map:", sorted(r.extract_constants_map(False).keys()))
        except Exception as e:  # the runner may not support it for folded constants
            print("  extract:", e)


if __name__ == "__main__":
    main()
