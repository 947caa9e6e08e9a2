"""The ExecuTorch release table: every upstream policy placed, every revision placed, versions parsed,
the generations it claims checked against real exports, and docs/upstream.md's copy of its evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.core.errors import InvalidChoiceError, ToolkitError, UnknownExecuTorchVersionError
from toolkit.core.policies import POLICIES, POLICY_CLASSES
from toolkit.core.policies.releases import (
    GENERATIONS,
    LABEL_LIMIT,
    NONE,
    OURS,
    RELEASES,
    REVISIONS,
    SETTING,
    executorch_releases,
    policies_for_executorch,
    policies_for_payload_generation,
    policy_table,
    release_for_version,
)
from toolkit.core.vocab import PolicyName

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = {name for name, cls in POLICY_CLASSES.items() if cls.reproduces}
ALL_VERSIONS = [v for rel in RELEASES for v in rel.versions]


def _run_policies() -> set[PolicyName]:
    return {run.policy for rel in RELEASES for run in rel.runs}


# ----------------------------------------------------------------------------------- labels


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_has_a_short_label_and_only_ours_say_ours(policy):
    label = executorch_releases(policy)
    assert label and len(label) <= LABEL_LIMIT, (policy, label, len(label))
    assert (label == OURS) == (PolicyName(policy) not in UPSTREAM), (policy, label)


def test_a_policy_some_release_runs_is_labelled_with_those_releases_and_the_others_say_why_not():
    run = _run_policies()
    for name in UPSTREAM:
        label = executorch_releases(name)
        if name in run:
            releases = [rel.release for rel in RELEASES if any(r.policy == name for r in rel.runs)]
            assert label.startswith("ExecuTorch "), label
            assert releases[0] in label and releases[-1] in label, (name, label, releases)
        else:
            assert "no release" in label or "never merged" in label, (name, label)
    # the facts behind those labels
    assert executorch_releases("refuse-on-mismatch") == "ExecuTorch 1.3.x-1.4.x, sharing on"
    assert executorch_releases(PolicyName.VERIFY_ALWAYS) == "PR #21706, never merged"
    assert "1.5.x" in executorch_releases("fqn-weight-cache")


def test_an_unknown_policy_name_is_refused_by_name():
    with pytest.raises(ValueError, match="name-onyl"):
        executorch_releases("name-onyl")


# -------------------------------------------------------------------------------- revisions


def test_every_revision_a_policy_reproduces_is_placed_with_its_commit():
    placed = {r.pr: r for r in REVISIONS}
    reproduced = {rev.pr for cls in POLICY_CLASSES.values() for rev in cls.reproduces}
    assert set(placed) == reproduced, "REVISIONS places exactly the revisions the policies reproduce"
    for name, cls in POLICY_CLASSES.items():
        for rev in cls.reproduces:
            assert placed[rev.pr].commit == rev.commit, (name, rev.pr, placed[rev.pr].commit, rev.commit)
            assert placed[rev.pr].evidence, rev.pr


def test_a_revision_runs_in_a_release_of_the_table_and_only_after_its_first_tag():
    names = [rel.release for rel in RELEASES]
    for r in REVISIONS:
        if r.runs_in:
            assert r.runs_in in names, r
        if r.first_tag and r.runs_in:
            line = ".".join(r.first_tag.removeprefix("v").split(".")[:2])
            assert release_for_version(line).release == r.runs_in, r
    # a closed, unmerged PR is in no tag and runs nowhere
    closed = next(r for r in REVISIONS if r.pr == 21706)
    assert closed.first_tag == "" and closed.runs_in == ""


def test_every_sharing_run_is_a_revision_its_policy_reproduces_shipped_in_that_release():
    """A release runs a sharing policy only if that policy reproduces a revision placed in it."""
    runs_in = {r.pr: r.runs_in for r in REVISIONS}
    for rel in RELEASES:
        for run in rel.runs:
            if not run.shares:
                continue
            prs = [rev.pr for rev in POLICY_CLASSES[run.policy].reproduces]
            assert any(runs_in[pr] == rel.release for pr in prs), (rel.release, run.policy, prs)


def test_policies_no_release_runs_are_those_of_unshipped_revisions_or_no_revision():
    run = _run_policies()
    assert {PolicyName.VERIFY_ALWAYS, PolicyName.BLIND_SHARE, PolicyName.NAME_ONLY}.isdisjoint(run)
    assert not (run - UPSTREAM), "no release runs one of ours"


# --------------------------------------------------------------------------------- releases


def test_releases_are_in_order_and_each_reads_what_it_writes():
    dates = [rel.date for rel in RELEASES]
    assert dates == sorted(dates)
    writes = [rel.writes for rel in RELEASES]
    assert writes == sorted(writes) and set(writes) == set(GENERATIONS)
    for rel in RELEASES:
        assert rel.writes in rel.reads, rel.release
        assert set(rel.reads) <= set(GENERATIONS)
        assert (rel.setting == "") == (rel.default == ""), rel.release
        assert rel.setting in ("", SETTING)
        for run in rel.runs:
            assert (run.value == NONE) == (rel.setting == ""), (rel.release, run)
        # exactly one policy per (generation read, setting value)
        for g in rel.reads:
            assert rel.policy(g, False) is not None and rel.policy(g, True) is not None, (rel.release, g)
        assert rel.policy(max(GENERATIONS) + 1, True) is None
        assert rel.evidence


def test_the_sharing_default_is_off_wherever_there_is_a_setting():
    for rel in RELEASES:
        if rel.setting:
            assert rel.default == "off"
            # the default run is what a user gets without touching anything
            assert rel.policy(rel.writes, False) == rel.sharing_off
        else:
            assert rel.sharing_off == rel.sharing_on == PolicyName.NO_SHARING


@pytest.mark.parametrize("version", ["1.5", "1.5.1", "v1.5.1", "1.5.0", "1.5.1+cpu", "1.5.x", " v1.5 "])
def test_version_spellings_find_the_1_5_line(version):
    assert release_for_version(version).release == "1.5.x"


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_every_published_version_finds_its_own_row(version):
    rel = release_for_version(version)
    assert version in rel.versions
    assert release_for_version("v" + version) is rel
    assert release_for_version(version + "-rc1") is rel  # a release candidate of it


@pytest.mark.parametrize("version", ["1.6", "1.5.2", "1.0.1", "0.7.0", "2", "latest", "", "1.3.1.1", "v"])
def test_an_unknown_version_names_every_known_one(version):
    with pytest.raises(UnknownExecuTorchVersionError) as e:
        policies_for_executorch(version)
    message = str(e.value)
    assert repr(version) in message
    for v in ALL_VERSIONS:
        assert v in message, (v, message)
    assert "no CUDA backend" in message  # 1.0.x and earlier are not missing by accident
    assert isinstance(e.value, ToolkitError) and isinstance(e.value, ValueError)


def test_a_version_runs_sharing_off_first_and_its_own_pte_with_sharing_on_last():
    for rel in RELEASES:
        pairs = policies_for_executorch(rel.versions[-1])
        policies = [p for p, _ in pairs]
        assert set(policies) == {run.policy for run in rel.runs}
        policy, setting = pairs[-1]
        assert policy == rel.sharing_on, rel.release
        if rel.setting:
            assert pairs[0][1].startswith(f"{SETTING}=off (default)"), pairs
            assert SETTING in setting
        else:
            assert pairs == ((PolicyName.NO_SHARING, "no sharing setting"),)
    assert policies_for_executorch("1.3") == (
        (PolicyName.NO_SHARING, f"{SETTING}=off (default)"),
        (PolicyName.REFUSE_ON_MISMATCH, f"{SETTING}=on"),
    )


def test_a_version_given_a_payload_generation_answers_for_that_pte():
    older = policies_for_executorch("1.5.1", generation=2)
    assert [p for p, _ in older] == [PolicyName.NO_SHARING, PolicyName.DECLINE_ON_MISMATCH]
    assert all(", on a .pte of" not in s for _, s in older)
    assert [p for p, _ in policies_for_executorch("1.5", generation=3)] == [PolicyName.FQN_WEIGHT_CACHE]
    with pytest.raises(InvalidChoiceError, match="does not read a .pte of payload generation 2"):
        policies_for_executorch("1.3.1", generation=2)


# ------------------------------------------------------------------------ payload generations


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_readers_of_a_generation_share_first_and_really_read_it(generation):
    readers = policies_for_payload_generation(generation)
    assert readers
    shares = []
    for policy, span, setting in readers:
        runs = [
            run
            for rel in RELEASES
            if rel.release in _releases_of(span)
            for run in rel.runs
            if run.policy == policy and rel.setting_text(run) == setting
        ]
        covered = _releases_of(span)
        assert len({rel.release for rel in RELEASES if rel.release in covered}) == len(covered)
        for rel in RELEASES:
            if rel.release in covered:
                assert generation in rel.reads, (generation, rel.release)
                assert any(rel.setting_text(r) == setting and r.policy == policy for r in rel.runs), (rel, setting)
        shares.append(all(run.shares for run in runs))
    assert shares == sorted(shares, reverse=True), readers  # sharing first
    assert shares[0], "the first answer is one with sharing on"
    # every release that reads the generation appears, under each value of its setting
    for rel in RELEASES:
        if generation in rel.reads:
            for sharing in (False, True):
                policy = rel.policy(generation, sharing)
                assert any(r.policy == policy and rel.release in _releases_of(r.release) for r in readers)


def _releases_of(span: str) -> list[str]:
    """``"1.3.x-1.4.x"`` -> every release of the table from the first to the last."""
    names = [rel.release for rel in RELEASES]
    first, _, last = span.partition("-")
    return names[names.index(first) : names.index(last or first) + 1]


def test_what_reads_each_generation_with_sharing_on():
    assert policies_for_payload_generation(1)[0] == (
        PolicyName.REFUSE_ON_MISMATCH,
        "1.3.x-1.4.x",
        f"{SETTING}=on",
    )
    assert policies_for_payload_generation(2)[0][:2] == (PolicyName.REFUSE_ON_MISMATCH, "1.4.x")
    assert [r.policy for r in policies_for_payload_generation(3)] == [PolicyName.FQN_WEIGHT_CACHE]
    with pytest.raises(InvalidChoiceError, match="payload generation 4"):
        policies_for_payload_generation(4)


@pytest.mark.parametrize("version", ["1.2.0", "1.5.1"])
def test_the_generation_a_release_writes_is_the_one_its_real_exports_hold(version):
    """The real exports of tests/fixtures were written by these versions (each result.json says
    so); the toolkit's reader finds the payload generation the table claims for their release."""
    from executorch_fixtures import unpacked

    from toolkit.sources import open_program

    programs = sorted(p.parent for p in unpacked(version).glob("*/prog.pte"))
    assert len(programs) >= 5, f"the executorch {version} exports are missing"
    expected = release_for_version(version).writes
    for folder in programs:
        result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        assert result["environment"]["executorch"] == version, folder
        found = {m.location.generation for m in open_program(folder / "prog.pte").methods}
        assert found == {expected}, (folder.name, found, expected)


def test_the_synthetic_generation_2_program_is_read_by_the_1_4_line():
    from toolkit.sources import open_program

    program = open_program(REPO / "tests" / "fixtures" / "synthetic-gen2" / "prog.pte")
    assert {m.location.generation for m in program.methods} == {release_for_version("1.4").writes}


# ---------------------------------------------------------------------------- policies table


def test_the_policies_table_has_one_row_per_policy_with_its_summary():
    rows = policy_table()
    assert [r["policy"] for r in rows] == [n.value for n in POLICY_CLASSES]
    for row in rows:
        cls = POLICY_CLASSES[PolicyName(row["policy"])]
        assert row["summary"] == cls.summary
        assert row["origin"] == ("upstream" if cls.reproduces else OURS)
        assert row["executorch"] == executorch_releases(row["policy"])
        assert bool(row["setting"]) == bool(cls.reproduces), row
    by_name = {r["policy"]: r for r in rows}
    assert by_name["refuse-on-mismatch"]["setting"] == f"{SETTING}=on"
    assert by_name["no-sharing"]["setting"] == f"{SETTING}=off (default)"


# ------------------------------------------------------------------------------------- docs


def test_docs_upstream_carries_every_row_with_its_evidence_verbatim():
    docs = (REPO / "docs" / "upstream.md").read_text(encoding="utf-8")
    section = docs[docs.index("## ExecuTorch releases and the policy each runs") :]
    for rel in RELEASES:
        assert f"| {rel.release} | {', '.join(rel.versions)} ({rel.date}) |" in section, rel.release
        assert f"`{rel.evidence}`" in section, rel.release
    for r in REVISIONS:
        assert f"`{r.evidence}`" in section, r.pr
    for policy in POLICIES:
        assert f"| `{policy}` | {executorch_releases(policy)} |" in section, policy
