"""Three methods: the first and third genuinely share, the second collides."""

import torch

from toolkit.build.samples import Expected

from ._common import randn


class Encoder(torch.nn.Module):
    def __init__(self, seed: int, with_head: bool = False):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(randn(32, 32, seed=seed))
        self.head = torch.nn.Linear(32, 8, bias=False) if with_head else None
        if self.head is not None:
            with torch.no_grad():
                self.head.weight.copy_(randn(8, 32, seed=seed + 100))

    def forward(self, x):
        y = torch.tanh(self.proj(x))
        return self.head(y) if self.head is not None else y


DESCRIPTION = """
`encode` and `encode_again` are the same module: `proj.weight` is genuinely shared.
`probe` is an independent sub-module whose `proj.weight` has the same FQN, shape,
dtype and strides but other data, plus a new `head.weight` (a miss). ExecuTorch's
metadata comparison passes, so `probe` silently runs on `encode`'s weight.
`fingerprint` declines `probe`'s `proj.weight` and still lets `encode_again` share.
"""


def methods():
    enc = Encoder(seed=1)
    return {
        "encode": (enc, (randn(4, 32, seed=10),)),
        "probe": (Encoder(seed=2, with_head=True), (randn(4, 32, seed=11),)),
        "encode_again": (enc, (randn(2, 32, seed=12),)),
    }


EXPECTED = {
    "no-sharing": Expected.of(),
    "name-only": Expected.of(wrong={"probe"}, min_shared=2),
    "refuse-on-mismatch": Expected.of(wrong={"probe"}, min_shared=2),
    "decline-on-mismatch": Expected.of(wrong={"probe"}, min_shared=2),
    "verify-always": Expected.of(wrong={"probe"}, min_shared=2),
    "fingerprint": Expected.of(min_shared=1, declined=1),
    "content-dedup": Expected.of(min_shared=1, declined=1),
    "blind-share": Expected.of(wrong={"probe"}, min_shared=2),
    # probe's proj.weight: the key cuda_fqn_weight:cpu:proj.weight with other data: the exporter refuses
    "fqn-weight-cache": Expected.of(loaded=False),
}
