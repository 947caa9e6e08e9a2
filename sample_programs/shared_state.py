"""Intended shared state: one module instance's KV buffer, filled by prefill, read by decode."""

import torch

from toolkit.build.samples import Expected

from ._common import ProjectionWithCache, randn


class Prefill(torch.nn.Module):
    def __init__(self, core: ProjectionWithCache):
        super().__init__()
        self.core = core

    def forward(self, x):
        self.core.kv.copy_(self.core.proj(x))  # fills the cache
        return self.core.kv * 2


class Decode(torch.nn.Module):
    def __init__(self, core: ProjectionWithCache):
        super().__init__()
        self.core = core

    def forward(self, x):
        return self.core.proj(x) + self.core.kv.sum(dim=0)  # reads what prefill filled


DESCRIPTION = """
One module instance (`core`) serves both methods: `prefill` fills its buffer `core.kv`,
`decode` reads it, like a language model's KV cache. Sharing is required here: run in
sequence, the eager `decode` reads what `prefill` wrote. Each method alone, from the initial
state, is right under every policy; in sequence, a policy that gives `decode` its own copy
of `core.kv` (no sharing) makes it read zeros: wrong. `fingerprint` shares `core.kv` because
provenance says it is one buffer (upstream: `share_kv_cache_across_methods`, issue #17496).
"""


def methods():
    core = ProjectionWithCache()
    return {
        "prefill": (Prefill(core), (randn(4, 16, seed=10),)),
        "decode": (Decode(core), (randn(4, 16, seed=11),)),
    }


def sequences():
    return {
        "generate": [
            ("prefill", (randn(4, 16, seed=10),)),
            ("decode", (randn(4, 16, seed=11),)),
            ("decode", (randn(4, 16, seed=12),)),
        ]
    }


EXPECTED = {
    "no-sharing": Expected.of(sequence_wrong={"generate"}),  # decode never sees prefill's cache
    "name-only": Expected.of(min_shared=2),
    "refuse-on-mismatch": Expected.of(min_shared=2),
    "decline-on-mismatch": Expected.of(min_shared=2),
    "verify-always": Expected.of(min_shared=2),
    "fingerprint": Expected.of(min_shared=2, declined=0),
    "content-dedup": Expected.of(min_shared=2, declined=0),
    "blind-share": Expected.of(min_shared=2),
    "fqn-weight-cache": Expected.of(min_shared=2),
}
