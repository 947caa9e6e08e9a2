"""Partial collision with a shape mismatch: one name hits, another misses."""

import torch

from toolkit.build.samples import Expected

from ._common import MatmulConstant, randn

DESCRIPTION = """
`prefill` holds `_tensor_constant0` as 64x64; `decode` holds `_tensor_constant0` as
64x128 and a new `head.weight`, so it has a miss: ExecuTorch uploads its blob and
compares. Before #21959 the shape mismatch fails the whole load; #21959 declines the one
constant. Sharing on the name alone would point a 64x128 slot at 64x64 bytes: the
toolkit marks that method not runnable instead of reading out of bounds.
"""


def methods():
    head = torch.nn.Linear(128, 16, bias=False)
    with torch.no_grad():
        head.weight.copy_(randn(16, 128, seed=5))
    return {
        "prefill": (MatmulConstant(randn(64, 64, seed=1)), (randn(4, 64, seed=10),)),
        "decode": (MatmulConstant(randn(64, 128, seed=2), head), (randn(4, 64, seed=11),)),
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
    # the two graphs differ, so do their .so files: two namespaces, two storage keys
    "fqn-weight-cache": Expected.of(declined=0),
}
