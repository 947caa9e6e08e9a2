"""Blame and the state reset over many constants: benchmarks/llm_scale.py's program at 12 tiny
layers (99 constants per method, every weight shared by prefill and decode, one state buffer),
with one culprit: decode's own ``blocks.7.w3`` holds other data, so ``name-only`` makes decode wrong."""

from __future__ import annotations

import dataclasses
import math
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

import toolkit
from toolkit.core.vocab import BlameStatus
from toolkit.engine import blame as blame_ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
CULPRIT = "blocks.7.w3"


@pytest.fixture(scope="module")
def program():
    """Built once, cached as the samples are (keyed by llm_scale.py's source, the builder's, torch)."""
    import llm_scale

    from toolkit.build.samples import _cache_key, cache_root

    args = Namespace(
        layers=12, hidden=32, ffn=64, vocab=64, dtype="bfloat16", compute="float32", device="cpu", culprit=CULPRIT
    )
    out = cache_root() / f"blame_scale-cpu-{_cache_key(llm_scale, 'cpu')}"
    if (out / "manifest.json").is_file():
        return toolkit.open_program(out)
    ms, seq = llm_scale.methods(args)
    return toolkit.build_program(ms, out, sequences=seq, progress=False, overwrite=True)


def culprits(b) -> set:
    return set(zip(b[b["fixes"]]["method"], b[b["fixes"]]["fqn"]))


def test_blame_clears_same_bytes_without_running_them(program):
    s = toolkit.load_program(program, "name-only")
    assert list(s.verify().query("ok == False")["method"]) == ["decode"]
    b = s.blame()
    assert culprits(b) == {("decode", f"core.{CULPRIT}")}, b
    assert b.attrs["experiments"] == 1  # only the culprit's bytes differ from what it shares
    shared = [d for d in s.methods["decode"].outcome.decisions if d.decision.value == "shared"]
    assert len(b) == len(shared) > 90
    cleared = b[~b["fixes"] & (b["fqn"] != "core.cache")]  # the state buffer is a suspect: decode could write it
    assert len(cleared) == len(b) - 2 and cleared["evidence"].str.startswith("not run: its recorded sha256").all()
    assert b.set_index("fqn").loc["core.cache", "evidence"].startswith("not needed: the culprit's swap fixes it")
    assert len([e for e in s.log if e.kind.value == "culprit_tried"]) == len(b)
    found = {(c.method, c.fqn): c.blame for c in s.verdict().constants}
    assert found[("decode", f"core.{CULPRIT}")] is BlameStatus.CULPRIT
    assert {v for k, v in found.items() if k != ("decode", f"core.{CULPRIT}") and k[0] == "decode"} <= {
        BlameStatus.HARMLESS,
        BlameStatus.NOT_TESTED,
    }
    s.close()


def test_blame_bisects_every_shared_constant(program):
    s = toolkit.load_program(program, "name-only")
    v = s.verify()
    b = blame_ops.blame(s, None, v, clear_same_bytes=False)
    assert culprits(b) == {("decode", f"core.{CULPRIT}")}, b
    n = len(b)
    assert 1 < b.attrs["experiments"] <= math.ceil(math.log2(n)) + 1, (b.attrs, n)  # not one by one
    assert s.verify().equals(v) and s.verify()["ok"].tolist() == [True, False]  # every swap undone
    s.close()


def test_blame_uploads_each_experiments_own_copies_as_one_batch(program, monkeypatch):
    """An experiment's own copies come from one upload of all of them (each piece read once), not
    one upload per constant; each copy equals the constant's own bytes."""
    s = toolkit.load_program(program, "name-only")
    v = s.verify()
    handle = s.methods["decode"].handle
    batches = []
    real = type(handle).upload_constants

    def counting(self, constants):
        batches.append(len(constants))
        return real(self, constants)

    monkeypatch.setattr(type(handle), "upload_constants", counting)
    b = blame_ops.blame(s, None, v, clear_same_bytes=False)
    assert culprits(b) == {("decode", f"core.{CULPRIT}")}, b
    assert len(batches) <= b.attrs["experiments"] and batches[0] > 10, batches  # one batch per experiment at most
    names = [c.name for c in s.methods["decode"].spec.constants][:5]
    copies = s.own_copies("decode", names)
    assert list(copies) == names
    for n in names:
        assert torch.equal(copies[n].view(torch.uint8), s.own_copy("decode", n).view(torch.uint8))
    with pytest.raises(toolkit.LoadError, match="no constant 'nope'"):
        s.own_copies("decode", ["nope"])
    s.close()


def test_reset_rewrites_only_what_ran_and_wrote(program):
    s = toolkit.load_program(program, "fingerprint")
    cache = next(c for c in s.program.methods[0].constants if c.mutated).nbytes
    for m, written in (("prefill", cache), ("decode", 0)):  # prefill fills the cache; decode only reads it
        s.reset_state()
        before = s.resets.bytes_rewritten
        s.run(m)
        s.reset_state()
        assert s.resets.bytes_rewritten - before == written, m
    before = s.resets.bytes_rewritten
    s.reset_state()  # nothing ran since: nothing to rewrite
    assert s.resets.bytes_rewritten == before and s.resets.bytes_checked == 0
    s.close()


def unique_bytes(lms) -> int:
    return sum({id(lm.tensors[c.name]): c.nbytes for lm in lms for c in lm.spec.constants}.values())


def test_reset_without_recorded_mutation_checksums_and_restores(program):
    """As for a .pte: which constants a run wrote is found by checksums on the device."""
    fresh = toolkit.load_program(program, "fingerprint")
    alone = fresh.run("decode")[0].clone()
    fresh.close()
    s = toolkit.load_program(dataclasses.replace(program, records_mutation=False), "fingerprint")
    every = unique_bytes(s.methods.values())
    cache = next(c for c in s.program.methods[0].constants if c.mutated).nbytes
    s.run("prefill")
    assert not torch.equal(s.run("decode")[0], alone)  # decode reads what prefill wrote
    before = dataclasses.replace(s.resets)
    s.reset_state()
    assert (
        s.resets.bytes_checked - before.bytes_checked == every
    )  # both ran: every tensor once (decode's culprit is its own)
    assert s.resets.bytes_rewritten - before.bytes_rewritten == cache
    assert torch.equal(s.run("decode")[0], alone)
    s.close()


@pytest.mark.gpu
def test_pte_reset_rewrites_only_the_state_a_run_wrote():
    """A real .pte (ExecuTorch 1.5.1, CUDA): prefill writes core.kv; the reset finds it by checksum."""
    from executorch_fixtures import ROOT

    s = toolkit.load_program(ROOT / "shared_state", "fingerprint")
    assert s.status == "loaded" and not s.program.records_mutation, s.error
    kv = next(c for c in s.program.method("prefill").constants if c.fqn == "core.kv")
    s.reset_state()
    alone = s.run("decode")[0].clone()
    s.reset_state()
    s.run("prefill")
    before = dataclasses.replace(s.resets)
    s.reset_state()
    assert s.resets.bytes_rewritten - before.bytes_rewritten == kv.nbytes
    assert s.resets.bytes_checked - before.bytes_checked == unique_bytes([s.methods["prefill"]])
    assert torch.equal(s.run("decode")[0], alone)
    s.close()


@pytest.mark.gpu
def test_pte_blame_names_the_lifted_constant():
    from executorch_fixtures import ROOT

    s = toolkit.load_program(ROOT / "total_collision", "name-only")
    b = s.blame()
    assert (
        culprits(b) == {("prefill", b[b["fixes"]]["fqn"].iloc[0])}
        and b[b["fixes"]]["name"].iloc[0] == "_tensor_constant0"
    ), b
    assert b.attrs["experiments"] <= math.ceil(math.log2(max(len(b), 2))) + 1
    s.close()


@pytest.mark.parametrize(
    "tensor",
    [torch.randn(5000), torch.randn(64, 96).to(torch.bfloat16).T, torch.arange(7.0), torch.zeros(3, dtype=torch.int8)],
)
def test_the_reset_checksum_sees_a_write_and_a_move(tensor):
    from toolkit.runtimes.aoti import AotiRuntime

    rt = AotiRuntime.__new__(AotiRuntime)  # checksum needs no runtime state
    initial = rt.checksum(tensor)
    assert rt.same_checksum(initial, rt.checksum(tensor.clone()))
    moved = tensor.clone().reshape(-1)
    moved[[0, 1]] = moved[[1, 0]]
    if not torch.equal(moved, tensor.reshape(-1)):  # two elements exchanged: same sum, other positions
        assert not rt.same_checksum(initial, rt.checksum(moved.reshape(tensor.shape)))
    written = tensor.clone()
    written[(-1,) * tensor.dim()] += 1
    assert not rt.same_checksum(initial, rt.checksum(written))
