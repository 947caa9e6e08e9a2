"""Sources of programs: each turns files of one format into the program model (:mod:`toolkit.core.model`).

* our program directory (:mod:`toolkit.sources.directory`): ``manifest.json`` beside per-method files;
* an ExecuTorch CUDA program (:mod:`toolkit.sources.executorch`): a ``.pte`` and its ``.ptd``;
* a torch AOTInductor package (:mod:`toolkit.sources.pt2`): a ``.pt2`` archive, one model or several.

A new format is one more module and one :class:`ProgramSource` in :data:`SOURCES`: the first that
claims a path opens it (:func:`open_program`), with the options it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from toolkit.core.errors import ProgramError
from toolkit.core.model import Program
from toolkit.core.vocab import ProgramFormat
from toolkit.integrity import verified_files
from toolkit.sources.binary import claimed_file
from toolkit.sources.directory import MANIFEST_FILE, open_directory, read_manifest_file
from toolkit.sources.executorch import PTE_IDENTIFIER, open_pte
from toolkit.sources.pt2 import ZIP_MAGIC, open_pt2


@dataclass(frozen=True)
class ProgramSource:
    """One format: the paths it claims (``claim``: what it opens, or None), how it opens one, its options."""

    format: ProgramFormat
    claim: Callable[[Path], Path | None]
    open: Callable[..., Program]
    options: tuple[str, ...] = ()


def _claim_pte(p: Path) -> Path | None:
    """A ``.pte`` (by name or file identifier), or a folder holding exactly one and no manifest."""
    if p.is_dir() and not (p / MANIFEST_FILE).exists():
        ptes = sorted(p.glob("*.pte"))
        return ptes[0] if len(ptes) == 1 else None
    return claimed_file(p, ".pte", PTE_IDENTIFIER, at=4)


SOURCES = (
    ProgramSource(
        ProgramFormat.PTE,
        _claim_pte,
        lambda p, **o: open_pte(p, verified=verified_files(), **o),
        ("data", "constant_table", "so_table", "reader"),
    ),
    ProgramSource(
        ProgramFormat.PT2, lambda p: claimed_file(p, ".pt2", ZIP_MAGIC), lambda p: open_pt2(p, verified_files())
    ),
    ProgramSource(ProgramFormat.DIRECTORY, lambda p: p if p.is_dir() or not p.exists() else None, open_directory),
)


def _claimed(p: Path) -> "tuple[ProgramSource, Path] | None":
    return next(((s, found) for s in SOURCES if (found := s.claim(p)) is not None), None)


def open_program(path: "str | Path | Program", **options) -> Program:
    """Read and validate a program (no .so is opened; digests are checked right before loading).

    ``path`` is a program directory (holding ``manifest.json``), an ExecuTorch ``.pte`` (or
    a folder holding exactly one, and no manifest), a torch ``.pt2`` package, or a
    :class:`Program`.  ``options`` are the claiming source's (:data:`SOURCES`): a ``.pte`` takes
    ``data``, ``constant_table``, ``so_table`` and ``reader`` (:func:`toolkit.sources.executorch.open_pte`).
    A ``.pte``, ``.ptd`` or ``.pt2`` hashed for its record is noted in :func:`~toolkit.integrity.verified_files`.
    """
    if isinstance(path, Program):
        return path
    p = Path(path)
    if p.name == MANIFEST_FILE and p.is_file():
        p = p.parent
    claimed = _claimed(p)
    if claimed is None:
        if p.suffix == ".ptd":
            raise ProgramError("an ExecuTorch .ptd holds only data: open its .pte (data= names the .ptd)", path=p)
        raise ProgramError(
            "not a program this toolkit can open (expected a program directory holding "
            f"{MANIFEST_FILE}, an ExecuTorch .pte or a torch .pt2 package)",
            path=p,
        )
    source, found = claimed
    for name in options:
        if name not in source.options:
            takers = " and ".join(s.format for s in SOURCES if name in s.options) or "no format"
            raise ProgramError(
                f"option {name}= is not one {source.format} takes (it takes "
                f"{', '.join(source.options) or 'none'}); it belongs to {takers}",
                path=p,
            )
    return source.open(found, **options)


def read_program_model(path: "str | Path | Program") -> Program:
    """The program model of ``path`` without checking that its files exist (a synthetic program has none).

    A ``.pte`` or ``.pt2`` is read whole (its model is in its files).
    """
    if isinstance(path, Program):
        return path
    p = Path(path)
    claimed = _claimed(p)
    if claimed is not None and claimed[0].format is not ProgramFormat.DIRECTORY:
        return open_program(p)
    manifest, root = (p / MANIFEST_FILE, p) if p.is_dir() else (p, p.parent)
    return read_manifest_file(manifest, root)


__all__ = ["SOURCES", "ProgramSource", "open_program", "read_program_model"]
