"""Verification of outputs that hold NaN or infinities: the same non-finite values where the
reference has them compare equal (and the frame says so); anywhere else they are wrong."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.engine.verification import compare_outputs

NAN, INF = math.nan, math.inf


def _cmp(out: list[float], ref: list[float]) -> dict:
    return compare_outputs([torch.tensor(out)], [torch.tensor(ref)])


@pytest.mark.parametrize(
    "out, ref, same",
    [
        ([NAN, 1.0], [NAN, 1.0], 1),
        ([INF, -INF, 2.0], [INF, -INF, 2.0], 2),
        ([NAN, INF, NAN], [NAN, INF, NAN], 3),  # nothing finite left to compare
    ],
)
def test_the_same_non_finite_values_compare_equal(out, ref, same):
    r = _cmp(out, ref)
    assert r["ok"] is True and r["max_abs_err"] == 0.0
    assert r["reason"] == f"{same} NaN or infinite values where the eager reference has the same (compared equal)"


def test_finite_positions_are_still_compared():
    assert _cmp([NAN, 1.0 + 1e-6], [NAN, 1.0])["ok"] is True
    r = _cmp([NAN, 1.5], [NAN, 1.0])
    assert r["ok"] is False and r["max_abs_err"] == pytest.approx(0.5)
    assert r["reason"].startswith("output differs from the eager reference; 1 NaN")


@pytest.mark.parametrize(
    "out, ref",
    [
        ([NAN, 1.0], [0.0, 1.0]),  # a NaN where the reference has none
        ([0.0, 1.0], [NAN, 1.0]),  # a number where the reference has NaN
        ([INF], [-INF]),  # infinities of other signs
        ([INF], [1e30]),  # an infinity against a finite value
        ([NAN], [INF]),
    ],
)
def test_non_finite_values_anywhere_else_are_wrong(out, ref):
    r = _cmp(out, ref)
    assert r["ok"] is False and r["max_abs_err"] == INF
    assert r["reason"] == "output differs from the eager reference"


def test_a_sequence_step_names_the_eager_sequence():
    r = compare_outputs([torch.tensor([NAN])], [torch.tensor([0.0])], against="the eager sequence")
    assert r["reason"] == "output differs from the eager sequence"


def test_a_method_whose_right_output_holds_nan_verifies_ok(built_sample):
    """NaN in the input gives NaN in the compiled output and in eager's: ok, not "wrong"; a
    reference with a NaN the compiled output does not have is still wrong."""
    from toolkit.build.samples import sample_module
    from toolkit.engine.session import load_program

    module, (x,) = sample_module("total_collision").methods()["prefill"]
    x = x.clone()
    x[1, 3] = NAN
    want = module(x).detach()
    assert want.isnan().any() and not want.isnan().all()
    s = load_program(built_sample("total_collision").root, "no-sharing")
    try:
        row = s.verify(references={"prefill": {"inputs": [x], "outputs": [want]}}).set_index("method").loc["prefill"]
        assert bool(row["ok"]) and math.isfinite(row["max_abs_err"]), row.to_dict()
        assert (
            f"{int(want.isnan().sum())} NaN or infinite values where the eager reference has the same" in row["reason"]
        )
        bad = want.clone()
        bad[0, 0] = NAN  # row 0 of the input holds no NaN: the compiled output is finite there
        row = s.verify(references={"prefill": {"inputs": [x], "outputs": [bad]}}).set_index("method").loc["prefill"]
        assert not bool(row["ok"]) and row["max_abs_err"] == INF
        assert row["reason"].startswith("output differs from the eager reference")
    finally:
        s.close()


def test_the_unshared_oracle_compares_nan_and_infinities_by_the_same_rule():
    """Nondeterministic repeats (not bit-equal): matched NaN and same-sign infinities are no error."""
    from toolkit.engine.verification import compare_unshared

    first = [torch.tensor([1.0, NAN, INF, -INF])]
    second = [torch.tensor([1.5, NAN, INF, -INF])]  # a spread of 0.5 on the finite position
    got = compare_unshared([torch.tensor([1.2, NAN, INF, -INF])], (first, second))
    assert got["ok"] and got["max_abs_err"] == pytest.approx(0.2) and got["atol"] == 1.0
    got = compare_unshared([torch.tensor([1.2, NAN, -INF, -INF])], (first, second))  # an infinity of the other sign
    assert not got["ok"] and got["max_abs_err"] == INF
