"""How outputs are compared: against a reference within the output dtype's tolerance, or against
two unshared runs bit for bit (within twice their spread where kernels are nondeterministic).

A NaN where the expected side has NaN, and an infinity of its sign, compare equal; a NaN or an
infinity anywhere else is wrong.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def dtype_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) fitting the output dtype: compiled kernels reorder reductions."""
    if dtype in (torch.bfloat16,):
        return 5e-2, 5e-2
    if dtype in (torch.float16,):
        return 1e-2, 1e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-3, 1e-3
    return 0.0, 0.0


def _abs_error(o: torch.Tensor, e: torch.Tensor) -> tuple[float, tuple[torch.Tensor, torch.Tensor] | None, int]:
    """The largest ``|o - e|`` over the positions where both are finite, with those values (float64)
    and how many NaN/infinite values of ``e`` ``o`` matches (a NaN by a NaN, an infinity by one of
    its sign).  inf (and no values) when shape or dtype differ, or a NaN or an infinity is unmatched."""
    if o.shape != e.shape or o.dtype != e.dtype:
        return math.inf, None, 0
    o, e = o.double(), e.double()
    finite = torch.isfinite(o) & torch.isfinite(e)
    alike = (torch.isnan(o) & torch.isnan(e)) | (torch.isinf(o) & (o == e))
    matched = int(alike.sum())
    if not bool((finite | alike).all()):
        return math.inf, None, matched
    of, ef = o[finite], e[finite]
    return (float((of - ef).abs().max()) if finite.any() else 0.0), (of, ef), matched


def compare_outputs(
    outputs: list[torch.Tensor], expected: list[torch.Tensor], against: str = "the eager reference"
) -> dict[str, Any]:
    """max_abs_err, atol, rtol, ok and reason of outputs against the reference.

    A NaN where the reference has NaN, and an infinity of the reference's sign, compare equal
    (``max_abs_err`` is taken over the other positions; the reason says how many there were);
    a NaN or an infinity anywhere else is wrong (``max_abs_err`` inf)."""
    errs, ok = [], len(outputs) == len(expected)
    atol, rtol, same_nonfinite = 0.0, 0.0, 0
    for o, e in zip(outputs, expected):
        a, r = dtype_tolerance(e.dtype)
        atol, rtol = max(atol, a), max(rtol, r)
        err, values, matched = _abs_error(o, e)
        errs.append(err)
        same_nonfinite += matched
        if values is None:
            ok = False
            continue
        ok &= bool(torch.allclose(*values, atol=a, rtol=r))
    reason = "" if ok else f"output differs from {against}"
    if same_nonfinite:
        reason += ("; " if reason else "") + (
            f"{same_nonfinite} NaN or infinite values where {against} has the same (compared equal)"
        )
    return {"max_abs_err": max(errs) if errs else 0.0, "atol": atol, "rtol": rtol, "ok": ok, "reason": reason}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Same dtypes, shapes and bytes (a NaN equals the same NaN)."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b)
    )


def _max_abs(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest error of :func:`_abs_error` over the pairs (the same rule for NaN and infinities)."""
    return max([0.0] + [_abs_error(x, y)[0] for x, y in zip(a, b)])


def compare_unshared(
    outputs: list[torch.Tensor], repeats: tuple[list[torch.Tensor], list[torch.Tensor]]
) -> dict[str, Any]:
    """max_abs_err, atol, rtol, ok of ``outputs`` against two runs of the unshared load on the same inputs:
    bit for bit where the two runs agree bit for bit; else within twice their spread (nondeterministic kernels)."""
    first, second = repeats
    if bitwise_equal(first, second):
        return {
            "max_abs_err": _max_abs(outputs, first),
            "atol": 0.0,
            "rtol": 0.0,
            "ok": bitwise_equal(outputs, first),
            "tolerance": "bit-exact",
        }
    spread = _max_abs(first, second)
    err = _max_abs(outputs, first)
    return {
        "max_abs_err": err,
        "atol": 2 * spread,
        "rtol": 0.0,
        "ok": err <= 2 * spread,
        "tolerance": f"within twice the spread of two unshared runs ({spread:.3g}): nondeterministic kernels",
    }
