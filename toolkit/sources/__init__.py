"""Sources of programs: each turns files of one format into the program model (:mod:`toolkit.model`).

Today: our program directory (:mod:`toolkit.sources.directory`).  A new format is one more
module with an ``open_*`` function, dispatched from :func:`open_program`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ProgramError
from ..model import Program
from .directory import MANIFEST_FILE, open_directory, read_manifest_file


def open_program(path: "str | Path | Program") -> Program:
    """Read and validate a program (no .so is opened; digests are checked right before loading).

    ``path`` is a program directory (holding ``manifest.json``) or a :class:`Program`.
    """
    if isinstance(path, Program):
        return path
    p = Path(path)
    if p.name == MANIFEST_FILE and p.is_file():
        p = p.parent
    if p.is_dir() or not p.exists():
        return open_directory(p)
    raise ProgramError("not a program this toolkit can open (expected a program directory holding "
                       f"{MANIFEST_FILE})", path=p)


def read_program_model(path: "str | Path | Program") -> Program:
    """The program model of ``path`` without checking that its files exist (a synthetic program has none)."""
    if isinstance(path, Program):
        return path
    p = Path(path)
    if p.is_dir():
        return read_manifest_file(p / MANIFEST_FILE, p)
    return read_manifest_file(p, p.parent)


__all__ = ["open_program", "read_program_model"]
