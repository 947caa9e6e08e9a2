"""Our program directory: a versioned JSON manifest beside per-method files.

Layout::

    manifest.json
    methods/<method>/model.so                # AOTInductor wrapper .so, constants NOT inside
    methods/<method>/weights.blob            # AOTInductor binary_blob with the constants
    methods/<method>/reference.safetensors   # eager inputs ("input.N") and outputs ("output.N")

The manifest is parsed declaratively (pydantic v2 models, strict types) and then checked
across fields (layouts against byte sizes, offsets against blob sizes, file records); every
failure is a :class:`~toolkit.core.errors.ManifestError` naming the manifest file and the field as
a dotted path (``methods[0].constants[1].offset``).  :func:`manifest_json` is the one
serialiser of a :class:`~toolkit.core.model.Program` into this format.

A lifted ``_tensor_constant*`` constant's ``so_key`` (:func:`toolkit.core.policies.fqn_weight_key`) is
ExecuTorch's, ``<sha256 of the .so>_so_blob``, from its ``.so``'s file record; none for a record of
64 zeros, a placeholder (synthetic programs): each method then counts as its own ``.so``.  That
sha256 is a claim of the manifest (a load verifies a file by its piece digests), so a load, and a
dry run, verify it against the ``.so``'s bytes before a key made of it decides (:func:`key_claims`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from toolkit.core.errors import ManifestError, ProgramError
from toolkit.core.model import (
    DTYPE_ITEMSIZE,
    METHOD_NAME_RE,
    ConstantSpec,
    FileRecord,
    MethodSpec,
    Program,
    SequenceSpec,
    SequenceStep,
    required_nbytes,
)
from toolkit.core.vocab import ConstantKind, ProgramFormat
from toolkit.integrity.claims import ClaimedConstant, ContentClaim

FORMAT_VERSION = 4  # written (BLAKE3 piece digests); 3 (sha256 piece digests), 2 (no piece digests) and
READ_VERSIONS = (1, 2, 3, 4)  # 1 (no provenance, no sequences) are still read
MANIFEST_FILE = "manifest.json"
MAX_RANK = 64
_SHA256 = r"^[0-9a-f]{64}$"
PLACEHOLDER_SHA256 = "0" * 64  # the file record of a file that does not exist (synthetic programs)


# ------------------------------------------------------------------ the schema


def _unicode(v: str) -> str:
    # JSON escapes can spell lone surrogates, which no UTF-8 file (CSV, HTML) can hold
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"text {v!r} is not valid Unicode (lone surrogate)") from None
    return v


def _relpath(v: str) -> str:
    p = Path(v)
    if p.is_absolute() or ".." in p.parts or "\\" in v:
        raise ValueError(f"path {v!r} escapes the program directory")
    return v


def _method_name(v: str) -> str:
    if not METHOD_NAME_RE.match(v):
        raise ValueError(f"method name {v!r} is not a plain identifier (it could escape the program directory)")
    return v


def _dtype(v: str) -> str:
    if v not in DTYPE_ITEMSIZE:
        raise ValueError(f"unknown dtype {v!r}")
    return v


def _format_version(v: int) -> int:
    if v not in READ_VERSIONS:
        raise ValueError(
            f"unknown format version {v}; this toolkit reads format version " + " or ".join(map(str, READ_VERSIONS))
        )
    return v


Text = Annotated[str, Field(strict=True), AfterValidator(_unicode)]
NonEmptyText = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_unicode)]
RelPath = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_unicode), AfterValidator(_relpath)]
Count = Annotated[int, Field(strict=True, ge=0)]
Dims = Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(strict=True, max_length=MAX_RANK)]
Sha256 = Annotated[str, Field(strict=True, pattern=_SHA256)]
Blake3 = Annotated[str, Field(strict=True, pattern=_SHA256)]  # 32 bytes as 64 lowercase hex digits, as sha256


class _Doc(BaseModel):
    # Unknown fields are refused: only our builder writes this format, so an unknown field is a
    # typo or a manifest of another version, and silently ignoring it would hide either.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ConstantDoc(_Doc):
    name: NonEmptyText
    kind: Annotated[ConstantKind, Field(strict=False)]  # its string value
    dtype: Annotated[str, Field(strict=True), AfterValidator(_dtype)]
    shape: Dims
    strides: Dims
    storage_offset: Count
    nbytes: Count
    offset: Count
    digest: Sha256
    fqn: Text
    mutated: bool
    storage: Text = ""  # version 2: the eager storage this constant was (provenance)


class StepDoc(_Doc):
    method: Text
    num_inputs: Count
    num_outputs: Count


class SequenceDoc(_Doc):
    name: Annotated[str, Field(strict=True), AfterValidator(_unicode), AfterValidator(_method_name)]
    steps: Annotated[list[StepDoc], Field(min_length=1)]
    reference_file: RelPath


class MethodDoc(_Doc):
    name: Annotated[str, Field(strict=True), AfterValidator(_unicode), AfterValidator(_method_name)]
    constants: list[ConstantDoc]
    blob_bytes: Count
    so_file: RelPath
    blob_file: RelPath
    reference_file: RelPath
    num_inputs: Count
    num_outputs: Count


class FileDoc(_Doc):
    sha256: Sha256
    bytes: Count
    chunk_bytes: Annotated[int, Field(strict=True, gt=0)] | None = None  # format version 3
    sha256_chunks: list[Sha256] | None = None  # the sha256 of each chunk_bytes piece, in order
    blake3_chunks: list[Blake3] | None = None  # format version 4: the BLAKE3 of each piece instead


class ManifestDoc(_Doc):
    format: Literal["constshare-program"]
    format_version: Annotated[int, Field(strict=True), AfterValidator(_format_version)]
    device: Literal["cpu", "cuda"]
    methods: Annotated[list[MethodDoc], Field(min_length=1)]
    files: dict[str, FileDoc]
    name: Text
    description: Text
    torch_version: NonEmptyText
    created_utc: Text
    sequences: list[SequenceDoc] = []  # version 2


# ------------------------------------------------------------------ errors


def _field_path(loc: tuple) -> str:
    """pydantic's ``loc`` as the dotted path our errors name: ``methods[0].constants[1].shape``.

    An element of a shape or strides list is reported as the list (the field a user edits).
    """
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i and loc[0] == "files" and i == 1:
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else str(part)
        if part in ("shape", "strides"):
            break
    return out or "(top level)"


def _short(v: Any, limit: int = 60) -> str:
    """A value for an error message: its repr, cut in the middle when long (a 400-digit number)."""
    text = repr(v)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(text)} characters)"


def _describe(err: dict) -> str:
    if err["type"] == "missing":
        return "missing"
    if err["type"] == "extra_forbidden":
        return "unknown field (this toolkit reads format version 1, which has no such field)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "value_error":
        return msg[:300]
    return f"{msg}, got {_short(err.get('input'))}"[:300]


def validation_problem(e: ValidationError) -> tuple[str, str]:
    """(what is wrong, the field as a dotted path) of pydantic's first error."""
    first = e.errors(include_url=False)[0]
    return _describe(first), _field_path(tuple(first["loc"]))


def _manifest_error(e: ValidationError, path: Path) -> ManifestError:
    message, field = validation_problem(e)
    return ManifestError(message, path=path, field=field)


# ------------------------------------------------------------------ reading


def parse_manifest(data: Any, path: Path, root: Path | None = None) -> Program:
    """Validate decoded manifest JSON into a :class:`Program`; every failure names ``path`` and the field."""
    try:
        doc = ManifestDoc.model_validate(data)
    except ValidationError as e:
        raise _manifest_error(e, path) from None

    def fail(where: str, msg: str) -> ManifestError:
        return ManifestError(msg, path=path, field=where)

    files: dict[str, FileRecord] = {}
    for rel, rec in doc.files.items():
        fw = f"files[{rel!r}]"
        try:
            _unicode(rel)
            _relpath(rel)
        except ValueError as e:
            raise fail(fw, str(e)) from None
        if rec.sha256_chunks is not None and rec.blake3_chunks is not None:
            raise fail(f"{fw}.blake3_chunks", "sha256_chunks and blake3_chunks both given: a file records one kind")
        kind, chunks = ("blake3", rec.blake3_chunks) if rec.blake3_chunks is not None else ("sha256", rec.sha256_chunks)
        field = f"{fw}.{kind}_chunks"
        if (rec.chunk_bytes is None) != (chunks is None):
            raise fail(fw, "chunk_bytes and sha256_chunks (or blake3_chunks) come together: one is missing")
        need = 4 if kind == "blake3" else 3
        if chunks is not None and doc.format_version < need:
            raise fail(field, f"{kind} chunk digests need format version {need}, not {doc.format_version}")
        if chunks is not None and len(chunks) != -(-rec.bytes // rec.chunk_bytes):
            raise fail(
                field,
                f"{len(chunks)} chunk digests for {rec.bytes} bytes in "
                f"chunks of {rec.chunk_bytes}: expected {-(-rec.bytes // rec.chunk_bytes)}",
            )
        files[rel] = FileRecord(
            sha256=rec.sha256,
            bytes=rec.bytes,
            chunk_bytes=rec.chunk_bytes or 0,
            chunks=tuple(chunks or ()),
            chunk_digest=kind,
        )

    methods: list[MethodSpec] = []
    seen: set[str] = set()
    for i, m in enumerate(doc.methods):
        w = f"methods[{i}]"
        if m.name in seen:
            raise fail(f"{w}.name", f"duplicate method name {m.name!r}")
        seen.add(m.name)
        # the method's own sizes first: a wrong blob_bytes is blamed on itself, not on a constant
        for key in ("so_file", "blob_file", "reference_file"):
            rel = getattr(m, key)
            if rel not in files:
                raise fail("files", f"no digest recorded for {rel!r} (method {m.name!r}, {key})")
        if files[m.blob_file].bytes != m.blob_bytes:
            raise fail(
                f"methods[{m.name}].blob_bytes",
                f"{m.blob_bytes} differs from the file record's {files[m.blob_file].bytes}",
            )
        so_sha = files[m.so_file].sha256  # lifted constants' so_key (see the module docstring)
        lifted_so_key = f"{so_sha}_so_blob" if so_sha != PLACEHOLDER_SHA256 else ""
        constants = []
        names: set[str] = set()
        for j, c in enumerate(m.constants):
            cw = f"{w}.constants[{j}]"
            if c.name in names:
                raise fail(f"{cw}.name", f"duplicate constant name {c.name!r}")
            names.add(c.name)
            shape, strides = tuple(c.shape), tuple(c.strides)
            if math.prod(shape) > 1 << 40:
                raise fail(f"{cw}.shape", f"shape {shape} is not plausible")
            if len(strides) != len(shape):
                raise fail(f"{cw}.strides", f"rank {len(strides)} does not match shape rank {len(shape)}")
            need = required_nbytes(c.dtype, shape, strides, c.storage_offset)
            if c.nbytes != need:
                raise fail(f"{cw}.nbytes", f"{c.nbytes} does not match dtype/shape/strides, which need {need}")
            if c.offset + c.nbytes > m.blob_bytes:
                raise fail(
                    f"{cw}.offset",
                    f"bytes [{c.offset}, {c.offset + c.nbytes}) fall outside the {m.blob_bytes}-byte blob",
                )
            constants.append(
                ConstantSpec(
                    name=c.name,
                    fqn=c.fqn,
                    kind=c.kind,
                    mutated=c.mutated,
                    dtype=c.dtype,
                    shape=shape,
                    strides=strides,
                    storage_offset=c.storage_offset,
                    nbytes=c.nbytes,
                    offset=c.offset,
                    digest=c.digest,
                    file=m.blob_file,
                    storage=c.storage,
                    so_key=lifted_so_key if c.fqn.startswith("_tensor_constant") else "",
                )
            )
        methods.append(
            MethodSpec(
                name=m.name,
                so_file=m.so_file,
                blob_file=m.blob_file,
                reference_file=m.reference_file,
                blob_bytes=m.blob_bytes,
                num_inputs=m.num_inputs,
                num_outputs=m.num_outputs,
                constants=tuple(constants),
            )
        )
    sequences = []
    names_seen: set[str] = set()
    for i, q in enumerate(doc.sequences):
        w = f"sequences[{i}]"
        if q.name in names_seen:
            raise fail(f"{w}.name", f"duplicate sequence name {q.name!r}")
        names_seen.add(q.name)
        steps = []
        for j, st in enumerate(q.steps):
            if st.method not in seen:
                raise fail(f"{w}.steps[{j}].method", f"no method {st.method!r} in this program")
            steps.append(SequenceStep(st.method, st.num_inputs, st.num_outputs))
        if q.reference_file not in files:
            raise fail("files", f"no digest recorded for {q.reference_file!r} (sequence {q.name!r})")
        sequences.append(SequenceSpec(q.name, tuple(steps), q.reference_file))
    return Program(
        name=doc.name,
        description=doc.description,
        device=doc.device,
        torch_version=doc.torch_version,
        created_utc=doc.created_utc,
        methods=tuple(methods),
        files=files,
        root=root,
        format=ProgramFormat.DIRECTORY,
        sequences=tuple(sequences),
    )


def key_claims(program: Program) -> list[str]:
    """The ``.so`` files of a program directory whose recorded sha256 a key is made of: each
    method's with lifted ``_tensor_constant*`` constants (their ``so_key``), also where the record
    is the placeholder (no file: the method counts as its own ``.so``) but the file is there.  The
    loader verifies each against its bytes before the first decision
    (:func:`toolkit.integrity.check_claimed_sha256`); none for another format, whose sources make
    every key of the bytes they read, or for a program in memory only."""
    if program.format is not ProgramFormat.DIRECTORY or program.root is None:
        return []
    out = []
    for m in program.methods:
        record = program.files.get(m.so_file)
        if record is None or not any(c.fqn.startswith("_tensor_constant") for c in m.constants):
            continue
        if record.sha256 != PLACEHOLDER_SHA256 or program.path(m.so_file).exists():
            out.append(m.so_file)
    return list(dict.fromkeys(out))


def content_claims(program: Program, pairs: Iterable[tuple[str, str, str, str]]) -> list[ContentClaim]:
    """The digest claims a decision between two constants rests on, each pair given as (method,
    constant, method of the cached or stored one, its name): for a program directory, whose
    constant digests are the manifest's claims (:func:`toolkit.integrity.check_content_claims`
    checks them); none for another format, whose sources compute every digest from the bytes they
    read, for a program in memory only, or where a file has the placeholder record (nothing to read)."""
    if program.format is not ProgramFormat.DIRECTORY or program.root is None:
        return []
    specs: dict[str, dict[str, ConstantSpec]] = {}

    def claimed(method: str, name: str) -> ClaimedConstant | None:
        if method not in specs:
            m = next((x for x in program.methods if x.name == method), None)
            specs[method] = {} if m is None else {c.name: c for c in m.constants}
        c = specs[method].get(name)
        record = program.files.get(c.file) if c is not None and c.file else None
        if record is None or record.sha256 == PLACEHOLDER_SHA256:
            return None
        return ClaimedConstant(method, c.name, c.file, c.offset, c.nbytes, c.digest)

    out = []
    for method, name, held_method, held_name in pairs:
        a, b = claimed(method, name), claimed(held_method, held_name)
        if a is not None and b is not None:
            out.append(ContentClaim(a, b))
    return list(dict.fromkeys(out))


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads keeps the last of two equal keys silently; a manifest with two is refused."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"key {_short(k)} appears twice in one object")
        out[k] = v
    return out


def read_manifest_file(path: Path, root: Path | None = None) -> Program:
    """Read and validate one manifest file; every failure is a ManifestError naming it."""
    if not path.exists():
        raise ManifestError("manifest is missing", path=path)
    if not path.is_file():
        raise ManifestError("manifest is not a regular file", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(f"manifest cannot be read: {e}", path=path) from None
    except UnicodeDecodeError as e:
        raise ManifestError(f"manifest is not valid JSON: {e}", path=path) from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    # JSONDecodeError is a ValueError, and so is an integer longer than Python's
    # int_max_str_digits; nesting deeper than the decoder's stack raises RecursionError.
    except _DuplicateKey as e:
        raise ManifestError(f"manifest is ambiguous: {e}", path=path) from None
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"manifest is not valid JSON: {str(e)[:300]}", path=path) from None
    return parse_manifest(data, path, root)


def open_directory(root: Path) -> Program:
    """A program directory: its manifest, validated, and every file it names present (no digest checked)."""
    if not root.exists():
        raise ProgramError("program directory does not exist", path=root)
    if not root.is_dir():
        raise ProgramError(f"is a file, not a program directory (one holding {MANIFEST_FILE})", path=root)
    program = read_manifest_file(root / MANIFEST_FILE, root)
    real_root = root.resolve()
    for rel in program.files:
        p = root / rel
        try:
            exists, regular = p.exists(), p.is_file()
            # a symlink (or a linked folder on the way) must not lead out of the program directory
            inside = p.resolve().is_relative_to(real_root)
        except OSError as e:  # e.g. ENAMETOOLONG: is_file() only swallows "no such file"
            raise ProgramError(f"file named in the manifest cannot be accessed: {e.strerror or e}", path=p) from None
        if not exists:
            raise ProgramError("file named in the manifest is missing", path=p)
        if not inside:
            raise ProgramError(
                f"file named in the manifest leads out of the program directory (to {p.resolve()})", path=p
            )
        if not regular:
            raise ProgramError("file named in the manifest is not a regular file (a folder, FIFO or device)", path=p)
    return program


# ------------------------------------------------------------------ writing


def _constant_json(c: ConstantSpec) -> dict:
    return {
        "name": c.name,
        "fqn": c.fqn,
        "kind": c.kind.value,
        "mutated": c.mutated,
        "dtype": c.dtype,
        "shape": list(c.shape),
        "strides": list(c.strides),
        "storage_offset": c.storage_offset,
        "nbytes": c.nbytes,
        "offset": c.offset,
        "digest": c.digest,
        "storage": c.storage,
    }


def _file_json(record: FileRecord) -> dict:
    out: dict = {"sha256": record.sha256, "bytes": record.bytes}
    if record.chunks:
        out.update({"chunk_bytes": record.chunk_bytes, f"{record.chunk_digest}_chunks": list(record.chunks)})
    return out


def manifest_json(program: Program, *, indent: int | None = 2) -> str:
    """The manifest of ``program`` in this format (``indent=None``: compact, for millions of constants).

    A constant's ``file`` is not written: in this format it is always its method's blob.
    """
    for m in program.methods:
        for c in m.constants:
            if c.file and c.file != m.blob_file:
                raise ValueError(
                    f"method {m.name!r}: constant {c.name!r} lives in {c.file!r}, not in the "
                    f"method's blob {m.blob_file!r}; a program directory cannot express that"
                )
    doc = {
        "format": ProgramFormat.DIRECTORY.value,
        "format_version": FORMAT_VERSION,
        "name": program.name,
        "description": program.description,
        "device": program.device,
        "torch_version": program.torch_version,
        "created_utc": program.created_utc,
        "methods": [
            {
                "name": m.name,
                "so_file": m.so_file,
                "blob_file": m.blob_file,
                "reference_file": m.reference_file,
                "blob_bytes": m.blob_bytes,
                "num_inputs": m.num_inputs,
                "num_outputs": m.num_outputs,
                "constants": [_constant_json(c) for c in m.constants],
            }
            for m in program.methods
        ],
        "files": {k: _file_json(v) for k, v in program.files.items()},
        "sequences": [
            {
                "name": q.name,
                "reference_file": q.reference_file,
                "steps": [
                    {"method": st.method, "num_inputs": st.num_inputs, "num_outputs": st.num_outputs} for st in q.steps
                ],
            }
            for q in program.sequences
        ],
    }
    return json.dumps(doc, indent=indent, separators=None if indent else (",", ":"))
