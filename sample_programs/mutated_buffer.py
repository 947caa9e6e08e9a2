"""Accidental shared state: two module instances whose mutated buffers share an FQN (`kv`)."""

from toolkit.build.samples import Expected

from ._common import ProjectionWithCache, randn


class Prefill(ProjectionWithCache):
    def forward(self, x):
        self.kv.copy_(self.proj(x))  # writes its cache
        return self.kv * 2


class Decode(ProjectionWithCache):
    def forward(self, x):
        return self.proj(x) + self.kv.sum(dim=0)  # reads its own cache


DESCRIPTION = """
Two module instances, each with its own buffer `kv`: `prefill` writes its own, `decode`
reads its own (all zeros). Same FQN, same metadata, same initial content (zeros), so every
name of `decode` hits the cache. Each method alone, from the initial state, is right under
every policy. Run in sequence (prefill, then decode) the eager program's `decode` still reads
zeros; sharing `kv` by name hands it `prefill`'s writes: wrong. `fingerprint` knows from
provenance that these were two buffers and keeps `kv` private, while sharing `proj.weight`
(equal content).
"""


def methods():
    prefill, decode = Prefill(), Decode()
    decode.load_state_dict(prefill.state_dict())  # equal values, separate tensors
    return {
        "prefill": (prefill, (randn(4, 16, seed=10),)),
        "decode": (decode, (randn(4, 16, seed=11),)),
    }


def sequences():
    return {"generate": [("prefill", (randn(4, 16, seed=10),)), ("decode", (randn(4, 16, seed=11),))]}


_LEAK = {"generate"}  # sharing kv by name carries prefill's writes into decode
EXPECTED = {
    "no-sharing": Expected.of(),
    "name-only": Expected.of(min_shared=2, sequence_wrong=_LEAK),
    "refuse-on-mismatch": Expected.of(min_shared=2, sequence_wrong=_LEAK),
    "decline-on-mismatch": Expected.of(min_shared=2, sequence_wrong=_LEAK),
    "verify-always": Expected.of(min_shared=2, sequence_wrong=_LEAK),
    "fingerprint": Expected.of(min_shared=1, declined=1),
    "content-dedup": Expected.of(min_shared=1, declined=1),
    "blind-share": Expected.of(min_shared=2, sequence_wrong=_LEAK),  # decode's kv re-pointed at prefill's
    "fqn-weight-cache": Expected.of(min_shared=2, sequence_wrong=_LEAK),  # equal bytes, one key: stored once
}
