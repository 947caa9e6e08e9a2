"""Reading one constant's bytes out of a host weights blob, and viewing raw bytes as the constant.

Every upload path reads through :func:`read_exactly`, so a blob shorter than the manifest's
constants is an :class:`~toolkit.core.errors.IntegrityError` naming the file (a recorded failed
load, also with integrity checking off), never a bare ``EOFError`` or a constant left partly unwritten.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from toolkit.core.errors import IntegrityError
from toolkit.core.model import ConstantSpec


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def blob_too_short(blob_path: Path, spec: ConstantSpec, detail: str) -> IntegrityError:
    """The error for a blob shorter than the manifest's constants: an IntegrityError (a
    ToolkitError), so a load with ``integrity="off"`` fails as a recorded failed load, as the size
    check of an integrity-checked load would have made it, not with a bare EOFError."""
    return IntegrityError(
        f"blob ends before constant {spec.name!r} does (offset {spec.offset}, {spec.nbytes} bytes): {detail}",
        path=blob_path,
    )


def read_exactly(fd: int, view: memoryview, offset: int, blob_path: Path, spec: ConstantSpec) -> None:
    """Fill ``view`` with the file's bytes from ``offset`` on (``view`` is all or part of ``spec``).

    One read may return fewer bytes than asked without being at the end of the file: Linux
    caps a single read at 0x7ffff000 bytes (just under 2 GiB), and signals or network file
    systems cut reads short too.  So read until the view is full; only a read of 0 bytes is
    the end of the file, and that is an error rather than a constant left partly unwritten.
    """
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise blob_too_short(blob_path, spec, f"nothing to read at byte {offset + got}")
        got += n


def read_constant_into(blob_path: Path, spec: ConstantSpec, buf: torch.Tensor) -> torch.Tensor:
    """Read the constant's bytes into ``buf`` (a uint8 CPU tensor of exactly ``spec.nbytes``)."""
    if spec.nbytes:
        fd = os.open(blob_path, os.O_RDONLY)
        try:
            read_exactly(fd, memoryview(buf.numpy()).cast("B"), spec.offset, blob_path, spec)
        finally:
            os.close(fd)
    return buf


def read_constant_bytes(blob_path: Path, spec: ConstantSpec, *, pin: bool = False) -> torch.Tensor:
    """The bytes of one constant, read from its host blob into a (pinned) uint8 CPU tensor."""
    return read_constant_into(blob_path, spec, torch.empty(spec.nbytes, dtype=torch.uint8, pin_memory=pin))


def as_constant(raw: torch.Tensor, spec: ConstantSpec) -> torch.Tensor:
    """View raw bytes (on any device) as the constant's dtype, shape and strides."""
    dt = dtype_from_name(spec.dtype)
    if spec.nbytes == 0:
        return torch.empty_strided(spec.shape, spec.strides, dtype=dt, device=raw.device)
    typed = raw.view(dt)
    return typed.as_strided(spec.shape, spec.strides, spec.storage_offset)
