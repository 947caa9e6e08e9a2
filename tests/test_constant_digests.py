"""A constant's manifest digest decides a share only once the bytes bear it out (issue 38, item 2).

A program directory's manifest records each constant's sha256; a share is taken, and judged right
or wrong, on two constants' digests being equal, and ``fqn-weight-cache``'s export refused on their
differing.  Setting decode's ``_tensor_constant0`` digest in ``total_collision`` to prefill's made
the dry run say "ok" under ``fingerprint`` and the real load run decode on prefill's data.  Now the
two constants' bytes must be equal exactly when their digests are, derived from the piece records
where they tell (nothing read: the default path's shared weights) and read otherwise.

The family at the end edits constant digests of a few samples' manifests at random (in memory:
nothing is written) and dry-runs each case under a random policy: refused with an error naming
the edited field, or exactly the genuine verdict.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random

import pytest
from conftest import manifest_family
from test_errors import clone, edit_manifest, read_json

import toolkit
from toolkit.core.errors import IntegrityError, ManifestError
from toolkit.core.options import LoadOptions
from toolkit.core.policies import POLICIES
from toolkit.core.vocab import Stage
from toolkit.integrity import ClaimedConstant, ContentClaim, check_content_claims, derived_equal, file_record
from toolkit.integrity import claims as claims_module
from toolkit.sources.directory import MANIFEST_FILE, parse_manifest

SAMPLE = "total_collision"
FIELD = "constants[_tensor_constant0].digest"


def _constant(data: dict, method: str, name: str) -> dict:
    m = next(m for m in data["methods"] if m["name"] == method)
    return next(c for c in m["constants"] if c["name"] == name)


def _forged(built_sample, tmp_path):
    """A copy of total_collision whose decode claims prefill's digest for its ``_tensor_constant0``."""
    root = clone(built_sample(SAMPLE), tmp_path / "forged")
    data = read_json(root)
    digest = _constant(data, "prefill", "_tensor_constant0")["digest"]
    assert _constant(data, "decode", "_tensor_constant0")["digest"] != digest
    return edit_manifest(root, lambda d: _constant(d, "decode", "_tensor_constant0").__setitem__("digest", digest))


def _refused_by_the_claim(session, root, method="decode") -> None:
    assert session.status == "failed"
    e = session.exception
    assert isinstance(e, IntegrityError), repr(e)
    assert e.field == FIELD and f"method {method!r}" in str(e), str(e)
    assert e.path == str(root / f"methods/{method}/weights.blob")


@pytest.mark.parametrize("policy", ["fingerprint", "content-dedup", "name-only", "blind-share", "fqn-weight-cache"])
def test_a_forged_constant_digest_is_refused_by_the_dry_run(built_sample, tmp_path, policy):
    root = _forged(built_sample, tmp_path)
    dry = toolkit.dry_run(toolkit.open_program(root), policy)
    _refused_by_the_claim(dry.session, root)
    assert dry.verdict.outcome.value != "ok"


def test_a_forged_constant_digest_is_refused_by_the_real_load(built_sample, tmp_path):
    root = _forged(built_sample, tmp_path)
    s = toolkit.load_program(root, "fingerprint", "cpu")
    try:
        _refused_by_the_claim(s, root)
        assert "decode" not in s.methods and s.claim_seconds > 0
    finally:
        s.close()


def test_a_forged_difference_cannot_make_the_exporter_refuse(built_sample, tmp_path):
    """three_methods' encode and encode_again hold the same proj.weight, probe another: fqn-weight-cache's
    exporter refuses at probe.  With probe claiming encode's digest it would pass probe and, were
    encode_again's digest edited to differ, refuse at encode_again: a refusal resting on a false claim."""
    root = clone(built_sample("three_methods"), tmp_path / "differ")
    genuine = toolkit.dry_run(toolkit.open_program(root), "fqn-weight-cache")
    assert genuine.session.failed_stage is Stage.EXPORT and genuine.session.failed_method == "probe"

    def edit(d):
        _constant(d, "probe", "proj_weight")["digest"] = _constant(d, "encode", "proj_weight")["digest"]
        _constant(d, "encode_again", "proj_weight")["digest"] = "ab" * 32

    edit_manifest(root, edit)
    dry = toolkit.dry_run(toolkit.open_program(root), "fqn-weight-cache")
    e = dry.session.exception
    assert isinstance(e, IntegrityError) and e.field == "constants[proj_weight].digest", repr(e)
    assert "'encode_again'" in str(e) and e.path == str(root / "methods/encode_again/weights.blob")
    assert dry.session.failed_stage is not Stage.EXPORT and dry.verdict.outcome.value != "refused"


def test_the_genuine_program_is_unaffected(built_sample, tmp_path):
    genuine = built_sample(SAMPLE)
    root = clone(genuine, tmp_path / "genuine")
    for policy in ("fingerprint", "content-dedup", "name-only", "fqn-weight-cache"):
        dry = toolkit.dry_run(toolkit.open_program(root), policy)
        assert dry.session.failed_stage is not None or dry.session.status == "loaded", (policy, dry.session.error)
        assert dry.verdict.outcome == toolkit.dry_run(genuine, policy).verdict.outcome
    s = toolkit.load_program(root, "name-only", "cpu")  # shares _tensor_constant0: judged wrong, from the bytes
    try:
        assert s.status == "loaded", s.error
        assert s.verdict().outcome == toolkit.dry_run(genuine, "name-only").verdict.outcome
    finally:
        s.close()


def test_a_load_with_integrity_off_trusts_the_claims(built_sample, tmp_path):
    """As every record with ``integrity="off"``: nothing is read to check them."""
    root = _forged(built_sample, tmp_path)
    s = toolkit.load_program(root, "fingerprint", "cpu", options=LoadOptions(integrity="off"))
    try:
        assert s.status == "loaded" and s.claim_seconds == 0.0
    finally:
        s.close()


@pytest.fixture
def reads(monkeypatch):
    """The files claims.py reads bytes of, one set per pass."""
    seen = []
    real = claims_module._hash_segments
    monkeypatch.setattr(
        claims_module,
        "_hash_segments",
        lambda root, r, wanted, o: seen.append({f for f, _, _ in wanted}) or real(root, r, wanted, o),
    )
    return seen


def test_identical_pieces_decide_without_reading_and_other_bytes_are_read_once(built_sample, tmp_path, reads):
    """three_methods' encode_again shares encode's proj.weight: their blobs' pieces are equal, so
    the claim is derived; under name-only probe's proj.weight (other bytes, a piece that also holds
    head.weight) is read, once per process."""
    root = clone(built_sample("three_methods"), tmp_path / "three")
    s = toolkit.load_program(root, "fingerprint", "cpu")
    try:
        shared = s.decisions.query("decision == 'shared'")
        assert set(shared["method"]) == {"encode_again"} and reads == []
    finally:
        s.close()
    for _ in range(2):
        dry = toolkit.dry_run(toolkit.open_program(root), "name-only")
        assert dry.session.status == "loaded" and dry.verdict.outcome.value == "wrong"
    assert reads == [{"methods/probe/weights.blob", "methods/encode/weights.blob"}]


# ------------------------------------------------------------------ the check itself, on files of many pieces

PIECE = 4096


def _files(tmp_path, layout: dict[str, bytes]):
    records = {}
    for rel, data in layout.items():
        (tmp_path / rel).write_bytes(data)
        records[rel] = file_record(tmp_path / rel, chunk_bytes=PIECE)
    return records


def _claim(a: tuple, b: tuple, digests=None) -> ContentClaim:
    def one(method, rel, data, offset, nbytes, digest):
        return ClaimedConstant(
            method,
            f"w_{method}",
            rel,
            offset,
            nbytes,
            digest or hashlib.sha256(data[offset : offset + nbytes]).hexdigest(),
        )

    da, db = digests or (None, None)
    return ContentClaim(one(*a, da), one(*b, db))


def test_derivation_from_piece_records(tmp_path):
    x, y, z = os.urandom(3 * PIECE), os.urandom(PIECE), os.urandom(PIECE)
    a, b = x + y + z, y + x + z  # x at 0 in a, at one piece in b; z at the same place
    records = _files(tmp_path, {"a.blob": a, "b.blob": b})
    aligned = _claim(("m", "a.blob", a, 0, len(x)), ("n", "b.blob", b, PIECE, len(x)))
    assert derived_equal(records, aligned) is True  # a piece apart: the same pieces
    assert derived_equal(records, _claim(("m", "a.blob", a, 4 * PIECE, PIECE), ("n", "b.blob", b, 4 * PIECE, PIECE)))
    other = _claim(("m", "a.blob", a, 0, 2 * PIECE), ("n", "b.blob", b, 0, 2 * PIECE))
    assert derived_equal(records, other) is False  # whole pieces inside both, other digests
    partial = _claim(("m", "a.blob", a, 1, 100), ("n", "b.blob", b, PIECE + 1, 100))
    assert derived_equal(records, partial) is True
    partial = _claim(("m", "a.blob", a, 1, 100), ("n", "b.blob", b, 1, 100))
    assert derived_equal(records, partial) is None  # a piece partly outside: unknown
    assert derived_equal(records, _claim(("m", "a.blob", a, 0, 8), ("n", "b.blob", b, 0, 16))) is False
    records = _files(tmp_path, {"c.blob": a[: 3 * PIECE + 10], "d.blob": b[: 3 * PIECE + 10]})
    short = _claim(("m", "c.blob", a, 3 * PIECE, 10), ("n", "d.blob", b, 3 * PIECE, 10))
    assert derived_equal(records, short) is False  # a file's last, shorter piece, whole inside both
    assert derived_equal(records, _claim(("m", "a.blob", a, 5, 64), ("n", "a.blob", a, 5, 64))) is True


def test_check_reads_only_what_the_records_cannot_tell(tmp_path, reads):
    x = os.urandom(2 * PIECE)
    a, b = x + os.urandom(PIECE), os.urandom(PIECE // 2) + x + os.urandom(PIECE)
    records = _files(tmp_path, {"a.blob": a, "b.blob": b})
    same = _claim(("m", "a.blob", a, 0, len(x)), ("n", "b.blob", b, PIECE // 2, len(x)))
    assert same.claims_equal
    assert check_content_claims(tmp_path, records, [same]) == 1  # half a piece apart: read
    assert check_content_claims(tmp_path, records, [same]) == 0  # found true before, files unchanged
    assert check_content_claims(tmp_path, records, [same], LoadOptions(rehash=True)) == 1
    lie = _claim(("m", "a.blob", a, 0, len(x)), ("n", "b.blob", b, PIECE // 2, len(x)), ("cd" * 32, None))
    with pytest.raises(IntegrityError) as e:
        check_content_claims(tmp_path, records, [lie])
    assert e.value.field == "constants[w_m].digest" and e.value.path == str(tmp_path / "a.blob")
    assert "'n'/'w_n'" in str(e.value) and "different" in str(e.value)


def test_a_forged_equal_digest_on_other_bytes_names_the_false_one(tmp_path):
    a, b = os.urandom(3 * PIECE), os.urandom(3 * PIECE)
    records = _files(tmp_path, {"a.blob": a, "b.blob": b})
    held = hashlib.sha256(b[PIECE : 2 * PIECE]).hexdigest()
    forged = _claim(("m", "a.blob", a, 0, PIECE), ("n", "b.blob", b, PIECE, PIECE), (held, None))
    assert derived_equal(records, forged) is False  # derived: nothing read to know it
    with pytest.raises(IntegrityError) as e:
        check_content_claims(tmp_path, records, [forged])
    assert e.value.field == "constants[w_m].digest" and "equal" in str(e.value)
    own = hashlib.sha256(a[:PIECE]).hexdigest()
    forged = _claim(("m", "a.blob", a, 0, PIECE), ("n", "b.blob", b, PIECE, PIECE), (None, own))
    with pytest.raises(IntegrityError) as e:  # the held one claims the constant's digest: it is named
        check_content_claims(tmp_path, records, [forged])
    assert e.value.field == "constants[w_n].digest" and e.value.path == str(tmp_path / "b.blob")


def test_bytes_read_to_check_a_claim_are_verified_against_their_pieces(tmp_path):
    x = os.urandom(2 * PIECE)
    a, b = x + os.urandom(PIECE), os.urandom(PIECE // 2) + x + os.urandom(PIECE)
    records = _files(tmp_path, {"a.blob": a, "b.blob": b})
    claim = _claim(("m", "a.blob", a, 0, len(x)), ("n", "b.blob", b, PIECE // 2, len(x)))
    (tmp_path / "b.blob").write_bytes(b[:PIECE] + bytes(PIECE) + b[2 * PIECE :])  # not what its record says
    with pytest.raises(IntegrityError, match="does not match the program's record"):
        check_content_claims(tmp_path, records, [claim])


# ------------------------------------------------------------------ the family: random edits of constant digests

CASES = 320
_SAMPLES = ("total_collision", "partial_collision_shape", "three_methods")


@pytest.fixture(scope="module")
def family(built_sample):
    return manifest_family(built_sample, _SAMPLES)


def _shown(dry) -> tuple:
    return dry.verdict.outcome.value, dry.session.status


def _edit(rng: random.Random, data: dict, foreign: list[str]) -> tuple[dict, set[str], str]:
    """1-3 edits of constant digests; (edited manifest, the fields whose claim changed, note)."""
    d = copy.deepcopy(data)
    slots = [(m, c) for m in d["methods"] for c in m["constants"]]
    digests = [c["digest"] for _, c in slots]
    changed, notes = set(), []
    for m, c in rng.sample(slots, min(len(slots), rng.choice([1, 1, 2, 3]))):
        old = c["digest"]
        how = rng.choice(["random", "flip", "other-constant", "other-constant", "other-program", "same"])
        if how == "random":
            new = "%064x" % rng.getrandbits(256)
        elif how == "flip":
            i = rng.randrange(64)
            new = old[:i] + "0123456789abcdef"[(int(old[i], 16) + rng.randrange(1, 16)) % 16] + old[i + 1 :]
        elif how == "other-constant":
            new = rng.choice(digests)
        elif how == "other-program":
            new = rng.choice(foreign)
        else:
            new = old
        c["digest"] = new
        notes.append(f"{m['name']}/{c['name']}: {how}")
        if new != old:
            changed.add(f"constants[{c['name']}].digest")
    return d, changed, "; ".join(notes)


@pytest.mark.parametrize("seed", range(CASES))
def test_random_edits_of_constant_digests_are_refused_by_field_or_change_nothing(family, seed):
    rng = random.Random(f"constant-digests-{seed}")
    name = rng.choice(_SAMPLES)
    f = family[name]
    program, data = f["program"], f["data"]
    foreign = [c["digest"] for n in _SAMPLES if n != name for m in family[n]["data"]["methods"] for c in m["constants"]]
    edited, changed, note = _edit(rng, data, foreign)
    try:
        model = parse_manifest(edited, program.root / MANIFEST_FILE, program.root)
    except ManifestError as e:
        pytest.fail(f"{note}: a well-formed digest refused by the schema: {e}")
    policy = rng.choice(list(POLICIES))
    dry = toolkit.dry_run(model, policy)
    if dry.session.status == "failed" and isinstance(dry.session.exception, IntegrityError):
        e = dry.session.exception
        assert e.field in changed, (note, policy, str(e))
        return
    if policy not in f["genuine"]:
        f["genuine"][policy] = _shown(toolkit.dry_run(program, policy))
    assert _shown(dry) == f["genuine"][policy], f"{note}: the verdict under {policy} changed"


def test_the_family_is_large_enough():
    assert CASES >= 300
