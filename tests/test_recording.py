"""The event log and the DataFrames built from it, on a real CPU load."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import toolkit
from toolkit.cli import main as cli_main
from toolkit.core import events as ev
from toolkit.core.vocab import EventKind


def test_every_event_type_has_a_distinct_kind_and_a_flat_row():
    kinds = [t.kind for t in ev.EVENT_TYPES]
    assert len(set(kinds)) == len(kinds) == len(EventKind)
    for t in ev.EVENT_TYPES:
        names = [f.name for f in dataclasses.fields(t)]
        assert names[:3] == ["seq", "time_s", "method"], t


def test_log_orders_events_and_can_be_switched_off():
    log = ev.EventLog()
    log.record(ev.LoadFailed, "m", error="boom")
    log.record(ev.ConstantsExtracted, "m", count=3)
    assert [e.seq for e in log] == [0, 1]
    assert [r["kind"] for r in (e.row() for e in log)] == ["load_failed", "constants_extracted"]
    off = ev.EventLog(enabled=False)
    off.record(ev.LoadFailed, "m", error="boom")
    assert len(off) == 0


def test_log_makes_each_event_once_on_first_read_and_reads_columns_from_its_records():
    from toolkit.core.vocab import Lookup

    log = ev.EventLog()
    log.record(ev.CacheLookup, "m0", name="a", fqn="a.w", result=Lookup.HIT, cached_owner="m")
    log.record(ev.LoadFailed, "m0", error="boom")
    log.record(ev.CacheLookup, "m1", cached_owner="", result=Lookup.MISS, fqn="b.w", name="b")  # other order
    first = log.of_type(ev.CacheLookup)
    assert [e.seq for e in first] == [0, 2] and first == log.of_type(ev.CacheLookup)
    assert all(a is b for a, b in zip(first, log.of_type(ev.CacheLookup)))  # made once
    assert log.last() is list(log)[-1] and log.last().fqn == "b.w"
    assert log.seqs(ev.CacheLookup) == [0, 2]
    for name in ("seq", "time_s", "method", "name", "fqn", "result", "cached_owner", "storage_key"):
        assert log.column(ev.CacheLookup, name) == [getattr(e, name) for e in first], name
    assert log.column(ev.CacheLookup, "storage_key") == ["", ""]  # a field not given: its default
    bad = ev.EventLog()
    with pytest.raises(TypeError, match=r"LoadFailed: unknown fields \['nope'\], missing fields \['error'\]"):
        bad.record(ev.LoadFailed, "m", nope=1)  # fails where it is recorded, as the event's constructor would
    assert len(bad) == 0


def test_tables_of_a_decline_load(built_sample):
    s = toolkit.load_program(built_sample("partial_collision_shape"), "decline-on-mismatch")
    events = s.events
    assert list(events["seq"]) == list(range(len(events)))
    kinds = list(events["kind"])
    # ExecuTorch's order for a method with a miss: container, enumerate, lookups, blob, extract, compare, decide
    d = [k for k, m in zip(kinds, events["method"]) if m == "decode"]
    order = [
        EventKind.CONTAINER_CREATED,
        EventKind.CONSTANT_ENUMERATED,
        EventKind.CACHE_LOOKUP,
        EventKind.BLOB_UPLOADED,
        EventKind.CONSTANTS_EXTRACTED,
        EventKind.FIELD_COMPARED,
        EventKind.DECIDED,
        EventKind.PAIRS_INSTALLED,
        EventKind.METHOD_LOADED,
    ]
    positions = [d.index(k.value) for k in order]
    assert positions == sorted(positions)

    lookups = s.lookups
    assert set(lookups.columns) >= {"method", "name", "fqn", "result"}
    assert dict(lookups[lookups.method == "decode"][["name", "result"]].values) == {
        "_tensor_constant0": "hit",
        "head_weight": "miss",
    }

    comps = s.comparisons
    assert list(comps["field"]) == ["dtype", "rank", "sizes", "strides", "device_type", "device_index"]
    sizes = comps.set_index("field").loc["sizes"]
    assert (sizes["cached"], sizes["new"], sizes["equal"]) == ("(64, 64)", "(64, 128)", False)

    dec = s.decisions
    assert {"method", "name", "fqn", "decision", "reason"} <= set(dec.columns)
    row = dec.set_index(["method", "name"]).loc[("decode", "_tensor_constant0")]
    assert row["decision"] == "declined"
    assert row["reason"].startswith(
        "Constant '_tensor_constant0': size mismatch at dim 1 (cached=64, new=128); then: "
        "Constant '_tensor_constant0' in method 'decode' differs from the cached copy"
    )
    assert row["cached_shape"] == "(64, 64)" and row["shape"] == "(64, 128)"
    assert s.status == "loaded" and s.error is None
    assert "declined 1" in repr(s) and "<table" in s._repr_html_()


def test_refused_load_reports_status_error_and_failed_event(built_sample):
    s = toolkit.load_program(built_sample("partial_collision_shape"), "refuse-on-mismatch")
    assert s.status == "failed" and s.failed_method == "decode"
    assert s.error.endswith("Refusing to share.")
    failed = s.events.query("kind == 'load_failed'")
    assert list(failed["method"]) == ["decode"]
    assert set(s.decisions.query("method == 'decode'")["decision"]) == {"refused"}
    # the failed method left the cache as it was after prefill
    assert [e.fqn for e in s.cache] == ["_tensor_constant0"]
    assert list(s.cache)[0].owner_method == "prefill"
    v = s.verify().set_index("method")
    assert v.loc["prefill", "ok"] and v.loc["decode", "ok"] is pd.NA and "not loaded" in v.loc["decode", "reason"]
    assert s.verdict().method("decode").outcome == "failed" and s.verdict().exit_code == 1


def test_compare_policies_has_one_row_per_policy(built_sample):
    df = toolkit.compare_policies(built_sample("total_collision")).frame
    assert list(df["policy"]) == list(toolkit.POLICIES)
    assert {"policy", "loaded", "wrong_methods", "shared", "declined", "device_bytes", "load_seconds"} <= set(
        df.columns
    )
    row = df.set_index("policy")
    assert row.loc["decline-on-mismatch", "wrong_methods"] == ["decode"]
    assert row.loc["fingerprint", "wrong_methods"] == [] and row.loc["fingerprint", "declined"] == 1


def test_cli_report_compare_and_errors(built_sample, tmp_path, capsys):
    prog = built_sample("total_collision")
    assert cli_main(["compare", str(prog.root), "--policies", "name-only,fingerprint"]) == 1  # name-only: decode wrong
    assert cli_main(["compare", str(prog.root), "--policies", "fingerprint"]) == 0
    out = capsys.readouterr().out
    assert "name-only" in out and "fingerprint" in out
    csv = tmp_path / "r.csv"
    assert cli_main(["report", str(prog.root), "--policy", "decline-on-mismatch", "--csv", str(csv)]) == 1
    assert len(pd.read_csv(csv)) == 2
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert "neither a program (directory, .pte or .pt2) nor a sample" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["report", str(prog.root), "--policy", "bogus"])


def test_a_failed_method_load_frees_its_container_without_waiting_for_gc(built_sample, monkeypatch):
    """A refused load must not keep the failed method's container (and on CUDA its whole blob)
    alive through the exception's traceback until the garbage collector happens to run."""
    import gc
    import weakref

    from toolkit.runtimes.aoti_container import AotiContainer

    made = []
    real_create = AotiContainer.create.__func__

    def create(cls, so_path, device):
        c = real_create(cls, so_path, device)
        made.append(weakref.ref(c))
        return c

    monkeypatch.setattr(AotiContainer, "create", classmethod(create))
    gc.disable()
    try:
        s = toolkit.load_program(built_sample("partial_collision_shape"), "refuse-on-mismatch")
        assert s.status == "failed" and len(made) == 2
        assert made[0]() is not None  # prefill: loaded and kept
        assert made[1]() is None  # decode: refused and already gone
    finally:
        gc.enable()
