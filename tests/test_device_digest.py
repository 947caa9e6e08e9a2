"""Verified staging's device digest.  A BLAKE3 piece is hashed on the device (toolkit.integrity.device_digest's
Triton kernels): where it landed when it lands whole in one constant, else in a scratch copy its constants'
bytes are then copied from; every digest is compared before any tensor is handed out.

On a machine without CUDA the same kernels run in Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set below before the kernels are first imported), so CI checks the kernels
byte for byte against the ``blake3`` package and the staging pipeline's split, tamper refusal and
counting; the ``gpu`` tests run them on the H200.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before toolkit.integrity.blake3_kernels is first imported: Triton reads it then
    os.environ.setdefault("TRITON_INTERPRET", "1")

import blake3  # noqa: E402
import pytest  # noqa: E402
import test_verified_staging  # noqa: E402
from test_integrity_pieces import flip_byte  # noqa: E402
from test_upload import spec  # noqa: E402

from toolkit import upload  # noqa: E402
from toolkit.core.errors import IntegrityError  # noqa: E402
from toolkit.core.options import LoadOptions, options_from_environment  # noqa: E402
from toolkit.integrity import (
    device_digest,
    file_record,  # noqa: E402
)

PIECE = 4096
CPU = torch.device("cpu")
LENGTHS = [0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 3073, 4096 + 5]  # one chunk, two, an odd tree level, a carry


def _hash(data: bytes, device: torch.device) -> str:
    buf = torch.zeros(max(64, -(-len(data) // 64) * 64), dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    d = device_digest.DeviceDigests(device, 3)
    d.hash(buf.to(device), 2, len(data))  # slot 2 of 3: the root lands in its own row
    out = d.hexdigests()
    assert list(out) == [2]
    return out[2]


def test_the_kernels_match_the_blake3_package_on_edge_case_lengths():
    for n in LENGTHS:
        data = os.urandom(n)
        assert _hash(data, CPU) == blake3.blake3(data).hexdigest(), n


def test_a_buffer_the_kernels_cannot_read_whole_blocks_of_is_refused():
    d = device_digest.DeviceDigests(CPU, 1)
    with pytest.raises(ValueError, match="whole 64-byte blocks"):
        d.hash(torch.zeros(100, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="4-byte aligned"):
        d.hash(torch.zeros(129, dtype=torch.uint8)[1:], 0)
    assert not device_digest.hashable_in_place(torch.zeros(128, dtype=torch.uint8)[:100], 100)
    assert device_digest.hashable_in_place(torch.zeros(128, dtype=torch.uint8), 128)


@pytest.fixture
def cold(monkeypatch):
    """No kernels loaded and no device warm in this process, whatever ran before."""
    monkeypatch.setattr(device_digest, "_kernels", None)
    monkeypatch.setattr(device_digest, "_WARM", {})
    monkeypatch.setattr(device_digest, "_WARM_STARTED", set())
    monkeypatch.setattr(device_digest, "_WARM_FAILED", {})


def test_auto_hashes_on_the_device_once_warm_there_and_never_waits(cold, monkeypatch):
    cuda, big = torch.device("cuda", 0), device_digest.MIN_BYTES
    assert device_digest.mode(cuda, big, None) == "when warm"  # cold: each piece on the host until warm
    assert device_digest.mode(cuda, big - 1, None) == "host"  # too small to pay for the warm-up's stall
    assert device_digest.mode(CPU, big, None) == "host"  # the interpreter only when asked for
    assert device_digest.mode(CPU, 64, True) == "device" and device_digest.mode(cuda, big, False) == "host"
    with monkeypatch.context() as m:
        m.setattr(device_digest.importlib.util, "find_spec", lambda name: None)  # no Triton installed
        assert device_digest.mode(cuda, big, None) == "host"
    # warm (Triton's kernels have run there, or precompiled ones load): every batch, however small
    monkeypatch.setattr(device_digest, "ready", lambda device: device == cuda)
    assert device_digest.mode(cuda, 64, None) == "device"
    monkeypatch.setattr(device_digest.importlib.util, "find_spec", lambda name: None)  # precompiled need no Triton
    assert device_digest.mode(cuda, 64, None) == "device"


def test_warm_up_loads_the_kernels_where_they_can_run(cold, monkeypatch):
    monkeypatch.setattr(device_digest, "available", lambda device: False)
    device_digest.warm_up(CPU)
    assert device_digest._kernels is None and not device_digest.ready(CPU)  # nothing to run them on
    monkeypatch.setattr(device_digest, "available", lambda device: True)
    device_digest.warm_up(CPU)  # the interpreter here
    assert device_digest._kernels is not None and device_digest.ready(CPU)


def test_a_background_warm_up_runs_once_per_device_and_a_failed_one_is_kept_not_raised(cold, monkeypatch):
    monkeypatch.setattr(device_digest, "available", lambda device: True)
    thread = device_digest.warm_up_in_background(CPU)
    assert thread is not None and device_digest.warm_up_in_background(CPU) is None  # started once
    thread.join(60)
    assert device_digest.ready(CPU) and device_digest.warm_up_error(CPU) is None
    other = torch.device("meta")

    def broken(device):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(device_digest, "warm_up", broken)
    device_digest.warm_up_in_background(other).join(60)
    assert not device_digest.ready(other) and "no compiler" in str(device_digest.warm_up_error(other))


def test_the_option_and_its_variable():
    assert LoadOptions().device_digest is None
    for text, want in (("auto", None), ("1", True), ("no", False)):
        assert options_from_environment({"CONSTSHARE_DEVICE_DIGEST": text}).device_digest is want
    with pytest.raises(ValueError, match="CONSTSHARE_DEVICE_DIGEST='maybe': expected auto, 1, true"):
        options_from_environment({"CONSTSHARE_DEVICE_DIGEST": "maybe"})


# ----------------------------------------------------------------------------- the staging pipeline


blob = test_verified_staging.blob  # the fixture: a random file of 10 pieces and a short one, and its bytes


def _specs(data_len: int) -> list:
    """c0 fills pieces 1-2 whole (aligned) and 100 bytes of piece 3; c1 shares piece 3 with it, 100
    bytes of which no constant reads; c2 starts one byte into piece 4 and fills 5 (misaligned in it);
    c3 is the file's short last piece (piece 10, 123 bytes: not whole 64-byte blocks).  Seven pieces
    (plan positions 0-6): few, since Triton's interpreter takes seconds to hash each on the CPU."""
    return [
        spec("c0", PIECE, 2 * PIECE + 100),
        spec("c1", 3 * PIECE + 200, 300),
        spec("c2", 4 * PIECE + 1, 2 * PIECE),
        spec("c3", 10 * PIECE, data_len - 10 * PIECE),
    ]


class Spied(list):
    """The table slots hashed on the device, in order; ``storages``: each slot's bytes' storage address."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, int] = {}

    def in_place(self, outs: list[torch.Tensor]) -> list[int]:
        """The slots hashed inside one of ``outs`` (where they landed), sorted; the rest were scratch copies."""
        mine = {t.untyped_storage().data_ptr() for t in outs}
        return sorted(s for s, at in self.storages.items() if at in mine)


@pytest.fixture
def spied(monkeypatch):
    slots = Spied()
    real = device_digest.DeviceDigests.hash

    def spy(self, data, slot, n=None):
        slots.append(slot)
        slots.storages[slot] = data.untyped_storage().data_ptr()
        return real(self, data, slot, n)

    monkeypatch.setattr(device_digest.DeviceDigests, "hash", spy)
    return slots


def _stage(path, record, specs, device=CPU, **kw):
    kw.setdefault("threads", 3)
    return upload.stage_pieces(path, record, specs, device, **kw)


def test_every_blake3_piece_is_hashed_on_the_device_where_it_landed_or_in_a_scratch_copy(blob, spied):
    path, data = blob
    specs, counted = _specs(len(data)), []
    outs = _stage(path, file_record(path, PIECE), specs, device_digest=True, chunk_bytes=1000, on_hashed=counted.append)
    assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert sorted(spied) == list(range(7))  # pieces 1-6 and 10, each hashed once on the device
    # in place: pieces 1-2 (c0's whole ones); 3 (shared, partly unread), 4-6 (misaligned in c2) and 10
    # (short) in scratch copies, from which their constants' bytes came
    assert spied.in_place(outs) == [0, 1]
    assert counted == [6 * PIECE + len(data) - 10 * PIECE]  # every piece read, hashed once


def test_without_the_option_or_under_sha256_pieces_every_piece_is_hashed_on_the_host(blob, spied):
    path, data = blob
    specs = _specs(len(data))
    for record, forced in (
        (file_record(path, PIECE), False),
        (file_record(path, PIECE), None),
        (file_record(path, PIECE, digest="sha256"), True),
    ):
        outs = _stage(path, record, specs, device_digest=forced)
        assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert spied == []


@pytest.mark.parametrize(  # each case once, its pieces one job each (the default slots) or cut in 1000-byte jobs
    "at,piece,chunk",
    [
        (2 * PIECE + 7, 2, LoadOptions.staging_chunk_bytes),
        (3 * PIECE + 250, 3, 1000),
        (3 * PIECE + 150, 3, LoadOptions.staging_chunk_bytes),
        (5 * PIECE + 3, 5, 1000),
        (10 * PIECE + 99, 10, LoadOptions.staging_chunk_bytes),
    ],
)
def test_a_tampered_piece_is_refused_naming_it_wherever_it_was_hashed(blob, spied, at, piece, chunk):
    """Piece 2 is hashed where it landed; 3 (shared: a byte c1 reads, and one no constant reads),
    5 (misaligned in c2) and 10 (short) in scratch copies."""
    path, data = blob
    rec = file_record(path, PIECE)
    flip_byte(path, at)
    with pytest.raises(
        IntegrityError,
        match=f"BLAKE3 does not match the program's record "
        rf"\(the {PIECE}-byte piece at byte {piece * PIECE}\)",
    ) as ei:
        _stage(path, rec, _specs(len(data)), device_digest=True, chunk_bytes=chunk)
    assert ei.value.path == str(path)
    assert spied  # found by the device


@pytest.mark.parametrize("hashed", [True, False], ids=["device digest", "unhashed"])
def test_a_piece_not_hashed_on_the_host_is_shared_by_the_workers(blob, spied, monkeypatch, hashed):
    """One piece, four 1 KiB jobs, four workers: a second worker reads part of it (each read waits
    up to 5 s for one), it arrives whole, and the device hashes it once, after all four parts."""
    import threading

    from toolkit.upload import staging

    path, data = blob
    readers, second = set(), threading.Event()
    real_read = staging.read_range

    def read_range(fd, view, at, *a, **kw):
        readers.add(threading.get_ident())
        if len(readers) > 1:
            second.set()
        second.wait(5)
        return real_read(fd, view, at, *a, **kw)

    monkeypatch.setattr(staging, "read_range", read_range)
    specs = [spec("w", PIECE, PIECE)]  # piece 1, whole and aligned
    record = file_record(path, PIECE) if hashed else None
    outs = _stage(path, record, specs, threads=4, chunk_bytes=1024, device_digest=True)
    assert outs[0].numpy().tobytes() == data[PIECE : 2 * PIECE]
    assert len(readers) > 1
    assert spied == ([0] if hashed else [])


def _warming(monkeypatch, cold_checks: int) -> list[torch.device]:
    """Auto on the CPU as on a cold CUDA device: the kernels turn warm after ``cold_checks`` pieces
    asked; returns the devices whose background warm-up was started."""
    started, asked = [], [0]

    def ready(device):
        asked[0] += 1
        return asked[0] > cold_checks

    monkeypatch.setattr(device_digest, "mode", lambda device, n, forced: "when warm" if forced is None else "host")
    monkeypatch.setattr(device_digest, "ready", ready)
    monkeypatch.setattr(device_digest, "warm_up_in_background", started.append)
    return started


def test_a_cold_batch_hashes_on_the_host_until_the_kernels_are_warm_then_on_the_device(blob, spied, monkeypatch):
    path, data = blob
    started = _warming(monkeypatch, cold_checks=2)
    specs, counted = _specs(len(data)), []
    outs = _stage(path, file_record(path, PIECE), specs, threads=1, chunk_bytes=1000, on_hashed=counted.append)
    assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert started == [CPU]  # the warm-up started, not waited for
    assert sorted(spied) == list(range(2, 7))  # pieces 1-2 (positions 0-1) taken cold, on the host
    assert counted == [6 * PIECE + len(data) - 10 * PIECE]  # every piece hashed once, wherever it was


@pytest.mark.parametrize("piece", [1, 4])
def test_a_tampered_piece_is_refused_whether_it_was_taken_cold_or_warm(blob, spied, monkeypatch, piece):
    path, data = blob
    rec = file_record(path, PIECE)
    flip_byte(path, piece * PIECE + 5)
    _warming(monkeypatch, cold_checks=2)  # piece 1 on the host, piece 4 on the device
    with pytest.raises(IntegrityError, match=rf"\(the {PIECE}-byte piece at byte {piece * PIECE}\)"):
        _stage(path, rec, _specs(len(data)), threads=1)
    # found where it was hashed: piece 4 (position 3) by the device, piece 1 (position 0) by the host
    assert (3 in spied) if piece == 4 else (0 not in spied)


# ----------------------------------------------------------------------------- straight out of locked pages


@pytest.fixture
def locked(monkeypatch):
    """A lock cache of 1 MiB whose locking is stubbed on the CPU: each registration appended to
    ``locked.calls`` as (file byte, bytes) and answered ``locked.answer(file byte)`` (0: it holds);
    the slots' reads appended to ``locked.reads``."""
    import types

    from toolkit.upload import lock_cache, locking, staging

    cache = lock_cache.HostLockCache(1 << 20)
    state = types.SimpleNamespace(cache=cache, calls=[], reads=[], answer=lambda at: 0)
    bases = {}

    def register(ptr, n):
        base = min((b for b in bases if b <= ptr), key=lambda b: ptr - b)
        state.calls.append((ptr - base, n))
        return state.answer(ptr - base)

    real_acquire, real_read = cache.acquire, staging.read_range

    def acquire(path):
        lm = real_acquire(path)
        bases[lm.base] = lm
        return lm

    def read_range(fd, view, at, *a, **kw):
        state.reads.append(at)
        return real_read(fd, view, at, *a, **kw)

    monkeypatch.setattr(locking, "register", register)
    monkeypatch.setattr(cache, "acquire", acquire)
    monkeypatch.setattr(staging, "read_range", read_range)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: types.SimpleNamespace(cudaHostUnregister=lambda ptr: 0))
    yield state
    cache.clear()


def _pieces_bytes(data_len: int) -> int:
    return 6 * PIECE + data_len - 10 * PIECE  # pieces 1-6 and the short piece 10: what _specs reads


def test_where_the_device_hashes_every_piece_a_batch_copies_them_from_the_files_locked_pages(blob, spied, locked):
    path, data = blob
    rec, specs = file_record(path, PIECE), _specs(len(data))
    for _ in range(2):  # the second finds the pages still locked
        spied.clear()
        went, counted = [], []
        outs = _stage(
            path, rec, specs, device_digest=True, locks=locked.cache, on_locked=went.append, on_hashed=counted.append
        )
        assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
        assert sorted(spied) == list(range(7)) and spied.in_place(outs) == [0, 1]  # as through the slots
        assert went == counted == [_pieces_bytes(len(data))]
        assert locked.reads == []  # no slot read a byte
    # the pieces' pages merged into one region per run of pieces, each locked once
    assert locked.calls == [(PIECE, 6 * PIECE), (10 * PIECE, PIECE)]
    assert locked.cache.locked_bytes == 7 * PIECE


@pytest.mark.parametrize("piece", [2, 3, 10])
def test_a_tampered_piece_copied_from_locked_pages_is_refused_naming_it(blob, spied, locked, piece):
    """Piece 2 is hashed where it landed; 3 (shared, partly unread) and 10 (short) in scratch copies."""
    path, data = blob
    rec = file_record(path, PIECE)
    flip_byte(path, piece * PIECE + 7)
    went = []
    with pytest.raises(IntegrityError, match=rf"\(the {PIECE}-byte piece at byte {piece * PIECE}\)") as ei:
        _stage(path, rec, _specs(len(data)), device_digest=True, locks=locked.cache, on_locked=went.append)
    assert ei.value.path == str(path)
    assert locked.calls and locked.reads == [] and went == []  # found by the device, nothing handed out


def test_pieces_whose_pages_do_not_lock_go_through_the_slots(blob, spied, locked):
    path, data = blob
    locked.answer = lambda at: 1 if at == 10 * PIECE else 0  # the short last piece's page fails
    specs, went = _specs(len(data)), []
    outs = _stage(path, file_record(path, PIECE), specs, device_digest=True, locks=locked.cache, on_locked=went.append)
    assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert went == [6 * PIECE] and locked.reads == [10 * PIECE]  # piece 10 alone through a slot
    assert sorted(spied) == [0, 0, 1, 2, 3, 4, 5]  # every piece on the device: 10 again as its batch's first


def test_a_batch_that_fails_midway_from_locked_pages_hands_its_mapping_back(blob, spied, locked, monkeypatch):
    from toolkit.upload import staging

    path, data = blob
    made = []

    def scratch(n, device):
        made.append(n)
        if len(made) == 2:
            raise MemoryError("no device memory for a scratch copy")
        return real_scratch(n, device)

    real_scratch = staging._scratch
    monkeypatch.setattr(staging, "_scratch", scratch)
    with pytest.raises(MemoryError, match="scratch copy"):
        _stage(path, file_record(path, PIECE), _specs(len(data)), device_digest=True, locks=locked.cache)
    ((lm,),) = [list(locked.cache._maps.values())]
    assert lm.users == 0 and locked.reads == []  # released to the cache, its pages still locked for the next load


def test_a_batch_over_the_lock_budget_or_of_a_file_swapped_after_it_was_opened_goes_through_the_slots(
    blob, spied, locked, monkeypatch
):
    from toolkit.upload import staging

    path, data = blob
    rec, specs = file_record(path, PIECE), _specs(len(data))
    locked.cache.budget_bytes = 6 * PIECE  # the batch's pages need 7
    went = []
    outs = _stage(path, rec, specs, device_digest=True, locks=locked.cache, on_locked=went.append)
    assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert went == [] and locked.calls == [] and locked.reads
    locked.cache.budget_bytes, locked.reads[:] = 1 << 20, []
    real_open = staging.open_checked

    def open_then_swap(p, record):
        opened = real_open(p, record)
        twin = path.with_name("twin")
        twin.write_bytes(data)  # the same bytes, another file: locking it would lock what the load did not open
        os.replace(twin, path)
        return opened

    monkeypatch.setattr(staging, "open_checked", open_then_swap)
    outs = _stage(path, rec, specs, device_digest=True, locks=locked.cache, on_locked=went.append)
    assert [t.numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert went == [] and locked.calls == [] and locked.reads


# ----------------------------------------------------------------------------- CUDA (run on the H200)


@pytest.mark.gpu
def test_the_precompiled_kernels_load_on_the_h200_and_agree_with_tritons(monkeypatch):
    dev = torch.device("cuda", 0)
    assert torch.cuda.get_device_capability(0) == (9, 0), "the H200 (sm90): the architecture we ship cubins for"
    assert device_digest.precompiled(dev) is not None, device_digest.precompiled_error(dev)
    data = os.urandom(3 * 1024 * 1024 + 4096 + 64)
    for n in (*LENGTHS, len(data)):
        want = blake3.blake3(data[:n]).hexdigest()
        assert _hash(data[:n], dev) == want, n  # the precompiled kernels
        with monkeypatch.context() as m:
            m.setattr(device_digest, "precompiled", lambda device: None)
            assert _hash(data[:n], dev) == want, n  # Triton's


@pytest.mark.gpu
def test_precompiled_kernels_that_compute_anything_else_are_never_used(monkeypatch):
    from toolkit.integrity import blake3_cubins

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(device_digest, "_PRECOMPILED", {})
    monkeypatch.setattr(device_digest, "_PRECOMPILED_FAILED", {})
    monkeypatch.setattr(blake3_cubins.Loaded, "launch", lambda self, *a: None)  # a launch that does nothing
    assert device_digest.precompiled(dev) is None
    assert "hash 2 KiB of zeros to" in str(device_digest.precompiled_error(dev))


@pytest.mark.gpu
def test_the_device_hashes_64_mib_pieces_exactly_and_refuses_a_tampered_one(tmp_path, spied):
    assert _hash(b"", torch.device("cuda", 0)) == blake3.blake3(b"").hexdigest()
    mib = 1 << 20
    data = (
        torch.randint(0, 256, (5 * 64 * mib + 4321,), dtype=torch.uint8, generator=torch.Generator().manual_seed(9))
        .numpy()
        .tobytes()
    )
    path = tmp_path / "weights.blob"
    path.write_bytes(data)
    rec = file_record(path)  # 64 MiB BLAKE3 pieces, as the builder records
    for n in (1, 1025, 64 * mib):
        assert _hash(data[:n], torch.device("cuda", 0)) == blake3.blake3(data[:n]).hexdigest(), n
    spied.clear()
    specs = [spec("a", 0, 3 * 64 * mib + 12), spec("b", 3 * 64 * mib + 12, 64 * mib), spec("c", 5 * 64 * mib, 4321)]
    dev = torch.device("cuda", 0)
    before = torch.cuda.memory_reserved(dev)
    outs = upload.stage_pieces(path, rec, specs, dev, threads=8, device_digest=True)
    assert torch.cuda.current_stream(dev).query()  # returned with every copy done, those out of the scratch too
    # the scratch copies (64 MiB each) handed back: what stays reserved is the constants' (2 MiB segments) at most
    held = sum(-(-t.numel() // (2 << 20)) * (2 << 20) for t in outs)
    assert torch.cuda.memory_reserved(dev) - before <= held + (2 << 20)
    assert [t.cpu().numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
    assert sorted(spied) == [0, 1, 2, 3, 4, 5]  # every piece on the device
    assert spied.in_place(outs) == [0, 1, 2]  # a's three whole pieces; 3 and 4 shared or misaligned, 5 short
    for at in (64 * mib + 99, 3 * 64 * mib + 5, 5 * 64 * mib + 4000):  # hashed in place, in a scratch copy, short
        flip_byte(path, at)
        with pytest.raises(IntegrityError, match=f"piece at byte {at // (64 * mib) * 64 * mib}"):
            upload.stage_pieces(path, rec, specs, dev, threads=8, device_digest=True)
        flip_byte(path, at)


@pytest.mark.gpu
def test_a_cuda_batch_from_locked_pages_is_exact_and_refuses_a_tampered_piece(tmp_path, spied):
    mib, dev = 1 << 20, torch.device("cuda", 0)
    data = torch.randint(0, 256, (5 * 64 * mib + 4321,), dtype=torch.uint8).numpy().tobytes()
    path = tmp_path / "weights.blob"
    path.write_bytes(data)
    rec = file_record(path)  # 64 MiB BLAKE3 pieces, as the builder records
    specs = [spec("a", 0, 3 * 64 * mib + 12), spec("b", 3 * 64 * mib + 12, 64 * mib), spec("c", 5 * 64 * mib, 4321)]
    locks = upload.HostLockCache(1 << 30)
    assert device_digest.available(dev)  # the kernels loaded (and self-tested: a hash of their own) before counting
    try:
        # the first as a caller naming no index may (its locking thread's: the current device)
        for attempt, where in (("locks", torch.device("cuda")), ("finds locked", dev)):
            spied.clear()
            went, before = [], torch.cuda.memory_reserved(dev)
            outs = upload.stage_pieces(path, rec, specs, where, threads=8, locks=locks, on_locked=went.append)
            assert torch.cuda.current_stream(dev).query(), attempt  # every copy done, those out of the scratch too
            held = sum(-(-t.numel() // (2 << 20)) * (2 << 20) for t in outs)
            assert torch.cuda.memory_reserved(dev) - before <= held + (2 << 20), attempt  # scratch handed back
            assert [t.cpu().numpy().tobytes() for t in outs] == [data[c.offset : c.offset + c.nbytes] for c in specs]
            assert went == [len(data)] and sorted(spied) == [0, 1, 2, 3, 4, 5], attempt
            assert spied.in_place(outs) == [0, 1, 2]
            del outs
        assert locks.locked_bytes == -(-len(data) // 4096) * 4096
        for at in (64 * mib + 99, 3 * 64 * mib + 5, 5 * 64 * mib + 4000):  # hashed in place, in a scratch copy, short
            flip_byte(path, at)
            with pytest.raises(IntegrityError, match=f"piece at byte {at // (64 * mib) * 64 * mib}"):
                upload.stage_pieces(path, rec, specs, dev, threads=8, locks=locks)
            flip_byte(path, at)
    finally:
        locks.clear()


_SHRUNK = """
import os, sys
import torch
sys.path.insert(0, sys.argv[2])
from test_upload import spec
from toolkit import upload
from toolkit.core.errors import IntegrityError
from toolkit.integrity import file_record
from toolkit.upload import staging

path, dev = sys.argv[1], torch.device("cuda", 0)
data = open(path, "rb").read()
specs, rec = [spec("w", 0, len(data))], file_record(path)
real = staging._copy_locked_pieces

def shrink_then_copy(lm, *a):
    for f in list(lm.futures.values()):
        f.result()  # every page locked: now the file is cut to one page under the load
    os.truncate(path, 4096)
    return real(lm, *a)

staging._copy_locked_pieces = shrink_then_copy
went, locks = [], upload.HostLockCache(1 << 30)
try:
    outs = upload.stage_pieces(path, rec, specs, dev, threads=8, locks=locks, on_locked=went.append)
except IntegrityError as e:
    print("refused", e)
else:
    assert went == [len(data)] and outs[0].cpu().numpy().tobytes() == data  # the pages kept as locked
    print("exact")
"""


@pytest.mark.gpu
def test_a_file_shrunk_under_a_batch_from_its_locked_pages_is_exact_or_refused_never_a_fault(tmp_path):
    """The host never reads the locked pages, so a truncation cannot raise SIGBUS in the load: the device
    copies what the driver locked, and hashes it; the process survives with the file's bytes or a refusal."""
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "weights.blob"
    path.write_bytes(os.urandom(3 * (64 << 20) + 100))
    tests = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", _SHRUNK, str(path), tests], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] in ("exact", "refused"), out.stdout


@pytest.mark.gpu
def test_a_cuda_load_hashes_whole_pieces_on_the_device_and_uploads_the_files_bytes(built_sample, tmp_path, spied):
    from test_errors import clone
    from test_integrity_pieces import set_piece_size

    from toolkit.engine.session import load_program
    from toolkit.integrity import verified_files
    from toolkit.sources import open_program

    root = clone(built_sample("total_collision", device="cuda"), tmp_path / "p")
    set_piece_size(root, PIECE)  # 4 KiB pieces: each 16 KiB constant holds whole ones
    prog = open_program(root)
    verified_files().clear()
    s = load_program(prog, "fingerprint", device="cuda", options=LoadOptions(device_digest=True))
    try:
        assert s.status == "loaded", s.error
        assert spied, "no piece was hashed on the device"
        for m in prog.methods:
            for c in m.constants:
                t = s.methods[m.name].own_tensors.get(c.name)
                if t is not None:
                    with open(prog.path(c.file or m.blob_file), "rb") as f:
                        f.seek(c.offset)
                        assert t.contiguous().view(torch.uint8).cpu().numpy().tobytes() == f.read(c.nbytes)
        assert s.verify()["ok"].all()
    finally:
        s.close()
        verified_files().clear()


_COLD_PROCESS = """
import sys
import torch
sys.path.insert(0, sys.argv[2])
from test_upload import spec
from toolkit import upload
from toolkit.integrity import device_digest, file_record

path, dev = sys.argv[1], torch.device("cuda", 0)
data = open(path, "rb").read()
specs, rec = [spec("w", 0, len(data))], file_record(path)  # 64 MiB BLAKE3 pieces
assert device_digest.mode(dev, len(data), None) == "device"  # the precompiled kernels: loaded and self-tested
hashed = []  # counted from here: the self-test hashes its own 2 KiB
real = device_digest.DeviceDigests.hash
device_digest.DeviceDigests.hash = lambda self, d, slot, n=None: (hashed.append(slot), real(self, d, slot, n))[1]
outs = upload.stage_pieces(path, rec, specs, dev, threads=8)  # the process's first batch
assert outs[0].cpu().numpy().tobytes() == data and sorted(hashed) == [0, 1, 2, 3], hashed
assert "triton" not in sys.modules  # nothing imported, nothing compiled
print("ok")
"""


@pytest.mark.gpu
def test_a_fresh_process_hashes_its_first_batch_on_the_device_without_triton(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "weights.blob"
    path.write_bytes(os.urandom(4 * (64 << 20)))
    tests = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", _COLD_PROCESS, str(path), tests], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
