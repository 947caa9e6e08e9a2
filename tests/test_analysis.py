"""Dry-run analysis predicts the real load, decision for decision; the memory floor holds.

Every sample program is built once (conftest's ``built_sample``) and loaded for real on
CPU under every policy; :func:`toolkit.workflows.dry_run.dry_run` must give the same
(method, name, decision, reason_code) rows in the same order, the same load status and
the same constant bytes.
"""

from __future__ import annotations

import pytest

from toolkit import POLICIES, load_program, open_program
from toolkit.build.samples import sample_module, sample_names
from toolkit.core.vocab import EventKind
from toolkit.workflows.dry_run import DRY_RUN_COLUMNS, dry_run, memory_floor

KEY = ["method", "name", "decision", "reason_code"]


def _sample(built_sample, name):
    return sample_module(name), built_sample(name)


def _rows(frame):
    return [tuple(str(v) for v in r) for r in frame[KEY].itertuples(index=False)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sample_names())
def test_prediction_equals_real_load(built_sample, name):
    _, prog = _sample(built_sample, name)
    for policy in POLICIES:
        s = load_program(prog, policy)
        try:
            predicted = dry_run(prog, policy)
            assert _rows(predicted.decisions) == _rows(s.decisions), f"{name} / {policy}"
            assert predicted.status == s.status, f"{name} / {policy}"
            assert predicted.device_bytes == s.device_bytes, f"{name} / {policy}"
            # whole-blob uploads predicted exactly
            blobs = {e.method for e in s.log if e.kind is EventKind.BLOB_UPLOADED}
            assert {m.method for m in predicted.methods if m.whole_blob and m.status == "loaded"} == {
                m for m in blobs if m in s.methods
            }
            # the out-of-bounds guard, predicted from metadata alone
            oob = {(e.method, e.name) for e in s.log if e.kind is EventKind.OUT_OF_BOUNDS_ALIAS}
            flagged = predicted.decisions[predicted.decisions["slot_problem"] != ""]
            assert {(r.method, r.name) for r in flagged.itertuples()} == oob, f"{name} / {policy}"
        finally:
            s.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", sample_names())
def test_memory_floor(built_sample, name):
    mod, prog = _sample(built_sample, name)
    f = memory_floor(prog)
    assert f.total_bytes == f.shareable_bytes + f.private_bytes == sum(f.by_device.values())
    assert f.total_bytes <= f.naive_bytes
    assert f.total_bytes >= f.largest_constant_bytes or f.constants == 0
    state = f.table["role"] == "state (one eager buffer)"
    assert f.table["counted"].sum() == f.distinct_shareable + f.distinct_state + int(
        (~state & (f.table["role"] != "shareable")).sum()
    )
    assert f.table.loc[f.table["counted"], "nbytes"].sum() == f.total_bytes
    for policy in POLICIES:
        a = dry_run(prog, policy)
        exp = mod.EXPECTED[policy]
        if a.device_bytes < f.total_bytes:
            # below the floor, something was shared that must not be: the sample says so
            assert not exp.loaded or exp.wrong or exp.not_runnable or exp.sequence_wrong, f"{name} / {policy}"
    # content-dedup reaches the floor, except for identical tensors inside one method (M counts
    # them once: slots could alias one tensor; the policy decides a method against the cache as
    # it was before that method, so it uploads each of them).  No empty FQNs in the samples.
    dedup = dry_run(prog, "content-dedup")
    if dedup.status == "loaded" and all(c.fqn for m in prog.methods for c in m.constants):
        assert dedup.device_bytes >= f.total_bytes
        state = {c.storage for m in prog.methods for c in m.constants if c.mutated and c.storage}
        seen, states, expected = set(), set(), 0
        for m in prog.methods:
            keys, new_states = {}, set()
            for c in m.constants:
                if c.storage in state:  # state: shared exactly when it is one eager buffer
                    if c.storage not in states:
                        expected += c.nbytes
                        new_states.add(c.storage)
                    continue
                key = (c.digest, c.dtype, c.shape, c.strides, c.storage_offset)
                if c.mutated or key not in seen:
                    expected += c.nbytes
                keys[key] = c.mutated
            seen |= {k for k, mutated in keys.items() if not mutated}
            states |= new_states
        assert dedup.device_bytes == expected


@pytest.mark.slow
def test_cpu_memory_events_match_accounting(built_sample):
    prog = built_sample("mutated_buffer")
    s = load_program(prog, "fingerprint")
    try:
        mem = s.memory
        assert set(mem["phase"]) == {"before", "peak", "after"}
        after = mem[mem["phase"] == "after"]["bytes_in_use"].tolist()
        peak = mem[mem["phase"] == "peak"]["bytes_in_use"].tolist()
        assert after[-1] == s.device_bytes == memory_floor(prog).total_bytes
        assert all(p >= a for p, a in zip(peak, after))
    finally:
        s.close()
    mem = s.memory
    assert mem[mem["phase"] == "unloaded"]["bytes_in_use"].iloc[-1] == 0


@pytest.mark.slow
def test_analysis_inputs_and_placement(built_sample, tmp_path):
    prog = built_sample("total_collision")
    by_prog = dry_run(prog, "fingerprint").decisions
    assert list(by_prog.columns) == DRY_RUN_COLUMNS
    assert by_prog.equals(dry_run(prog.root, "fingerprint").decisions)
    assert by_prog.equals(dry_run(open_program(prog.root), "fingerprint").decisions)
    assert by_prog.equals(dry_run(prog.root / "manifest.json", "fingerprint").decisions)
    # two devices: every hit of the second method mismatches on device_index
    first, second = prog.method_names[:2]
    split = dry_run(prog, "fingerprint", device={second: "cuda:1", first: "cuda:0"}).decisions
    later = split[split["method"] == second]
    assert set(later["decision"]) <= {"loaded", "declined", "private"}
    assert "shared" not in set(later["decision"])
    f = memory_floor(prog, device={second: "cuda:1", first: "cuda:0"})
    assert set(f.by_device) == {"cuda:0", "cuda:1"} and f.total_bytes == f.naive_bytes
    with pytest.raises(ValueError):
        dry_run(prog, "fingerprint", device={"nope": "cpu"})
    with pytest.raises(ValueError):
        dry_run(prog, "no-such-policy")


@pytest.mark.slow
def test_unload_returns_toolkit_owned_memory(built_sample):
    """torch <= 2.13 leaks a reference per user-managed tensor (PR #194480 fixes it): the
    container gets non-owning aliases, so our uploads are freed when the last user unloads."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    prog = built_sample("three_methods")
    s = load_program(prog, "fingerprint")
    assert s.verify()["ok"].all()
    refs = [StorageWeakRef(t.untyped_storage()) for lm in s.methods.values() for t in lm.own_tensors.values()]
    assert refs
    first = prog.method_names[0]
    s.unload(first)  # shared entries stay alive for the methods still using them
    gc.collect()
    assert s.verify().set_index("method").drop(index=first)["ok"].all()
    s.close()
    del s
    gc.collect()
    assert all(r.expired() for r in refs)


def test_the_earlier_names_of_the_dry_run_still_answer_with_a_warning(built_sample):
    import toolkit

    prog = built_sample("total_collision")
    with pytest.warns(DeprecationWarning, match="toolkit.dry_run"):
        decisions = toolkit.analyze(prog, "name-only")
    assert decisions.equals(dry_run(prog, "name-only").decisions)
    with pytest.warns(DeprecationWarning, match="toolkit.dry_run"):
        assert toolkit.run_analysis(prog, "fingerprint").verdict == dry_run(prog, "fingerprint").verdict
