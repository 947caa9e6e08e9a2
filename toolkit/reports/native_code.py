"""The notice that a full load runs a program's native code, said once per process.

A full load runs the code compiled into the program's ``.so`` files in this process, so a user
is told before loading a program the toolkit did not build; a dry run runs none and needs no notice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.core.vocab import ProgramFormat

if TYPE_CHECKING:
    from toolkit.core.model import Program

_NATIVE_CODE_NOTICED: list[str] = []  # the program it was given for, once per process


def native_code_notice(program: "Program") -> str | None:
    """What a full load does, said once per process before the first load of a program not
    built here (built here: a program directory in the build cache, which our builder wrote);
    None when it needs no saying."""
    from toolkit.build.samples import cache_root

    root = Path(program.root).resolve() if program.root is not None else None
    if _NATIVE_CODE_NOTICED or (
        program.format is ProgramFormat.DIRECTORY and root is not None and root.is_relative_to(cache_root().resolve())
    ):
        return None
    _NATIVE_CODE_NOTICED.append(str(root))
    return (
        f"loading {program.name!r} from {root} runs the native code compiled into it (its .so files) in this "
        "process: load only programs you trust; a dry run runs none"
    )
