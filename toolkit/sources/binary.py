"""Bounds-checked binary readers for the sources: mapped files, records, FlatBuffer tables.

:class:`MappedFile` reads a program's file once into a sealed private copy, hashing it as it
reads, and parses the copy; its :class:`~toolkit.core.model.FileRecord` and copy are noted in the
:class:`~toolkit.integrity.VerifiedFiles` it is given.  :class:`Table` reads FlatBuffer tables
with no schema compiler: a table through its vtable, a field by its index in the schema (a union
takes two slots).  :class:`Bytes` and :class:`Cursor` read plain little-endian records.  Every
read is checked against the buffer, and every failure is a :class:`~toolkit.core.errors.ProgramError`
naming the file, the field as a dotted path (``execution_plan[1].delegates[0].processed``) and
the byte offset: a malformed file can never make a reader index out of range, loop, or allocate
without bound (a vector's length is checked against the bytes that remain first).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import struct
from pathlib import Path

from toolkit.core.errors import ProgramError
from toolkit.core.model import FileRecord
from toolkit.integrity import VerifiedCopy, VerifiedFiles, file_identity

_U8, _U16, _U32, _I32, _U64, _I64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<i", "<Q", "<q"))


class Bytes:
    """A bounds-checked view of a file's bytes (or a region of them) that names the file in errors."""

    def __init__(self, data, path: Path, *, base: int = 0, what: str = ""):
        self.data = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        self.path = path
        self.base = base  # absolute offset of data[0] in the file (for error messages)
        self.what = what  # e.g. "delegate payload of method 'decode'"

    def __len__(self) -> int:
        return len(self.data)

    def error(self, message: str, field: str | None, at: int | None = None) -> ProgramError:
        where = f" (byte {self.base + at})" if at is not None else ""
        prefix = f"{self.what}: " if self.what else ""
        return ProgramError(f"{prefix}{message}{where}", path=self.path, field=field)

    def need(self, at: int, size: int, field: str | None) -> None:
        if at < 0 or size < 0 or at + size > len(self.data):
            raise self.error(
                f"{size} bytes at offset {at} run past the end of the data ({len(self.data)} bytes)",
                field,
                at if 0 <= at <= len(self.data) else None,
            )

    def unpack(self, st: struct.Struct, at: int, field: str | None) -> int:
        self.need(at, st.size, field)
        return st.unpack_from(self.data, at)[0]

    def u8(self, at: int, field: str | None = None) -> int:
        return self.unpack(_U8, at, field)

    def u16(self, at: int, field: str | None = None) -> int:
        return self.unpack(_U16, at, field)

    def u32(self, at: int, field: str | None = None) -> int:
        return self.unpack(_U32, at, field)

    def i32(self, at: int, field: str | None = None) -> int:
        return self.unpack(_I32, at, field)

    def u64(self, at: int, field: str | None = None) -> int:
        return self.unpack(_U64, at, field)

    def i64(self, at: int, field: str | None = None) -> int:
        return self.unpack(_I64, at, field)

    def raw(self, at: int, size: int, field: str | None = None) -> bytes:
        self.need(at, size, field)
        return bytes(self.data[at : at + size])

    def text(self, at: int, size: int, field: str | None) -> str:
        try:
            return self.raw(at, size, field).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"text is not valid UTF-8 ({e.reason})", field, at + e.start) from None


class Cursor:
    """Sequential little-endian reads over :class:`Bytes` (for the CUDA delegate's payloads)."""

    def __init__(self, b: Bytes, at: int = 0):
        self.b = b
        self.at = at

    def _take(self, st: struct.Struct, field: str) -> int:
        v = self.b.unpack(st, self.at, field)
        self.at += st.size
        return v

    def u32(self, field: str) -> int:
        return self._take(_U32, field)

    def i32(self, field: str) -> int:
        return self._take(_I32, field)

    def u64(self, field: str) -> int:
        return self._take(_U64, field)

    def i64(self, field: str) -> int:
        return self._take(_I64, field)

    def string(self, field: str, *, max_len: int = 1 << 20) -> str:
        n = self.u32(f"{field} (length)")
        if n > max_len:
            raise self.b.error(f"string length {n} is not plausible", field, self.at - 4)
        s = self.b.text(self.at, n, field)
        self.at += n
        return s

    def remaining(self) -> int:
        return len(self.b) - self.at


class Table:
    """One FlatBuffer table: fields by schema index, each read checked."""

    __slots__ = ("b", "pos", "where", "_vt", "_vt_size", "_size")

    def __init__(self, b: Bytes, pos: int, where: str):
        self.b, self.pos, self.where = b, pos, where
        b.need(pos, 4, where)
        vt = pos - b.i32(pos, where)
        if vt < 0 or vt + 4 > len(b):
            raise b.error(f"table's vtable offset points outside the buffer (to {vt})", where, pos)
        vt_size, size = b.u16(vt, where), b.u16(vt + 2, where)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > len(b):
            raise b.error(f"vtable of size {vt_size} does not fit the buffer", where, vt)
        if size < 4 or pos + size > len(b):
            raise b.error(f"table of size {size} does not fit the buffer", where, pos)
        self._vt, self._vt_size, self._size = vt, vt_size, size

    def _field(self, index: int, width: int, name: str) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self._vt_size:
            return None
        off = self.b.u16(self._vt + slot, self.path(name))
        if off == 0:
            return None
        if off + width > self._size:
            raise self.b.error(
                f"field lies outside its table ({off}+{width} > {self._size})", self.path(name), self.pos
            )
        return self.pos + off

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def scalar(self, index: int, name: str, kind: str = "u32", default: int = 0) -> int:
        width = {"u8": 1, "i8": 1, "u16": 2, "u32": 4, "i32": 4, "u64": 8, "i64": 8}[kind]
        at = self._field(index, width, name)
        if at is None:
            return default
        if kind == "i8":
            v = self.b.u8(at, self.path(name))
            return v - 256 if v > 127 else v
        return getattr(self.b, kind)(at, self.path(name))

    def _target(self, index: int, name: str) -> int | None:
        at = self._field(index, 4, name)
        if at is None:
            return None
        target = at + self.b.u32(at, self.path(name))
        if target >= len(self.b):
            raise self.b.error(f"offset points past the end of the buffer (to {target})", self.path(name), at)
        return target

    def table(self, index: int, name: str) -> "Table | None":
        target = self._target(index, name)
        return None if target is None else Table(self.b, target, self.path(name))

    def string(self, index: int, name: str) -> str | None:
        target = self._target(index, name)
        if target is None:
            return None
        n = self.b.u32(target, self.path(name))
        return self.b.text(target + 4, n, self.path(name))

    def _vector(self, index: int, name: str, elem: int) -> tuple[int, int] | None:
        target = self._target(index, name)
        if target is None:
            return None
        n = self.b.u32(target, self.path(name))
        if n * elem > len(self.b) - target - 4:
            raise self.b.error(f"vector of {n} elements does not fit the buffer", self.path(name), target)
        return target + 4, n

    def tables(self, index: int, name: str) -> list["Table"]:
        vec = self._vector(index, name, 4)
        if vec is None:
            return []
        start, n = vec
        out = []
        for i in range(n):
            at = start + 4 * i
            where = f"{self.path(name)}[{i}]"
            target = at + self.b.u32(at, where)
            if target >= len(self.b):
                raise self.b.error(f"element offset points past the end of the buffer (to {target})", where, at)
            out.append(Table(self.b, target, where))
        return out

    def ints(self, index: int, name: str, kind: str = "i32") -> list[int]:
        width = {"u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8}[kind]
        vec = self._vector(index, name, width)
        if vec is None:
            return []
        start, n = vec
        fmt = {"u8": "B", "i32": "i", "u32": "I", "i64": "q", "u64": "Q"}[kind]
        return list(struct.unpack_from(f"<{n}{fmt}", self.b.data, start))

    def byte_region(self, index: int, name: str) -> tuple[int, int] | None:
        """(offset, length) of a ``[ubyte]`` field inside the buffer, without copying it."""
        return self._vector(index, name, 1)

    def union(self, index: int, name: str) -> tuple[int, "Table | None"]:
        """(type tag, value table) of a union declared at ``index`` (its type slot)."""
        tag = self.scalar(index, f"{name}_type", "u8")
        return tag, (self.table(index + 1, name) if tag else None)


def root(b: Bytes, identifier: bytes, name: str) -> Table:
    """The root table of a FlatBuffer whose file identifier must be ``identifier``."""
    b.need(0, 8, "(header)")
    got = b.raw(4, 4, "(file identifier)")
    if got != identifier:
        raise b.error(f"not a {name}: file identifier is {got!r}, expected {identifier!r}", "(file identifier)", 4)
    return Table(b, b.u32(0, "(root offset)"), "")


def claimed_file(path: Path, suffix: str, magic: bytes, *, at: int = 0) -> Path | None:
    """``path`` if it is a file named ``*<suffix>`` or whose bytes at ``at`` are ``magic``, else None."""
    if not path.is_file():
        return None
    if path.suffix == suffix:
        return path
    try:
        with open(path, "rb") as f:
            return path if f.read(at + len(magic))[at:] == magic else None
    except OSError:
        return None


class MappedFile:
    """One file of the program, read once into a sealed private copy (:class:`~toolkit.integrity.
    VerifiedCopy`) that is hashed as it is read and parsed through a read-only mapping of the copy:
    a writer or a shrink of the file meanwhile changes nothing read here (and cannot raise SIGBUS);
    the copy and its record are noted in ``verified``, so a load uses these very bytes."""

    def __init__(self, path: Path, rel: str, verified: VerifiedFiles | None = None):
        self.path, self.rel = path, rel
        h = hashlib.sha256()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ProgramError("not a regular file", path=path)
                self.copy = VerifiedCopy.read(fd, Path(path), st.st_size, [(0, st.st_size)], [h], 1)
            finally:
                os.close(fd)
            self._map = mmap.mmap(self.copy.fd, 0, access=mmap.ACCESS_READ) if st.st_size else None
        except (OSError, ValueError) as e:  # unreadable, a directory, a name the OS refuses, unmappable
            raise ProgramError(f"file cannot be read: {getattr(e, 'strerror', None) or e}", path=path) from None
        self.size = st.st_size
        self.bytes = Bytes(self._map if self._map is not None else b"", path)
        self._record = FileRecord(sha256=h.hexdigest(), bytes=self.size)
        self._digests: dict[tuple[int, int], str] = {}
        if verified is not None:  # the bytes hashed are the copy's: a load uses them, unread again
            verified.note(path, file_identity(st), self._record.sha256, self.copy)

    def record(self) -> FileRecord:
        return self._record

    def sha256(self, offset: int, size: int) -> str:  # once per region: methods' constants share bytes
        if offset < 0 or size < 0 or offset + size > self.size:  # a slice would wrap or stop short, silently
            raise ProgramError(
                f"bytes [{offset}, {offset + size}) lie outside the {self.size}-byte file", path=self.path
            )
        if (offset, size) not in self._digests:
            self._digests[(offset, size)] = hashlib.sha256(self.bytes.data[offset : offset + size]).hexdigest()
        return self._digests[(offset, size)]

    def close(self) -> None:
        self.bytes = Bytes(b"", self.path)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the GC closes it later
                pass
