"""Payload generation 3: a method's constants from its per-FQN manifest, each on a storage of its own.

Every manifest entry names an FQN, the named data holding its storage and the view over it; the
constant takes the internal name AOTInductor gives that FQN (:func:`aoti_internal_names`), which
is how the compiled model names its slot.
"""

from __future__ import annotations

import re
from typing import Iterable

from toolkit.core.errors import ProgramError
from toolkit.core.model import ConstantSpec, PerConstantStorages, aligned_slot_bytes, required_nbytes
from toolkit.core.vocab import ConstantKind
from toolkit.sources.executorch.files import ProgramFiles
from toolkit.sources.executorch.payload import Payload


def aoti_internal_names(fqns: Iterable[str]) -> list[str]:
    """AOTInductor's internal constant names for ``fqns`` (``graph.allocate_non_dup_const_name``)."""
    taken: set[str] = set()
    next_suffix: dict[str, int] = {}  # every ``prefix_k`` below it is taken: linear in the FQNs, not quadratic
    out = []
    for fqn in fqns:
        name = f"constant_{fqn}" if fqn[:1].isdigit() else fqn
        prefix = name = re.sub(r"[^a-zA-Z0-9_]", "_", name)
        n = next_suffix.get(prefix, 0)
        while name in taken:
            name, n = f"{prefix}_{n}", n + 1
        next_suffix[prefix] = n
        taken.add(name)
        out.append(name)
    return out


def _kind(fqn: str) -> ConstantKind:
    return ConstantKind.LIFTED_CONSTANT if fqn.startswith("_tensor_constant") else ConstantKind.PARAMETER


def fqn_constants(files: ProgramFiles, payload: Payload) -> tuple[list[ConstantSpec], str, PerConstantStorages, int]:
    """Generation 3: the method's constants, one per manifest entry, each on its own storage (named data)."""
    names = aoti_internal_names(e["fqn"] for e in payload.entries)
    constants, seen = [], set()
    total, blob_file = 0, (files.ptds[0].rel if files.ptds else files.pte.rel)
    all_cuda = all(e["device"] == "cuda" for e in payload.entries)
    for name, e in zip(names, payload.entries):
        w = e["where"]
        if e["fqn"] in seen:  # the runtime refuses it too ("appears more than once")
            raise ProgramError(
                f"FQN {e['fqn']!r} appears more than once in the method's manifest", path=files.pte.path, field=w
            )
        seen.add(e["fqn"])
        reg = files.find(e["storage_key"], f"{w}.storage_key")
        if reg.size != e["storage_nbytes"]:
            raise ProgramError(
                f"storage {e['storage_key']!r} has {reg.size} bytes, the manifest says {e['storage_nbytes']}",
                path=files[reg.file].path,
                field=f"named_data[{e['storage_key']!r}]",
            )
        need = required_nbytes(e["dtype"], e["sizes"], e["strides"], e["storage_offset"])
        if need > reg.size:
            raise ProgramError(
                f"the view of {e['fqn']!r} reads {need} bytes of a {reg.size}-byte storage",
                path=files.pte.path,
                field=w,
            )
        blob_file = reg.file
        total += aligned_slot_bytes(reg.size, all_cuda=all_cuda)
        constants.append(
            ConstantSpec(
                name=name,
                fqn=e["fqn"],
                kind=_kind(e["fqn"]),
                mutated=False,
                dtype=e["dtype"],
                shape=e["sizes"],
                strides=e["strides"],
                storage_offset=e["storage_offset"],
                nbytes=need,
                offset=reg.offset,
                digest=files[reg.file].sha256(reg.offset, need),
                file=reg.file,
                storage_key=e["storage_key"],
                so_key=payload.so_keys[0],
                storage_nbytes=reg.size,
            )
        )
    return constants, blob_file, PerConstantStorages(), total
