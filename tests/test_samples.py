"""Every sample program gives its stated outcome under every policy, loaded for real on CPU
through the AOTInductor runtime."""

from __future__ import annotations

import pandas as pd
import pytest

import toolkit
from toolkit.build.samples import sample_module, sample_names
from toolkit.core.vocab import EventKind

CASES = [(s, p) for s in sample_names() for p in toolkit.POLICIES]


def check_outcome(program, sample: str, policy: str, device=None):
    expected = sample_module(sample).EXPECTED[policy]
    session = toolkit.load_program(program, policy, device=device)
    try:
        verdict = session.verify()
        d = session.decisions
        assert (session.status == "loaded") == expected.loaded, (session.status, session.error)
        if not expected.loaded:
            # the runtime's refusal (before #21959), or the 1.5.x exporter's (fqn-weight-cache)
            assert session.error and ("Refusing to share" in session.error or "with different data" in session.error), (
                session.error
            )
            assert (d["decision"] == "refused").any()
        wrong = set(verdict[verdict["ran"] & ~verdict["ok"]]["method"])
        assert wrong == set(expected.wrong), verdict
        not_runnable = {m for m, lm in session.methods.items() if not lm.runnable}
        assert not_runnable == set(expected.not_runnable)
        assert (d["decision"] == "shared").sum() >= expected.min_shared
        if expected.declined is not None:
            assert (d["decision"] == "declined").sum() == expected.declined
        if expected.loaded:
            # every method that ran and is not expected wrong is right
            ran = verdict[verdict["ran"]]
            assert set(ran[ran["ok"]]["method"]) == set(session.methods) - set(expected.wrong) - not_runnable
            # every sequence, from the initial state with state carried, diverges exactly where stated
            diverging = {q.name for q in program.sequences if not session.verify(sequence=q.name)["ok"].all()}
            assert diverging == set(expected.sequence_wrong), (
                diverging,
                [session.verify(sequence=q.name) for q in program.sequences],
            )
        return session, verdict
    finally:
        session.close()


@pytest.mark.slow
@pytest.mark.parametrize("sample,policy", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_sample_outcome_on_cpu(built_sample, sample, policy):
    check_outcome(built_sample(sample), sample, policy)


@pytest.mark.gpu
@pytest.mark.parametrize("sample,policy", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_sample_outcome_on_cuda(built_sample, sample, policy):
    check_outcome(built_sample(sample, "cuda"), sample, policy)


def test_declined_constant_is_left_out_of_the_user_managed_pairs(built_sample):
    s = toolkit.load_program(built_sample("partial_collision_shape"), "decline-on-mismatch")
    declined = s.decisions.query("decision == 'declined'")
    assert list(declined["name"]) == ["_tensor_constant0"]
    pairs = [e for e in s.log if e.kind is EventKind.PAIRS_INSTALLED and e.method == "decode"]
    assert len(pairs) == 1 and "_tensor_constant0" not in pairs[0].names.split(",")


def test_fingerprint_still_shares_genuinely_shared_weights(built_sample):
    s = toolkit.load_program(built_sample("three_methods"), "fingerprint")
    d = s.decisions.set_index(["method", "name"])
    assert d.loc[("encode_again", "proj_weight"), "decision"] == "shared"
    assert d.loc[("encode_again", "proj_weight"), "shared_from"] == "encode/proj_weight"
    assert d.loc[("probe", "proj_weight"), "decision"] == "declined"
    assert s.verify()["ok"].all()
    # memory-optimal: no whole blob was uploaded
    assert not any(e.kind is EventKind.BLOB_UPLOADED for e in s.log)


def test_out_of_bounds_alias_is_recorded_and_never_run(built_sample):
    s = toolkit.load_program(built_sample("partial_collision_shape"), "name-only")
    oob = [e for e in s.log if e.kind is EventKind.OUT_OF_BOUNDS_ALIAS]
    assert len(oob) == 1 and oob[0].method == "decode" and "out-of-bounds" in oob[0].problem
    v = s.verify().set_index("method")
    assert not v.loc["decode", "ran"] and v.loc["decode", "ok"] is pd.NA  # nothing ran: neither ok nor wrong
    assert "not runnable" in v.loc["decode", "reason"] and s.verdict().not_runnable == ["decode"]
    with pytest.raises(toolkit.LoadError, match="not runnable"):
        s.run("decode")


def test_a_samples_cache_key_covers_the_shared_sample_code(monkeypatch):
    """An edit to sample_programs/_common.py alone rebuilds the samples that use it."""
    from pathlib import Path

    from toolkit.build.samples import _cache_key, sample_module

    mod = sample_module("shared_state")
    before = _cache_key(mod, "cpu")
    real = Path.read_bytes
    monkeypatch.setattr(
        Path, "read_bytes", lambda self: real(self) + b"# edited" if self.name == "_common.py" else real(self)
    )
    assert _cache_key(mod, "cpu") != before
    assert _cache_key(mod, "cuda") != _cache_key(mod, "cpu")
