"""Synthetic manifests: valid, deterministic, analysable from disk, decisions as their roles say."""

from __future__ import annotations

import pytest

from toolkit.build.synthetic import SyntheticSpec, generate, write_synthetic
from toolkit.sources import read_program_model
from toolkit.sources.directory import manifest_json
from toolkit.workflows.dry_run import dry_run, memory_floor


def _roles(spec: SyntheticSpec):
    """Role of each constant slot, recovered from the generated manifest."""
    m = generate(spec)
    first, second = m.methods[0].constants, m.methods[1].constants
    roles = []
    for a, b in zip(first, second):
        if a.mutated:
            roles.append("mutated")
        elif a.fqn != b.fqn:
            roles.append("unique")
        elif a.fqn.startswith("_tensor_constant"):
            roles.append("lifted")
        elif a.shape != b.shape:
            roles.append("metadata_collision")
        elif a.digest != b.digest:
            roles.append("content_collision")
        else:
            roles.append("shared")
    return m, roles


def test_written_manifest_parses_and_analyzes(tmp_path):
    spec = SyntheticSpec(methods=3, constants=300, seed=1)
    path = write_synthetic(spec, tmp_path)
    back = read_program_model(tmp_path)  # the toolkit's own validation accepts it
    assert back == generate(spec)
    assert manifest_json(back, indent=None) == manifest_json(generate(spec), indent=None)  # deterministic
    for p in (path, tmp_path, back):
        assert len(dry_run(p, "fingerprint").decisions) == 900


def test_decisions_follow_roles():
    spec = SyntheticSpec(
        methods=4,
        constants=2_000,
        content_collision=0.05,
        metadata_collision=0.05,
        lifted=0.05,
        mutated=0.02,
        unique=0.05,
        seed=3,
    )
    m, roles = _roles(spec)
    count = {r: roles.count(r) for r in set(roles)}
    assert all(
        count.get(r, 0) > 0
        for r in ("shared", "content_collision", "metadata_collision", "lifted", "mutated", "unique")
    )
    d = dry_run(m, "fingerprint").decisions
    later = d[d["method"] != "method_0"]
    n = spec.methods - 1
    by = later.groupby("reason_code").size().to_dict()
    assert by["fingerprint_match"] == n * count["shared"]
    # metadata collisions alternate between two shapes: odd methods mismatch method_0's shape,
    # even ones have its shape and other data (a content mismatch); lifted and same-shape
    # collisions differ in content only
    odd = sum(1 for i in range(1, spec.methods) if i % 2)
    assert by["metadata_mismatch"] == odd * count["metadata_collision"]
    assert (
        by["content_mismatch"]
        == n * (count["content_collision"] + count["lifted"]) + (n - odd) * count["metadata_collision"]
    )
    # synthetic state has no provenance: never shared, each later method declines the cached one
    assert by["other_state"] == n * count["mutated"]
    assert by["first_seen"] == n * count["unique"]
    # ExecuTorch's metadata check lets the same-shape collisions through, silently
    e = dry_run(m, "decline-on-mismatch").decisions
    e_later = e[e["method"] != "method_0"]
    shared = e_later[e_later["decision"] == "shared"]
    assert len(shared) >= n * (count["shared"] + count["content_collision"] + count["lifted"] + count["mutated"])
    # before #21959 the first metadata mismatch fails the load at method_1
    r = dry_run(m, "refuse-on-mismatch")
    assert r.status == "failed" and [p.status for p in r.methods][:3] == ["loaded", "failed", "not reached"]


def test_floor_matches_roles():
    spec = SyntheticSpec(methods=5, constants=1_000, seed=7)
    m, roles = _roles(spec)
    f = memory_floor(m)
    first = m.methods[0].constants
    expected = 0
    for i, role in enumerate(roles):
        sizes = [meth.constants[i].nbytes for meth in m.methods]
        if role == "shared":
            expected += sizes[0]
        elif role == "metadata_collision":
            expected += sum(sizes)  # every method's data differs as well as the shape
        else:  # collisions, lifted, unique and mutated: one copy per method
            expected += sum(sizes)
    assert f.total_bytes == expected
    assert f.private_bytes == sum(c.nbytes for meth in m.methods for c in meth.constants if c.mutated)
    # content-dedup reaches the floor on synthetic programs (no identical tensors within a method)
    assert dry_run(m, "content-dedup").device_bytes == f.total_bytes
    assert first[0].offset == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(methods=0),
        dict(constants=-1),
        dict(unique=1.5),
        dict(content_collision=-0.1),
        dict(dtype="float7"),
        dict(device="tpu"),
    ],
)
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValueError):
        SyntheticSpec(**bad)


def test_shared_constants_are_one_object():
    m = generate(SyntheticSpec(methods=8, constants=500, seed=2))
    a, b = m.methods[0].constants, m.methods[7].constants
    same = sum(x is y for x, y in zip(a, b))
    assert same > 400  # most slots are genuinely shared: one ConstantSpec, little memory at scale
