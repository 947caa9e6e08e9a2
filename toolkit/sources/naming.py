"""A program's name from its file: the file's stem, unless the stem says nothing (``prog.pte``).

ExecuTorch's exporters write every program as ``prog.pte`` (and torch's examples ``model.pt2``), so
the stem would call every program the same; a generic stem takes its folder's name instead, which is
how people tell such files apart.
"""

from __future__ import annotations

from pathlib import Path

GENERIC_STEMS = frozenset({"prog", "program", "model", "module", "export", "exported", "out", "output", "main"})


def program_name(path: Path) -> str:
    """``path``'s stem, or its folder's name where the stem is generic (and the folder has a name)."""
    path = Path(path)
    if path.stem.lower() in GENERIC_STEMS and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem
