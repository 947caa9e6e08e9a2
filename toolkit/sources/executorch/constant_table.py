"""Payload generations 1 and 2: a method's constants from a constant table laid over its dense weights blob.

These generations keep the constant table inside the ``.so``, which a source never opens: the
caller passes it (``constant_table=``: :class:`AotiConstant` rows per method, a JSON file of them,
or a callable given the method and its ``.so`` bytes), or a ``constant_table.json`` lies beside the
``.pte``.  The offsets then follow AOTInductor's dense ``binary_blob`` layout and must add up to the
blob's size, so a table that is not this ``.so``'s is refused.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from toolkit.core.errors import ProgramError
from toolkit.core.model import DTYPE_ITEMSIZE, ConstantSpec, Region, aligned_slot_bytes, required_nbytes
from toolkit.core.vocab import ConstantKind
from toolkit.sources.executorch.files import ProgramFiles
from toolkit.sources.executorch.layout import Delegate, Plan
from toolkit.sources.executorch.payload import Payload

DEFAULT_CONSTANT_TABLE_FILE = "constant_table.json"  # read from beside the .pte when constant_table= is not given


@dataclass(frozen=True)
class AotiConstant:
    """One entry of a ``.so``'s constant table, for generations 1 and 2 (``constant_table=``).

    ``data_size`` is the bytes of its storage in the dense blob (default: what the view
    reads); ``offset`` its byte offset in the blob (default: AOTInductor's layout rule).
    A :class:`~toolkit.core.model.ConstantSpec` (e.g. of the program the ``.so`` was built from)
    is accepted in place of one.
    """

    name: str
    fqn: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int = 0
    kind: ConstantKind = ConstantKind.PARAMETER
    mutated: bool = False
    data_size: int | None = None
    offset: int | None = None


def _read_constant_table(path: Path) -> dict:
    """A constant table JSON file: {method: [row, ...]}, each row :class:`AotiConstant`'s fields."""
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ProgramError(f"constant table cannot be read: {e}", path=path) from None
    if not isinstance(table, dict):
        raise ProgramError(
            f"constant table is a JSON {type(table).__name__}, not an object of method -> rows", path=path
        )
    return table


class ConstantTable:
    """The ``constant_table=`` of :func:`~toolkit.sources.executorch.open_pte`, resolved when a method first
    needs it: a mapping of rows per method, a JSON file of one, a callable, or None (the default file)."""

    def __init__(self, given, root: Path, pte: Path):
        self.table, self.root, self.pte = given, root, pte
        self.file: Path | None = None  # the JSON file it was read from

    @property
    def where(self) -> Path:
        """The file a problem with a row is reported against."""
        return self.file or self.pte

    def rows(self, method: str, files: ProgramFiles, so: Region, field: str) -> list:
        """The rows of ``method`` (``so``: its ``.so``, which a callable table is given)."""
        if self.table is None and (self.root / DEFAULT_CONSTANT_TABLE_FILE).is_file():
            self.table = self.root / DEFAULT_CONSTANT_TABLE_FILE
        if isinstance(self.table, (str, os.PathLike)):
            self.file = Path(self.table)
            self.table = _read_constant_table(self.file)
        if self.table is None:
            raise ProgramError(
                f"method {method!r}: this payload generation keeps the constant table only inside the .so; "
                "reading it needs the .so opened by a runtime: pass constant_table= (see AotiConstant; the CLI's "
                f"--constant-table FILE), or put {DEFAULT_CONSTANT_TABLE_FILE} beside the .pte",
                path=self.pte,
                field=field,
            )
        try:
            if callable(self.table):
                rows = self.table(method, files[so.file].bytes.raw(so.offset, so.size))
            else:
                rows = self.table[method]
        except KeyError:
            raise ProgramError(
                f"constant_table has no entry for method {method!r}", path=self.where, field=field
            ) from None
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
            raise ProgramError(
                f"constant_table[{method!r}] is a {type(rows).__name__}, not a list of rows",
                path=self.where,
                field=field,
            )
        return list(rows)


def blob_constants(
    files: ProgramFiles, table: ConstantTable, plan: Plan, d: Delegate, payload: Payload, so: Region, pw: str
) -> tuple[list[ConstantSpec], str, Region, int]:
    """Generations 1 and 2: the method's constants, its table's rows laid out in its dense weights blob
    (AOTInductor's ``binary_blob`` rule, unless a row gives its offset); the rows must fill the blob exactly."""
    blob = files.find(payload.weights_key, f"{pw}.weights_key")
    if payload.generation == 2:
        got = files[blob.file].sha256(blob.offset, blob.size) + "_weights_blob"
        if got != payload.weights_key:
            raise ProgramError(
                f"weights key {payload.weights_key!r} does not match the sha256 of its bytes "
                f"({got!r}): the blob was modified",
                path=files[blob.file].path,
                field=f"named_data[{payload.weights_key!r}]",
            )
    rows = table.rows(plan.name, files, so, f"{pw}.constant_table")
    all_cuda = d.specs.get("target_device", b"cuda").startswith(b"cuda")
    constants, at = [], 0
    for i, r in enumerate(rows):
        w = f"constant_table[{plan.name!r}][{i}]"
        if isinstance(r, Mapping):
            try:
                r = AotiConstant(
                    **{
                        **r,
                        "shape": tuple(r["shape"]),
                        "strides": tuple(r["strides"]),
                        "kind": ConstantKind(r.get("kind", "parameter")),
                    }
                )
            except (TypeError, KeyError, ValueError) as e:
                raise ProgramError(
                    f"constant table row is not an AotiConstant: {e}",
                    path=table.where,
                    field=w,
                ) from None
        elif not isinstance(r, (AotiConstant, ConstantSpec)):
            raise ProgramError(
                f"constant table row is a {type(r).__name__}, not an AotiConstant or a mapping",
                path=table.where,
                field=w,
            )
        shape, strides = tuple(r.shape), tuple(r.strides)
        if r.dtype not in DTYPE_ITEMSIZE or len(shape) != len(strides):
            raise ProgramError(
                f"constant {r.name!r}: dtype {r.dtype!r}, shape {shape}, strides {strides} is not a layout",
                path=files.pte.path,
                field=w,
            )
        need = required_nbytes(r.dtype, shape, strides, r.storage_offset)
        size = getattr(r, "data_size", None)
        size = need if size is None else size
        off = getattr(r, "offset", None) if isinstance(r, AotiConstant) else None
        off = at if off is None else off
        if need > size or off + need > blob.size:
            raise ProgramError(
                f"constant {r.name!r} reads [{off}, {off + need}) of a {blob.size}-byte blob (storage {size} bytes)",
                path=files[blob.file].path,
                field=w,
            )
        at = off + aligned_slot_bytes(size, all_cuda=all_cuda)
        constants.append(
            ConstantSpec(
                name=r.name,
                fqn=r.fqn,
                kind=ConstantKind(r.kind),
                mutated=bool(r.mutated),
                dtype=r.dtype,
                shape=shape,
                strides=strides,
                storage_offset=r.storage_offset,
                nbytes=need,
                offset=blob.offset + off,
                digest=files[blob.file].sha256(blob.offset + off, need),
                file=blob.file,
                so_key=payload.so_keys[0],
            )
        )
    if at != blob.size:
        raise ProgramError(
            f"the constant table lays out {at} bytes, the weights blob has {blob.size}: the table is not this .so's",
            path=files[blob.file].path,
            field=f"named_data[{payload.weights_key!r}]",
        )
    return constants, blob.file, blob, blob.size
