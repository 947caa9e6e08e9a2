"""The program format: a versioned JSON manifest beside per-method files.

Layout of a program directory::

    manifest.json
    methods/<method>/model.so                # AOTInductor wrapper .so, constants NOT inside
    methods/<method>/weights.blob            # AOTInductor binary_blob with the constants
    methods/<method>/reference.safetensors   # eager inputs ("input.N") and outputs ("output.N")

Everything here is plain data plus parsing/validation; reading files happens only in
:func:`read_manifest` and :meth:`Program.check_files`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .errors import IntegrityError, ManifestError, ProgramError
from .vocab import ConstantKind

FORMAT_NAME = "constshare-program"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
METHOD_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
DEVICE_KINDS = ("cpu", "cuda")

# dtype name -> bytes per element; names are torch's (str(torch.float32) without "torch.")
DTYPE_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


@dataclass(frozen=True)
class TensorMeta:
    """The metadata ExecuTorch compares, plus the byte size a slot needs."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    device_type: str
    device_index: int

    @property
    def rank(self) -> int:
        return len(self.shape)


def required_nbytes(dtype: str, shape: Iterable[int], strides: Iterable[int], storage_offset: int = 0) -> int:
    """Bytes of storage a tensor view of this layout reads (0 for an empty tensor)."""
    shape, strides = tuple(shape), tuple(strides)
    if any(s == 0 for s in shape):
        return 0
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    return (storage_offset + extent) * DTYPE_ITEMSIZE[dtype]


@dataclass(frozen=True)
class ConstantSpec:
    """One constant of one method, as the build saw it."""

    name: str  # AOTInductor internal name, e.g. "layers_0_weight" or "_tensor_constant0"
    fqn: str  # original FQN, e.g. "layers.0.weight"; "" when AOTI reports none
    kind: ConstantKind
    mutated: bool  # the graph writes it (ExportedProgram.graph_signature.buffers_to_mutate)
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int
    nbytes: int  # bytes of storage the slot reads
    offset: int  # byte offset of that storage inside the method's weights blob
    digest: str  # sha256 of those bytes

    def meta(self, device_type: str, device_index: int) -> TensorMeta:
        return TensorMeta(self.dtype, self.shape, self.strides, device_type, device_index)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    so_file: str
    blob_file: str
    reference_file: str
    blob_bytes: int
    num_inputs: int
    num_outputs: int
    constants: tuple[ConstantSpec, ...]

    def constant(self, name: str) -> ConstantSpec:
        for c in self.constants:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass(frozen=True)
class FileRecord:
    sha256: str
    bytes: int


@dataclass(frozen=True)
class ProgramManifest:
    name: str
    description: str
    device: str  # "cpu" or "cuda"
    torch_version: str
    created_utc: str
    methods: tuple[MethodSpec, ...]
    files: dict[str, FileRecord] = field(default_factory=dict)
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def method(self, name: str) -> MethodSpec:
        for m in self.methods:
            if m.name == name:
                return m
        raise KeyError(f"program {self.name!r} has no method {name!r}; it has {self.method_names}")

    @property
    def method_names(self) -> list[str]:
        return [m.name for m in self.methods]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- parsing


class _Reader:
    """Typed field access into decoded JSON that names the field path on every failure."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, msg: str) -> ManifestError:
        return ManifestError(msg, path=self.path, field=where)

    def obj(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {type(value).__name__}")
        return value

    def get(self, d: dict, key: str, where: str) -> Any:
        if key not in d:
            raise self.fail(f"{where}.{key}" if where else key, "missing")
        return d[key]

    def str_(self, d: dict, key: str, where: str, *, allow_empty: bool = True) -> str:
        v = self.get(d, key, where)
        if not isinstance(v, str) or (not allow_empty and not v):
            raise self.fail(f"{where}.{key}" if where else key, f"expected a {'non-empty ' if not allow_empty else ''}string, got {v!r}"[:300])
        self.unicode(v, f"{where}.{key}" if where else key)
        return v

    def unicode(self, v: str, where: str) -> None:
        # JSON escapes can spell lone surrogates, which no UTF-8 file (CSV, HTML) can hold
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail(where, f"text {v!r} is not valid Unicode (lone surrogate)"[:300]) from None

    def int_(self, d: dict, key: str, where: str, *, minimum: int = 0) -> int:
        v = self.get(d, key, where)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(f"{where}.{key}" if where else key, f"expected an integer >= {minimum}, got {v!r}"[:300])
        return v

    def bool_(self, d: dict, key: str, where: str) -> bool:
        v = self.get(d, key, where)
        if not isinstance(v, bool):
            raise self.fail(f"{where}.{key}", f"expected true or false, got {v!r}"[:300])
        return v

    def ints(self, d: dict, key: str, where: str, *, minimum: int = 0) -> tuple[int, ...]:
        v = self.get(d, key, where)
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < minimum for x in v):
            raise self.fail(f"{where}.{key}", f"expected a list of integers >= {minimum}, got {v!r}"[:300])
        if len(v) > 64:
            raise self.fail(f"{where}.{key}", f"rank {len(v)} is not plausible")
        return tuple(v)


def _relpath(r: _Reader, d: dict, key: str, where: str) -> str:
    v = r.str_(d, key, where, allow_empty=False)
    p = Path(v)
    if p.is_absolute() or ".." in p.parts or "\\" in v:
        raise r.fail(f"{where}.{key}", f"path {v!r} escapes the program directory")
    return v


def parse_manifest(data: Any, path: Path) -> ProgramManifest:
    """Validate decoded manifest JSON; every failure names ``path`` and the field."""
    r = _Reader(path)
    top = r.obj(data, "(top level)")
    fmt = r.str_(top, "format", "")
    if fmt != FORMAT_NAME:
        raise r.fail("format", f"expected {FORMAT_NAME!r}, got {fmt!r}")
    version = r.int_(top, "format_version", "")
    if version != FORMAT_VERSION:
        raise r.fail("format_version", f"unknown format version {version}; this toolkit reads version {FORMAT_VERSION}")
    device = r.str_(top, "device", "")
    if device not in DEVICE_KINDS:
        raise r.fail("device", f"expected one of {DEVICE_KINDS}, got {device!r}")
    methods_raw = r.get(top, "methods", "")
    if not isinstance(methods_raw, list) or not methods_raw:
        raise r.fail("methods", "expected a non-empty list of methods")
    methods: list[MethodSpec] = []
    seen: set[str] = set()
    for i, m_raw in enumerate(methods_raw):
        w = f"methods[{i}]"
        m = r.obj(m_raw, w)
        name = r.str_(m, "name", w)
        if not METHOD_NAME_RE.match(name):
            raise r.fail(f"{w}.name", f"method name {name!r} is not a plain identifier (it could escape the program directory)")
        if name in seen:
            raise r.fail(f"{w}.name", f"duplicate method name {name!r}")
        seen.add(name)
        consts_raw = r.get(m, "constants", w)
        if not isinstance(consts_raw, list):
            raise r.fail(f"{w}.constants", "expected a list")
        blob_bytes = r.int_(m, "blob_bytes", w)
        constants = []
        names: set[str] = set()
        for j, c_raw in enumerate(consts_raw):
            cw = f"{w}.constants[{j}]"
            c = r.obj(c_raw, cw)
            cname = r.str_(c, "name", cw, allow_empty=False)
            if cname in names:
                raise r.fail(f"{cw}.name", f"duplicate constant name {cname!r}")
            names.add(cname)
            kind_s = r.str_(c, "kind", cw)
            try:
                kind = ConstantKind(kind_s)
            except ValueError:
                raise r.fail(f"{cw}.kind", f"unknown kind {kind_s!r}") from None
            dtype = r.str_(c, "dtype", cw)
            if dtype not in DTYPE_ITEMSIZE:
                raise r.fail(f"{cw}.dtype", f"unknown dtype {dtype!r}")
            shape = r.ints(c, "shape", cw)
            strides = r.ints(c, "strides", cw)
            if len(strides) != len(shape):
                raise r.fail(f"{cw}.strides", f"rank {len(strides)} does not match shape rank {len(shape)}")
            storage_offset = r.int_(c, "storage_offset", cw)
            nbytes = r.int_(c, "nbytes", cw)
            if math.prod(shape) > 1 << 40:
                raise r.fail(f"{cw}.shape", f"shape {shape} is not plausible")
            need = required_nbytes(dtype, shape, strides, storage_offset)
            if nbytes != need:
                raise r.fail(f"{cw}.nbytes", f"{nbytes} does not match dtype/shape/strides, which need {need}")
            offset = r.int_(c, "offset", cw)
            if offset + nbytes > blob_bytes:
                raise r.fail(f"{cw}.offset", f"bytes [{offset}, {offset + nbytes}) fall outside the {blob_bytes}-byte blob")
            digest = r.str_(c, "digest", cw)
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise r.fail(f"{cw}.digest", "expected a sha256 hex digest")
            constants.append(ConstantSpec(
                name=cname, fqn=r.str_(c, "fqn", cw), kind=kind, mutated=r.bool_(c, "mutated", cw),
                dtype=dtype, shape=shape, strides=strides, storage_offset=storage_offset,
                nbytes=nbytes, offset=offset, digest=digest,
            ))
        methods.append(MethodSpec(
            name=name,
            so_file=_relpath(r, m, "so_file", w),
            blob_file=_relpath(r, m, "blob_file", w),
            reference_file=_relpath(r, m, "reference_file", w),
            blob_bytes=blob_bytes,
            num_inputs=r.int_(m, "num_inputs", w),
            num_outputs=r.int_(m, "num_outputs", w),
            constants=tuple(constants),
        ))
    files_raw = r.obj(r.get(top, "files", ""), "files")
    files: dict[str, FileRecord] = {}
    for rel, rec_raw in files_raw.items():
        fw = f"files[{rel!r}]"
        r.unicode(rel, fw)
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise r.fail(fw, f"path {rel!r} escapes the program directory")
        rec = r.obj(rec_raw, fw)
        sha = r.str_(rec, "sha256", fw)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise r.fail(f"{fw}.sha256", "expected a sha256 hex digest")
        files[rel] = FileRecord(sha256=sha, bytes=r.int_(rec, "bytes", fw))
    for m in methods:
        for key in ("so_file", "blob_file", "reference_file"):
            rel = getattr(m, key)
            if rel not in files:
                raise r.fail(f"files", f"no digest recorded for {rel!r} (method {m.name!r}, {key})")
        if files[m.blob_file].bytes != m.blob_bytes:
            raise r.fail(f"methods[{m.name}].blob_bytes", f"{m.blob_bytes} differs from the file record's {files[m.blob_file].bytes}")
    return ProgramManifest(
        name=r.str_(top, "name", ""),
        description=r.str_(top, "description", ""),
        device=device,
        torch_version=r.str_(top, "torch_version", "", allow_empty=False),
        created_utc=r.str_(top, "created_utc", ""),
        methods=tuple(methods),
        files=files,
    )


def read_manifest(root: Path) -> ProgramManifest:
    """Read ``root/manifest.json`` of a program directory."""
    if not root.is_dir():
        raise ProgramError("program directory does not exist", path=root)
    return read_manifest_file(root / MANIFEST_FILE)


def read_manifest_file(path: Path) -> ProgramManifest:
    """Read and validate one manifest file; every failure is a ManifestError naming it."""
    if not path.is_file():
        raise ManifestError("manifest is missing", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(f"manifest cannot be read: {e}", path=path) from None
    except UnicodeDecodeError as e:
        raise ManifestError(f"manifest is not valid JSON: {e}", path=path) from None
    try:
        data = json.loads(text)
    # JSONDecodeError is a ValueError, and so is an integer longer than Python's
    # int_max_str_digits; nesting deeper than the decoder's stack raises RecursionError.
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"manifest is not valid JSON: {str(e)[:300]}", path=path) from None
    return parse_manifest(data, path)


@dataclass(frozen=True)
class Program:
    """A program directory that has been read and validated."""

    root: Path
    manifest: ProgramManifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def device(self) -> str:
        return self.manifest.device

    @property
    def methods(self) -> tuple[MethodSpec, ...]:
        return self.manifest.methods

    def path(self, rel: str) -> Path:
        return self.root / rel

    def check_files(self, rels: Iterable[str] | None = None) -> None:
        """Check size and sha256 of files against the manifest before anything uses them.

        Loading a .so runs its code, so this runs before any .so is opened or byte uploaded.
        """
        for rel in (self.manifest.files if rels is None else rels):
            rec = self.manifest.files[rel]
            p = self.path(rel)
            try:
                if not p.is_file():
                    raise IntegrityError("file is missing", path=p)
                size = p.stat().st_size
                if size != rec.bytes:
                    kind = "truncated" if size < rec.bytes else "oversized"
                    raise IntegrityError(f"file is {kind}: {size} bytes, manifest records {rec.bytes}", path=p)
                digest = sha256_file(p)
            except OSError as e:  # unreadable, or a name the OS refuses (ENAMETOOLONG)
                raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=p) from None
            if digest != rec.sha256:
                raise IntegrityError("sha256 does not match the manifest: the file was modified", path=p)
