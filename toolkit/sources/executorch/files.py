"""The files of one ExecuTorch program: the ``.pte``, its ``.ptd`` files and what lies beside them.

Each file is opened once (read into a verified copy, :class:`~toolkit.sources.binary.MappedFile`)
and named by its path relative to the ``.pte``'s folder, as the program model names it; the named
data of the ``.pte`` and the ``.ptd`` files is looked up here by key.  A path that is not a regular
file is never opened (a FIFO would block, a device would read without end).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from toolkit.core.errors import ProgramError
from toolkit.core.model import FileRecord, Region
from toolkit.integrity import VerifiedFiles
from toolkit.sources.binary import MappedFile
from toolkit.sources.executorch.layout import refuse_trailing_before_copy

DEFAULT_DATA_FILE = "aoti_cuda_blob.ptd"


def _rel(path: Path, root: Path) -> str:
    try:
        return os.path.relpath(path, root)
    except ValueError:  # another drive (Windows)
        return str(path.resolve())


def not_a_file(path: Path) -> str:
    """Why ``path``, not a regular file, is not opened."""
    return "is not a regular file (a folder, FIFO or device)" if path.exists() else "does not exist"


def data_files(pte: Path, data) -> list[Path]:
    """The ``.ptd`` files of the program: those given, or ``aoti_cuda_blob.ptd`` beside the ``.pte``."""
    if data is None:
        p = pte.parent / DEFAULT_DATA_FILE
        return [p] if p.is_file() else []
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    out = []
    for d in items:
        p = Path(d)
        if not p.is_file():
            raise ProgramError(f"data file (.ptd) given for the program {not_a_file(p)}", path=p)
        out.append(p)
    return out


class ProgramFiles:
    """The opened files of one program (relative path -> file) and the named data of all of them."""

    def __init__(self, pte: Path, data: Sequence[Path], verified: VerifiedFiles | None):
        self.root, self.verified = pte.parent, verified
        self.opened: dict[str, MappedFile] = {}
        self.named: dict[str, Region] = {}  # filled once the .pte and the .ptd files are read
        self.pte = self.open(pte)
        self.ptds = [self.open(p) for p in data]

    def open(self, path: Path) -> MappedFile:
        rel = _rel(path, self.root)
        if rel not in self.opened:
            if not path.is_file():  # opening a FIFO would block, a device would read without end
                raise ProgramError(not_a_file(path), path=path)
            refuse_trailing_before_copy(path)
            self.opened[rel] = MappedFile(path, rel, self.verified)
        return self.opened[rel]

    def __getitem__(self, rel: str) -> MappedFile:
        return self.opened[rel]

    def drop(self, f: MappedFile) -> None:
        """Close a file that turned out not to be the program's: it gets no record."""
        self.opened.pop(f.rel).close()

    def find(self, key: str, field: str) -> Region:
        """The region of named data ``key``, in the ``.pte`` or a ``.ptd``."""
        reg = self.named.get(key)
        if reg is None:
            where = ", ".join(f.rel for f in self.ptds) or "no .ptd was found or given"
            raise ProgramError(
                f"named data {key!r} is in neither the .pte nor the data files ({where})",
                path=self.pte.path,
                field=field,
            )
        return replace(reg, key=key)

    def records(self) -> dict[str, FileRecord]:
        return {rel: f.record() for rel, f in self.opened.items()}

    def close(self) -> None:
        for f in self.opened.values():
            f.close()
