"""The CUDA delegate's payload: where a method's ``.so`` and weights lie, in one of three generations.

The ``processed`` bytes of the ``CudaBackend`` delegate are empty (generation 1: the named-data
keys follow from the method's name), the text ``<so_key>\\n<weights_key>`` (generation 2), or a
per-FQN manifest (generation 3: ``ETCUDAFQN3``, ``4``, ``5`` and ``0``: one ``.so`` key or
several per-architecture variants, then one entry per weight with its storage key and view).
The decoder applies the checks of upstream's own (``decode_cuda_aoti_metadata``,
``CudaWeightCache::parse``), so a payload the runtime refuses is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.model import SCALAR_TYPES
from toolkit.sources.binary import Bytes, Cursor
from toolkit.sources.executorch.layout import Delegate

MAX_RANK = 64
MAX_ENTRIES = 1 << 20  # the runtime's own bound (kMaxManifestEntries)
MAX_VARIANTS = 256

# c10::ScalarType codes the 1.5.x runtime accepts (is_supported_cuda_fqn_dtype)
CUDA_FQN_SCALAR_TYPES = {c: SCALAR_TYPES[c] for c in (0, 1, 2, 3, 4, 5, 6, 11, 15)}
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
FQN_MAGICS = ("ETCUDAFQN3", "ETCUDAFQN4", "ETCUDAFQN5", "ETCUDAFQN0")


@dataclass
class Payload:
    """A decoded payload: its generation, a label naming it, the keys of its .so variants and weights."""

    generation: int
    label: str
    so_keys: list[str]  # the variants' .so keys, the one modelled first
    weights_key: str = ""
    entries: list[dict] = field(default_factory=list)


def _decode_entries(c: Cursor, where: str) -> list[dict]:
    n = c.u32(f"{where}.num_entries")
    if n > MAX_ENTRIES:
        raise c.b.error(
            f"{n} weight entries (the runtime accepts at most {MAX_ENTRIES})", f"{where}.num_entries", c.at - 4
        )
    entries = []
    for i in range(n):
        w = f"{where}.entries[{i}]"
        start = c.at
        fqn, key = c.string(f"{w}.fqn"), c.string(f"{w}.storage_key")
        nbytes, dtype, dev = c.u64(f"{w}.storage_nbytes"), c.i32(f"{w}.dtype"), c.i32(f"{w}.device_type")
        offset, ndim = c.i64(f"{w}.storage_offset"), c.u32(f"{w}.ndim")
        if not fqn or not key:
            raise c.b.error("weight entry without an FQN or a storage key", w, start)
        if ndim > MAX_RANK:
            raise c.b.error(f"rank {ndim} > {MAX_RANK}", f"{w}.ndim", c.at - 4)
        sizes = [c.i64(f"{w}.sizes") for _ in range(ndim)]
        strides = [c.i64(f"{w}.strides") for _ in range(ndim)]
        if offset < 0 or any(v < 0 for v in sizes + strides):
            raise c.b.error(
                f"negative storage offset, size or stride (offset {offset}, sizes {sizes}, strides {strides})", w, start
            )
        if dtype not in CUDA_FQN_SCALAR_TYPES:
            raise c.b.error(f"ScalarType {dtype} is not one the CUDA runtime accepts", f"{w}.dtype", start)
        if dev not in DEVICE_TYPES:
            raise c.b.error(f"device type {dev} is neither 0 (cpu) nor 1 (cuda)", f"{w}.device_type", start)
        entries.append(
            {
                "fqn": fqn,
                "storage_key": key,
                "storage_nbytes": nbytes,
                "dtype": CUDA_FQN_SCALAR_TYPES[dtype],
                "device": DEVICE_TYPES[dev],
                "storage_offset": offset,
                "sizes": tuple(sizes),
                "strides": tuple(strides),
                "where": w,
            }
        )
    return entries


def decode_payload(d: Delegate, method_name: str, path: Path) -> Payload:
    where = f"{d.where}.processed"
    raw = d.payload
    b = Bytes(raw, path, what=f"CUDA delegate payload of method {method_name!r}")
    if not raw:
        base = method_name or ""
        return Payload(
            1,
            "method keys (before #20424)",
            [f"{base}_so_blob" if base else "so_blob"],
            f"{base}_weights_blob" if base else "weights_blob",
        )
    if raw.startswith(b"ETCUDAFQN"):
        magic = raw[:10].decode("ascii", "replace")
        if magic not in FQN_MAGICS:
            raise b.error(
                f"payload {magic!r} is not one this toolkit reads ({', '.join(FQN_MAGICS)})", f"{where}.magic", 0
            )
        c = Cursor(b, 10)
        variants = []
        if magic == "ETCUDAFQN3":
            key = c.string(f"{where}.so_blob_key")
            if not key:
                raise b.error("payload names no .so key", f"{where}.so_blob_key", 10)
            variants.append((0, 0, False, key))
        else:
            n = c.u32(f"{where}.num_variants")
            if not 1 <= n <= MAX_VARIANTS:
                raise b.error(f"{n} variants (1 to {MAX_VARIANTS} allowed)", f"{where}.num_variants", 10)
            for i in range(n):
                vw = f"{where}.variants[{i}]"
                at = c.at
                sm, ptx = c.u32(f"{vw}.target_sm"), c.u32(f"{vw}.ptx_compute")
                flags = c.u32(f"{vw}.flags") if magic in ("ETCUDAFQN5", "ETCUDAFQN0") else 0
                key = c.string(f"{vw}.so_blob_key")
                fallback = bool(flags & 1)
                bad = (
                    not key
                    or ptx > sm
                    or flags & ~1
                    or (sm == 0 and (magic != "ETCUDAFQN0" or n != 1 or ptx or fallback))
                    or (fallback and (ptx == 0 or any(v[2] for v in variants)))
                    or (not fallback and sm and any(v[0] == sm and not v[2] for v in variants))
                )
                if bad:  # the checks of upstream's decoder (decode_cuda_aoti_metadata, CudaWeightCache::parse)
                    raise b.error(f"invalid variant (target sm {sm}, ptx {ptx}, flags {flags}, key {key!r})", vw, at)
                variants.append((sm, ptx, fallback, key))
            if any(v[2] for v in variants) and any(v[1] and not v[2] for v in variants):
                raise b.error("a regular variant advertises PTX beside a fallback variant", f"{where}.variants", 10)
        entries = _decode_entries(c, where)
        if c.remaining():
            raise b.error(f"{c.remaining()} bytes after the last weight entry", where, c.at)
        chosen = [v for v in variants if not v[2]] or variants
        order = chosen[:1] + [v for v in variants if v is not chosen[0]]
        label = (
            magic
            if len(variants) == 1 and variants[0][0] == 0
            else magic
            + " ("
            + ", ".join(
                (f"sm{sm}" if sm else "any") + (f"+ptx{ptx}" if ptx else "") + (" fallback" if fb else "")
                for sm, ptx, fb, _ in variants
            )
            + ")"
        )
        return Payload(3, label, [v[3] for v in order], "", entries)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise b.error(
            "payload is neither empty, nor ETCUDAFQN*, nor the text '<so_key>\\n<weights_key>'", where, e.start
        ) from None
    if len(lines) != 2 or not all(lines):
        raise b.error(f"text payload has {len(lines)} line(s); expected '<so_key>\\n<weights_key>'", where, 0)
    return Payload(2, "so and weights keys (#20424 to 1.4)", [lines[0]], lines[1])
