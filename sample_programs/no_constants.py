"""A method with no constants beside one with constants."""

import torch

from toolkit.build.samples import Expected

from ._common import randn


class Gate(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * x


DESCRIPTION = """
`gate` has no constants at all (nothing to enumerate, look up or upload); `project`
has one weight. Every policy must load and run both: an empty method is the all-hit
branch with nothing in it.
"""


def methods():
    lin = torch.nn.Linear(16, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(randn(16, 16, seed=1))
    return {
        "gate": (Gate(), (randn(4, 16, seed=10),)),
        "project": (lin, (randn(4, 16, seed=11),)),
    }


EXPECTED = {
    p: Expected.of()
    for p in (
        "no-sharing",
        "name-only",
        "refuse-on-mismatch",
        "decline-on-mismatch",
        "verify-always",
        "fingerprint",
        "content-dedup",
        "blind-share",
        "fqn-weight-cache",
    )
}
