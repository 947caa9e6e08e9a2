"""A load's batch records (one record holding a method's lookups, comparisons or decisions as columns) give
exactly what one record per event gives: the same events (seq, type, fields), the same frames, row for row.

The reference is the straightforward path: a log whose ``record_rows`` records each event on its own with
``record`` (what the loader did before batches), fed by the same load.  Compared on random programs
(hypothesis: sizes, collision and state rates, placement) under every policy, and on a load that fails
half-way (a refused method, an export refusal).
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit import POLICIES
from toolkit.build.synthetic import SyntheticSpec, generate
from toolkit.core import events as ev
from toolkit.core.options import LoadOptions
from toolkit.core.policies import get_policy
from toolkit.core.vocab import Integrity
from toolkit.engine import frames as tables
from toolkit.engine.devices import resolve_devices
from toolkit.engine.session import Session
from toolkit.runtimes.dry_run import DryRunRuntime
from toolkit.workflows.dry_run import dry_run


class OneByOneLog(ev.EventLog):
    """Every event recorded on its own, in order, as ``record`` does: no batch."""

    def record_rows(self, method, types, kinds, columns):
        types = tuple(types)
        order = [0] * len(next(iter(columns[types[0]].values()))) if kinds is None else kinds
        at = [0] * len(types)
        for k in order:
            t = types[k]
            self.record(t, method, **{f: v[at[k]] for f, v in columns[t].items()})
            at[k] += 1


def _load(program, policy: str, log: ev.EventLog | None = None) -> Session:
    rt = DryRunRuntime()
    s = Session(
        program,
        get_policy(policy),
        resolve_devices(program, None, rt),
        options=LoadOptions(integrity=Integrity.OFF),
        runtime=rt,
    )
    if log is not None:
        s.log = log
    return s.load()


def _frames(s: Session) -> dict[str, pd.DataFrame]:
    log = s.log
    return {
        "events": tables.events_frame(log).drop(columns=["time_s", "seconds"], errors="ignore"),
        "lookups": tables.lookups_frame(log),
        "comparisons": tables.comparisons_frame(log),
        "decisions": tables.decisions_frame(log),
        "memory": tables.memory_frame(log).drop(columns="time_s"),
        "analysis": tables.dry_run_frame(log, s.results.values(), policy=s.policy.name.value),
    }


def _same_loads(program, policy: str) -> None:
    batched, one_by_one = _load(program, policy), _load(program, policy, OneByOneLog())
    assert batched.status == one_by_one.status and batched.error == one_by_one.error
    assert len(batched.log) == len(one_by_one.log)
    if any(m.constants for m in program.methods):  # the fast path was taken
        assert any(isinstance(r, ev._Batch) for r in batched.log._records)
    assert not any(isinstance(r, ev._Batch) for r in one_by_one.log._records)
    # every event, made lazily from its batch, is the event recorded on its own (its times aside)
    for a, b in zip(batched.log, one_by_one.log):
        assert type(a) is type(b)
        ra, rb = a.row(), b.row()
        for volatile in ("time_s", "seconds"):  # clocks
            ra.pop(volatile, None), rb.pop(volatile, None)
        assert ra == rb
        assert [repr(v) for v in ra.values()] == [repr(v) for v in rb.values()]
    fa, fb = _frames(batched), _frames(one_by_one)
    for name in fa:
        pd.testing.assert_frame_equal(fa[name], fb[name], check_exact=True, obj=name)
        for c in fa[name].columns:  # stricter than pandas: a bool is not 1, an enum member not its value
            assert [repr(v) for v in fa[name][c]] == [repr(v) for v in fb[name][c]], (name, c)
    for name in ("seq", "time_s", "method", "name", "fqn", "decision"):
        assert batched.log.column(ev.Decided, name) == [getattr(e, name) for e in batched.log.of_type(ev.Decided)]
    assert [r.findings for r in batched.results.values()] == [r.findings for r in one_by_one.results.values()]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    methods=st.integers(1, 4),
    constants=st.integers(0, 60),
    content=st.floats(0, 0.3),
    metadata=st.floats(0, 0.3),
    lifted=st.floats(0, 0.1),
    mutated=st.floats(0, 0.2),
    device=st.sampled_from(["cpu", "cuda"]),
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(POLICIES),
)
def test_batches_equal_one_record_per_event_on_random_programs(
    methods, constants, content, metadata, lifted, mutated, device, seed, policy
):
    program = generate(
        SyntheticSpec(
            methods=methods,
            constants=constants,
            content_collision=content,
            metadata_collision=metadata,
            lifted=lifted,
            mutated=mutated,
            device=device,
            seed=seed,
        )
    )
    _same_loads(program, policy)


@pytest.mark.parametrize("policy", POLICIES)
def test_batches_equal_one_record_per_event_under_every_policy(policy):
    # collisions of both kinds and state: hits, declines, refusals and failed loads among the policies
    program = generate(
        SyntheticSpec(
            methods=3, constants=80, content_collision=0.1, metadata_collision=0.1, mutated=0.1, lifted=0.05, seed=11
        )
    )
    _same_loads(program, policy)


def test_a_batch_checks_its_fields_and_lengths_as_record_does():
    log = ev.EventLog()
    with pytest.raises(TypeError, match=r"LoadFailed: unknown fields \['nope'\], missing fields \['error'\]"):
        log.record_batch(ev.LoadFailed, "m", nope=["x"])
    with pytest.raises(ValueError, match="ConstantEnumerated: columns of"):
        log.record_batch(ev.ConstantEnumerated, "m", name=["a", "b"], fqn=["a"], dtype=["x", "y"])
    with pytest.raises(ValueError, match="FieldCompared"):  # kinds say one FieldCompared, its columns hold two
        log.record_rows(
            "m",
            (ev.FieldCompared, ev.LoadFailed),
            [0, 1],
            {
                ev.FieldCompared: {k: [1, 2] for k in ("name", "fqn", "field", "cached", "new", "equal")},
                ev.LoadFailed: {"error": ["e"]},
            },
        )
    assert len(log) == 0
    log.record(ev.LoadFailed, "m", error="first")
    log.record_rows(
        "m",
        (ev.ConstantsExtracted, ev.LoadFailed),
        [1, 0, 0, 1],
        {ev.ConstantsExtracted: {"count": [1, 2]}, ev.LoadFailed: {"error": ["a", "b"]}},
    )
    log.record_batch(ev.CacheLookup, "n", name=["x"], fqn=["x.w"], result=["hit"], cached_owner=["m"])
    assert [(e.seq, type(e).__name__) for e in log] == [
        (0, "LoadFailed"),
        (1, "LoadFailed"),
        (2, "ConstantsExtracted"),
        (3, "ConstantsExtracted"),
        (4, "LoadFailed"),
        (5, "CacheLookup"),
    ]
    assert log.seqs(ev.LoadFailed) == [0, 1, 4] and log.column(ev.LoadFailed, "error") == ["first", "a", "b"]
    assert log.column(ev.ConstantsExtracted, "count") == [1, 2] and log.last().storage_key == ""  # a default
    assert log.column(ev.CacheLookup, "storage_key") == [""] and log.column(ev.CacheLookup, "method") == ["n"]
    assert log.column(ev.LoadFailed, "error", [4, 0]) == ["b", "first"]
    off = ev.EventLog(enabled=False)
    off.record_batch(ev.ConstantsExtracted, "m", count=[1])
    assert len(off) == 0


def test_a_streaming_log_sees_every_event_of_a_batch():
    seen: list[int] = []

    class Streaming(ev.EventLog):
        def recorded(self, start, stop):
            seen.extend(self.event(i).seq for i in range(start, stop))

    s = _load(generate(SyntheticSpec(methods=2, constants=30, seed=2)), "fingerprint", Streaming())
    assert seen == list(range(len(s.log)))


def test_run_analysis_frame_is_the_reference_frame():
    program = generate(
        SyntheticSpec(methods=2, constants=200, content_collision=0.05, metadata_collision=0.05, mutated=0.02, seed=5)
    )
    a = dry_run(program, "decline-on-mismatch")
    ref = _load(program, "decline-on-mismatch", OneByOneLog())
    pd.testing.assert_frame_equal(
        a.decisions,
        tables.dry_run_frame(ref.log, ref.results.values(), policy="decline-on-mismatch"),
        check_exact=True,
    )
