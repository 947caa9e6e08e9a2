"""Checks several policies share: metadata compared field by field, a tensor against the slot it fills,
and the lines upstream logs when a cached constant does not match.
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

from toolkit.core.model import DTYPE_ITEMSIZE, ConstantSpec, TensorMeta, shown
from toolkit.core.policies.decisions import FieldComparison
from toolkit.core.vocab import MetadataField


class Comparisons(tuple):
    """The field comparisons of two metadata, in order (a tuple), and whether every field is equal."""

    all_equal: bool

    def __new__(cls, items: Iterable[FieldComparison]) -> "Comparisons":
        self = super().__new__(cls, items)
        self.all_equal = all(x.equal for x in self)
        return self


@functools.lru_cache(maxsize=1 << 16)
def compare_metadata(cached: TensorMeta, new: TensorMeta) -> Comparisons:
    """Field by field, in cuda_backend.cpp's order: dtype, rank, sizes, strides, device type, index
    (memoised: a program's constants repeat a few shapes, and a dry run compares every hit)."""
    pairs = [
        (MetadataField.DTYPE, cached.dtype, new.dtype),
        (MetadataField.RANK, cached.rank, new.rank),
        (MetadataField.SIZES, cached.shape, new.shape),
        (MetadataField.STRIDES, cached.strides, new.strides),
        (MetadataField.DEVICE_TYPE, cached.device_type, new.device_type),
        (MetadataField.DEVICE_INDEX, cached.device_index, new.device_index),
    ]
    return Comparisons(FieldComparison(f, shown(a), shown(b)) for f, a, b in pairs)


def mismatch_text(comps: Sequence[FieldComparison]) -> str:
    return "; ".join(f"{c.field.value}: cached {c.cached} vs new {c.new}" for c in comps if not c.equal)


def device_label(device_type: str, device_index: int) -> str:
    return "cpu" if device_type == "cpu" else f"{device_type}:{device_index}"


def slot_problem(
    have: TensorMeta, have_bytes: int, slot: ConstantSpec, device_type: str, device_index: int
) -> str | None:
    """Why a tensor (``have``, with ``have_bytes`` readable bytes) cannot fill ``slot``, or None.

    AOTInductor checks nothing when a tensor is installed user-managed: a smaller tensor
    is read out of bounds, another dtype is misread, another device faults.  The loader
    refuses to run such a method; the dry-run analysis predicts the same.
    """
    if (have.device_type, have.device_index) != (device_type, device_index):
        return (
            f"tensor on {device_label(have.device_type, have.device_index)} cannot fill a slot on "
            f"{device_label(device_type, device_index)}"
        )
    if have.dtype != slot.dtype:
        return f"dtype {have.dtype} cannot fill a {slot.dtype} slot"
    # both counted from the view's first element (a slot's nbytes counts from its storage's start)
    need = slot.nbytes - slot.storage_offset * DTYPE_ITEMSIZE.get(slot.dtype, 0) if slot.nbytes else 0
    if have_bytes < need:
        return f"{have_bytes} bytes cannot fill a slot that reads {need} bytes (out-of-bounds read)"
    return None


# SlimTensor's c10::ScalarType and DeviceType (backends/aoti/slim/c10/core at 922adad721), as upstream prints them
SLIM_SCALAR_TYPE = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "bool": 11,
    "bfloat16": 15,
}
_SLIM_DEVICE_TYPE = {"cpu": 0, "cuda": 1}


def check_cached_constant_match(fqn: str, cached: TensorMeta, new: TensorMeta) -> str | None:
    """The line upstream's ``check_cached_constant_match`` logs (922adad721, e4b18fa9aa, 144ce1bc77: one
    code), verbatim, or None on a match: only the first field that differs, in its order.  Dtype and device
    type are the integers of SlimTensor's enums (a dtype SlimTensor lacks: its name)."""
    pre = f"Constant '{fqn}': "
    if cached.dtype != new.dtype:
        dt = [SLIM_SCALAR_TYPE.get(m.dtype, m.dtype) for m in (cached, new)]
        return f"{pre}dtype mismatch (cached={dt[0]}, new={dt[1]})"
    if cached.rank != new.rank:
        return f"{pre}dim mismatch (cached={cached.rank}, new={new.rank})"
    for what, a, b in (("size", cached.shape, new.shape), ("stride", cached.strides, new.strides)):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"{pre}{what} mismatch at dim {i} (cached={x}, new={y})"
    dev = [f"{_SLIM_DEVICE_TYPE.get(m.device_type, m.device_type)}:{m.device_index}" for m in (cached, new)]
    return None if dev[0] == dev[1] else f"{pre}device mismatch (cached={dev[0]}, new={dev[1]})"


def refusal_message(fqn: str, method: str) -> str:
    """The error 922adad721 logs after :func:`check_cached_constant_match`'s line, verbatim (it names the FQN)."""
    return (
        f"Constant '{fqn}' in method '{method}' is incompatible with the cached version "
        "from a previous method. Refusing to share."
    )


def decline_message(fqn: str, method: str) -> str:
    """What e4b18fa9aa and 144ce1bc77 log after :func:`check_cached_constant_match`'s line, verbatim."""
    return (
        f"Constant '{fqn}' in method '{method}' differs from the cached copy; "
        "using this method's own copy instead of sharing"
    )
