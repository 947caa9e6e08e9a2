"""The builder's handling of a blob whose file layout is not the one its .so reads.

AOTInductor (torch 2.11, CUDA, measured on the H200) writes the weights blob of an all-CUDA
program unpadded while the .so reads every constant 64-byte aligned: a 16-byte counter puts
every later constant 48 bytes early in the file.  The builder finds such a constant by its
bytes and rewrites the file as the .so reads it.
"""

from __future__ import annotations

import mmap

import torch

from toolkit.builder import _Placed, _bytes_at, _rewrite_blob, _search_blob


def _mapped(path):
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def test_a_constant_written_early_is_found_and_the_blob_laid_out_as_the_so_reads_it(tmp_path):
    counter = torch.tensor([7, 9], dtype=torch.int64)  # 16 bytes: the .so pads it to 64
    freq = torch.arange(12, dtype=torch.float32)[2:].view(2, 5)  # a view: storage from element 0
    blob = tmp_path / "weights.blob"
    blob.write_bytes(counter.numpy().tobytes() + torch.arange(12, dtype=torch.float32).numpy().tobytes())
    mm = _mapped(blob)
    whole = torch.frombuffer(bytearray(blob.read_bytes()), dtype=torch.uint8)
    assert _bytes_at(whole, 0, 16, counter) and not _bytes_at(whole, 64, 48, freq)  # not where the .so reads it
    at = _search_blob(mm, freq, 48, 16)
    assert at == 16
    found = [_Placed("counter", counter, 0, "int64", 16, 0), _Placed("freq", freq, 64, "float32", 48, at)]
    mm = _rewrite_blob(blob, mm, found)
    data = blob.read_bytes()
    assert len(data) == 64 + 48 and data[16:64] == bytes(48)
    new = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert _bytes_at(new, 0, 16, counter) and _bytes_at(new, 64, 48, freq)
    assert not (tmp_path / "weights.blob.relaid").exists()
    mm.close()


def test_bytes_that_are_nowhere_in_the_blob_are_not_found(tmp_path):
    blob = tmp_path / "weights.blob"
    blob.write_bytes(bytes(64))
    assert _search_blob(_mapped(blob), torch.ones(4), 16, 0) is None
