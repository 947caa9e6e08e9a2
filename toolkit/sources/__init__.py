"""Sources of programs: each turns files of one format into the program model (:mod:`toolkit.model`).

* our program directory (:mod:`toolkit.sources.directory`): ``manifest.json`` beside per-method files;
* an ExecuTorch CUDA program (:mod:`toolkit.sources.executorch`): a ``.pte`` and its ``.ptd``;
* a torch AOTInductor package (:mod:`toolkit.sources.pt2`): a ``.pt2`` archive, one model or several.

A new format is one more module with an ``open_*`` function, dispatched from :func:`open_program`.

The ``.so`` key of a program directory's method (what ExecuTorch 1.5.x namespaces lifted
``_tensor_constant*`` FQNs by, see :func:`toolkit.policies.fqn_weight_key`) is derived here
as ExecuTorch derives it, ``<sha256 of the .so>_so_blob``, from the manifest's file record
of the method's ``.so``; it is set on the method and on its ``_tensor_constant*`` constants
(the only ones it namespaces).  A record of 64 zeros is a placeholder (synthetic programs
have no files): such a method gets no key, and each method then counts as its own ``.so``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ProgramError
from ..integrity import verified_files
from ..model import Program
from .directory import MANIFEST_FILE, open_directory, read_manifest_file
from .executorch import is_pte, open_pte
from .pt2 import is_pt2, open_pt2

_PLACEHOLDER_SHA = "0" * 64


def _with_so_keys(program: Program) -> Program:
    """A directory program with its methods' ``.so`` keys set (see the module docstring)."""
    methods = []
    changed = False
    for m in program.methods:
        rec = program.files.get(m.so_file)
        if m.so_key or rec is None or rec.sha256 == _PLACEHOLDER_SHA:
            methods.append(m)
            continue
        key = f"{rec.sha256}_so_blob"
        constants = tuple(replace(c, so_key=key) if c.fqn.startswith("_tensor_constant") and not c.so_key else c
                          for c in m.constants)
        methods.append(replace(m, so_key=key, constants=constants))
        changed = True
    return replace(program, methods=tuple(methods)) if changed else program


def _single_pte(p: Path) -> Path | None:
    if not p.is_dir() or (p / MANIFEST_FILE).exists():
        return None
    ptes = sorted(p.glob("*.pte"))
    return ptes[0] if len(ptes) == 1 else None


def open_program(path: "str | Path | Program", data: "str | Path | list | None" = None, *,
                 constant_table=None, reader: str = "toolkit") -> Program:
    """Read and validate a program (no .so is opened; digests are checked right before loading).

    ``path`` is a program directory (holding ``manifest.json``), an ExecuTorch ``.pte`` (or
    a folder holding exactly one, and no manifest), a torch ``.pt2`` package, or a
    :class:`Program`.  For a ``.pte``, ``data`` names its ``.ptd`` file(s) (default:
    ``aoti_cuda_blob.ptd`` beside it), ``constant_table`` is the ``.so``'s constant table
    for payload generations 1 and 2, and ``reader="executorch"`` parses it with ExecuTorch's
    own reader (the optional extra); see :func:`toolkit.sources.executorch.open_pte`.  A ``.pte``,
    ``.ptd`` or ``.pt2`` hashed for its record is noted in :func:`~toolkit.integrity.verified_files`.
    """
    if isinstance(path, Program):
        return path
    p = Path(path)
    if p.name == MANIFEST_FILE and p.is_file():
        p = p.parent
    pte = p if p.is_file() and is_pte(p) else _single_pte(p)
    if pte is not None:
        return open_pte(pte, data, constant_table=constant_table, reader=reader, verified=verified_files())
    if data is not None or constant_table is not None:
        raise ProgramError("data= and constant_table= belong to an ExecuTorch .pte; this is not one", path=p)
    if p.is_file() and is_pt2(p):
        return open_pt2(p, verified_files())
    if p.is_dir() or not p.exists():
        return _with_so_keys(open_directory(p))
    if p.suffix == ".ptd":
        raise ProgramError("an ExecuTorch .ptd holds only data: open its .pte (data= names the .ptd)", path=p)
    raise ProgramError("not a program this toolkit can open (expected a program directory holding "
                       f"{MANIFEST_FILE}, an ExecuTorch .pte or a torch .pt2 package)", path=p)


def read_program_model(path: "str | Path | Program") -> Program:
    """The program model of ``path`` without checking that its files exist (a synthetic program has none).

    A ``.pte`` or ``.pt2`` is read whole (its model is in its files).
    """
    if isinstance(path, Program):
        return path
    p = Path(path)
    if p.is_file() and (is_pte(p) or is_pt2(p)) or _single_pte(p) is not None:
        return open_program(p)
    if p.is_dir():
        return _with_so_keys(read_manifest_file(p / MANIFEST_FILE, p))
    return _with_so_keys(read_manifest_file(p, p.parent))


__all__ = ["open_program", "read_program_model"]
