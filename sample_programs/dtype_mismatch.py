"""Dtype-only mismatch: same name, shape and byte size; float16 against bfloat16."""

import torch

from toolkit.build.samples import Expected

from ._common import randn


class Scale(torch.nn.Module):
    def __init__(self, scale: torch.Tensor, with_head: bool):
        super().__init__()
        self.register_buffer("scale", scale)
        self.head = torch.nn.Linear(16, 4, bias=False) if with_head else None
        if self.head is not None:
            with torch.no_grad():
                self.head.weight.copy_(randn(4, 16, seed=8))

    def forward(self, x):
        y = x * self.scale.float()
        return self.head(y) if self.head is not None else y


DESCRIPTION = """
Both methods hold buffer `scale`, 16x16: float16 in `prefill`, bfloat16 in `decode`.
The byte sizes are equal, so nothing would read out of bounds, but the same bits mean
other numbers. Metadata comparison declines it; name-only sharing would install a
float16 tensor into a bfloat16 slot, which the toolkit refuses to run.
"""


def methods():
    return {
        "prefill": (Scale(randn(16, 16, seed=3, dtype=torch.float16), False), (randn(16, 16, seed=10),)),
        "decode": (Scale(randn(16, 16, seed=4, dtype=torch.bfloat16), True), (randn(16, 16, seed=11),)),
    }


EXPECTED = {
    "no-sharing": Expected.of(),
    "name-only": Expected.of(not_runnable={"decode"}),
    "refuse-on-mismatch": Expected.of(loaded=False),
    "decline-on-mismatch": Expected.of(declined=1),
    "verify-always": Expected.of(declined=1),
    "fingerprint": Expected.of(declined=1),
    "content-dedup": Expected.of(declined=1),
    "blind-share": Expected.of(not_runnable={"decode"}),
    "fqn-weight-cache": Expected.of(loaded=False),  # key cuda_fqn_weight:cpu:scale, other data
}
