"""Stateful programs: provenance recorded at build time, sequences verified step by step from the
initial state, state shared exactly when it is one eager buffer, and blame naming the culprit."""

from __future__ import annotations

import pytest

import toolkit
from toolkit.build.samples import sample_module

pytestmark = pytest.mark.slow  # loads (cached) sample programs


def test_provenance_says_which_constants_were_one_eager_tensor(built_sample):
    shared = built_sample("shared_state")
    by = {m.name: {c.fqn: c for c in m.constants} for m in shared.methods}
    assert by["prefill"]["core.kv"].storage == by["decode"]["core.kv"].storage != ""
    assert by["prefill"]["core.proj.weight"].storage == by["decode"]["core.proj.weight"].storage
    [buf] = shared.state_buffers()
    assert (buf.fqn, buf.writers, buf.readers) == ("core.kv", ("prefill",), ("decode",))
    accidental = built_sample("mutated_buffer")
    by = {m.name: {c.fqn: c for c in m.constants} for m in accidental.methods}
    assert by["prefill"]["kv"].storage != by["decode"]["kv"].storage  # two instances, one name
    assert by["prefill"]["kv"].digest == by["decode"]["kv"].digest  # ... and equal zeros
    assert {b.fqn for b in accidental.state_buffers()} == {"kv"}


def test_a_sequence_is_recorded_and_verified_step_by_step(built_sample):
    p = built_sample("shared_state")
    [seq] = p.sequences
    assert [st.method for st in seq.steps] == ["prefill", "decode", "decode"]
    s = toolkit.load_program(p, "fingerprint")
    v = s.verify(sequence="generate")
    assert list(v["step"]) == [0, 1, 2] and list(v["method"]) == ["prefill", "decode", "decode"]
    assert v["ok"].all(), v
    again = s.verify(sequence="generate")
    assert again.equals(v)
    with pytest.raises(KeyError, match="no sequence 'nope'"):
        s.verify(sequence="nope")
    s.close()


def test_state_is_reset_so_verifying_twice_gives_the_same_answer(built_sample, monkeypatch):
    from toolkit.engine import verification

    p = built_sample("mutated_buffer")
    s = toolkit.load_program(p, "name-only")  # kv shared by name: prefill's writes reach decode
    first = verification.verify_session(s)
    seq1 = verification.verify_sequence(s, "generate")
    second = verification.verify_session(s)  # state left by the sequence is reset first
    seq2 = verification.verify_sequence(s, "generate")
    assert first.equals(second) and seq1.equals(seq2)
    assert first["ok"].all()  # each method alone, from the initial state, is right
    assert not seq1["ok"].all() and list(seq1[~seq1["ok"]]["method"]) == ["decode"]
    s.close()


def test_without_resets_the_leak_shows_in_standalone_runs(built_sample, monkeypatch):
    """The reset is what makes standalone verification independent of order: without it,
    name-only's decode reads what prefill's run wrote."""
    p = built_sample("mutated_buffer")
    s = toolkit.load_program(p, "name-only")
    monkeypatch.setattr(type(s), "reset_state", lambda self: 0)
    from toolkit.engine import verification

    v = verification.verify_session(s)
    assert not v.set_index("method").loc["decode", "ok"]
    s.close()


@pytest.mark.parametrize(
    "sample, policy, sequence, culprits",
    [
        ("total_collision", "name-only", None, {("decode", "_tensor_constant0")}),
        ("total_collision", "decline-on-mismatch", None, {("decode", "_tensor_constant0")}),
        ("three_methods", "decline-on-mismatch", None, {("probe", "proj_weight")}),
        ("mutated_buffer", "name-only", "generate", {("decode", "kv")}),
        ("shared_state", "no-sharing", "generate", {("decode", "core_kv")}),
        ("total_collision", "fingerprint", None, set()),
        ("shared_state", "fingerprint", "generate", set()),
        ("mutated_buffer", "fingerprint", "generate", set()),
    ],
)
def test_blame_names_the_culprit_and_nothing_else(built_sample, sample, policy, sequence, culprits):
    s = toolkit.load_program(built_sample(sample), policy)
    b = s.blame(sequence)
    assert set(zip(b[b["fixes"]]["method"], b[b["fixes"]]["name"])) == culprits, b
    if culprits:
        assert all(b[b["fixes"]]["evidence"].str.len() > 0)
        tried = [e for e in s.log if e.kind.value == "culprit_tried"]
        assert len(tried) == len(b)
    # the experiments are undone: the load answers as before
    v = s.verify(sequence=sequence)
    assert (v["ok"].all()) == (not culprits)
    s.close()


def test_blame_evidence_says_why(built_sample):
    s = toolkit.load_program(built_sample("mutated_buffer"), "name-only")
    row = s.blame("generate").set_index("name").loc["kv"]
    assert "state written by 'prefill'" in row["evidence"]
    s.close()
    s = toolkit.load_program(built_sample("shared_state"), "no-sharing")
    row = s.blame("generate").set_index("name").loc["core_kv"]
    assert "is not shared" in row["evidence"] and row["swap"].startswith("the writer's tensor")
    s.close()


def test_every_sample_with_sequences_states_them_under_every_policy():
    for name in ("mutated_buffer", "shared_state"):
        mod = sample_module(name)
        assert set(mod.sequences()) == {"generate"}
        assert set(mod.EXPECTED) == set(toolkit.POLICIES)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "sample, policy, sequence, culprits",
    [
        ("total_collision", "name-only", None, {("decode", "_tensor_constant0")}),
        ("mutated_buffer", "name-only", "generate", {("decode", "kv")}),
        ("shared_state", "no-sharing", "generate", {("decode", "core_kv")}),
        ("shared_state", "fingerprint", "generate", set()),
    ],
)
def test_blame_on_cuda(built_sample, sample, policy, sequence, culprits):
    s = toolkit.load_program(built_sample(sample, "cuda"), policy)
    b = s.blame(sequence)
    assert set(zip(b[b["fixes"]]["method"], b[b["fixes"]]["name"])) == culprits, b
    s.close()


class _Accumulate(__import__("torch").nn.Module):
    """A method whose output depends on how often it ran: state carried in its buffer."""

    def __init__(self):
        import torch

        super().__init__()
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x):
        self.acc.add_(x.sum(0))
        return self.acc * 1.0


class _Pure(__import__("torch").nn.Module):
    def __init__(self):
        import torch

        super().__init__()
        self.register_buffer("w", torch.arange(4.0))

    def forward(self, x):
        return x @ self.w


@pytest.fixture(scope="module")
def accumulating(tmp_path_factory):
    import torch

    x = torch.ones(2, 4)
    return toolkit.build_program(
        {"accumulate": (_Accumulate(), (x,)), "pure": (_Pure(), (x,))},
        tmp_path_factory.mktemp("acc") / "p",
        progress=False,
    )


def test_repeatability_attributes_state_carried_differences(accumulating):
    s = toolkit.load_program(accumulating, "fingerprint")
    r = s.repeatability(runs=3).set_index("method")
    assert not r.loc["accumulate", "changes_with_reset"] and r.loc["accumulate", "changes_without_reset"]
    assert r.loc["accumulate", "cause"].startswith("state carried") and "acc" in r.loc["accumulate", "cause"]
    assert not r.loc["pure", "changes_with_reset"] and not r.loc["pure", "changes_without_reset"]
    assert r.loc["pure", "cause"] == ""
    assert s.verify()["ok"].all() and s.verify()["ok"].all()  # resets make verification repeatable
    with pytest.raises(ValueError, match="runs must be at least 2"):
        s.repeatability(runs=1)
    s.close()


def test_blame_fills_the_culprit_column_of_decisions_and_the_csv(built_sample, tmp_path):
    from toolkit.reports.collision import read_report, to_csv

    s = toolkit.load_program(built_sample("total_collision"), "name-only")
    assert (s.decisions["culprit"] == "").all()  # nothing blamed before blame() runs
    s.blame()
    d = s.decisions.set_index(["method", "name"])
    assert d.loc[("decode", "_tensor_constant0"), "culprit"] == "standalone"
    assert d.loc[("prefill", "_tensor_constant0"), "culprit"] == ""
    report = read_report(to_csv(s, tmp_path / "r.csv") and tmp_path / "r.csv")
    f = report.frame.set_index(["method", "name"])
    assert f.loc[("decode", "_tensor_constant0"), "culprit"] == "standalone"
    s.close()
