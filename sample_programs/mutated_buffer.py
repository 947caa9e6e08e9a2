"""A mutated buffer with the same FQN in two methods."""

import torch

from toolkit.samples import Expected

from ._common import randn


class Cached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(randn(16, 16, seed=1))
        self.register_buffer("kv", torch.zeros(4, 16))


class Prefill(Cached):
    def forward(self, x):
        self.kv.copy_(self.proj(x))  # writes the cache
        return self.kv * 2


class Decode(Cached):
    def forward(self, x):
        return self.proj(x) + self.kv.sum(dim=0)  # reads the cache


DESCRIPTION = """
`prefill` writes buffer `kv`; `decode` reads a buffer with the same FQN. At build time
both are zeros, so name, metadata and content digest all match, and every name of
`decode` hits the cache. Shared, `decode` reads what `prefill` wrote and differs from
its eager reference (computed on a fresh cache). There is no mutability bit at runtime;
`fingerprint` takes it from the export (buffers_to_mutate) and keeps `kv` private,
while still sharing `proj.weight`.
"""


def methods():
    prefill, decode = Prefill(), Decode()
    decode.load_state_dict(prefill.state_dict())
    return {
        "prefill": (prefill, (randn(4, 16, seed=10),)),
        "decode": (decode, (randn(4, 16, seed=11),)),
    }


EXPECTED = {
    "no-sharing": Expected.of(),
    "name-only": Expected.of(wrong={"decode"}, min_shared=2),
    "refuse-on-mismatch": Expected.of(wrong={"decode"}, min_shared=2),
    "decline-on-mismatch": Expected.of(wrong={"decode"}, min_shared=2),
    "verify-always": Expected.of(wrong={"decode"}, min_shared=2),
    "fingerprint": Expected.of(min_shared=1, declined=0),
    "content-dedup": Expected.of(min_shared=1, declined=0),
}
