"""Where a constant lies in its weights blob: where the .so's own whole-blob upload reads it.

AOTInductor reads a blob file constant after constant, each from where the previous one's data
size ended (``bytes_read += data_size``, aoti_runtime/model_base.h), and places each into a
device allocation whose slots are padded to 64 bytes.  The compiler pads the data sizes of a
blob that holds any CPU constant itself, so there file offsets and allocation offsets agree.
An all-CUDA blob it writes unpadded (torch 2.11, measured on the H200): after a 16-byte counter
every constant lies 48 bytes further into the allocation than into the file, and an offset
derived from a constant's pointer is wrong.
"""

from __future__ import annotations

import pytest
import torch

import toolkit
from toolkit.runtimes.aoti_container import AotiContainer, read_compiled


class _CounterAndWeight(torch.nn.Module):
    """A weight, a 16-byte counter (int64[2]) written each call, then a table (parameters come
    first, then buffers in their order): the table is the constant whose place moves."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(torch.randn(8, 8, generator=g))
        self.register_buffer("counter", torch.zeros(2, dtype=torch.int64))
        self.register_buffer("table", torch.randn(8, 8, generator=g))

    def forward(self, x):
        self.counter.add_(1)
        return x @ self.weight @ self.table + self.counter.sum().to(x.dtype)


def _build(tmp_path, device):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    return toolkit.build_program(
        {"step": (_CounterAndWeight(), (x,))}, tmp_path / f"p-{device}", device=device, progress=False
    )


def _layouts(program, device):
    """Per constant: (program's offset, .so's file offset, offset of its pointer in the allocation)."""
    spec = program.methods[0]
    so, blob = program.path(spec.so_file), program.path(spec.blob_file)
    compiled = read_compiled(so, torch.device(device))
    c = AotiContainer.create(so, torch.device(device))
    c.upload_blob(blob)
    tensors = c.extract()
    base = min(t.untyped_storage().data_ptr() for t in tensors.values())
    return (
        {
            k.fqn: (
                k.offset,
                compiled.constants[k.name].blob_offset,
                tensors[k.name].untyped_storage().data_ptr() - base,
            )
            for k in spec.constants
        },
        compiled.blob_bytes,
        blob.stat().st_size,
    )


def _check_every_policy(program):
    for policy in toolkit.POLICIES:
        s = toolkit.load_program(program, policy)
        try:
            assert s.status == "loaded", (policy, s.error)
            v = s.verify()
            assert v["ok"].all(), (policy, v.to_string())
        finally:
            s.close()


@pytest.mark.parametrize(
    "device, table, blob_bytes",
    [
        # a CPU blob: the compiler pads the counter's data size to 64, file and allocation agree
        ("cpu", (320, 320, 320), 256 + 64 + 256),
        # an all-CUDA blob: read unpadded from the file (272), placed padded in the allocation (320)
        pytest.param("cuda", (272, 272, 320), 256 + 16 + 256, marks=pytest.mark.gpu),
    ],
)
def test_a_constant_lies_in_the_file_where_the_so_reads_it_not_where_its_pointer_lies(
    tmp_path, device, table, blob_bytes
):
    program = _build(tmp_path, device)
    layout, so_blob_bytes, file_bytes = _layouts(program, device)
    assert layout == {"weight": (0, 0, 0), "counter": (256, 256, 256), "table": table}, layout
    assert so_blob_bytes == file_bytes == blob_bytes
    _check_every_policy(program)
