"""Which original FQNs does AOTInductor report for real model shapes (tied weights, views, quantized
weights with scales, folded expressions, one tensor under two names)?

    python benchmarks/probes/fqn_probe.py [--out DIR]

Builds each small module as a one-method program on the CPU (``toolkit.build_program``: the ``.so``'s
own slot table) and prints, per case, every constant's internal name, original FQN, kind, dtype and
shape, how many FQNs are empty and which repeat.  Writes ``result.json`` into ``--out`` (default
/tmp/constshare-fqn-probe, where the programs are built).  Findings: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import toolkit


class TiedLM(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.embed = torch.nn.Embedding(32, 8)
        s.lm_head = torch.nn.Linear(8, 32, bias=False)
        s.lm_head.weight = s.embed.weight

    def forward(s, ids):
        return s.lm_head(s.embed(ids))


class Views(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(s, x):
        return x @ s.w + x @ s.w.t() + x @ s.w[:, :4].repeat(1, 2)


class Quant(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.register_buffer("qweight", torch.randint(-127, 127, (16, 8), dtype=torch.int8))
        s.register_buffer("scales", torch.rand(16))

    def forward(s, x):
        return x @ (s.qweight.float() * s.scales[:, None]).t()


class Folded(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(s, x):
        return x @ (s.w * 2 + 1) + torch.arange(8.0)


class TwoAttr(torch.nn.Module):  # one tensor registered under two attribute names (not a tied Parameter)
    def __init__(s):
        super().__init__()
        t = torch.randn(8)
        s.register_buffer("a", t)
        s.register_buffer("b", t)

    def forward(s, x):
        return x * s.a + x * s.b


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/constshare-fqn-probe"))
    args = ap.parse_args(argv)
    cases = {
        "tied_lm": (TiedLM(), (torch.randint(0, 32, (1, 4)),)),
        "views": (Views(), (torch.randn(2, 8),)),
        "quant": (Quant(), (torch.randn(2, 8),)),
        "folded": (Folded(), (torch.randn(2, 8),)),
        "two_attr": (TwoAttr(), (torch.randn(2, 8),)),
    }
    out = {}
    for name, (m, inputs) in cases.items():
        t = time.time()
        prog = toolkit.build_program({"m": (m, inputs)}, args.out / name, device="cpu", overwrite=True)
        spec = prog.methods[0]
        rows = [(c.name, c.fqn, c.kind.value, c.dtype, list(c.shape)) for c in spec.constants]
        fqns = [r[1] for r in rows]
        out[name] = {
            "constants": rows,
            "empty_fqn": sum(1 for f in fqns if not f),
            "repeated_fqn": sorted({f for f in fqns if f and fqns.count(f) > 1}),
            "seconds": round(time.time() - t, 1),
        }
        print(name, json.dumps(out[name]), flush=True)
    (args.out / "result.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
