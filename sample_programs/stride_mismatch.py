"""Stride-only mismatch: same name, dtype and shape; different memory layout."""

import torch

from toolkit.build.samples import Expected

from ._common import randn


class Scaled(torch.nn.Module):
    def __init__(self, w: torch.Tensor, with_head: bool):
        super().__init__()
        self.register_buffer("w", w)
        self.head = torch.nn.Linear(32, 8, bias=False) if with_head else None
        if self.head is not None:
            with torch.no_grad():
                self.head.weight.copy_(randn(8, 32, seed=7))

    def forward(self, x):
        y = x @ self.w
        return self.head(y) if self.head is not None else y


DESCRIPTION = """
Both methods hold buffer `w`, 32x32 float32. In `decode` it is stored transposed
(strides (1, 32)), so the bytes are laid out differently; `decode` also has a new
`head.weight`, so it takes ExecuTorch's miss path. Metadata comparison catches the
stride difference; sharing by name alone makes `decode` read the bytes in the wrong
order and its output goes wrong.
"""


def methods():
    w = randn(32, 32, seed=3)
    w_t = randn(32, 32, seed=4).t().contiguous().t()  # strides (1, 32)
    return {
        "prefill": (Scaled(w, with_head=False), (randn(4, 32, seed=10),)),
        "decode": (Scaled(w_t, with_head=True), (randn(4, 32, seed=11),)),
    }


EXPECTED = {
    "no-sharing": Expected.of(),
    "name-only": Expected.of(wrong={"decode"}),
    "refuse-on-mismatch": Expected.of(loaded=False),
    "decline-on-mismatch": Expected.of(declined=1),
    "verify-always": Expected.of(declined=1),
    "fingerprint": Expected.of(declined=1),
    "content-dedup": Expected.of(declined=1),
    "blind-share": Expected.of(wrong={"decode"}, min_shared=1),
    "fqn-weight-cache": Expected.of(loaded=False),  # key cuda_fqn_weight:cpu:w, other data
}
