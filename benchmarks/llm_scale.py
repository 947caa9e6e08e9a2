"""Language-model scale: a Llama-8B-shaped prefill/decode program, every policy in fresh processes.

    python benchmarks/llm_scale.py [--program-dir DIR] [--layers 32] [--hidden 4096] [--ffn 14336]
                                   [--vocab 128256] [--dtype bfloat16] [--compute weights|float32]
                                   [--device cuda] [--out DIR]

The program: one ``Core`` module (token embedding, ``--layers`` blocks of q/k/v/o projections and a
SwiGLU MLP with Llama-3-8B's shapes at the defaults, a final norm and the LM head), used by two
methods of the same instance, ``prefill`` (16 prompt tokens) and ``decode`` (one token); ``prefill``
also writes a small ``cache`` buffer that ``decode`` reads (state the two methods share, as a KV
cache is). The attention is left out: the graph stays trivial so AOTInductor compiles it in seconds,
while every weight is used, so each method's ``.so`` declares all of them and each method's blob
holds all of them.

Measured, in one run:

* the build (``toolkit.build_program`` on the device): seconds, and the build process's peak
  host memory (``ru_maxrss``), against the bytes of one method's constants;
* per policy, one fresh process each: the load on the default path (integrity checking on:
  the first load of each file in that process), the same program loaded again in that
  process (pages locked, files already verified), resident device bytes (driver level,
  ``cudaMemGetInfo``) and the peak while loading, against M (``toolkit.workflows.dry_run.memory_floor``);
  the methods wrong alone and in the ``generate`` sequence;
* the integrity check alone (every file of the program, fresh process): seconds and GB/s.

Writes results/llm_scale/<date>-<machine>[-<tag>].csv (one row per policy, the build's figures in every
row) and the build's figures beside the program (``<program-dir>_build.json``, read back by ``--reuse``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import resource
import threading
import time
from pathlib import Path

import _common
import pandas as pd
import torch

GIB = _common.GIB
PROMPT = 16


class Block(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, dtype, device, gen, compute=None):
        super().__init__()
        self.compute = compute  # None: compute in the weights' dtype; torch.float32: upcast every weight

        def w(rows, cols):
            return torch.nn.Parameter(
                (torch.randn(rows, cols, generator=gen, device=device) * cols**-0.5).to(dtype), requires_grad=False
            )

        self.wq, self.wk, self.wv, self.wo = w(hidden, hidden), w(hidden, hidden), w(hidden, hidden), w(hidden, hidden)
        self.w1, self.w3, self.w2 = w(ffn, hidden), w(ffn, hidden), w(hidden, ffn)
        self.norm = torch.nn.Parameter(torch.ones(hidden, dtype=dtype, device=device), requires_grad=False)

    def forward(self, h):
        c = (lambda t: t.to(self.compute)) if self.compute is not None else (lambda t: t)
        x = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(h.dtype) * c(self.norm)
        h = h + (x @ c(self.wq).T + x @ c(self.wk).T + x @ c(self.wv).T) @ c(self.wo).T  # no attention itself
        return h + (torch.nn.functional.silu(x @ c(self.w1).T) * (x @ c(self.w3).T)) @ c(self.w2).T


class Core(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, ffn: int, vocab: int, dtype, device, compute=None):
        super().__init__()
        self.compute = compute
        gen = torch.Generator(device=device).manual_seed(0)
        self.embed = torch.nn.Parameter(
            (torch.randn(vocab, hidden, generator=gen, device=device) * 0.02).to(dtype), requires_grad=False
        )
        self.blocks = torch.nn.ModuleList([Block(hidden, ffn, dtype, device, gen, compute) for _ in range(layers)])
        self.head = torch.nn.Parameter(
            (torch.randn(vocab, hidden, generator=gen, device=device) * hidden**-0.5).to(dtype), requires_grad=False
        )
        self.register_buffer("cache", torch.zeros(PROMPT, hidden, dtype=dtype, device=device))

    def trunk(self, ids):
        h = self.embed[ids]
        if self.compute is not None:
            h = h.to(self.compute)
        for b in self.blocks:
            h = b(h)
        return h


class Prefill(torch.nn.Module):
    def __init__(self, core):
        super().__init__()
        self.core = core

    def forward(self, ids):
        h = self.core.trunk(ids)
        self.core.cache.copy_(h)  # prefill fills the state decode reads
        return h[-1:] @ self.core.head.to(h.dtype).T


class Decode(torch.nn.Module):
    def __init__(self, core):
        super().__init__()
        self.core = core

    def forward(self, ids):
        h = self.core.trunk(ids) + self.core.cache[-1:].to(self.core.compute or self.core.cache.dtype)
        return h @ self.core.head.to(h.dtype).T


def with_culprit(core: Core, fqn: str) -> Core:
    """``core`` as decode sees it when ``fqn`` (``blocks.<i>.<weight>``) is its own, other data:
    every other tensor the same object (a policy sharing by name alone makes decode wrong)."""
    _, i, name = fqn.split(".")
    twin, block = copy.copy(core), copy.copy(core.blocks[int(i)])
    block._parameters = {
        **block._parameters,
        name: torch.nn.Parameter(block._parameters[name] * 2, requires_grad=False),
    }
    twin._modules = {**core._modules, "blocks": torch.nn.ModuleList(list(core.blocks))}
    twin.blocks[int(i)] = block
    return twin


def methods(args) -> tuple[dict, dict]:
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    compute = None if args.compute == "weights" else getattr(torch, args.compute)
    core = Core(args.layers, args.hidden, args.ffn, args.vocab, dtype, dev, compute)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (PROMPT,), generator=g).to(dev)
    token = torch.randint(0, args.vocab, (1,), generator=g).to(dev)
    decode_core = with_culprit(core, args.culprit) if args.culprit else core
    ms = {"prefill": (Prefill(core), (prompt,)), "decode": (Decode(decode_core), (token,))}
    seq = {"generate": [("prefill", (prompt,)), ("decode", (token,)), ("decode", (token,))]}
    return ms, seq


def child_build(args) -> dict:
    import torch._inductor.config as inductor_config

    from toolkit import build_program

    # bf16 rounding where eager rounds (not only at the stores), so verification compares like with like
    inductor_config.emulate_precision_casts = True
    t = time.perf_counter()
    ms, seq = methods(args)
    made = time.perf_counter() - t
    params = sum(p.numel() * p.element_size() for p in ms["prefill"][0].parameters())
    t = time.perf_counter()
    prog = build_program(
        ms,
        args.program_dir,
        device=args.device,
        name="llm_scale",
        sequences=seq,
        description="benchmarks/llm_scale.py",
        progress=True,
        overwrite=True,
    )
    return {
        "build_seconds": time.perf_counter() - t,
        "module_seconds": made,
        "parameter_bytes": params,
        "method_constant_bytes": {m.name: sum(c.nbytes for c in m.constants) for m in prog.methods},
        "blob_bytes": {m.name: m.blob_bytes for m in prog.methods},
        "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


class Peak:
    """Driver-level bytes in use, polled every millisecond on a thread, for a load's peak."""

    def __init__(self, dev):
        self.dev, self.peak, self._stop = dev, 0, threading.Event()

    def used(self) -> int:
        free, total = torch.cuda.mem_get_info(self.dev)
        return total - free

    def __enter__(self):
        self.peak = self.used()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.used())


def child_policy(args) -> dict:
    from toolkit import load_program, open_program
    from toolkit.workflows.dry_run import memory_floor

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        dev = torch.device("cuda", dev.index or 0)
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
    prog = open_program(args.program_dir)
    floor = memory_floor(prog).total_bytes
    before = Peak(dev).used() if cuda else 0
    with Peak(dev) if cuda else _Null() as pk:
        t = time.perf_counter()
        s = load_program(prog, args.child)  # the default path: integrity checking on
        first = time.perf_counter() - t
    resident = (Peak(dev).used() - before) if cuda else s.device_bytes
    out = {
        "policy": args.child,
        "status": str(s.status),
        "error": s.error,
        "first_load_s": first,
        "resident_bytes": resident,
        "peak_bytes": (pk.peak - before) if cuda else None,
        "M_bytes": floor,
        "loader_device_bytes": s.device_bytes,
    }
    if s.status == "loaded":
        v = s.verify()
        out["wrong_alone"] = sorted(v.loc[v["ok"] == False, "method"])  # noqa: E712 (numpy bools)
        out["max_abs_err_alone"] = {r["method"]: float(r["max_abs_err"]) for _, r in v.iterrows()}
        out["atol_rtol"] = [float(v["atol"].iloc[0]), float(v["rtol"].iloc[0])]
        q = s.verify(sequence="generate")
        out["sequence_ok"] = bool(q["ok"].all())
    s.close()
    del s
    gc.collect()
    t = time.perf_counter()
    s2 = load_program(prog, args.child)
    out["reload_s"] = time.perf_counter() - t
    s2.close()
    return out


class _Null:
    peak = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def child_integrity(args) -> dict:
    from toolkit import open_program
    from toolkit.integrity import check_files, hash_threads, verified_files

    prog = open_program(args.program_dir)
    rels = [rel for m in prog.methods for rel in m.files]
    nbytes = sum(prog.files[r].bytes for r in set(rels))
    verified_files().clear()
    t = time.perf_counter()
    check_files(prog.root, prog.files, rels)
    sec = time.perf_counter() - t
    return {
        "integrity_s": sec,
        "integrity_bytes": nbytes,
        "integrity_GBps": nbytes / sec / 1e9,
        "hash_threads": hash_threads(),
    }


def program_arguments(
    ap: argparse.ArgumentParser, program_dir: str, compute: str = "weights", culprit: str = ""
) -> None:
    """The options that say which program is built (shared with benchmarks/verify_blame_scale.py)."""
    ap.add_argument("--program-dir", default=program_dir)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--compute",
        default=compute,
        choices=["weights", "float32"],
        help="float32: upcast every weight in the graph, so verification compares float32 kernels "
        "(bf16 kernels differ from eager's by a rounding step: every method 'wrong' at 8B)",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--culprit",
        default=culprit,
        help="blocks.<i>.<weight>: decode's own copy of it holds other "
        "data, so a policy sharing by name alone makes decode wrong",
    )


def program_argv(args) -> list[str]:
    """:func:`program_arguments`' values as a command line (for the build child)."""
    return [
        "--program-dir",
        args.program_dir,
        "--layers",
        str(args.layers),
        "--hidden",
        str(args.hidden),
        "--ffn",
        str(args.ffn),
        "--vocab",
        str(args.vocab),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--compute",
        args.compute,
        "--culprit",
        args.culprit,
    ]


def main(argv=None):
    from toolkit import POLICIES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    program_arguments(ap, "/tmp/llm_scale")
    ap.add_argument("--policies", nargs="+", default=["fingerprint", *[p for p in POLICIES if p != "fingerprint"]])
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--child-timeout", type=float, default=300)
    ap.add_argument("--reuse", action="store_true", help="keep a program already built in --program-dir")
    ap.add_argument("--tag", default=None, help="ends the CSV's name (e.g. a smaller shape's)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    common = program_argv(args)
    if args.child:
        fn = {"build": child_build, "integrity": child_integrity}.get(args.child, child_policy)
        print(json.dumps(fn(args)))
        return None
    build_record = Path(f"{Path(args.program_dir).resolve()}_build.json")
    if args.reuse and (Path(args.program_dir) / "manifest.json").is_file():
        built = json.loads(build_record.read_text())
    else:
        built = _common.run_child(__file__, ["build", *common], timeout=args.child_timeout * 3)
    per = max(built["method_constant_bytes"].values())
    print(
        f"build: {built['build_seconds']:.1f} s for {len(built['blob_bytes'])} methods of "
        f"{per / GIB:.2f} GiB constants each; peak host RSS {built['peak_host_rss_bytes'] / GIB:.2f} GiB "
        f"= {built['peak_host_rss_bytes'] / per:.2f} x one method's constants",
        flush=True,
    )
    build_record.write_text(json.dumps(built, indent=1))
    integ = _common.run_child(__file__, ["integrity", *common], timeout=args.child_timeout)
    print(
        f"integrity alone: {integ['integrity_bytes'] / GIB:.2f} GiB in {integ['integrity_s']:.2f} s = "
        f"{integ['integrity_GBps']:.1f} GB/s ({integ['hash_threads']} threads)",
        flush=True,
    )
    rows = []
    for policy in args.policies:
        try:
            got = _common.run_child(__file__, [policy, *common], timeout=args.child_timeout)
        except Exception as e:  # keep the other policies
            got = {"policy": policy, "status": "child failed", "error": str(e)[-300:]}
        got["x_M"] = got["resident_bytes"] / got["M_bytes"] if got.get("M_bytes") else None
        rows.append(got)
        print(
            f"  {policy:>20}: {got.get('status')}, resident {got.get('resident_bytes', 0) / GIB:.2f} GiB "
            f"= {got['x_M'] or float('nan'):.4f} x M, first load {got.get('first_load_s', float('nan')):.2f} s, "
            f"reload {got.get('reload_s', float('nan')):.2f} s, wrong alone {got.get('wrong_alone')}, "
            f"sequence ok {got.get('sequence_ok')}",
            flush=True,
        )
        df = pd.DataFrame(rows)  # written after every policy: a run cut short keeps what it measured
        for k, v in {**built, **integ}.items():
            df[k] = json.dumps(v) if isinstance(v, dict) else v
        path = _common.write_results("llm_scale", df, args.out, args.tag)
    print(f"written to {path}")
    return df


if __name__ == "__main__":
    main()
