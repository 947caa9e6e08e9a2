"""Total collision: every constant name of the second method is already cached."""

from toolkit.build.samples import Expected

from ._common import MatmulConstant, randn

DESCRIPTION = """
Two methods, each with one lifted tensor constant. AOTInductor names both
`_tensor_constant0`; both are 64x64 float32 (identical metadata) with unrelated data.
`decode`'s only name hits the cache, so ExecuTorch takes the all-hit branch and shares
on the name alone: its output is silently wrong. Comparing metadata (#21706) cannot see
it either; only a content check (`fingerprint`) declines the share.
"""


def methods():
    return {
        "prefill": (MatmulConstant(randn(64, 64, seed=1)), (randn(4, 64, seed=10),)),
        "decode": (MatmulConstant(randn(64, 64, seed=2) * 50), (randn(4, 64, seed=11),)),
    }


EXPECTED = {
    "no-sharing": Expected.of(),
    "name-only": Expected.of(wrong={"decode"}, min_shared=1),
    "refuse-on-mismatch": Expected.of(wrong={"decode"}, min_shared=1),
    "decline-on-mismatch": Expected.of(wrong={"decode"}, min_shared=1),
    "verify-always": Expected.of(wrong={"decode"}, min_shared=1, declined=0),
    "fingerprint": Expected.of(declined=1),
    "content-dedup": Expected.of(declined=1),
    # #18667 re-points decode's name at prefill's tensor unchecked; 1.5.x: one graph, byte-identical .so
    # files, so both lifted constants get one storage key with other data: the exporter refuses
    "blind-share": Expected.of(wrong={"decode"}, min_shared=1),
    "fqn-weight-cache": Expected.of(loaded=False),
}
