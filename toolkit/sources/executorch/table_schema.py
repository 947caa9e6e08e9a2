"""The schema of a generation-1/2 constant table: what one method's rows may hold, before they touch a blob.

A table is a caller's copy of what the ``.so`` declares, so every field is checked as untrusted
input: strict types (an int is an int, not a bool, a float or a string), ranges (offsets, sizes,
dimensions and strides non-negative and below 2**63, ranks at most :data:`MAX_RANK`), no unknown
or repeated field, and names and FQNs unique per method.  Where each row lies in its blob is
checked against the blob itself (:func:`~toolkit.sources.executorch.constant_table.blob_constants`).
Every refusal is a :class:`~toolkit.core.errors.ProgramError` naming the table and the field as a
path, ``constant_table['prefill'][3].offset``, in the style of the manifest's errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from toolkit.core.errors import ProgramError
from toolkit.core.model import DTYPE_ITEMSIZE, required_nbytes
from toolkit.core.vocab import ConstantKind

MAX_RANK = 64  # as the manifest's
_LIMIT = 1 << 63  # no offset, size, dimension or stride of a real table reaches it (they are int64 in the .so)


class JsonObject(dict):
    """A JSON object as :func:`json.loads` read it, with the keys it held more than once (it keeps the last)."""

    repeated: tuple[str, ...] = ()


def json_object(pairs: list[tuple[str, Any]]) -> JsonObject:
    """``object_pairs_hook``: an object that remembers its repeated keys, refused once the field path is known."""
    out = JsonObject(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        repeated = []
        for k, _ in pairs:
            (repeated.append if k in seen else seen.add)(k)
        out.repeated = tuple(repeated)
    return out


def _unicode(v: str) -> str:
    # JSON escapes can spell lone surrogates, which no UTF-8 report (CSV, HTML) can hold
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"text {_short(v)} is not valid Unicode (lone surrogate)") from None
    return v


def _dtype(v: str) -> str:
    if v not in DTYPE_ITEMSIZE:
        raise ValueError(f"unknown dtype {_short(v)}")
    return v


def _tuple_as_list(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v  # rows given in Python (AotiConstant) hold tuples


Text = Annotated[str, Field(strict=True), AfterValidator(_unicode)]
NonEmptyText = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_unicode)]
Count = Annotated[int, Field(strict=True, ge=0, lt=_LIMIT)]
Dims = Annotated[list[Count], BeforeValidator(_tuple_as_list), Field(strict=True, max_length=MAX_RANK)]


class TableRow(BaseModel):
    """One row: :class:`~toolkit.sources.executorch.constant_table.AotiConstant`'s fields, validated."""

    # Unknown fields are refused: a misspelt "ofset" silently ignored would lay the row out elsewhere.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: NonEmptyText
    fqn: Text
    dtype: Annotated[str, Field(strict=True), AfterValidator(_dtype)]
    shape: Dims
    strides: Dims
    storage_offset: Count = 0
    kind: Annotated[ConstantKind, Field(strict=False)] = ConstantKind.PARAMETER  # its string value
    mutated: bool = False
    data_size: Count | None = None  # bytes of its storage in the blob (default: what the view reads)
    offset: Count | None = None  # byte offset in the blob (default: AOTInductor's dense layout)

    @property
    def view(self) -> tuple:
        """What the row reads of its slot: two rows may share a slot only with the same view."""
        return (self.dtype, tuple(self.shape), tuple(self.strides), self.storage_offset)

    @property
    def need(self) -> int:
        """Bytes of storage the view reads."""
        return required_nbytes(self.dtype, self.shape, self.strides, self.storage_offset)

    @property
    def storage_bytes(self) -> int:
        """Bytes of its slot in the blob."""
        return self.need if self.data_size is None else self.data_size


def _short(v: Any, limit: int = 60) -> str:
    """A value for an error message: its repr, cut in the middle when long."""
    try:
        text = repr(v)
    except ValueError:  # an int longer than Python's int_max_str_digits
        return f"an integer of {v.bit_length()} bits" if isinstance(v, int) else type(v).__name__
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(text)} characters)"


def _field_path(loc: tuple) -> str:
    """pydantic's ``loc`` inside a row as the path our errors append: ``.offset``, ``.shape[1]``."""
    return "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" if isinstance(p, str) and p.isidentifier() else f"[{_short(p)}]"
        for p in loc
    )


def _describe(err: dict) -> str:
    if err["type"] == "missing":
        return "missing"
    if err["type"] == "extra_forbidden":
        return "unknown field (a row has AotiConstant's fields only)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "value_error":
        return msg[:300]
    return f"{msg}, got {_short(err.get('input'))}"[:300]


def check_rows(rows: list, where: Path, field: str) -> list[TableRow]:
    """One method's rows (mappings of AotiConstant's fields) validated; ``field`` names the list in errors."""
    out: list[TableRow] = []
    names: dict[str, int] = {}
    fqns: dict[str, int] = {}
    for i, row in enumerate(rows):
        w = f"{field}[{i}]"
        if not isinstance(row, dict):
            raise ProgramError(
                f"constant table row is a {type(row).__name__}, not an AotiConstant or a mapping", path=where, field=w
            )
        if getattr(row, "repeated", ()):
            raise ProgramError(
                f"constant table row is ambiguous: field {_short(row.repeated[0])} is given twice",
                path=where,
                field=w + _field_path(row.repeated[:1]),
            )
        try:
            r = TableRow.model_validate(row)
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            raise ProgramError(
                f"constant table row is not an AotiConstant: {_describe(first)}",
                path=where,
                field=w + _field_path(tuple(first["loc"])),
            ) from None
        if len(r.strides) != len(r.shape):
            raise ProgramError(
                f"constant {r.name!r}: rank {len(r.strides)} of its strides does not match rank {len(r.shape)} "
                "of its shape",
                path=where,
                field=f"{w}.strides",
            )
        if r.need > r.storage_bytes:
            raise ProgramError(
                f"constant {r.name!r}: its view reads {r.need} bytes, more than its {r.data_size}-byte storage",
                path=where,
                field=f"{w}.data_size",
            )
        for key, seen, what in ((r.name, names, "name"), (r.fqn, fqns, "fqn")):
            if key and key in seen:
                # one .so declares each constant once: a repeated name or FQN would make the method's match ambiguous
                raise ProgramError(
                    f"constant {what} {_short(key)} is also row {seen[key]}'s", path=where, field=f"{w}.{what}"
                )
            seen[key] = i
        out.append(r)
    return out
