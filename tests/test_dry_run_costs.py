"""What keeps a dry run cheap at scale (benchmarks/scaling.py, issue 25 target 4) without changing what it records:
the event log's per-type index of its entries, and the cyclic collector paused around the pass."""

from __future__ import annotations

import gc
import random

import pytest

from toolkit.build.synthetic import SyntheticSpec, generate
from toolkit.core import events as ev
from toolkit.workflows.dry_run import collector_paused, dry_run


def _columns_by_events(log: ev.EventLog, event_type: type[ev.Event], name: str) -> list:
    return [getattr(e, name) for e in log if type(e) is event_type]


def test_columns_read_between_records_see_every_entry_of_their_type():
    """The index of entries per type is brought up to date by each read: records of every kind (one event, a batch
    of one type, rows of two types) interleaved with reads give the columns the events give."""
    rng = random.Random(3)
    log = ev.EventLog()
    for step in range(60):
        what = rng.randrange(4)
        if what == 0:
            log.record(ev.ConstantUploaded, "m", name=f"c{step}", fqn=f"f{step}", bytes=step, seconds=0.0, path="x")
        elif what == 1:
            n = rng.randrange(1, 4)
            log.record_batch(
                ev.ConstantEnumerated,
                "m",
                name=[f"e{step}.{i}" for i in range(n)],
                fqn=[f"f{i}" for i in range(n)],
                dtype=["float32"] * n,
            )
        elif what == 2:
            kinds = [rng.randrange(2) for _ in range(rng.randrange(1, 5))]
            nf, nd = kinds.count(0), kinds.count(1)
            log.record_rows(
                "m",
                (ev.FieldCompared, ev.DigestCompared),
                kinds,
                {
                    ev.FieldCompared: {
                        "name": [f"n{step}"] * nf,
                        "fqn": ["q"] * nf,
                        "field": ["dtype"] * nf,
                        "cached": ["a"] * nf,
                        "new": ["b"] * nf,
                        "equal": [False] * nf,
                    },
                    ev.DigestCompared: {
                        "name": [f"d{step}"] * nd,
                        "fqn": ["q"] * nd,
                        "cached": ["x"] * nd,
                        "new": ["x"] * nd,
                        "equal": [True] * nd,
                    },
                },
            )
        else:  # a read in the middle: the index is made here and must grow with what comes after
            for t, name in (
                (ev.ConstantUploaded, "name"),
                (ev.FieldCompared, "name"),
                (ev.DigestCompared, "seq"),
                (ev.ConstantEnumerated, "seq"),
                (ev.MethodLoaded, "seq"),
            ):
                assert log.column(t, name) == _columns_by_events(log, t, name), (step, t.__name__, name)
    for t in (ev.ConstantUploaded, ev.ConstantEnumerated, ev.FieldCompared, ev.DigestCompared):
        for name in ("seq", "time_s", "method", "name"):
            assert log.column(t, name) == _columns_by_events(log, t, name), (t.__name__, name)
    assert log.column(ev.MethodLoaded, "seq") == []


@pytest.fixture
def collector_state():
    """The collector's state restored after the test, whatever it did."""
    was = gc.isenabled()
    yield
    gc.unfreeze()
    gc.enable() if was else gc.disable()


def test_the_pass_leaves_no_young_generation_to_rescan(collector_state):
    """Turned back on after the pass, the collector does not start by rescanning every object the pass made
    (0.9 s at 400,000 decisions): they are in the oldest generation, none frozen, the collector on."""
    gc.enable()
    gc.collect()
    program = generate(SyntheticSpec(methods=2, constants=300))
    a = dry_run(program, "fingerprint")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    made = [a.session, a.session.log, a.session.cache, *a.session.log._records]
    assert not [o for o in made if id(o) in young]
    assert all(gc.is_tracked(o) for o in made)  # still collectable: in the oldest generation, not untracked
    assert gc.get_count()[0] < 100


def test_a_cycle_made_during_the_pass_is_still_collected(collector_state):
    gc.enable()
    with collector_paused():
        a: list = []
        a.append(a)
    del a
    assert gc.collect() >= 1


def test_objects_the_owner_froze_stay_frozen_and_a_disabled_collector_stays_off(collector_state):
    gc.enable()
    gc.freeze()  # a server about to fork
    frozen = gc.get_freeze_count()
    assert frozen > 0
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.unfreeze()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_the_collector_is_restored_when_the_pass_raises(collector_state):
    gc.enable()
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("stop")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _uploads_load(native: bool):
    from toolkit.core.options import LoadOptions
    from toolkit.core.policies import get_policy
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session
    from toolkit.runtimes.dry_run import DryRunRuntime

    class Runtime(DryRunRuntime):
        native_uploads = native

    program = generate(SyntheticSpec(methods=3, constants=120, seed=5))
    rt = Runtime()
    return Session(
        program,
        get_policy("fingerprint"),
        resolve_devices(program, None, rt),
        options=LoadOptions(integrity="off"),
        runtime=rt,
    ).load()


def test_uploads_that_run_no_native_code_are_one_record_of_the_same_events():
    """A runtime whose uploads run native code has each recorded as it is done (a streaming worker keeps
    them before a crash); the dry run's are one batch per method: the same events, in the same places."""
    one_by_one, batched = _uploads_load(True), _uploads_load(False)
    entries = {
        s: [r for r in s.log._records if (r[0] if type(r) is tuple else r.types[0]) is ev.ConstantUploaded]
        for s in (one_by_one, batched)
    }
    uploads = len(one_by_one.log.of_type(ev.ConstantUploaded))
    assert uploads > 100
    assert len(entries[one_by_one]) == uploads and all(type(r) is tuple for r in entries[one_by_one])
    assert len(entries[batched]) == sum(1 for r in batched.results.values() if r.own_upload_bytes)
    assert all(isinstance(r, ev._Batch) for r in entries[batched])
    assert len(one_by_one.log) == len(batched.log)
    for a, b in zip(one_by_one.log, batched.log):
        ra, rb = a.row(), b.row()
        for clock in ("time_s", "seconds"):
            ra.pop(clock, None), rb.pop(clock, None)
        assert ra == rb
    assert all(e.seconds >= 0 for e in batched.log.of_type(ev.ConstantUploaded))


def test_an_upload_that_raises_leaves_the_uploads_before_it_recorded(monkeypatch):
    """The batch is recorded also when an upload fails half-way, as the one-by-one records were."""
    from toolkit.runtimes import dry_run

    real = dry_run.DryRunMethod.upload_constants

    def failing(self, constants):
        for i, item in enumerate(real(self, constants)):
            if i == 7:
                raise RuntimeError("device lost")
            yield item

    monkeypatch.setattr(dry_run.DryRunMethod, "upload_constants", failing)
    names = {}
    for native in (True, False):
        s = _uploads_load(native)
        assert s.status == "failed" and "device lost" in s.error
        names[native] = [e.name for e in s.log.of_type(ev.ConstantUploaded)]
        assert len(names[native]) == 7
        assert type(s.log.last()) is ev.LoadFailed and s.log.last().method == s.program.methods[0].name
    assert names[True] == names[False]


def test_members_are_the_enums_own():
    """vocab.Members: the same member objects (``is`` comparisons and values unchanged), every one of them."""
    from toolkit.core import vocab

    for e in (vocab.Decision, vocab.Reason, vocab.TensorOrigin, vocab.Lookup, vocab.ConstantKind):
        m = vocab.Members(e)
        assert {k: getattr(m, k) for k in e.__members__} == dict(e.__members__)
        assert all(getattr(m, k) is v for k, v in e.__members__.items())
    with pytest.raises(AttributeError):
        vocab.Members(vocab.Lookup).MAYBE  # noqa: B018 (the access itself must raise)
