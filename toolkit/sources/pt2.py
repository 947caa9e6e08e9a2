"""torch AOTInductor packages: a ``.pt2`` archive holding one model or several.

A zip under one root folder; each model's files under ``data/aotinductor/<model>/`` (its
``.wrapper.so``, generated ``.wrapper.cpp`` and ``.wrapper_metadata.json``), its constants as a
dense ``binary_blob`` beside the ``.so`` or as ``pickle_weights`` (``data/weights/weight_<N>``,
one ``torch.save`` storage each, per model a ``weights_config.json``).  The constant table and
the input/output counts are read from the generated ``.wrapper.cpp``, and so is each input's
dtype and sizes (its ``check_input_N``: a dynamic dimension at the smallest size the checks
allow), which the differential oracle draws inputs of; the nested pickles are scanned with
:mod:`pickletools` (opcodes only, nothing executed, no torch).  A package without the generated
source is refused (a source never opens a ``.so``; torch always packages the source).  The
program model: format ``torch-pt2``, one method per model in archive order; every member it needs stored uncompressed;
a constant's ``offset`` is the absolute offset of its storage in the archive.  The layout, each
field of the model, and what torch's own loader does: ``docs/upstream.md``.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import ProgramError
from toolkit.core.model import (
    DTYPE_ITEMSIZE,
    METHOD_NAME_RE,
    ConstantSpec,
    InputSpec,
    MethodSpec,
    PackedLocation,
    PerConstantStorages,
    Program,
    Region,
    aligned_slot_bytes,
    required_nbytes,
)
from toolkit.core.vocab import ConstantKind, ProgramFormat
from toolkit.integrity import VerifiedFiles
from toolkit.sources.binary import Bytes, MappedFile
from toolkit.sources.naming import program_name

AOTI_DIR = "data/aotinductor/"
WEIGHTS_DIR = "data/weights/"
MAX_MEMBERS = 1 << 20
ZIP_MAGIC = b"PK\x03\x04"  # a zip's local file header (torch's packages are zips)

# legacy typed-storage classes torch.save pickles, -> dtype
STORAGE_DTYPES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "Float8_e4m3fnStorage": "float8_e4m3fn",
    "Float8_e5m2Storage": "float8_e5m2",
}
CONSTANT_TYPES = {
    "Parameter": ConstantKind.PARAMETER,
    "Buffer": ConstantKind.BUFFER,
    "TensorConstant": ConstantKind.LIFTED_CONSTANT,
}
# an assignment's head; its value runs to the ``;`` ending the line (matched per line: linear)
_INFO = re.compile(r"constants_info_\[(\d{1,18})\]\.(\w+)[ \t]*=[ \t]*")
MAX_COUNT = 1 << 20  # inputs, outputs, constants a model may declare
_BASE = re.compile(r"AOTInductorModelBase\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,")
# the generated input checks (torch/_inductor/codegen/cpp_wrapper_cpu.py, generate_input_output_runtime_checks),
# matched per line: a check function's head, its expected dtype, a check's message and, a line on, its value
_CHECK_HEAD = re.compile(r"static void check_input_(\d{1,7})\(")
_CHECK_DTYPE = re.compile(r"_expected_dtype = aoti_torch_dtype_(\w{1,40})\(\)")
_CHECK_MESSAGE = re.compile(
    r'"input_handles\[(\d{1,7})\]: (unmatched dim value|dim value is too small|dim value is too large|'
    r"unmatched stride value) at (\d{1,4}), "
)
_CHECK_VALUE = re.compile(r'"expected[a-z ]{0,12}:? ?[<>]?=? ?(\d{1,20}), "')
# where the checks leave a dynamic dimension's lower bound open (aot_inductor.check_lowerbound off):
# torch.export specializes sizes 0 and 1, so a dimension it keeps dynamic is at least 2
UNCHECKED_DYNAMIC_SIZE = 2


class _Window(io.RawIOBase):
    """A seekable read-only file over bytes of a mapped file (for :mod:`zipfile`, copying only what it reads)."""

    def __init__(self, data: memoryview):
        self._data, self._pos = data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._data)}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        chunk = self._data[self._pos : self._pos + len(b)]
        n = len(chunk)
        b[:n] = chunk
        self._pos += n
        return n


@dataclass(frozen=True)
class Pt2Location(PackedLocation):
    """A ``.pt2``'s model: its ``.so`` and weights members of the archive, a dense blob or per-weight storages."""

    weights_format: str  # binary_blob, pickle_weights or "no constants"
    inputs: tuple[InputSpec, ...] | None = None  # as the generated source checks them (None: it does not)


@dataclass(frozen=True)
class _Member:
    name: str  # inside the archive, without the root folder
    offset: int  # absolute offset of its data in the file
    size: int


def _members(b: Bytes, data: memoryview, base: int, what: str) -> list[tuple[str, _Member]]:
    """(full name, member) of every stored member of the zip in ``data`` (at ``base`` in the file)."""
    try:
        with zipfile.ZipFile(_Window(data)) as z:
            infos = z.infolist()
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        ValueError,
        OSError,
        EOFError,
        UnicodeDecodeError,
        IndexError,
        KeyError,
        OverflowError,
        NotImplementedError,
    ) as e:
        raise b.error(
            f"{what} is not a readable zip archive: {type(e).__name__}: {e}", "(zip directory)", base
        ) from None
    if len(infos) > MAX_MEMBERS:
        raise b.error(f"{what} lists {len(infos)} members", "(zip directory)", base)
    out = []
    for info in infos:
        w = f"{what}[{info.filename!r}]"
        h = base + info.header_offset
        if b.raw(h, 4, w) != ZIP_MAGIC:
            raise b.error("no local file header where the zip directory says", w, h)
        n, m = b.u16(h + 26, w), b.u16(h + 28, w)
        start = h + 30 + n + m
        if info.compress_type != zipfile.ZIP_STORED:
            out.append((info.filename, _Member(info.filename, -1, info.file_size)))
            continue
        if info.compress_size != info.file_size or start + info.file_size > base + len(data):
            raise b.error(f"member of {info.file_size} bytes at {start} does not fit the archive", w, h)
        out.append((info.filename, _Member(info.filename, start, info.file_size)))
    return out


def _need_stored(b: Bytes, m: _Member, field: str) -> _Member:
    if m.offset < 0:
        raise b.error(
            "member is compressed: its bytes have no offset in the file (torch stores members uncompressed)", field
        )
    return m


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(text: str) -> str:
    """``text`` as valid Unicode: a pair of surrogate escapes (``\\ud83d\\ude00``) joined into its
    character, a lone surrogate (which no UTF-8 or XML file holds) written as its escape, visibly."""
    if not _SURROGATE.search(text):
        return text
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", joined)


def _c_string(v: str) -> str | None:
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return _valid_text(v[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape"))
    return None


def _dims(v: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"\{([0-9,\s]*)\}", v)  # one class: "\s*[0-9,\s]*" backtracks quadratically
    if m is None:
        return None
    return tuple(int(x) for x in re.sub(r"\s", "", m.group(1)).split(",") if x)


def _constant_table(src: str, b: Bytes, field: str) -> tuple[list[dict], int, int]:
    """Rows of ``constants_info_`` in index order, and (num_inputs, num_outputs)."""
    base = _BASE.search(src)
    if base is None:
        raise b.error("the generated wrapper has no AOTInductorModelBase(...) constructor call", field)
    # the length first: int() refuses 5,000 digits, and 10^12 constants is no table to wait for
    if any(len(x) > len(str(MAX_COUNT)) or int(x) > MAX_COUNT for x in base.groups()):
        raise b.error(
            f"the model declares {', '.join(x[:20] for x in base.groups())} inputs, outputs, constants: "
            f"at most {MAX_COUNT} of each",
            field,
        )
    n_in, n_out, n_const = (int(x) for x in base.groups())
    rows: dict[int, dict] = {}
    for line in src.splitlines():
        m = _INFO.search(line) if "constants_info_[" in line else None
        value = line[m.end() :].rstrip() if m else ""
        if not value.endswith(";"):
            continue
        i, key = int(m.group(1)), m.group(2)
        if i >= n_const:
            raise b.error(f"constants_info_[{i}] but the model declares {n_const} constants", field)
        rows.setdefault(i, {})[key] = value[:-1].strip()
    if len(rows) != n_const:  # every index is below n_const: this many are all of them
        raise b.error(f"constants_info_ lists {len(rows)} of the {n_const} constants the model declares", field)
    out = []
    for i in range(n_const):
        r, w = rows[i], f"{field}.constants_info_[{i}]"
        try:
            name, fqn = _c_string(r["name"]), _c_string(r.get("original_fqn", '""'))
            dtype = r["dtype"].removeprefix("cached_torch_dtype_")
            device = r["device_type"].removeprefix("cached_torch_device_type_")
            shape, stride = _dims(r["shape"]), _dims(r["stride"])
            kind = re.search(r"ConstantType::(\w+)", r.get("type", ""))
            row = {
                "name": name,
                "fqn": fqn,
                "dtype": dtype,
                "device": device,
                "shape": shape,
                "strides": stride,
                "storage_offset": int(r["offset"]),
                "data_size": int(r["data_size"]),
                "folded": r.get("from_folded", "false") == "true",
                "kind": kind.group(1) if kind else "",
                "where": w,
            }
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            raise b.error(f"constant table entry cannot be read ({type(e).__name__}: {e})", w) from None
        if not name or fqn is None or shape is None or stride is None or len(shape) != len(stride):
            raise b.error(f"constant table entry is incomplete: {r}", w)
        if dtype not in DTYPE_ITEMSIZE:
            raise b.error(f"unknown dtype {dtype!r}", f"{w}.dtype")
        out.append(row)
    return out, n_in, n_out


def wrapper_inputs(src: str, num_inputs: int) -> tuple[InputSpec, ...] | None:
    """Each input's dtype and sizes as the generated wrapper's ``check_input_N`` checks them, in input
    order; a dynamic dimension at the smallest size its checks allow (its ``dim value is too small``
    bound). None where the source does not check every input (a torch that generates no checks)."""
    dtypes: dict[int, str] = {}
    checks: dict[int, dict[int, dict[str, int]]] = {}  # input -> dimension -> kind -> value
    current, pending = -1, None
    for line in src.splitlines():
        if "check_input_" in line and (head := _CHECK_HEAD.search(line)):
            current, pending = int(head.group(1)), None
        elif "_expected_dtype" in line and (dtype := _CHECK_DTYPE.search(line)) and current >= 0:
            dtypes.setdefault(current, dtype.group(1))
        elif "input_handles[" in line and (message := _CHECK_MESSAGE.search(line)):
            pending = (int(message.group(1)), message.group(2), int(message.group(3)))
        elif pending is not None and "expected" in line:
            value = _CHECK_VALUE.search(line)
            if value is not None:
                i, kind, dim = pending
                checks.setdefault(i, {}).setdefault(dim, {})[kind] = int(value.group(1))
            pending = None
    if set(dtypes) != set(range(num_inputs)) or not set(checks) <= set(dtypes):  # (no inputs: nothing to check)
        return None
    out = []
    for i in range(num_inputs):
        dims = checks.get(i, {})
        shape, dynamic = [], []
        for d in range(max(dims, default=-1) + 1):  # the stride checks reach the last dimension too
            c = dims.get(d, {})
            if "unmatched dim value" in c:
                shape.append(c["unmatched dim value"])
                continue
            size = c.get("dim value is too small", UNCHECKED_DYNAMIC_SIZE)
            shape.append(min(size, c.get("dim value is too large", size)))
            dynamic.append(d)
        out.append(InputSpec(dtypes[i], tuple(shape), tuple(dynamic)))
    return tuple(out)


def _scan_pickle(data: bytes, b: Bytes, field: str) -> dict:
    """What a ``torch.save`` pickle of one tensor says about its storage, without executing it."""
    out = {"parameter": False}
    pending = None
    strings = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "STACK_GLOBAL") and isinstance(arg, str):
                mod, _, name = arg.partition(" ")
                if mod == "torch._utils" and name == "_rebuild_parameter":
                    out["parameter"] = True
                if mod == "torch" and name.endswith("Storage") and "dtype" not in out:
                    if name not in STORAGE_DTYPES:
                        raise b.error(f"storage type torch.{name} is not one this toolkit knows", field)
                    out["dtype"] = STORAGE_DTYPES[name]
                    pending, strings = True, []
            elif pending and isinstance(arg, str) and op.name.endswith("UNICODE"):
                strings.append(arg)
            elif pending and isinstance(arg, int) and op.name.startswith(("BININT", "LONG", "INT")):
                if len(strings) >= 2:
                    out["key"], out["location"], out["numel"] = strings[0], strings[1], arg
                    pending = None
    except ProgramError:
        raise
    except Exception as e:  # pickletools raises ValueError and others on damaged input
        raise b.error(f"the weight's pickle cannot be scanned: {type(e).__name__}: {e}", field) from None
    if "dtype" not in out or "key" not in out:
        raise b.error("the weight's pickle names no storage", field)
    return out


class _Reader:
    def __init__(self, path: Path, verified: VerifiedFiles | None):
        self.path = path
        self.root = path.parent
        self.rel = os.path.relpath(path, self.root)
        self.file = MappedFile(path, self.rel, verified)
        self.b = self.file.bytes

    def read(self) -> Program:
        b = self.b
        members = _members(b, b.data, 0, "archive")
        roots = {name.split("/", 1)[0] for name, _ in members}
        if len(roots) != 1 or not all("/" in name for name, _ in members):
            raise b.error(f"members lie under {len(roots)} root folders; a .pt2 has one", "(zip directory)")
        prefix = roots.pop() + "/"
        self.m = {name[len(prefix) :]: mem for name, mem in members}
        fmt = self.m.get("archive_format")
        if fmt is None or b.raw(_need_stored(b, fmt, "archive_format").offset, fmt.size, "archive_format") != b"pt2":
            raise b.error("no archive_format member saying 'pt2'", "archive_format")
        models: list[str] = []
        for name, _ in members:
            rest = name[len(prefix) :]
            if rest.startswith(AOTI_DIR) and rest.count("/") >= 3:
                model = rest[len(AOTI_DIR) :].split("/", 1)[0]
                if model not in models:
                    models.append(model)
        if not models:
            raise b.error(f"no AOTInductor model under {AOTI_DIR}", AOTI_DIR)
        methods, devices = [], set()
        for model in models:
            spec, device = self._method(model)
            methods.append(spec)
            devices.add(device)
        if len(devices) != 1:
            raise b.error(f"models compiled for different devices {sorted(devices)}", AOTI_DIR)
        formats = sorted({m.location.weights_format for m in methods})
        return Program(
            name=program_name(self.path),
            description=f"torch AOTInductor package ({', '.join(formats)})",
            device=devices.pop(),
            torch_version="unknown",
            created_utc="",
            methods=tuple(methods),
            files={self.rel: self.file.record()},
            root=self.root,
            format=ProgramFormat.PT2,
            records_mutation=False,
        )

    def _text(self, mem: _Member, field: str) -> str:
        _need_stored(self.b, mem, field)
        return self.b.text(mem.offset, mem.size, field)

    def _method(self, model: str) -> tuple[MethodSpec, str]:
        b, d = self.b, f"{AOTI_DIR}{model}/"
        if not METHOD_NAME_RE.match(model):
            raise b.error(f"model name {model!r} is not a plain identifier", d)
        files = {k[len(d) :]: v for k, v in self.m.items() if k.startswith(d) and "/" not in k[len(d) :]}
        so = [k for k in files if k.endswith(".wrapper.so")] or [k for k in files if k.endswith(".so")]
        cpp = [k for k in files if k.endswith(".wrapper.cpp")]
        if len(so) != 1:
            raise b.error(f"model {model!r} has {len(so)} wrapper .so files; one is needed", d)
        so_m = _need_stored(b, files[so[0]], d + so[0])
        if len(cpp) != 1:
            raise b.error(
                f"model {model!r} has no generated wrapper source (.wrapper.cpp): its constant table is "
                "only inside the .so, which a source does not open",
                d,
            )
        src = self._text(files[cpp[0]], d + cpp[0])
        table, n_in, n_out = _constant_table(src, b, d + cpp[0])
        so_key = self.file.sha256(so_m.offset, so_m.size) + "_so_blob"
        meta = [k for k in files if k.endswith(".wrapper_metadata.json")]
        device = "cpu"
        if meta:
            try:
                device = json.loads(self._text(files[meta[0]], d + meta[0])).get("AOTI_DEVICE_KEY", "cpu")
            except (ValueError, AttributeError, RecursionError) as e:
                raise b.error(f"metadata is not a JSON object: {e}", d + meta[0]) from None
        device = "cuda" if str(device).startswith("cuda") else "cpu"
        blobs = [k for k in files if k.endswith("_weights.blob")]
        config = files.get("weights_config.json")
        live = [r for r in table if not r["folded"]]
        all_cuda = all(r["device"] == "cuda" for r in live)
        names = [r["name"] for r in live]
        if len(set(names)) != len(names):
            raise b.error("constant table lists a name twice", d + cpp[0])
        if blobs:
            if len(blobs) != 1 or config is not None:
                raise b.error("a model has one weights blob, or weights_config.json, not both", d)
            constants, weights, blob_bytes, label = self._blob(live, all_cuda, files[blobs[0]], d + blobs[0], so_key)
        elif config is not None:
            constants, blob_bytes = self._pickled(live, all_cuda, config, d + "weights_config.json", so_key)
            weights, label = PerConstantStorages(), "pickle_weights"
        elif live:
            raise b.error(f"model {model!r} has constants but neither a weights blob nor weights_config.json", d)
        else:
            constants, weights, blob_bytes, label = [], PerConstantStorages(), 0, "no constants"
        location = Pt2Location(
            Region(self.rel, so_m.offset, so_m.size, so_m.name), weights, label, wrapper_inputs(src, n_in)
        )
        spec = MethodSpec(
            name=model,
            so_file=self.rel,
            blob_file=self.rel,
            reference_file="",
            blob_bytes=blob_bytes,
            num_inputs=n_in,
            num_outputs=n_out,
            constants=tuple(constants),
            location=location,
        )
        return spec, device

    def _constant(self, r: dict, offset: int, so_key: str, storage_key: str = "", kind: ConstantKind | None = None):
        need = required_nbytes(r["dtype"], r["shape"], r["strides"], r["storage_offset"])
        if need > r["data_size"]:
            raise self.b.error(f"the view reads {need} bytes of a {r['data_size']}-byte storage", r["where"])
        kind = (
            kind
            or CONSTANT_TYPES.get(r["kind"])
            or (ConstantKind.LIFTED_CONSTANT if r["fqn"].startswith("_tensor_constant") else ConstantKind.PARAMETER)
        )
        return ConstantSpec(
            name=r["name"],
            fqn=r["fqn"],
            kind=kind,
            mutated=False,
            dtype=r["dtype"],
            shape=r["shape"],
            strides=r["strides"],
            storage_offset=r["storage_offset"],
            nbytes=need,
            offset=offset,
            digest=self.file.sha256(offset, need),
            file=self.rel,
            storage_key=storage_key,
            so_key=so_key,
        )

    def _blob(self, live: list[dict], all_cuda: bool, mem: _Member, field: str, so_key: str):
        _need_stored(self.b, mem, field)
        out, at = [], 0
        for r in live:
            if at + r["data_size"] > mem.size:
                raise self.b.error(
                    f"constant {r['name']!r} at [{at}, {at + r['data_size']}) runs past the {mem.size}-byte blob", field
                )
            out.append(self._constant(r, mem.offset + at, so_key))
            at += aligned_slot_bytes(r["data_size"], all_cuda=all_cuda)
        if at != mem.size:
            raise self.b.error(f"the constant table lays out {at} bytes, the blob has {mem.size}", field)
        return out, Region(self.rel, mem.offset, mem.size, mem.name), mem.size, "binary_blob"

    def _pickled(self, live: list[dict], all_cuda: bool, config_m: _Member, field: str, so_key: str):
        b = self.b
        try:
            config = json.loads(self._text(config_m, field))
        except (ValueError, RecursionError) as e:
            raise b.error(f"not JSON: {e}", field) from None
        if not isinstance(config, dict):
            raise b.error("not a JSON object", field)
        spelled = {_valid_text(k): v for k, v in config.items()}  # keys spelled as the table's FQNs are
        if len(spelled) != len(config):
            raise b.error("two keys read the same once their lone surrogates are escaped", field)
        config = spelled
        by_fqn = {r["fqn"]: r for r in live}
        if set(config) != set(by_fqn):
            raise b.error(
                f"weights_config names {sorted(set(config) ^ set(by_fqn))[:5]} that the constant table "
                "does not (or the other way round)",
                field,
            )
        storages: dict[str, dict] = {}
        out, total = [], 0
        for r in live:
            w = f"{field}[{r['fqn']!r}]"
            entry = config[r["fqn"]]
            if (
                not isinstance(entry, list)
                or len(entry) != 4
                or not isinstance(entry[0], str)
                or not all(isinstance(x, list) and all(type(v) is int and v >= 0 for v in x) for x in entry[1:3])
                or type(entry[3]) is not int
                or entry[3] < 0
            ):
                raise b.error(f"entry is not [file, shape, stride, offset]: {str(entry)[:200]}", w)
            fname, shape, stride, offset = entry
            if tuple(shape) != r["shape"] or tuple(stride) != r["strides"] or offset != r["storage_offset"]:
                raise b.error(
                    f"layout {shape}/{stride}/{offset} differs from the constant table's "
                    f"{r['shape']}/{r['strides']}/{r['storage_offset']}",
                    w,
                )
            if fname not in storages:
                storages[fname] = self._storage(WEIGHTS_DIR + fname, w)
            st = storages[fname]
            if st["dtype"] != r["dtype"]:
                raise b.error(f"weight file holds {st['dtype']}, the constant table says {r['dtype']}", w)
            row = dict(r, data_size=st["size"])
            kind = CONSTANT_TYPES.get(r["kind"])
            if kind is None:
                kind = ConstantKind.PARAMETER if st["parameter"] else ConstantKind.BUFFER
            out.append(self._constant(row, st["offset"], so_key, WEIGHTS_DIR + fname, kind))
            total += aligned_slot_bytes(st["size"], all_cuda=all_cuda)
        return out, total

    def _storage(self, name: str, field: str) -> dict:
        b = self.b
        mem = self.m.get(name)
        if mem is None:
            raise b.error(f"weights_config names {name!r}, which the archive does not hold", field)
        _need_stored(b, mem, name)
        inner = _members(b, b.data[mem.offset : mem.offset + mem.size], mem.offset, name)
        pkl = [m for n, m in inner if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise b.error("not a torch.save archive (no data.pkl)", name)
        p = _need_stored(b, pkl[0], f"{name}/data.pkl")
        info = _scan_pickle(b.raw(p.offset, p.size, f"{name}/data.pkl"), b, f"{name}/data.pkl")
        data = [m for n, m in inner if n.endswith(f"/data/{info['key']}")]
        if len(data) != 1:
            raise b.error(f"the pickle's storage {info['key']!r} is not in the weight archive", name)
        d = _need_stored(b, data[0], f"{name}/data/{info['key']}")
        if d.size != info["numel"] * DTYPE_ITEMSIZE[info["dtype"]]:
            raise b.error(
                f"storage member has {d.size} bytes; {info['numel']} x {info['dtype']} needs "
                f"{info['numel'] * DTYPE_ITEMSIZE[info['dtype']]}",
                f"{name}/data/{info['key']}",
            )
        return {"offset": d.offset, "size": d.size, "dtype": info["dtype"], "parameter": info["parameter"]}


def open_pt2(path: "str | Path", verified: VerifiedFiles | None = None) -> Program:
    """The program model of a torch ``.pt2`` AOTInductor package (one method per model); the file,
    hashed for its record, is noted in ``verified``."""
    p = Path(path)
    if not p.is_file():
        raise ProgramError("torch package (.pt2) does not exist", path=p)
    r = _Reader(p, verified)
    try:
        return r.read()
    finally:
        r.file.close()
