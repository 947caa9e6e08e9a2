"""The host-to-device upload paths (toolkit.upload): every path delivers the blob's exact bytes.

The region arithmetic is pure and runs everywhere; the paths themselves need CUDA and are
marked ``gpu`` (run on the H200 with ``pytest -m gpu``).
"""

from __future__ import annotations

import mmap
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from toolkit import upload
from toolkit.core.errors import IntegrityError
from toolkit.core.model import ConstantSpec
from toolkit.core.options import LoadOptions
from toolkit.core.vocab import ConstantKind, FirstLoad, UploadMode, UploadPath
from toolkit.upload import locking, mapped

PAGE = mmap.PAGESIZE


def spec(name: str, offset: int, nbytes: int) -> ConstantSpec:
    return ConstantSpec(
        name=name,
        fqn=name,
        kind=ConstantKind.BUFFER,
        mutated=False,
        dtype="uint8",
        shape=(nbytes,),
        strides=(1,),
        storage_offset=0,
        nbytes=nbytes,
        offset=offset,
        digest="0" * 64,
    )


# ---------------------------------------------------------------------------- pure parts
def _check_regions(ranges, region_bytes):
    regions = upload.regions_to_lock(ranges, [], region_bytes)
    for s, e in regions:
        assert s % PAGE == 0 and e % PAGE == 0, (s, e)
        assert 0 < e - s <= region_bytes
    for (_, e1), (s2, _) in zip(regions, regions[1:]):
        assert e1 <= s2, "regions overlap: a page would be locked twice"
    for s, e in ranges:
        if e > s:
            covered = sum(min(e, re) - max(s, rs) for rs, re in regions if rs < e and re > s)
            assert covered == e - s, f"range {s}:{e} not covered"
    return regions


def test_ranges_sharing_a_page_become_one_region():
    # two constants that end and start inside the same page: registering both pages
    # separately would fail with "already registered"
    regions = _check_regions([(10, PAGE + 5), (PAGE + 5, PAGE + 100)], 64 * PAGE)
    assert regions == [(0, 2 * PAGE)]


def test_a_large_range_is_split_into_region_sized_pieces():
    regions = _check_regions([(3, 10 * PAGE + 1)], 4 * PAGE)
    assert regions == [(0, 4 * PAGE), (4 * PAGE, 8 * PAGE), (8 * PAGE, 11 * PAGE)]


def test_empty_ranges_lock_nothing():
    assert upload.regions_to_lock([(5, 5)], [], 4 * PAGE) == []


def test_random_ranges_are_covered_by_disjoint_page_regions():
    rng = random.Random(7)
    for _ in range(200):
        ranges = []
        for _ in range(rng.randint(1, 12)):
            s = rng.randint(0, 50 * PAGE)
            ranges.append((s, s + rng.choice([0, 1, 7, PAGE - 1, PAGE, 3 * PAGE + 11, rng.randint(1, 20 * PAGE)])))
        _check_regions(ranges, rng.choice([1, 2, 5]) * PAGE)


def test_pages_already_locked_are_not_locked_again():
    locked = [(2 * PAGE, 4 * PAGE), (6 * PAGE, 7 * PAGE)]
    got = upload.regions_to_lock([(PAGE + 1, 8 * PAGE - 3)], locked, 64 * PAGE)
    assert got == [(PAGE, 2 * PAGE), (4 * PAGE, 6 * PAGE), (7 * PAGE, 8 * PAGE)]
    assert upload.regions_to_lock([(2 * PAGE + 5, 3 * PAGE)], locked, 64 * PAGE) == []


def test_random_ranges_minus_locked_regions_lock_each_page_once():
    rng = random.Random(11)
    for _ in range(300):
        locked: list[tuple[int, int]] = []
        ever: set[int] = set()
        for _ in range(rng.randint(1, 5)):  # several loads of one blob, each locking what is missing
            ranges = []
            for _ in range(rng.randint(1, 6)):
                s = rng.randint(0, 40 * PAGE)
                ranges.append((s, s + rng.randint(0, 12 * PAGE)))
            new = upload.regions_to_lock(ranges, locked, rng.choice([1, 3]) * PAGE)
            pages = {p for s, e in new for p in range(s // PAGE, e // PAGE)}
            assert not pages & ever, "a page would be locked twice"
            ever |= pages
            locked = sorted(locked + new)
            for s, e in ranges:  # every byte asked for is now in a locked page
                assert all(p in ever for p in range(s // PAGE, -(-e // PAGE)))


def test_covering_finds_exactly_the_regions_of_a_range(tmp_path):
    f = tmp_path / "b"
    f.write_bytes(b"x" * (10 * PAGE))
    lm = upload.LockedMapping(f, locking.file_key(f))
    lm.regions = [(0, 2 * PAGE), (2 * PAGE, 4 * PAGE), (8 * PAGE, 9 * PAGE)]
    assert lm.covering(5, 3 * PAGE) == [(0, 2 * PAGE), (2 * PAGE, 4 * PAGE)]
    assert lm.covering(8 * PAGE + 1, 8 * PAGE + 2) == [(8 * PAGE, 9 * PAGE)]
    assert lm.covering(3 * PAGE, 5 * PAGE) is None  # bytes 4..5 pages are not locked
    assert lm.covering(10 * PAGE, 10 * PAGE + 1) is None
    lm.regions = []
    lm.unlock_and_unmap()
    assert lm.mm.closed


def test_each_load_sets_the_lock_budget_of_the_process_cache():
    """The budget is the options' of the load making the uploader, not frozen at import."""
    dev = torch.device("cuda", 0)  # constructing uploaders touches no device
    locks = upload.host_locks()
    assert upload.host_locks() is locks  # one per process
    before = locks.budget_bytes
    try:
        up = upload.make_uploader(dev, LoadOptions(host_lock_bytes=3 << 29))
        assert up.locks is locks and locks.budget_bytes == 3 << 29
        upload.make_uploader(dev, LoadOptions(host_lock_bytes=0))
        assert locks.budget_bytes == 0
        upload.make_uploader(dev, LoadOptions())  # None: a quarter of physical memory
        assert locks.budget_bytes == upload.lock_budget(None) > 0
    finally:
        locks.budget_bytes = before
    assert isinstance(upload.make_uploader(dev, LoadOptions(upload=UploadMode.STAGED)), upload.HostStager)
    assert upload.make_uploader(dev, LoadOptions(upload="unstaged")) is None


def test_region_size_must_be_whole_pages():
    with pytest.raises(ValueError, match="page size"):
        upload.MappedBlobUploader(torch.device("cuda", 0), region_bytes=PAGE + 1)


def test_an_unknown_upload_path_is_named_in_the_error():
    with pytest.raises(ValueError, match="LoadOptions.upload 'turbo'; choose one of 'mapped', 'staged', 'unstaged'"):
        LoadOptions(upload="turbo")


def test_cpu_loads_record_how_the_bytes_travelled(built_sample):
    from toolkit import load_program
    from toolkit.integrity import verified_files

    verified_files().clear()  # a whole copy of the blob an earlier load verified would be read from instead
    s = load_program(built_sample("total_collision"), "fingerprint", device="cpu")  # the default: verified staging
    ups = [e for e in s.log if e.kind.value == "constant_uploaded"]
    assert ups and {e.path for e in ups} == {UploadPath.VERIFIED_HOST}
    assert set(s.events.query("kind == 'constant_uploaded'")["path"]) == {"verified staging, host"}  # the enum's value
    s = load_program(built_sample("total_collision"), "fingerprint", device="cpu", check_integrity=False)
    assert {e.path for e in s.log if e.kind.value == "constant_uploaded"} == {UploadPath.HOST}


# ---------------------------------------------------------------------------- short reads
def _short_reads(monkeypatch, most: int = 7) -> list[int]:
    """Make every ``os.preadv`` return at most ``most`` bytes, as one read of 2 GiB or more
    does on Linux (capped at 0x7ffff000 bytes); returns the offsets read at, call by call."""
    real, offsets = os.preadv, []

    def preadv(fd, buffers, offset):
        (view,) = buffers
        offsets.append(offset)
        return real(fd, [memoryview(view)[:most]], offset)

    monkeypatch.setattr(os, "preadv", preadv)
    return offsets


@pytest.fixture
def small_blob(tmp_path):
    data = torch.randint(0, 256, (1000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    path = tmp_path / "weights.bin"
    path.write_bytes(data.numpy().tobytes())
    return path, data


def test_short_reads_are_repeated_until_the_constant_is_complete(small_blob, monkeypatch):
    path, data = small_blob
    offsets = _short_reads(monkeypatch)
    for c in [spec("c0", 0, 0), spec("c1", 3, 1), spec("c2", 11, 500), spec("c3", 900, 100)]:
        del offsets[:]
        assert _same(upload.read_constant_bytes(path, c), data, c), c.name
        assert _same(upload.upload_constant(path, c, torch.device("cpu")), data, c), c.name
        assert len(offsets) == 2 * -(-c.nbytes // 7), c.name  # each read really was cut short


def test_staged_reads_split_across_threads_survive_short_reads(tmp_path, monkeypatch):
    n = (8 << 20) + 5  # large enough to be split across the read threads
    data = torch.randint(0, 256, (n + 3,), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    path = tmp_path / "weights.bin"
    path.write_bytes(data.numpy().tobytes())
    c = spec("big", 3, n)
    st = upload.HostStager(torch.device("cpu"), read_threads=4)
    st._pool = ThreadPoolExecutor(4)  # what _ensure sets up, without pinned (CUDA) buffers
    try:
        offsets = _short_reads(monkeypatch, most=4099)
        buf = torch.zeros(n, dtype=torch.uint8)
        fd = os.open(path, os.O_RDONLY)
        try:
            st._read(fd, buf, c.offset, path, c)
        finally:
            os.close(fd)
        assert _same(buf, data, c)
        assert len(offsets) >= n // 4099
    finally:
        st.close()


def test_a_blob_that_ends_inside_a_constant_is_an_error_naming_file_and_offset(small_blob, monkeypatch):
    path, _ = small_blob
    _short_reads(monkeypatch)
    late = spec("late", 990, 20)  # the blob's last 10 bytes, then nothing
    for read in (
        lambda: upload.read_constant_bytes(path, late),
        lambda: upload.upload_constant(path, late, torch.device("cpu")),
    ):
        with pytest.raises(IntegrityError, match="'late'") as ei:
            read()
        assert ei.value.path == str(path) and str(path) in str(ei.value)
        assert "offset 990" in str(ei.value) and "byte 1000" in str(ei.value)


def test_a_staged_read_past_the_end_is_an_error_naming_the_file(small_blob, monkeypatch):
    path, _ = small_blob
    _short_reads(monkeypatch)
    late = spec("late", 500, 600)
    st = upload.HostStager(torch.device("cpu"), read_threads=1)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(IntegrityError, match="nothing to read at byte 1000") as ei:
            st._read(fd, torch.empty(600, dtype=torch.uint8), late.offset, path, late)
    finally:
        os.close(fd)
    assert ei.value.path == str(path)


# ---------------------------------------------------------------------------- CUDA paths
@pytest.fixture
def blob(tmp_path):
    data = torch.randint(
        0, 256, (3 * (64 << 20) + 12345,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    path = tmp_path / "weights.bin"
    path.write_bytes(data.numpy().tobytes())
    # odd sizes and offsets: empty, one byte, sharing pages, unaligned, spanning regions
    sizes = [0, 1, PAGE + 3, 77, (8 << 20) + 5, (64 << 20) * 2 + 999, 4096, 13]
    specs, off = [], 5
    for i, n in enumerate(sizes):
        specs.append(spec(f"c{i}", off, n))
        off += n + (i % 3)
    return path, data, specs


def _same(got: torch.Tensor, data: torch.Tensor, c: ConstantSpec) -> bool:
    return torch.equal(got.cpu(), data[c.offset : c.offset + c.nbytes])


@pytest.mark.gpu
@pytest.mark.parametrize("choice", ["mapped", "staged", "unstaged"])
def test_every_path_delivers_the_exact_bytes(blob, choice):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    locks = upload.host_locks()
    locks.clear()
    # the locked first load has its own test
    up = upload.make_uploader(dev, LoadOptions(upload=choice, first_load=FirstLoad.STAGED))
    try:
        for rounds in range(3):  # a first load, then reloads of the same blob
            if up is not None:
                up.prefetch(path, specs)
            order = specs if rounds != 1 else list(reversed(specs))  # out of the prefetched order too
            for c in order:
                assert _same(upload.upload_constant(path, c, dev, up), data, c), (choice, c.name)
                if up is not None and c.nbytes:
                    if choice == "mapped" and rounds:
                        assert up.last_path == UploadPath.MAPPED_WARM, c.name
                    else:
                        assert up.last_path == UploadPath.STAGED, c.name
            if up is not None:
                up.release()
                locks.wait_until_locked()  # a true reload: the background locking is done
        if up is not None:
            assert getattr(up, "disabled_reason", None) is None
            up.close()
        if choice == "mapped":
            assert locks.locked_bytes >= sum(c.nbytes for c in specs)
            assert locks.mapped_files == [path]
        else:
            assert locks.mapped_files == []  # nothing is locked on the other paths
    finally:
        locks.clear()
    assert locks.locked_bytes == 0
    assert _lock_whole_file_again(path) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("first_load", [FirstLoad.LOCKED, FirstLoad.STAGED])
def test_uploads_from_a_verified_copy_deliver_its_bytes_whatever_the_file_becomes(blob, first_load):
    """What an integrity-checked load uploads: the sealed copy's bytes, page-locked in place, on a
    first load and a reload, although the file was rewritten (and shrunk) after it was verified."""
    from toolkit.integrity import VerifiedFiles, file_record

    path, data, specs = blob
    copy = VerifiedFiles().copy(path, file_record(path))
    with open(path, "r+b") as f:
        f.write(bytes(PAGE * 3))
        f.truncate(PAGE * 5)
    dev = torch.device("cuda", 0)
    locks = upload.host_locks()
    locks.clear()
    up = upload.make_uploader(dev, LoadOptions(first_load=first_load))
    try:
        for _ in range(2):
            up.prefetch(copy.path, specs)
            for c in specs:
                assert _same(upload.upload_constant(copy.path, c, dev, up), data, c), c.name
            up.release()
            locks.wait_until_locked()
        assert up.disabled_reason is None
    finally:
        up.close()
        locks.clear()


def test_an_unknown_first_load_mode_is_named_in_the_error():
    with pytest.raises(ValueError, match="first load 'telepathy'.*'staged', 'locked', 'hybrid'"):
        upload.MappedBlobUploader(torch.device("cuda", 0), first_load="telepathy")
    assert upload.MappedBlobUploader(torch.device("cuda", 0), first_load="hybrid").first_load is FirstLoad.HYBRID
    assert upload.MappedBlobUploader(torch.device("cuda", 0)).first_load is FirstLoad.LOCKED  # the default
    up = upload.make_uploader(torch.device("cuda", 0), LoadOptions(first_load="hybrid"))
    assert up.first_load is FirstLoad.HYBRID and up.locks is upload.host_locks()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["locked", "hybrid"])
@pytest.mark.parametrize("broken_lock", [False, True])
def test_a_first_load_that_locks_as_it_copies_delivers_the_exact_bytes(blob, monkeypatch, mode, broken_lock):
    path, data, specs = blob
    if broken_lock:
        monkeypatch.setattr(locking, "register", lambda ptr, n: 1)  # cudaErrorInvalidValue
    locks = upload.HostLockCache(1 << 40)
    up = upload.MappedBlobUploader(torch.device("cuda", 0), locks=locks, first_load=mode, piece_bytes=16 << 20)
    try:
        up.prefetch(path, specs)
        paths = {}
        for c in specs:
            assert _same(up.upload(path, c), data, c), (mode, c.name)
            paths[c.name] = up.last_path
        big = [c.name for c in specs if c.nbytes >= (8 << 20)]
        if broken_lock:
            assert up.disabled_reason and "failed during a first load" in up.disabled_reason
            assert locks.locked_bytes == 0
        else:
            # under hybrid a constant of one piece goes whichever way took it first
            want = {UploadPath.HYBRID, UploadPath.LOCKED_NOW} if mode == "hybrid" else {UploadPath.LOCKED_NOW}
            assert all(paths[n] in want for n in big), paths
            if mode == "locked":  # every page of them locked as they were copied
                assert locks.locked_bytes >= sum(c.nbytes for c in specs if c.name in big)
            else:  # the pieces taken from the back were staged, not locked
                assert 0 < locks.locked_bytes
            up.release()
            locks.wait_until_locked()
            for c in specs:  # a reload: every page locked
                assert _same(up.upload(path, c), data, c)
                if c.nbytes:
                    assert up.last_path == UploadPath.MAPPED_WARM, c.name
            assert up.disabled_reason is None
    finally:  # a failed check must not leave pages locked for the next test
        up.close()
        locks.wait_until_locked()
        locks.clear()
    assert locks.locked_bytes == 0 and locks.mapped_files == []
    monkeypatch.undo()  # the real cudaHostRegister again, for the check that nothing stays locked
    assert _lock_whole_file_again(path) == 0


@pytest.mark.gpu
def test_lone_uploads_without_prefetch_are_staged_then_warm(blob):
    path, data, specs = blob
    locks = upload.HostLockCache(1 << 40)
    up = upload.MappedBlobUploader(torch.device("cuda", 0), region_bytes=16 << 20, locks=locks, first_load="staged")
    for c in specs:  # each upload is its own batch; the previous one is locked in the background
        assert _same(up.upload(path, c), data, c)
    up.release()
    locks.wait_until_locked()
    for c in specs:
        assert _same(up.upload(path, c), data, c)
        if c.nbytes:
            assert up.last_path == UploadPath.MAPPED_WARM, c.name
    up.close()
    assert up.disabled_reason is None
    locks.clear()
    assert locks.locked_bytes == 0 and locks.mapped_files == []


@pytest.mark.gpu
def test_a_failed_lock_falls_back_to_staging_with_the_same_bytes(blob, monkeypatch):
    path, data, specs = blob
    monkeypatch.setattr(locking, "register", lambda ptr, n: 1)  # cudaErrorInvalidValue
    locks = upload.HostLockCache(1 << 40)
    up = upload.MappedBlobUploader(torch.device("cuda", 0), locks=locks, first_load="staged")
    for _ in range(2):  # the first load stages and "locks"; the reload finds the locks failed
        _load_all_staged(up, path, data, specs)
        locks.wait_until_locked()
    assert "cudaHostRegister" in (up.disabled_reason or "") and str(path) in up.disabled_reason
    up.close()
    locks.clear()


def _load_all_staged(up, path: Path, data: torch.Tensor, specs) -> None:
    """One load of every constant, each expected to arrive right and through pinned staging."""
    up.prefetch(path, specs)
    for c in specs:
        assert _same(up.upload(path, c), data, c)
        if c.nbytes:
            assert up.last_path == UploadPath.STAGED
    up.release()


def _lock_whole_file_again(path: Path) -> int:
    """cudaHostRegister of the whole file through a new mapping: fails on pages still locked."""
    import warnings

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = torch.frombuffer(mm, dtype=torch.uint8)
    err = locking.register(t.data_ptr(), t.numel())
    if err == 0:
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    del t
    mm.close()
    return err


@pytest.mark.gpu
def test_with_no_budget_nothing_is_ever_locked(blob):
    path, data, specs = blob
    up = upload.MappedBlobUploader(torch.device("cuda", 0), locks=upload.HostLockCache(0))
    for _ in range(2):
        _load_all_staged(up, path, data, specs)
    up.drain()
    assert up.locks.locked_bytes == 0 and up.locks.mapped_files == []
    assert _lock_whole_file_again(path) == 0
    up.close()


@pytest.mark.gpu
def test_a_reload_copies_from_pages_still_locked_and_a_rewritten_blob_is_never_reused(blob):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    locks = upload.HostLockCache(1 << 40)
    first = upload.MappedBlobUploader(dev, locks=locks, first_load="staged")
    first.prefetch(path, specs[:5])
    for c in specs[:5]:
        assert _same(first.upload(path, c), data, c)
    first.close()  # the session ends; locking its pages carries on in the background
    locks.wait_until_locked()
    assert locks.locked_bytes > 0 and locks.mapped_files == [path]
    second = upload.MappedBlobUploader(
        dev, locks=locks, first_load="staged"
    )  # another session, a superset of constants
    second.prefetch(path, specs)
    for i, c in enumerate(specs):
        assert _same(second.upload(path, c), data, c)
        if c.nbytes:
            assert second.last_path == (UploadPath.MAPPED_WARM if i < 5 else UploadPath.STAGED), c.name
    second.release()
    locks.wait_until_locked()
    # the blob is rewritten in place (same size, new bytes): a new file version, a new mapping
    new = torch.flip(data, dims=[0]).contiguous()
    path.write_bytes(new.numpy().tobytes())
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second.prefetch(path, specs)
    for c in specs:
        assert _same(second.upload(path, c), new, c), c.name
        if c.nbytes:
            assert second.last_path == UploadPath.STAGED
    second.close()
    locks.wait_until_locked()
    locks.clear()
    assert locks.locked_bytes == 0 and locks.mapped_files == []
    assert _lock_whole_file_again(path) == 0


@pytest.mark.gpu
def test_unused_blobs_over_the_budget_are_unlocked_oldest_first(tmp_path):
    dev = torch.device("cuda", 0)
    files = []
    for i in range(3):
        f = tmp_path / f"blob{i}.bin"
        f.write_bytes(bytes([i]) * (4 << 20))
        files.append(f)
    c = spec("w", 0, 4 << 20)
    locks = upload.HostLockCache(9 << 20)  # room for two blobs
    up = upload.MappedBlobUploader(dev, locks=locks, first_load="staged")
    for f in files:
        up.prefetch(f, [c])
        assert int(up.upload(f, c)[0]) == files.index(f)
        up.release()
        up.drain()
    assert locks.mapped_files == files[1:]
    assert locks.locked_bytes == 8 << 20
    assert _lock_whole_file_again(files[0]) == 0  # the oldest is really unlocked
    up.close()
    locks.clear()


@pytest.mark.gpu
def test_a_constant_past_the_end_of_the_blob_is_an_error_naming_it(blob):
    path, _, _ = blob
    up = upload.MappedBlobUploader(torch.device("cuda", 0))
    with pytest.raises(IntegrityError, match="'late'") as ei:
        up.prefetch(path, [spec("late", path.stat().st_size - 10, 11)])
    assert ei.value.path == str(path)
    up.close()


@pytest.mark.gpu
def test_the_cuda_paths_survive_short_reads(blob, monkeypatch):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    _short_reads(monkeypatch, most=(1 << 20) + 7)  # odd-sized pieces, few enough calls to be quick
    staging = torch.empty(max(c.nbytes for c in specs), dtype=torch.uint8, pin_memory=True)
    st = upload.HostStager(dev)
    try:
        for c in specs:
            assert _same(upload.upload_constant(path, c, dev, staging), data, c), c.name  # a pinned buffer given
            assert _same(upload.upload_constant(path, c, dev), data, c), c.name  # a pinned buffer per constant
            assert _same(st.upload(path, c), data, c), c.name
        late = spec("late", path.stat().st_size - 10, 11)
        for up in (lambda: upload.upload_constant(path, late, dev, staging), lambda: st.upload(path, late)):
            with pytest.raises(IntegrityError, match="'late'") as ei:
                up()
            assert ei.value.path == str(path)
    finally:
        st.close()


@pytest.mark.gpu
def test_a_cuda_load_locks_as_it_copies_and_its_reload_copies_from_locked_pages(built_sample):
    from toolkit import load_program

    prog = built_sample("total_collision", device="cuda")
    locks = upload.host_locks()
    locks.clear()
    try:
        paths = []
        for _ in range(2):
            # the mapped uploader's path (the default before verified staging, and integrity off's)
            s = load_program(prog, "fingerprint", device="cuda", options=LoadOptions(integrity="copy"))
            ups = [e for e in s.log if e.kind.value == "constant_uploaded"]
            assert ups
            paths.append({e.path for e in ups})
            assert s.verify()["ok"].all()
            s.close()
            locks.wait_until_locked()
        # the first load locks pages as it copies (a constant whose pages the one before it
        # locked copies from those); the reload finds every page locked
        assert UploadPath.LOCKED_NOW in paths[0]
        assert paths[0] <= {UploadPath.LOCKED_NOW, UploadPath.MAPPED, UploadPath.MAPPED_WARM}
        assert paths[1] == {UploadPath.MAPPED_WARM}
    finally:
        locks.clear()


# ------------------------------------------------- the first load's logic, CUDA calls stubbed
@pytest.fixture
def cuda_stubbed(monkeypatch):
    """CPU stand-ins for the few CUDA calls of a first load (locking, streams, events, pinned
    buffers), so that the piece, neighbour-page and fallback logic runs in CI byte for byte."""
    from concurrent.futures import ThreadPoolExecutor

    class _Sync:
        def synchronize(self):
            pass

        def record(self, stream=None):
            pass

    class _NoDevice:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    registered: list[tuple[int, int]] = []
    monkeypatch.setattr(locking, "register", lambda ptr, n: registered.append((ptr, n)) or 0)
    monkeypatch.setattr(mapped, "device_thread", lambda device, name: ThreadPoolExecutor(1))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Sync())
    monkeypatch.setattr(torch.cuda, "Event", _Sync)
    monkeypatch.setattr(torch.cuda, "device", _NoDevice)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    return registered


@pytest.mark.parametrize("mode", ["locked", "hybrid"])
@pytest.mark.parametrize("fail_every", [0, 3])
def test_the_first_load_logic_delivers_every_byte(blob, cuda_stubbed, monkeypatch, mode, fail_every):
    path, data, specs = blob
    if fail_every:  # every third lock fails: those bytes are staged, and the uploader stops locking
        calls = []
        monkeypatch.setattr(
            locking, "register", lambda ptr, n: calls.append(n) or (1 if len(calls) % fail_every == 0 else 0)
        )
    locks = upload.HostLockCache(1 << 40)
    up = upload.MappedBlobUploader(torch.device("cpu"), locks=locks, first_load=mode, piece_bytes=16 << 20)
    up.prefetch(path, specs)
    paths = {}
    for c in specs:
        assert _same(up.upload(path, c), data, c), (mode, fail_every, c.name, up.last_path)
        paths[c.name] = up.last_path
    if fail_every:
        assert up.disabled_reason and "failed during a first load" in up.disabled_reason
    else:
        assert up.disabled_reason is None
        assert paths[specs[5].name] in (UploadPath.LOCKED_NOW, UploadPath.HYBRID)  # the 128 MiB one
        # locked: every byte of every non-empty constant lies in a region locked now
        if mode == "locked":
            lm = locks.acquire(path)
            assert all(lm.covering(c.offset, c.offset + c.nbytes) for c in specs if c.nbytes)
            locks.release(lm, up._unlocker())
        # pieces are whole pages and never overlap
        regions = sorted((ptr, ptr + n) for ptr, n in cuda_stubbed)
        assert all(n % PAGE == 0 for _, n in cuda_stubbed)
        assert all(a[1] <= b[0] for a, b in zip(regions, regions[1:]))
