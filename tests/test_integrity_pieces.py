"""BLAKE3 piece digests (program format 4) and only the pieces a load reads hashed.

A weights blob's copy is filled piece by piece as readers ask for byte ranges: a piece is read,
hashed and compared before anyone reads it; a piece no one asks for is never read or hashed.
Format 3 (sha256 pieces) and format 2 (one whole-file sha256) programs still verify.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import pytest
from test_errors import SAMPLE, clone, read_json, write_json

from toolkit.core.errors import IntegrityError, ManifestError
from toolkit.core.model import FileRecord
from toolkit.core.options import LoadOptions
from toolkit.engine.session import load_program
from toolkit.integrity import VerifiedFiles, chunk_digests, file_record, verified_files
from toolkit.sources import open_program
from toolkit.sources.directory import FORMAT_VERSION, manifest_json, parse_manifest

PIECE = 4096


def _file(tmp_path: Path, n: int = 10 * PIECE + 123) -> tuple[Path, bytes]:
    data = os.urandom(n)
    p = tmp_path / "blob"
    p.write_bytes(data)
    return p, data


def flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


# ----------------------------------------------------------------------------- the record


def test_the_builder_records_blake3_pieces_and_the_whole_sha256(tmp_path):
    p, data = _file(tmp_path)
    rec = file_record(p, PIECE)
    assert rec.chunk_digest == "blake3" and rec.sha256 == hashlib.sha256(data).hexdigest()
    assert rec.chunks == tuple(blake3.blake3(data[i : i + PIECE]).hexdigest() for i in range(0, len(data), PIECE))
    assert (
        file_record(p, PIECE, "sha256").chunks
        == chunk_digests(p, PIECE, digest="sha256")
        == tuple(hashlib.sha256(data[i : i + PIECE]).hexdigest() for i in range(0, len(data), PIECE))
    )


@pytest.fixture(scope="module")
def base(built_sample):
    return built_sample(SAMPLE)


def test_a_blake3_record_round_trips_through_the_manifest(base, tmp_path):
    text = (base.root / "manifest.json").read_text()
    assert FORMAT_VERSION == 4 and '"blake3_chunks"' in text and '"sha256_chunks"' not in text
    again = parse_manifest(__import__("json").loads(manifest_json(base)), tmp_path / "m.json")
    assert again.files == base.files
    assert {r.chunk_digest for r in base.files.values()} == {"blake3"}


@pytest.mark.parametrize(
    "edit, field, says",
    [
        (lambda r: r["blake3_chunks"].__setitem__(0, "Z" * 64), "blake3_chunks[0]", "should match pattern"),
        (lambda r: r["blake3_chunks"].__setitem__(0, "ab" * 31), "blake3_chunks[0]", "should match pattern"),
        (lambda r: r["blake3_chunks"].append("0" * 64), "blake3_chunks", "expected 1"),
        (lambda r: r.update(sha256_chunks=list(r["blake3_chunks"])), "blake3_chunks", "both given"),
    ],
    ids=["not hex", "short", "one too many", "both kinds"],
)
def test_a_malformed_blake3_record_names_its_field(base, tmp_path, edit, field, says):
    root = clone(base, tmp_path / "p")
    data = read_json(root)
    rel = data["methods"][0]["blob_file"]
    edit(data["files"][rel])
    write_json(root, data)
    with pytest.raises(ManifestError) as e:
        open_program(root)
    assert e.value.field == f"files[{rel!r}].{field}" and says in str(e.value)
    assert str(root / "manifest.json") in str(e.value)


def test_blake3_pieces_need_format_version_4(base, tmp_path):
    root = clone(base, tmp_path / "p")
    data = read_json(root)
    data["format_version"] = 3
    write_json(root, data)
    with pytest.raises(ManifestError, match="blake3 chunk digests need format version 4, not 3") as e:
        open_program(root)
    assert e.value.field.endswith(".blake3_chunks")


# ----------------------------------------------------------------------------- pieces read


def test_only_the_pieces_asked_for_are_read_and_hashed(tmp_path):
    p, data = _file(tmp_path)
    rec = file_record(p, PIECE)
    vf = VerifiedFiles()
    copy = vf.copy(p, rec, ranges=())
    assert vf.hashed_bytes == 0 and not copy.complete
    vf.more(copy, [(PIECE + 10, 2 * PIECE + 1)])  # touches pieces 1 and 2
    assert vf.hashed_bytes == 2 * PIECE
    with open(copy.path, "rb") as f:
        assert f.read()[PIECE : 3 * PIECE] == data[PIECE : 3 * PIECE]
    vf.more(copy, [(PIECE, PIECE + 1), (5, 5)])  # piece 1 again, and an empty range: nothing new
    assert vf.hashed_bytes == 2 * PIECE and vf.hashes == 1
    vf.more(copy)  # the rest
    assert vf.hashed_bytes == len(data) and copy.complete
    assert Path(copy.path).read_bytes() == data


def test_a_flipped_byte_in_a_piece_read_is_refused_naming_the_file(tmp_path):
    p, _ = _file(tmp_path)
    rec = file_record(p, PIECE)
    flip_byte(p, 7 * PIECE + 3)
    vf = VerifiedFiles()
    copy = vf.copy(p, rec, ranges=[(0, PIECE)])  # piece 0 is intact: no error, piece 7 not read
    assert vf.hashed_bytes == PIECE
    with pytest.raises(
        IntegrityError,
        match=rf"BLAKE3 does not match the program's record \(the {PIECE}-byte "
        rf"piece at byte {7 * PIECE}\)",
    ) as e:
        vf.more(copy, [(7 * PIECE, 7 * PIECE + 1)])
    assert e.value.path == str(p)
    with pytest.raises(IntegrityError):  # still refused: the piece stays unverified
        vf.more(copy, [(7 * PIECE + 100, 7 * PIECE + 101)])
    # the whole-file check (every byte now) refuses it at once
    with pytest.raises(IntegrityError, match="piece at byte 28672"):
        VerifiedFiles().copy(p, rec)


def test_a_write_after_the_check_into_a_piece_not_yet_read_is_refused(tmp_path):
    """The file is read through the descriptor held since the check: a piece written after it
    (same inode) is refused when it is read."""
    p, _ = _file(tmp_path)
    rec = file_record(p, PIECE)
    vf = VerifiedFiles()
    copy = vf.copy(p, rec, ranges=())
    flip_byte(p, 3 * PIECE)
    with pytest.raises(IntegrityError, match="piece at byte 12288"):
        vf.more(copy, [(3 * PIECE, 3 * PIECE + 8)])


def test_a_file_swapped_in_after_the_check_is_never_read(tmp_path):
    p, data = _file(tmp_path)
    rec = file_record(p, PIECE)
    vf = VerifiedFiles()
    copy = vf.copy(p, rec, ranges=())
    other = tmp_path / "other"
    other.write_bytes(os.urandom(len(data)))
    other.replace(p)  # renamed over the program's file
    vf.more(copy)  # the held descriptor still reads the checked file: every piece matches
    assert Path(copy.path).read_bytes() == data


def test_a_copy_being_filled_is_sealed_against_other_writers(tmp_path):
    p, data = _file(tmp_path)
    copy = VerifiedFiles().copy(p, file_record(p, PIECE), ranges=[(0, 1)])
    with pytest.raises(PermissionError):
        with open(copy.path, "r+b") as f:  # a write() through another descriptor
            f.write(b"x")
    import mmap

    fd = os.open(copy.path, os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, len(data))  # a new shared writable mapping
        with pytest.raises(OSError):
            os.ftruncate(fd, 1)
    finally:
        os.close(fd)


@pytest.mark.parametrize("digest", ["sha256", None], ids=["format 3 (sha256 pieces)", "format 2 (whole sha256)"])
def test_older_records_still_verify(tmp_path, digest):
    p, data = _file(tmp_path)
    rec = file_record(p, PIECE, "sha256") if digest else FileRecord(hashlib.sha256(data).hexdigest(), len(data))
    vf = VerifiedFiles()
    copy = vf.copy(p, rec, ranges=[(0, 1)])
    # sha256 pieces: only piece 0; one whole-file digest: any byte read needs all of them
    assert vf.hashed_bytes == (PIECE if digest else len(data))
    vf.more(copy)
    assert Path(copy.path).read_bytes() == data
    flip_byte(p, len(data) - 1)
    with pytest.raises(IntegrityError, match="sha256 does not match the program's record") as e:
        VerifiedFiles().copy(p, rec)
    assert e.value.path == str(p)


# ----------------------------------------------------------------------------- whole loads


def _as_format(root: Path, version: int) -> None:
    """Rewrite a program's records as format ``version`` writes them (3: sha256 pieces; 2: none)."""
    data = read_json(root)
    data["format_version"] = version
    for rel, rec in data["files"].items():
        del rec["blake3_chunks"]
        if version == 3:
            rec["sha256_chunks"] = list(chunk_digests(root / rel, rec["chunk_bytes"], digest="sha256"))
        else:
            del rec["chunk_bytes"]
    write_json(root, data)


def set_piece_size(root: Path, piece: int) -> None:
    data = read_json(root)
    for rel, rec in data["files"].items():
        rec["chunk_bytes"], rec["blake3_chunks"] = piece, list(chunk_digests(root / rel, piece))
    write_json(root, data)


@pytest.fixture
def fresh():
    verified_files().clear()
    yield verified_files()
    verified_files().clear()


def test_a_blob_no_constant_is_read_from_is_not_hashed(base, tmp_path, fresh):
    """name-only shares decode's one constant from prefill: decode's blob is never read, so a
    flipped byte in it goes unnoticed; integrity="files-first" verifies every byte first and refuses it."""
    root = clone(base, tmp_path / "p")
    set_piece_size(root, PIECE)
    blob = root / "methods/decode/weights.blob"
    flip_byte(blob, 0)
    before = fresh.hashed_bytes  # the process's counter: earlier tests count into it too
    prog = open_program(root)
    s = load_program(prog, "name-only")
    assert s.status == "loaded", s.error
    read = sum(v.bytes for k, v in prog.files.items() if k != "methods/decode/weights.blob")
    assert fresh.hashed_bytes - before == read  # every other file whole, nothing of decode's blob
    s.close()
    fresh.clear()
    s = load_program(prog, "name-only", options=LoadOptions(integrity="files-first"))
    assert s.status == "failed" and s.exception.path == str(blob)
    assert s.failed_method == "decode" and not s.methods  # before any .so was opened


def test_a_flipped_byte_in_a_blob_read_fails_that_method_before_its_uploads(base, tmp_path, fresh):
    root = clone(base, tmp_path / "p")
    set_piece_size(root, PIECE)
    blob = root / "methods/decode/weights.blob"
    c = next(c for m in open_program(root).methods if m.name == "decode" for c in m.constants)
    flip_byte(blob, c.offset + c.nbytes - 1)
    s = load_program(root, "fingerprint")  # declines the share: decode's constant is uploaded from its blob
    assert s.status == "failed" and s.failed_method == "decode"
    assert isinstance(s.exception, IntegrityError) and s.exception.path == str(blob)
    assert "BLAKE3 does not match the program's record" in s.error and str(blob) in s.error
    assert "decode" not in s.methods


@pytest.mark.parametrize("version", [3, 2])
def test_older_format_programs_still_load_and_verify(base, tmp_path, fresh, version):
    root = clone(base, tmp_path / "p")
    _as_format(root, version)
    prog = open_program(root)
    assert {r.chunk_digest if r.chunks else "whole" for r in prog.files.values()} == (
        {"sha256"} if version == 3 else {"whole"}
    )
    s = load_program(prog, "fingerprint")
    assert s.status == "loaded", s.error
    s.close()
    fresh.clear()
    flip_byte(root / "methods/prefill/weights.blob", 5)
    s = load_program(prog, "fingerprint")
    assert s.status == "failed" and s.failed_method == "prefill"
    assert "sha256 does not match the program's record" in s.error


# ----------------------------------------------------------------------------- integrity="in-place"


def test_in_place_hashes_the_pieces_read_in_the_file_and_names_it(tmp_path):
    p, data = _file(tmp_path)
    rec = file_record(p, PIECE)
    vf = VerifiedFiles()
    opts = LoadOptions(integrity="in-place")
    copy = vf.copy(p, rec, opts, ranges=[(0, 1)])
    assert copy.in_place and copy.path == p and vf.hashed_bytes == PIECE  # no copy: the file itself
    flip_byte(p, 9 * PIECE)
    with pytest.raises(IntegrityError, match=rf"piece at byte {9 * PIECE}") as e:
        vf.more(copy, [(9 * PIECE, 9 * PIECE + 1)])
    assert e.value.path == str(p)
    assert vf.copy(p, rec, ranges=()).in_place is False  # asked with a copy: a copy, not the in-place record
    assert vf.copy(p, rec, opts, ranges=()).in_place is False  # and the sealed copy then serves in-place readers
    # whole-file reads (a .so, a reference) are always copied
    q = tmp_path / "so"
    q.write_bytes(data)
    assert not vf.copy(q, file_record(q, PIECE), opts).in_place


def test_in_place_loads_upload_from_the_program_files_and_open_so_copies(base, tmp_path, fresh):
    from test_isolation import mapped_files

    root = clone(base, tmp_path / "p")
    opts = LoadOptions(integrity="in-place")
    s = load_program(root, "fingerprint", options=opts)
    assert s.status == "loaded", s.error
    assert str(root / "methods/prefill/model.so") not in mapped_files()  # dlopen'ed from its sealed copy
    s.close()
    fresh.clear()
    blob = root / "methods/decode/weights.blob"
    flip_byte(blob, 3)
    s = load_program(root, "fingerprint", options=opts)
    assert s.status == "failed" and s.failed_method == "decode" and s.exception.path == str(blob)
    assert "decode" not in s.methods


def test_a_copy_dropped_over_the_budget_but_still_held_is_not_read_again(tmp_path):
    """The budget drops the least recently used copy; while a load still holds it (its memory is spent
    anyway), the file is not read, hashed and copied a second time."""
    a, _ = _file(tmp_path)
    b = tmp_path / "other"
    b.write_bytes(os.urandom(a.stat().st_size))
    files = VerifiedFiles(budget_bytes=a.stat().st_size)  # room for one copy
    held = files.copy(a, file_record(a, PIECE))
    files.copy(b, file_record(b, PIECE))  # drops a's copy from the budget
    hashed = files.hashes
    assert files.copy(a, file_record(a, PIECE)) is held and files.hashes == hashed
    del held
    import gc

    gc.collect()
    files.copy(b, file_record(b, PIECE))  # a's copy dropped again, now held by no one
    files.copy(a, file_record(a, PIECE))
    assert files.hashes > hashed  # gone: read and verified again


@pytest.mark.parametrize("ranges", [None, [(0, 10)]], ids=["whole", "lazy"])
def test_a_record_with_too_few_piece_digests_is_refused_read_whole_or_lazily(tmp_path, ranges):
    """One piece table serves both ways of reading: a record whose digests do not cover the file
    is an error naming it, never a tail of bytes taken as verified."""
    from dataclasses import replace

    p, _ = _file(tmp_path)
    short = replace(file_record(p, PIECE), chunks=file_record(p, PIECE).chunks[:-1])
    with pytest.raises(IntegrityError, match="piece digests recorded") as e:
        VerifiedFiles().copy(p, short, ranges=ranges)
    assert e.value.path == str(p)
