"""The column-by-column frame builders of toolkit.engine.frames give exactly the frames of the row-dict path.

``events_frame`` and ``comparisons_frame`` are built column by column (benchmarks/scaling.py:
half the time and under half the peak memory at 3 million events); the reference here is
what they were before, a frame from one ``Event.row()`` dict per event.  Compared with
dtypes, column order and NaN positions, on logs holding every event type in random mixes
and on dry runs under every policy.
"""

from __future__ import annotations

import enum
import random
import typing
from dataclasses import fields

import pandas as pd
import pytest

from toolkit import POLICIES
from toolkit.build.synthetic import SyntheticSpec, generate
from toolkit.core import events as ev
from toolkit.engine import frames as tables
from toolkit.workflows.dry_run import dry_run


def _events_by_rows(log: ev.EventLog) -> pd.DataFrame:
    return tables.rows_frame([e.row() for e in log])


def _comparisons_by_rows(log: ev.EventLog) -> pd.DataFrame:
    rows = []
    for e in log:
        if isinstance(e, ev.FieldCompared):
            rows.append(e.row())
        elif isinstance(e, ev.DigestCompared):
            rows.append({**e.row(), "field": "digest"})
    return pd.DataFrame(rows, columns=tables.COMPARISON_COLUMNS)


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert got.columns.tolist() == want.columns.tolist()
    assert [str(d) for d in got.dtypes] == [str(d) for d in want.dtypes]
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for c in got.columns:  # stricter than pandas: None is not NaN, 1 is not True
        assert [repr(v) for v in got[c].tolist()] == [repr(v) for v in want[c].tolist()], c


def _random_log(rng: random.Random, types: list[type[ev.Event]], n: int) -> ev.EventLog:
    def value(tp):
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return rng.choice(list(tp))  # a str enum (vocab)
        if tp is bool:
            return rng.random() < 0.5
        if tp is int:
            return rng.randint(-3, 10**12)
        if tp is float:
            return rng.random()
        if tp is str:
            return rng.choice(["", "a", "x, y", "(64, 64)"])
        raise TypeError(f"no value for {tp!r}")

    log = ev.EventLog()
    for _ in range(n):
        t = rng.choice(types)
        hints = typing.get_type_hints(t)
        log.record(
            t,
            rng.choice(["prefill", "decode"]),
            **{f.name: value(hints[f.name]) for f in fields(t) if f.name not in ("seq", "time_s", "method")},
        )
    return log


def test_empty_log():
    log = ev.EventLog()
    _same(tables.events_frame(log), _events_by_rows(log))
    _same(tables.comparisons_frame(log), _comparisons_by_rows(log))
    assert tables.decisions_frame(log).columns.tolist() == tables.DECISION_COLUMNS


@pytest.mark.parametrize("seed", range(25))
def test_random_mixes_of_every_event_type(seed):
    rng = random.Random(seed)
    types = list(ev.EVENT_TYPES) if seed == 0 else rng.sample(ev.EVENT_TYPES, rng.randint(1, len(ev.EVENT_TYPES)))
    log = _random_log(rng, types, rng.randint(1, 120))
    _same(tables.events_frame(log), _events_by_rows(log))
    _same(tables.comparisons_frame(log), _comparisons_by_rows(log))
    # an enum-valued column comes out as its string values, a mixed numeric one as float with NaN
    f = tables.events_frame(log)
    assert all(type(v) is str for v in f["kind"])


@pytest.mark.parametrize("policy", POLICIES)
def test_dry_runs_under_every_policy(policy):
    prog = generate(
        SyntheticSpec(methods=3, constants=120, content_collision=0.1, metadata_collision=0.1, mutated=0.05, seed=3)
    )
    s = dry_run(prog, policy).session
    assert len(s.log) > 360
    _same(tables.events_frame(s.log), _events_by_rows(s.log))
    _same(tables.comparisons_frame(s.log), _comparisons_by_rows(s.log))
    d = tables.decisions_frame(s.log)
    rows = tables.rows_frame([e.row() for e in s.log], kind="decided", columns=tables.DECISION_COLUMNS[:-1])
    _same(d.drop(columns="culprit"), rows)


def test_wrong_methods_are_the_ones_that_ran_and_disagree():
    import pandas as pd

    from toolkit.engine.frames import wrong_methods

    v = pd.DataFrame(
        {
            "method": ["a", "b", "c", "d"],
            "ran": [True, True, False, False],
            "ok": pd.array([False, True, pd.NA, False], dtype="boolean"),
        }
    )
    assert wrong_methods(v) == ["a"]  # c: no reference (NA), d: did not run
    assert wrong_methods(v.iloc[:0]) == [] and wrong_methods(None) == []
