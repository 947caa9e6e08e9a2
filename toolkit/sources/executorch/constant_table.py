"""Payload generations 1 and 2: a method's constants from a constant table laid over its dense weights blob.

These generations keep the constant table inside the ``.so``, which a source never opens itself: the
caller passes it (``constant_table=``: :class:`AotiConstant` rows per method, a JSON file of them,
or a callable given the method and its ``.so`` bytes), or a ``constant_table.json`` lies beside the
``.pte``, or a real load hands over a reader of each ``.so``'s own table (``so_table=``, which opens the
``.so``: :class:`~toolkit.runtimes.aoti_container.SoConstantTables`).  Given both a table and a reader,
each method's rows are compared with its ``.so``'s field by field, so a table of another method or a
stale one is refused naming the field.  The offsets follow AOTInductor's dense ``binary_blob`` layout and
must add up to the blob's size, so a table that is not this ``.so``'s is refused there too.  The table is
a caller's copy, so it is checked as untrusted input: its fields by a schema (:mod:`.table_schema`), then
each row's slot against its own method's blob, which the slots must tile without overlap (rows share a
slot only as one view).  Where each program's table came from is :attr:`ConstantTable.origin`.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Mapping

from toolkit.core.errors import ProgramError
from toolkit.core.model import ConstantSpec, Region, aligned_slot_bytes
from toolkit.core.vocab import ConstantKind
from toolkit.sources.executorch.files import ProgramFiles
from toolkit.sources.executorch.layout import Delegate, Plan
from toolkit.sources.executorch.payload import Payload
from toolkit.sources.executorch.table_schema import TableRow, check_rows, json_object

DEFAULT_CONSTANT_TABLE_FILE = "constant_table.json"  # read from beside the .pte when constant_table= is not given
# the fields a table row and its .so's row must agree on (the .so does not record which buffers a method writes)
SO_FIELDS = ("name", "fqn", "dtype", "shape", "strides", "storage_offset", "kind", "data_size")


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
        table = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=json_object)
    # JSONDecodeError and an integer longer than int_max_str_digits are ValueErrors; deep nesting a RecursionError
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProgramError(f"constant table cannot be read: {str(e)[:300]}", path=path) from None
    if not isinstance(table, dict):
        raise ProgramError(
            f"constant table is a JSON {type(table).__name__}, not an object of method -> rows",
            path=path,
            field="constant_table",
        )
    if getattr(table, "repeated", ()):
        raise ProgramError(
            f"constant table is ambiguous: method {table.repeated[0]!r} is given twice",
            path=path,
            field=f"constant_table[{table.repeated[0]!r}]",
        )
    return table


def _as_mapping(r):
    """A row given in Python as the mapping the schema checks (an AotiConstant's or a ConstantSpec's fields)."""
    if isinstance(r, AotiConstant):
        return {f.name: getattr(r, f.name) for f in fields(AotiConstant)}
    if isinstance(r, ConstantSpec):  # its offset is into a file, its nbytes what it reads: the layout rule decides
        return {k: getattr(r, k) for k in ("name", "fqn", "dtype", "shape", "strides", "storage_offset", "kind")} | {
            "mutated": r.mutated
        }
    if isinstance(r, Mapping) and not isinstance(r, dict):
        return dict(r)
    return r


def _plain(v):
    """A row's value as the table file writes it (a kind as its string)."""
    return v.value if isinstance(v, ConstantKind) else v


class ConstantTable:
    """The ``constant_table=`` of :func:`~toolkit.sources.executorch.open_pte`, resolved when a method first
    needs it: a mapping of rows per method, a JSON file of one, a callable, or None (the default file,
    else the ``.so``'s own table through ``so_table``).  A mapping or file is validated whole
    (:mod:`.table_schema`) the first time; a callable's rows and a ``.so``'s per method.

    ``so_table(method, file, offset, size)`` reads the table of the ``.so`` at ``[offset, offset + size)``
    of ``file`` (a real load: it opens the ``.so``); each method's given rows are then checked against it.
    """

    def __init__(self, given, root: Path, pte: Path, so_table=None):
        self.table, self.root, self.pte, self.so_table = given, root, pte, so_table
        self.given = given is not None
        self.file: Path | None = None  # the JSON file it was read from
        self.checked: dict[str, list[TableRow]] | None = None  # a mapping's rows, validated
        self.blobs: dict[str, Region] = {}  # the weights blob of each method laid out so far
        self.from_so: list[str] = []  # the methods whose rows were read from their .so
        self.against_so: list[str] = []  # the methods whose given rows were checked against their .so

    @property
    def where(self) -> Path:
        """The file a problem with a row is reported against."""
        return self.file or self.pte

    @property
    def origin(self) -> str | None:
        """Where the tables came from (the program's ``table_origin``); None when no method needed one."""
        if self.from_so:
            return "constant tables read from each method's .so"
        if self.file is not None:
            what = f"constant tables from {self.file.name}" + ("" if self.given else " beside the .pte")
        elif self.checked is not None or self.against_so or self.given:
            what = "constant tables given (constant_table=)"
        else:
            return None
        return what + (", checked against each method's .so" if self.against_so else "")

    def _check(self, method, rows, field: str) -> list[TableRow]:
        if not isinstance(method, str):
            raise ProgramError(f"constant_table has a key {method!r}, not a method name", path=self.where, field=field)
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
            raise ProgramError(
                f"constant_table[{method!r}] is a {type(rows).__name__}, not a list of rows",
                path=self.where,
                field=field,
            )
        return check_rows([_as_mapping(r) for r in rows], self.where, f"constant_table[{method!r}]")

    def _missing(self, method: str, field: str) -> ProgramError:
        """Neither a table nor a reader of the .so: say what is needed and both ways to give it."""
        command = f"constshare table {shlex.quote(str(self.pte))}"
        return ProgramError(
            f"method {method!r}: this payload generation keeps the constant table only inside the .so, which a "
            "dry run (or a load without CUDA) never opens. Either run `"
            + command
            + "` on a machine with CUDA (it reads each method's table from its .so in a worker process and "
            f"writes {DEFAULT_CONSTANT_TABLE_FILE} beside the .pte, so that later runs on any machine need no "
            f".so), or put {DEFAULT_CONSTANT_TABLE_FILE} beside the .pte or pass constant_table= (see "
            "AotiConstant; the CLI's --constant-table FILE). A real load on CUDA reads the tables from the .so "
            "itself",
            path=self.pte,
            field=field,
        )

    def _so_rows(self, method: str, files: ProgramFiles, so: Region, raw: list | None = None) -> list[TableRow]:
        """The rows the method's own .so declares (``raw``, when given, receives them as read)."""
        where, field = files[so.file].path, f"named_data[{so.key!r}]"
        try:
            rows = self.so_table(method, where, so.offset, so.size)
        except ProgramError as e:
            raise ProgramError(
                f"method {method!r}: its constant table cannot be read from its .so: {e}", path=where, field=field
            ) from None
        except Exception as e:  # the runtime's own failure (no CUDA, a .so that does not load): one line
            raise ProgramError(
                f"method {method!r}: its constant table cannot be read from its .so: {type(e).__name__}: "
                f"{str(e)[:300]}",
                path=where,
                field=field,
            ) from None
        if raw is not None:
            raw.extend(rows)
        return check_rows([_as_mapping(r) for r in rows], where, field)

    def _compare(self, method: str, rows: list[TableRow], files: ProgramFiles, so: Region) -> None:
        """Refuse rows that are not what the method's .so declares, naming the first field that differs."""
        raw: list = []
        declared = self._so_rows(method, files, so, raw)
        prefix = f"constant_table[{method!r}]"
        for i, (r, d) in enumerate(zip(rows, declared)):
            for f in SO_FIELDS:
                mine, its = getattr(r, f), getattr(d, f)
                if f == "data_size" and mine is None:  # the layout rule decides it: checked against the blob
                    continue
                if f == "kind" and isinstance(raw[i], Mapping) and "kind" not in raw[i]:  # the .so does not say
                    continue
                if mine != its:
                    raise ProgramError(
                        f"constant table row {i} of method {method!r} says {f} {_plain(mine)!r}, the method's .so "
                        f"declares {_plain(its)!r} (its constant {d.name!r}): the table is not this .so's (another "
                        "method's, or stale)",
                        path=self.where,
                        field=f"{prefix}[{i}].{f}",
                    )
        if len(rows) != len(declared):
            n = min(len(rows), len(declared))
            raise ProgramError(
                f"constant table has {len(rows)} rows for method {method!r}, its .so declares {len(declared)} "
                f"constants in its blob: the table is not this .so's (another method's, or stale)",
                path=self.where,
                field=f"{prefix}[{n}]",
            )
        self.against_so.append(method)

    def rows(self, method: str, files: ProgramFiles, so: Region, field: str) -> list[TableRow]:
        """The rows of ``method``, validated (``so``: its ``.so``, which a callable table is given); checked
        against the ``.so``'s own rows when a reader of them was given."""
        rows = self._given_rows(method, files, so, field)
        if rows is None:
            if self.so_table is None:
                raise self._missing(method, field)
            rows = self._so_rows(method, files, so)
            self.from_so.append(method)
        elif self.so_table is not None:
            self._compare(method, rows, files, so)
        return rows

    def _given_rows(self, method: str, files: ProgramFiles, so: Region, field: str) -> list[TableRow] | None:
        """The rows the caller gave (or the file beside the .pte holds); None when there is no table."""
        if self.table is None and (self.root / DEFAULT_CONSTANT_TABLE_FILE).is_file():
            self.table = self.root / DEFAULT_CONSTANT_TABLE_FILE
        if isinstance(self.table, (str, os.PathLike)):
            self.file = Path(self.table)
            self.table = _read_constant_table(self.file)
        if self.table is None:
            return None
        if callable(self.table):
            try:
                rows = self.table(method, files[so.file].bytes.raw(so.offset, so.size))
            except KeyError:  # a callable over a mapping that has no such method
                raise ProgramError(
                    f"constant_table has no entry for method {method!r}", path=self.where, field=field
                ) from None
            return self._check(method, rows, field)
        if not isinstance(self.table, Mapping):
            raise ProgramError(
                f"constant_table is a {type(self.table).__name__}, not a mapping of method -> rows",
                path=self.where,
                field=field,
            )
        if self.checked is None:  # every entry, so that no malformed row hides under a method not opened
            self.checked = {m: self._check(m, rows, f"constant_table[{m!r}]") for m, rows in self.table.items()}
        if method not in self.checked:
            raise ProgramError(
                f"constant_table has no entry for method {method!r}",
                path=self.where,
                field=f"constant_table[{method!r}]",
            )
        return self.checked[method]

    def claim(self, method: str, blob: Region, files: ProgramFiles) -> None:
        """Note ``method``'s weights blob, refusing one that overlaps another method's without being the same."""
        for other, b in self.blobs.items():
            same = (b.file, b.offset, b.size) == (blob.file, blob.offset, blob.size)
            if (
                b.file == blob.file
                and not same
                and b.offset < blob.offset + blob.size
                and blob.offset < b.offset + b.size
            ):
                raise ProgramError(
                    f"method {method!r}'s weights blob [{blob.offset}, {blob.offset + blob.size}) overlaps method "
                    f"{other!r}'s [{b.offset}, {b.offset + b.size})",
                    path=files[blob.file].path,
                    field=f"named_data[{blob.key!r}]",
                )
        self.blobs[method] = blob


def blob_constants(
    files: ProgramFiles, table: ConstantTable, plan: Plan, d: Delegate, payload: Payload, so: Region, pw: str
) -> tuple[list[ConstantSpec], str, Region, int]:
    """Generations 1 and 2: the method's constants, its table's rows laid out in its dense weights blob
    (AOTInductor's ``binary_blob`` rule, unless a row gives its offset).  Each row's slot must lie in the
    method's own blob, and the slots must tile it as AOTInductor lays it out: no overlap (rows may share a
    slot only as identical views), no bytes left to no constant, nothing past its end."""
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
    table.claim(plan.name, blob, files)
    rows = table.rows(plan.name, files, so, f"{pw}.constant_table")
    all_cuda = d.specs.get("target_device", b"cuda").startswith(b"cuda")
    prefix = f"constant_table[{plan.name!r}]"
    slots: dict[tuple[int, int], int] = {}  # (offset, size) -> the first row in that slot
    laid: list[tuple[int, int, int, int]] = []  # (offset, size, need, row) in table order
    at = 0
    for i, r in enumerate(rows):
        w = f"{prefix}[{i}]"
        need, size = r.need, r.storage_bytes
        off = at if r.offset is None else r.offset
        if off + size > blob.size:
            raise ProgramError(
                f"constant {r.name!r} has its storage at [{off}, {off + size}), past the end of its method's "
                f"{blob.size}-byte weights blob",
                path=table.where,
                field=f"{w}.offset" if r.offset is not None else w,
            )
        first = slots.setdefault((off, size), i) if size else i  # an empty slot holds no bytes to share
        if first != i and rows[first].view != r.view:
            raise ProgramError(
                f"constant {r.name!r} shares row {first}'s slot [{off}, {off + size}) with another view of it",
                path=table.where,
                field=f"{w}.offset",
            )
        at = off + aligned_slot_bytes(size, all_cuda=all_cuda)
        laid.append((off, size, need, i))
    end, before = 0, -1
    # the .so keeps each constant in its own slot, back to back: an overlap or a gap is a table not its own
    for off, size in sorted(k for k in slots if k[1]):
        i = slots[(off, size)]
        if off != end:
            what = (
                f"overlaps the slot of constant {rows[before].name!r} (row {before}), which ends at {end}"
                if off < end
                else f"leaves bytes [{end}, {off}) to no constant"
            )
            raise ProgramError(
                f"constant {rows[i].name!r} at [{off}, {off + size}) {what}: AOTInductor lays a blob's constants "
                "out back to back",
                path=table.where,
                field=f"{prefix}[{i}].offset" if rows[i].offset is not None else f"{prefix}[{i}]",
            )
        end, before = off + aligned_slot_bytes(size, all_cuda=all_cuda), i
    if end != blob.size:
        raise ProgramError(
            f"the constant table lays out {end} bytes, the weights blob has {blob.size}: the table is not this .so's",
            path=table.where,
            field=prefix,
        )
    constants = []
    for off, _, need, i in laid:
        r = rows[i]
        constants.append(
            ConstantSpec(
                name=r.name,
                fqn=r.fqn,
                kind=ConstantKind(r.kind),
                mutated=r.mutated,
                dtype=r.dtype,
                shape=tuple(r.shape),
                strides=tuple(r.strides),
                storage_offset=r.storage_offset,
                nbytes=need,
                offset=blob.offset + off,
                digest=files[blob.file].sha256(blob.offset + off, need),
                file=blob.file,
                so_key=payload.so_keys[0],
            )
        )
    return constants, blob.file, blob, blob.size
