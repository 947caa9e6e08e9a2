"""Claimed digests decide nothing unchecked (issue 38, item 2).

A program directory records each file's whole sha256 beside its piece digests; a load verifies
the pieces, so the sha256 is a claim.  It used to decide two things: the key a ``.so`` is kept
under for the process (a program claiming another's sha256 for its own ``.so``, loaded first,
made that other program run its code) and ExecuTorch 1.5.x's key of lifted constants
(``fqn-weight-cache``: editing the claim alone turned "refused" into "ok").  Now the ``.so`` is
kept under the sha256 of its own verified bytes, and a claim a key is made of is checked
against the bytes before the first decision, in the dry run (which reads the file, opens
nothing) as in the real load.

The family at the end edits the claimed digest fields of two samples' manifests at random
(in memory: nothing is written) and checks each case with the cheap dry run or the record
check alone: refused with an error naming the edited field, or the genuine verdict.
"""

from __future__ import annotations

import copy
import os
import random
import uuid
from pathlib import Path

import pytest
from conftest import manifest_family
from test_errors import clone, edit_manifest, read_json, refresh_digests

import toolkit
from toolkit.core.errors import IntegrityError, ManifestError
from toolkit.core.options import LoadOptions
from toolkit.core.policies import POLICIES, get_policy
from toolkit.integrity import check_claimed_sha256, copy_region, keep_for_process
from toolkit.sources.directory import MANIFEST_FILE, PLACEHOLDER_SHA256, key_claims, parse_manifest

GENUINE = "total_collision"  # two methods, byte-identical .so files, lifted constants: fqn-weight-cache refuses it
OTHER = "partial_collision_shape"  # lifted constants too, two different .so files: fqn-weight-cache loads it
SO = "methods/decode/model.so"


def _field(rel: str) -> str:
    return f"files[{rel!r}].sha256"


def _padded(program, dst: Path) -> Path:
    """A copy of ``program`` whose .so files end in bytes no other test has (the loader ignores
    what follows an ELF's sections), so no copy of them is kept in this process yet."""
    root = clone(program, dst)
    tail = uuid.uuid4().bytes * 4
    for m in program.methods:
        with open(root / m.so_file, "ab") as f:
            f.write(tail)
    return refresh_digests(root)


@pytest.fixture
def opened(monkeypatch):
    """The path of every compiled model the AOTInductor runtime creates a container from."""
    from toolkit.runtimes import aoti

    paths: list[str] = []
    real = aoti.AotiContainer.create

    def create(cls, so_path, device):
        paths.append(str(so_path))
        return real.__func__(cls, so_path, device)

    monkeypatch.setattr(aoti.AotiContainer, "create", classmethod(create))
    return paths


# ------------------------------------------------------------------ a .so is kept under its own bytes


def test_a_program_claiming_anothers_so_digest_cannot_lend_it_its_code(built_sample, tmp_path, opened):
    """The attack: B's manifest claims A's .so sha256 for B's own prefill .so (B's piece digests
    are B's, so B's pieces verify); B is loaded first.  A, loaded next in the same process, must
    run A's code and verify; B is refused, naming the field that lies."""
    genuine = _padded(built_sample(GENUINE), tmp_path / "genuine")
    claimed = read_json(genuine)["files"][SO]["sha256"]
    claimant = clone(built_sample("dtype_mismatch"), tmp_path / "claimant")
    edit_manifest(claimant, lambda d: d["files"]["methods/prefill/model.so"].update(sha256=claimed))

    b = toolkit.load_program(claimant, "no-sharing")
    b_status = b.status
    b.close()
    opened.clear()
    a = toolkit.load_program(genuine, "no-sharing")
    try:
        assert a.status == "loaded", a.error
        ran = [Path(p).read_bytes() for p in opened]
        assert ran == [(genuine / m.so_file).read_bytes() for m in a.program.methods], "A ran other bytes"
        v = a.verify()
        assert v["ok"].all(), v[["method", "max_abs_err", "reason"]].to_dict("records")
    finally:
        a.close()
    assert b_status == "failed" and isinstance(b.exception, IntegrityError), "B's lying record was loaded"
    assert b.exception.field == _field("methods/prefill/model.so") and b.failed_method == "prefill"
    assert str(claimant / "methods/prefill/model.so") in b.error and claimed in b.error


def test_the_process_keeps_a_so_under_the_digest_of_its_own_bytes(tmp_path):
    """keep_for_process takes no claim: two copies of other bytes are two kept copies, two copies
    of the same bytes one."""
    nonce = uuid.uuid4().bytes
    files = {}
    for name, body in (("a", b"A"), ("b", b"B"), ("a2", b"A")):
        files[name] = tmp_path / name
        files[name].write_bytes(body * 4096 + nonce)
    a, b, a2 = (copy_region(files[n], 0, files[n].stat().st_size)[0] for n in ("a", "b", "a2"))
    assert keep_for_process(a) is a
    assert keep_for_process(b) is b
    assert keep_for_process(a2) is a
    assert a.sha256() != b.sha256()


# ------------------------------------------------------------------ the key of ExecuTorch 1.5.x


@pytest.mark.parametrize(
    "sample, value",
    [
        (GENUINE, "ab" * 32),  # refused -> ok, unchecked: decode's lifted constant under a key of its own
        (GENUINE, PLACEHOLDER_SHA256),  # the placeholder: each method counted as its own .so
        (OTHER, "prefill"),  # ok -> refused, unchecked: decode claims prefill's .so, their keys collide
    ],
    ids=["random", "placeholder", "another-method"],
)
def test_editing_the_claimed_so_digest_alone_does_not_change_fqn_weight_cache(built_sample, tmp_path, sample, value):
    program = built_sample(sample)
    genuine = toolkit.dry_run(program, "fqn-weight-cache").verdict.outcome
    root = clone(program, tmp_path / "p")
    if value == "prefill":
        value = read_json(root)["files"]["methods/prefill/model.so"]["sha256"]
    edit_manifest(root, lambda d: d["files"][SO].update(sha256=value))

    dry = toolkit.dry_run(root, "fqn-weight-cache")
    assert dry.session.status == "failed", f"{genuine} became {dry.verdict.outcome} on the claim alone"
    assert isinstance(dry.session.exception, IntegrityError)
    assert dry.session.exception.field == _field(SO) and dry.session.exception.path == str(root / SO)
    assert _field(SO) in dry.verdict.error and dry.verdict.outcome != genuine

    s = toolkit.load_program(root, "fqn-weight-cache")
    try:
        assert s.status == "failed" and isinstance(s.exception, IntegrityError), s.error
        assert s.exception.field == _field(SO) and s.failed_method == "decode"
        assert s.verdict().outcome != genuine
    finally:
        s.close()


def test_an_unedited_program_gives_its_verdict_and_opens_nothing_in_the_dry_run(built_sample, tmp_path, opened):
    """The control: the check reads the .so files (hashing them) and opens none of them."""
    program = built_sample(GENUINE)
    dry = toolkit.dry_run(clone(program, tmp_path / "p"), "fqn-weight-cache")
    assert dry.verdict.outcome.value == "refused" and dry.session.failed_stage.value == "export"
    assert opened == []
    assert str(tmp_path) not in Path("/proc/self/maps").read_text()


def test_a_claim_a_key_is_made_of_must_be_verifiable(built_sample, tmp_path):
    """A manifest whose .so is gone: the claim cannot be checked, so the dry run does not trust it."""
    root = clone(built_sample(GENUINE), tmp_path / "p")
    os.unlink(root / SO)
    dry = toolkit.dry_run(root, "fqn-weight-cache")
    assert dry.session.status == "failed" and isinstance(dry.session.exception, IntegrityError)
    assert dry.session.exception.path == str(root / SO) and "missing" in dry.session.error
    assert toolkit.dry_run(root, "fingerprint").session.status == "loaded"  # no key of it: nothing to trust


# ------------------------------------------------------------------ the family: random edits of claimed digests

CASES = 320
_SAMPLES = (GENUINE, OTHER)
_KEYS_READ = [p for p in POLICIES if get_policy(p).reads_so_keys]


@pytest.fixture(scope="module")
def family(built_sample):
    """Per sample: its program, its manifest, its genuine dry-run frame per policy (made when needed)."""
    return manifest_family(built_sample, _SAMPLES)


def _shown(dry) -> list:
    cols = [c for c in ("method", "name", "decision", "reason_code", "key") if c in dry.decisions.columns]
    return [dry.verdict.outcome.value, dry.session.status, dry.decisions[cols].to_dict("records")]


# how a claim is edited, the ones the schema refuses (not a digest) rarer than the ones it reads
_HOW = (
    ["random"] * 3
    + ["flip"] * 3
    + ["other-file"] * 2
    + ["other-program"] * 2
    + ["placeholder", "same", "upper", "short"]
)


def _edit(rng: random.Random, data: dict, others: list[str]) -> tuple[dict, list[str], str]:
    """1-2 edits of claimed sha256 fields (half the time of .so files); (edited manifest, the files whose
    claim changed, note)."""
    d = copy.deepcopy(data)
    files = d["files"]
    rels = sorted(files)
    changed, notes = [], []
    sos = [r for r in rels if r.endswith(".so")]
    for rel in rng.sample(sos if rng.random() < 0.5 else rels, rng.choice([1, 1, 2])):
        old = files[rel]["sha256"]
        how = rng.choice(_HOW)
        if how == "random":
            new = "%064x" % rng.getrandbits(256)
        elif how == "flip":
            i = rng.randrange(64)
            new = old[:i] + "0123456789abcdef"[(int(old[i], 16) + rng.randrange(1, 16)) % 16] + old[i + 1 :]
        elif how == "other-file":
            new = data["files"][rng.choice(rels)]["sha256"]
        elif how == "other-program":
            new = rng.choice(others)
        elif how == "placeholder":
            new = PLACEHOLDER_SHA256
        elif how == "upper":
            new = old.upper() if any(ch.isalpha() for ch in old) else old[:-1] + "A"
        elif how == "short":
            new = old[: rng.randrange(64)]
        else:
            new = old
        files[rel]["sha256"] = new
        notes.append(f"{rel}: {how}")
        if new != data["files"][rel]["sha256"]:
            changed.append(rel)
    return d, sorted(set(changed)), "; ".join(notes)


@pytest.mark.parametrize("seed", range(CASES))
def test_random_edits_of_claimed_digests_are_refused_by_field_or_change_nothing(family, seed):
    rng = random.Random(f"claimed-digests-{seed}")
    name = rng.choice(_SAMPLES)
    f = family[name]
    program, data = f["program"], f["data"]
    others = [
        r.sha256 for n in _SAMPLES if n != name for rel, r in family[n]["program"].files.items() if rel.endswith(".so")
    ]
    edited, changed, note = _edit(rng, data, others)
    fields = {_field(rel) for rel in changed}
    try:
        model = parse_manifest(edited, program.root / MANIFEST_FILE, program.root)
    except ManifestError as e:  # not a digest at all (upper case, short): the schema names it
        assert e.field in fields, (note, str(e))
        return

    if rng.random() < 0.2:  # the record check alone, file by file: every changed claim refused by name
        for rel in sorted(model.files):
            if rel in changed:
                with pytest.raises(IntegrityError) as e:
                    check_claimed_sha256(model.root, model.files, [rel], LoadOptions())
                assert e.value.field == _field(rel) and e.value.path == str(model.root / rel), note
            else:
                check_claimed_sha256(model.root, model.files, [rel], LoadOptions())
        return

    policy = rng.choice(_KEYS_READ * 3 + list(POLICIES))
    dry = toolkit.dry_run(model, policy)
    keyed = set(key_claims(program)) & set(changed)  # claims a key of this program is made of
    if dry.session.status == "failed" and isinstance(dry.session.exception, IntegrityError):
        e = dry.session.exception
        assert e.field in fields and e.path == str(program.root / e.field.split("'")[1]), (note, str(e))
        assert keyed and get_policy(policy).reads_so_keys, f"{note}: refused, though no key reads the claim"
        return
    assert not (keyed and get_policy(policy).reads_so_keys), f"{note}: a key made of an unchecked claim decided"
    if policy not in f["genuine"]:
        f["genuine"][policy] = _shown(toolkit.dry_run(program, policy))
    assert _shown(dry) == f["genuine"][policy], f"{note}: the verdict under {policy} changed"


def test_the_family_is_large_enough():
    assert CASES >= 300
