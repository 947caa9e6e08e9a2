"""The host-to-device upload paths (toolkit.upload): every path delivers the blob's exact bytes.

The region arithmetic is pure and runs everywhere; the paths themselves need CUDA and are
marked ``gpu`` (run on the H200 with ``pytest -m gpu``).
"""

from __future__ import annotations

import mmap
import random
from pathlib import Path

import pytest
import torch

from toolkit import upload
from toolkit.manifest import ConstantSpec
from toolkit.vocab import ConstantKind

PAGE = mmap.PAGESIZE


def spec(name: str, offset: int, nbytes: int) -> ConstantSpec:
    return ConstantSpec(name=name, fqn=name, kind=ConstantKind.BUFFER, mutated=False, dtype="uint8",
                        shape=(nbytes,), strides=(1,), storage_offset=0, nbytes=nbytes, offset=offset,
                        digest="0" * 64)


# ---------------------------------------------------------------------------- pure parts
def _check_regions(ranges, region_bytes):
    regions = upload.page_regions(ranges, region_bytes)
    for s, e in regions:
        assert s % PAGE == 0 and e % PAGE == 0, (s, e)
        assert 0 < e - s <= region_bytes
    for (s1, e1), (s2, e2) in zip(regions, regions[1:]):
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
    assert upload.page_regions([(5, 5)], 4 * PAGE) == []


def test_random_ranges_are_covered_by_disjoint_page_regions():
    rng = random.Random(7)
    for _ in range(200):
        ranges = []
        for _ in range(rng.randint(1, 12)):
            s = rng.randint(0, 50 * PAGE)
            ranges.append((s, s + rng.choice([0, 1, 7, PAGE - 1, PAGE, 3 * PAGE + 11, rng.randint(1, 20 * PAGE)])))
        _check_regions(ranges, rng.choice([1, 2, 5]) * PAGE)


def test_covering_finds_exactly_the_regions_of_a_range():
    regions = [(0, 2 * PAGE), (2 * PAGE, 4 * PAGE), (8 * PAGE, 9 * PAGE)]
    b = upload._MappedBatch(Path("x"), None, None, regions, [s for s, _ in regions], [None] * 3, [0] * 3)  # type: ignore[arg-type]
    assert b.covering(5, 3 * PAGE) == [0, 1]
    assert b.covering(8 * PAGE + 1, 8 * PAGE + 2) == [2]
    assert b.covering(3 * PAGE, 5 * PAGE) is None  # bytes 4..5 pages are not locked
    assert b.covering(10 * PAGE, 10 * PAGE + 1) is None


def test_region_size_must_be_whole_pages():
    with pytest.raises(ValueError, match="page size"):
        upload.MappedBlobUploader(torch.device("cuda", 0), region_bytes=PAGE + 1)


def test_an_unknown_upload_path_is_named_in_the_error(monkeypatch):
    monkeypatch.setenv(upload.UPLOAD_ENV, "turbo")
    with pytest.raises(ValueError, match="CONSTSHARE_UPLOAD='turbo'"):
        upload.make_uploader(torch.device("cuda", 0))


def test_cpu_loads_record_how_the_bytes_travelled(built_sample):
    from toolkit import load_program

    s = load_program(built_sample("total_collision"), "fingerprint", device="cpu")
    ups = [e for e in s.log if e.kind.value == "constant_uploaded"]
    assert ups and {e.path for e in ups} == {upload.PATH_HOST}
    assert set(s.events.query("kind == 'constant_uploaded'")["path"]) == {upload.PATH_HOST}


# ---------------------------------------------------------------------------- CUDA paths
@pytest.fixture
def blob(tmp_path):
    data = torch.randint(0, 256, (3 * (64 << 20) + 12345,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
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
    return torch.equal(got.cpu(), data[c.offset: c.offset + c.nbytes])


@pytest.mark.gpu
@pytest.mark.parametrize("choice", ["mapped", "staged", "unstaged"])
def test_every_path_delivers_the_exact_bytes(blob, monkeypatch, choice):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    monkeypatch.setenv(upload.UPLOAD_ENV, choice)
    up = upload.make_uploader(dev)
    for rounds in range(3):  # the same blob again after release: nothing is left locked twice
        if up is not None:
            up.prefetch(path, specs)
        order = specs if rounds != 1 else list(reversed(specs))  # out of the prefetched order too
        for c in order:
            assert _same(upload.upload_constant(path, c, dev, up), data, c), (choice, c.name)
            if up is not None and c.nbytes:
                expected = upload.PATH_MAPPED if choice == "mapped" else upload.PATH_STAGED
                assert up.last_path == expected
        if up is not None:
            up.release()
    if up is not None:
        assert getattr(up, "disabled_reason", None) is None
        up.close()


@pytest.mark.gpu
def test_a_lone_upload_without_prefetch_locks_only_its_pages(blob):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    up = upload.MappedBlobUploader(dev, region_bytes=16 << 20)
    for c in specs:  # each upload maps and locks on its own, then the next one releases it
        assert _same(up.upload(path, c), data, c)
        assert up.last_path == upload.PATH_MAPPED
    up.close()
    assert up.disabled_reason is None


@pytest.mark.gpu
def test_a_failed_lock_falls_back_to_staging_with_the_same_bytes(blob, monkeypatch):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(upload, "_register", lambda ptr, n: 1)  # cudaErrorInvalidValue
    up = upload.MappedBlobUploader(dev)
    up.prefetch(path, specs)
    for c in specs:
        assert _same(up.upload(path, c), data, c)
    assert up.last_path == upload.PATH_STAGED
    assert "cudaHostRegister" in (up.disabled_reason or "") and str(path) in up.disabled_reason
    up.close()


@pytest.mark.gpu
def test_a_released_batch_is_unlocked_so_it_can_be_locked_again(blob):
    path, data, specs = blob
    dev = torch.device("cuda", 0)
    up = upload.MappedBlobUploader(dev)
    up.prefetch(path, specs)
    up.release()  # nothing uploaded (a failed load): pending locks are cancelled or undone
    up.drain()
    # the same pages lock again: cudaHostRegister fails on pages still registered
    import warnings

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = torch.frombuffer(mm, dtype=torch.uint8)
    assert upload._register(t.data_ptr(), t.numel()) == 0
    assert int(torch.cuda.cudart().cudaHostUnregister(t.data_ptr())) == 0
    del t
    mm.close()
    up.close()


@pytest.mark.gpu
def test_a_constant_past_the_end_of_the_blob_is_an_error_naming_it(blob):
    path, _, _ = blob
    up = upload.MappedBlobUploader(torch.device("cuda", 0))
    with pytest.raises(EOFError, match="'late'"):
        up.prefetch(path, [spec("late", path.stat().st_size - 10, 11)])
    up.close()


@pytest.mark.gpu
def test_cuda_loads_upload_through_the_locked_mapping(built_sample):
    from toolkit import load_program

    s = load_program(built_sample("total_collision", device="cuda"), "fingerprint", device="cuda")
    ups = [e for e in s.log if e.kind.value == "constant_uploaded"]
    assert ups and {e.path for e in ups} == {upload.PATH_MAPPED}
    assert s.verify()["ok"].all()
    s.close()
