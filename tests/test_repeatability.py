"""repeatability() on CPU: a kernel whose outputs change with identical state and inputs.

The GPU tests exercise atomics (``index_add_``); on a CPU, a random op compiled into the
method (AOTInductor draws fresh numbers on every call) is the nondeterministic kernel: its
outputs differ between runs even when the state is reset before each one, which is what
tells it apart from state carried in mutated buffers.
"""

from __future__ import annotations

import pytest
import torch

from toolkit import build_program, load_program


class Noisy(torch.nn.Module):
    def __init__(self, w: torch.nn.Parameter):
        super().__init__()
        self.w = w

    def forward(self, x):
        return x @ self.w + torch.rand(x.shape) * 1e-3  # a fresh draw on every call


class Plain(torch.nn.Module):
    def __init__(self, w: torch.nn.Parameter):
        super().__init__()
        self.w = w

    def forward(self, x):
        return x @ self.w


@pytest.fixture(scope="module")
def noisy_program(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8, generator=g), requires_grad=False)
    x = torch.randn(2, 8, generator=g)
    return build_program(
        {"noisy": (Noisy(w), (x,)), "plain": (Plain(w), (x,))},
        tmp_path_factory.mktemp("noisy") / "prog",
        progress=False,
    )


def test_a_random_kernel_is_named_nondeterministic_and_a_plain_method_is_not(noisy_program):
    s = load_program(noisy_program, "fingerprint")
    try:
        rep = s.repeatability(runs=3).set_index("method")
        assert bool(rep.loc["noisy", "changes_with_reset"]) and bool(rep.loc["noisy", "changes_without_reset"])
        assert rep.loc["noisy", "cause"].startswith("nondeterministic kernels")
        assert rep.loc["noisy", "buffers"] == ""  # no state involved
        assert not bool(rep.loc["plain", "changes_with_reset"]) and not bool(rep.loc["plain", "changes_without_reset"])
        assert rep.loc["plain", "cause"] == ""
        # the shared weight is right: both methods verify (the noise is within tolerance)
        v = s.verify().set_index("method")
        assert bool(v["ok"].all()), v.to_string()
    finally:
        s.close()


def test_repeatability_needs_two_runs(noisy_program):
    s = load_program(noisy_program, "fingerprint")
    try:
        with pytest.raises(ValueError, match="at least 2"):
            s.repeatability(runs=1)
    finally:
        s.close()
