"""Verified staging.  A batch of per-constant uploads reads each piece of the
file's record once into the process's own staging slots, hashes it there and copies it from there
(toolkit.upload.stage_pieces); no private copy of the file is filled.  The planning is pure
(toolkit.integrity.plan_piece_copies); the CPU runs the same pipeline with plain slots, so every CPU
load of the default path exercises it.
"""

from __future__ import annotations

import hashlib
import os
import random

import pytest
import torch
from test_errors import SAMPLE, clone
from test_integrity_pieces import flip_byte, set_piece_size
from test_upload import spec

from toolkit import upload
from toolkit.core.errors import IntegrityError
from toolkit.core.model import FileRecord
from toolkit.core.options import LoadOptions, options_from_environment
from toolkit.core.vocab import FirstLoad, Integrity, UploadPath
from toolkit.engine.session import load_program
from toolkit.integrity import PieceCopy, file_record, plan_piece_copies, record_piece_plan, verified_files
from toolkit.sources import open_program
from toolkit.upload import staging
from toolkit.upload.slots import Slots, pinned_block, take_slots

PIECE = 4096


# ----------------------------------------------------------------------------- the plan (pure)


def test_a_plan_names_each_piece_a_batch_reads_and_the_copies_it_feeds():
    pieces = [(0, 100, "a"), (100, 100, "b"), (200, 100, "c"), (300, 50, "d")]
    # constant 0 spans pieces 0-2 unaligned, 1 is empty, 2 lies inside piece 2, none reads piece 3
    plan = plan_piece_copies(pieces, [(30, 200), (120, 0), (250, 10)])
    assert [(p.index, p.start, p.length, p.digest) for p in plan] == [
        (0, 0, 100, "a"),
        (1, 100, 100, "b"),
        (2, 200, 100, "c"),
    ]
    assert plan[0].copies == (PieceCopy(0, 0, 30, 70),)
    assert plan[1].copies == (PieceCopy(0, 70, 0, 100),)
    assert plan[2].copies == (PieceCopy(0, 170, 0, 30), PieceCopy(2, 0, 50, 10))


def test_a_record_without_pieces_is_one_piece_under_its_sha256(tmp_path):
    rec = FileRecord(sha256="f" * 64, bytes=1000)
    plan = record_piece_plan(rec, tmp_path / "x", [(10, 5), (900, 100)])
    assert [(p.index, p.start, p.length, p.digest) for p in plan] == [(0, 0, 1000, "f" * 64)]
    assert plan[0].copies == (PieceCopy(0, 0, 10, 5), PieceCopy(1, 0, 900, 100))


def test_a_range_outside_every_piece_is_refused():
    with pytest.raises(ValueError, match=r"bytes \[100, 120\) of constant 0 lie in no piece"):
        plan_piece_copies([(0, 100, None)], [(90, 30)])


def test_random_plans_cover_every_byte_of_every_constant_once():
    rng = random.Random(7)
    for _ in range(200):
        size, step = rng.randint(1, 5000), rng.randint(1, 700)
        pieces = [(s, min(step, size - s), str(s)) for s in range(0, size, step)]
        spans = []
        for _ in range(rng.randint(0, 8)):
            off = rng.randint(0, size - 1)
            spans.append((off, rng.randint(0, size - off)))
        got: dict[int, list[int]] = {k: [] for k in range(len(spans))}
        for p in plan_piece_copies(pieces, spans):
            assert pieces[p.index] == (p.start, p.length, p.digest)
            for cp in p.copies:
                assert 0 <= cp.in_piece and cp.in_piece + cp.nbytes <= p.length and cp.nbytes > 0
                assert p.start + cp.in_piece == spans[cp.constant][0] + cp.in_constant
                got[cp.constant] += range(cp.in_constant, cp.in_constant + cp.nbytes)
        assert all(sorted(got[k]) == list(range(n)) for k, (_, n) in enumerate(spans))


# ----------------------------------------------------------------------------- the pipeline (CPU)


def _specs(data_len: int) -> list:
    """Constants spanning several pieces, unaligned, empty, one byte, sharing a piece, at the end."""
    sizes = [
        (5, 3 * PIECE + 11),
        (3 * PIECE + 20, 0),
        (3 * PIECE + 20, 1),
        (3 * PIECE + 21, 700),
        (7 * PIECE - 3, 2 * PIECE),
        (data_len - 9, 9),
    ]
    return [spec(f"c{i}", off, n) for i, (off, n) in enumerate(sizes)]


@pytest.fixture
def blob(tmp_path):
    data = os.urandom(10 * PIECE + 123)
    p = tmp_path / "weights.blob"
    p.write_bytes(data)
    return p, data


def _stage(path, record, specs, **kw):
    kw.setdefault("threads", 3)
    return upload.stage_pieces(path, record, specs, torch.device("cpu"), **kw)


@pytest.mark.parametrize("threads,chunk", [(1, 8 << 20), (3, 1000), (4, PIECE)])
def test_the_bytes_staged_are_the_files(blob, threads, chunk):
    path, data = blob
    specs = _specs(len(data))
    counted = []
    outs = _stage(path, file_record(path, PIECE), specs, threads=threads, chunk_bytes=chunk, on_hashed=counted.append)
    for c, t in zip(specs, outs):
        assert t.dtype == torch.uint8 and t.device.type == "cpu" and t.numel() == c.nbytes
        assert t.numpy().tobytes() == data[c.offset : c.offset + c.nbytes], c.name
    # every piece some constant reads, hashed once (pieces 0-3, 6-8 and the last), none of 4, 5 and 9
    assert counted == [8 * PIECE - PIECE + 123]


def test_a_sparse_file_with_holes_stages_its_zeros(tmp_path):
    p = tmp_path / "sparse.blob"
    with open(p, "wb") as f:
        f.truncate(40 * PIECE)
        for at in (PIECE + 7, 20 * PIECE, 40 * PIECE - 5):
            f.seek(at)
            f.write(os.urandom(5 if at == 40 * PIECE - 5 else 3000))
    data = p.read_bytes()
    specs = [spec("a", 0, 40 * PIECE), spec("b", PIECE + 1, 3 * PIECE), spec("c", 39 * PIECE, PIECE)]
    for rec in (file_record(p, PIECE), FileRecord(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))):
        outs = _stage(p, rec, specs, chunk_bytes=3 * PIECE)
        assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]


def test_a_record_without_pieces_hashes_the_whole_file_once(blob):
    path, data = blob
    rec = FileRecord(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    counted = []
    outs = _stage(path, rec, [spec("x", 100, 50)], chunk_bytes=1000, on_hashed=counted.append)
    assert outs[0].numpy().tobytes() == data[100:150] and counted == [len(data)]
    flip_byte(path, len(data) - 1)  # a byte no constant reads: the whole-file digest still refuses it
    with pytest.raises(IntegrityError, match="sha256 does not match the program's record") as ei:
        _stage(path, rec, [spec("x", 100, 50)])
    assert ei.value.path == str(path)


def test_a_tampered_piece_a_constant_reads_fails_naming_file_and_piece(blob):
    path, data = blob
    rec, specs = file_record(path, PIECE), _specs(len(data))
    flip_byte(path, 4 * PIECE + 10)  # piece 4: no constant reads it
    flip_byte(path, 9 * PIECE + 1)  # piece 9: no constant reads it either
    outs = _stage(path, rec, specs)
    assert outs[4].numpy().tobytes() == data[specs[4].offset : specs[4].offset + specs[4].nbytes]
    flip_byte(path, 7 * PIECE + 100)  # piece 7: constant c4 reads it
    counted = []
    with pytest.raises(IntegrityError) as ei:
        _stage(path, rec, specs, on_hashed=counted.append)
    assert ei.value.path == str(path)
    assert f"BLAKE3 does not match the program's record (the {PIECE}-byte piece at byte {7 * PIECE})" in str(ei.value)
    assert str(path) in str(ei.value) and counted and counted[0] <= 7 * PIECE + 123


def test_a_file_shrunk_under_the_staging_is_a_clean_error(blob, monkeypatch):
    path, data = blob
    rec = file_record(path, PIECE)
    real = staging.open_checked

    def open_then_shrink(p, record):  # the check passes, then the file loses its last pieces
        got = real(p, record)
        os.truncate(p, 5 * PIECE)
        return got

    monkeypatch.setattr(staging, "open_checked", open_then_shrink)
    with pytest.raises(IntegrityError, match="file ended while it was read") as ei:
        _stage(path, rec, _specs(len(data)))
    assert ei.value.path == str(path)


def test_a_file_of_another_size_or_a_constant_past_its_end_is_refused(blob):
    path, data = blob
    rec = file_record(path, PIECE)
    with pytest.raises(IntegrityError, match="ends before constant 'late'") as ei:
        _stage(path, rec, [spec("late", len(data) - 2, 3)])
    assert ei.value.path == str(path)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(IntegrityError, match="file is oversized"):
        _stage(path, rec, [spec("x", 0, 10)])


def test_unhashed_staging_delivers_the_bytes(blob):
    path, data = blob
    specs = _specs(len(data))
    counted = []
    outs = _stage(path, None, specs, chunk_bytes=1000, on_hashed=counted.append)
    assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert counted == []  # nothing hashed
    assert [(s, n) for s, n, _ in upload.unhashed_pieces(specs, len(data), 2 * PIECE)][-1][0] + upload.unhashed_pieces(
        specs, len(data), 2 * PIECE
    )[-1][1] == len(data)


def test_staging_slots_are_reused_and_never_shared_by_two_batches_at_once():
    dev = torch.device("cpu")
    with take_slots(dev, 2, 1000) as a:
        with take_slots(dev, 2, 1000) as b:
            assert a is not b
    with take_slots(dev, 2, 1000) as c:
        assert c in (a, b)


def test_slots_make_the_buffers_of_the_workers_a_batch_will_use_ahead_and_once():
    from concurrent.futures import wait

    slots = Slots(torch.device("cpu"), 3, 1000)
    wait(slots.prepare(2))
    assert [len(b) for b in slots.bufs] == [2, 2, 0]  # two workers' two buffers each, the third's not
    first = slots.worker_bufs(0)[0][0]
    assert slots.prepare(2) == [] and slots.worker_bufs(0)[0][0] is first  # made once, then reused
    assert len(slots.prepare(5)) == 1 and len(slots.worker_bufs(2)) == 2  # never past the set's workers


def test_the_options_select_staging_and_its_slot_size():
    assert LoadOptions().integrity is Integrity.STAGED and LoadOptions().staging_chunk_bytes == 16 << 20
    o = options_from_environment(
        {"CONSTSHARE_INTEGRITY": "copy", "CONSTSHARE_STAGING_CHUNK_MIB": "64", "CONSTSHARE_FIRST_LOAD": "pipelined"}
    )
    assert (o.integrity, o.staging_chunk_bytes, o.first_load) == (Integrity.COPY, 64 << 20, FirstLoad.PIPELINED)
    with pytest.raises(ValueError, match="CONSTSHARE_STAGING_CHUNK_MIB='0'"):
        options_from_environment({"CONSTSHARE_STAGING_CHUNK_MIB": "0"})


# ----------------------------------------------------------------------------- the loader (CPU)


@pytest.fixture(scope="module")
def base(built_sample):
    return built_sample(SAMPLE)


@pytest.fixture
def fresh():
    verified_files().clear()
    yield verified_files()
    verified_files().clear()


def _uploads(s):
    return [e for e in s.log if e.kind.value == "constant_uploaded"]


def _file_bytes(prog, c, blob_file) -> bytes:
    with open(prog.path(c.file or blob_file), "rb") as f:
        f.seek(c.offset)
        return f.read(c.nbytes)


def test_a_default_cpu_load_stages_verified_and_uploads_the_files_bytes(base, tmp_path, fresh):
    root = clone(base, tmp_path / "p")
    set_piece_size(root, PIECE)
    prog = open_program(root)
    before = fresh.hashed_bytes
    s = load_program(prog, "fingerprint", device="cpu")
    assert s.status == "loaded", s.error
    assert _uploads(s) and {e.path for e in _uploads(s)} == {UploadPath.VERIFIED_HOST}
    assert set(s.events.query("kind == 'constant_uploaded'")["path"]) == {"verified staging, host"}
    specs = {m.name: m for m in prog.methods}
    for m, lm in s.methods.items():
        for name, t in lm.own_tensors.items():
            c = next(c for c in specs[m].constants if c.name == name)
            assert t.contiguous().view(torch.uint8).numpy().tobytes() == _file_bytes(prog, c, specs[m].blob_file)
    # the blobs' pieces the constants cover, hashed once each: every other file whole
    blobs = {m.blob_file for m in prog.methods}
    covered = 0
    for m in prog.methods:
        plan = record_piece_plan(
            prog.files[m.blob_file], prog.path(m.blob_file), [(c.offset, c.nbytes) for c in m.constants]
        )
        covered += sum(p.length for p in plan)
    assert fresh.hashed_bytes - before == covered + sum(v.bytes for k, v in prog.files.items() if k not in blobs)
    # no private copy of a blob was filled: its lazy copy still lacks every piece
    for b in blobs:
        copy = s.runtime._copies[prog.path(b)]
        assert not copy.complete and len(copy._pending.pieces) == len(prog.files[b].chunks)
    assert s.verify()["ok"].all()
    s.close()


@pytest.mark.parametrize(
    "options,path",
    [
        (LoadOptions(integrity="copy"), UploadPath.HOST),
        (LoadOptions(integrity="in-place"), UploadPath.HOST),
        (LoadOptions(integrity="files-first"), UploadPath.HOST),
        (LoadOptions(integrity="off"), UploadPath.HOST),
    ],
)
def test_the_other_integrity_paths_upload_without_staging(base, fresh, options, path):
    s = load_program(base, "fingerprint", device="cpu", options=options)
    assert s.status == "loaded", s.error
    assert {e.path for e in _uploads(s)} == {path}
    assert s.verify()["ok"].all()
    s.close()


def test_a_tampered_blob_fails_its_method_with_nothing_of_it_uploaded_or_loaded(base, tmp_path, fresh):
    root = clone(base, tmp_path / "p")
    set_piece_size(root, PIECE)
    prog = open_program(root)
    decode = next(m for m in prog.methods if m.name == "decode")
    c = decode.constants[-1]
    blob = prog.path(decode.blob_file)
    flip_byte(blob, c.offset + c.nbytes - 1)
    s = load_program(root, "fingerprint", device="cpu")
    assert s.status == "failed" and s.failed_method == "decode"
    assert isinstance(s.exception, IntegrityError) and s.exception.path == str(blob)
    assert "BLAKE3 does not match the program's record" in s.error and "piece at byte" in s.error
    assert "decode" not in s.methods and "prefill" in s.methods
    assert not [e for e in _uploads(s) if e.method == "decode"]  # no constant of the failed batch came back


def test_own_copy_goes_through_the_staging_too(base, fresh):
    s = load_program(base, "fingerprint", device="cpu")
    assert s.status == "loaded", s.error
    m = next(iter(s.methods))
    lm = s.methods[m]
    name = next(iter(lm.own_tensors))
    before = fresh.hashed_bytes
    t = s.own_copy(m, name)
    assert torch.equal(t, lm.own_tensors[name]) and t.data_ptr() != lm.own_tensors[name].data_ptr()
    assert fresh.hashed_bytes > before  # nothing kept: hashed again
    s.close()


# ----------------------------------------------------------------------------- CUDA (run on the H200)


@pytest.mark.gpu
def test_cuda_staging_delivers_the_exact_bytes_and_refuses_a_tampered_piece(tmp_path):
    data = (
        torch.randint(0, 256, (3 * (64 << 20) + 12345,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
        .numpy()
        .tobytes()
    )
    path = tmp_path / "weights.blob"
    path.write_bytes(data)
    rec = file_record(path)  # 64 MiB BLAKE3 pieces, as the builder records
    sizes = [(5, 0), (5, 1), (4099, (64 << 20) * 2 + 999), (190 << 20, 77), (len(data) - 13, 13)]
    specs = [spec(f"c{i}", off, n) for i, (off, n) in enumerate(sizes)]
    dev = torch.device("cuda", 0)
    for chunk in (4 << 20, 8 << 20, 16 << 20):
        outs = upload.stage_pieces(path, rec, specs, dev, threads=8, chunk_bytes=chunk)
        for c, t in zip(specs, outs):
            assert t.device == dev and t.cpu().numpy().tobytes() == data[c.offset : c.offset + c.nbytes], (
                chunk,
                c.name,
            )
    outs = upload.stage_pieces(path, None, specs, dev, threads=8)
    assert all(t.cpu().numpy().tobytes() == data[c.offset : c.offset + c.nbytes] for c, t in zip(specs, outs))
    flip_byte(path, (64 << 20) + 5)  # piece 1: c2 reads it
    with pytest.raises(IntegrityError, match=f"piece at byte {64 << 20}") as ei:
        upload.stage_pieces(path, rec, specs, dev, threads=8)
    assert ei.value.path == str(path)
    untouched = [c for c in specs if c.nbytes == 0 or c.offset >= (128 << 20)]
    outs = upload.stage_pieces(path, rec, untouched, dev, threads=8)  # pieces 0 and 1 unread: no error
    assert all(t.cpu().numpy().tobytes() == data[c.offset : c.offset + c.nbytes] for c, t in zip(untouched, outs))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options,path",
    [
        (LoadOptions(), UploadPath.VERIFIED_LOCKED),  # the device hashes every piece: from the locked pages
        (LoadOptions(first_load="staged"), UploadPath.VERIFIED_STAGED),
        (LoadOptions(integrity="off", first_load="pipelined"), UploadPath.PIECES),
    ],
)
def test_a_cuda_load_stages_and_uploads_the_files_bytes(built_sample, options, path, fresh):
    """(``fresh``: a copy of the blob verified whole by an earlier load in this process is read from, not staged.)"""
    prog = built_sample("total_collision", device="cuda")
    s = load_program(prog, "fingerprint", device="cuda", options=options)
    assert s.status == "loaded", s.error
    assert _uploads(s) and {e.path for e in _uploads(s)} == {path}
    specs = {m.name: m for m in prog.methods}
    n = 0
    for m, lm in s.methods.items():
        for name, t in lm.own_tensors.items():
            c = next(c for c in specs[m].constants if c.name == name)
            assert t.device.type == "cuda"
            assert t.contiguous().view(torch.uint8).cpu().numpy().tobytes() == _file_bytes(prog, c, specs[m].blob_file)
            n += 1
    assert n == len(_uploads(s))
    assert s.verify()["ok"].all()
    s.close()


@pytest.mark.gpu
def test_staging_slots_are_pinned_huge_page_aligned_blocks_that_copy_asynchronously():
    """The slots' memory (``toolkit.upload.slots.pinned_block``): page-locked (CUDA reports it pinned), 2 MiB
    aligned (so the kernel can back it with huge pages), two slots of one block per worker, and a
    non-blocking copy out of it delivers its bytes."""
    block = pinned_block(8 << 20)
    assert block.is_pinned() and block.numel() == 8 << 20 and block.data_ptr() % (2 << 20) == 0
    block.copy_(torch.randint(0, 256, (8 << 20,), dtype=torch.uint8))
    dev = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    dev.copy_(block, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), block)
    slots = Slots(torch.device("cuda", 0), 2, 4 << 20)
    a, b = slots.worker_bufs(1)
    assert a[0].is_pinned() and b[0].data_ptr() == a[0].data_ptr() + (4 << 20) and not slots.bufs[0]
    slots.pool.shutdown()
