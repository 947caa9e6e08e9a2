"""The notice that a full load runs a program's native code, said once per process.

A full load opens a program's ``.so`` files and so runs the code compiled into them in this
process, so a user is told before loading any program but one this process has just built itself
(:func:`toolkit.build.cache_trust.built_by_this_process`): a build reused from the build cache
is told too, since the cache is a folder on disk; a dry run runs none and needs no notice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.core.model import Program

_NATIVE_CODE_NOTICED: list[str] = []  # the program it was given for, once per process


def native_code_notice(program: "Program") -> str | None:
    """What a full load does, said once per process before the first load of a program whose
    ``.so`` files it opens, unless this process built that program itself; None when it needs no saying."""
    from toolkit.build.cache_trust import built_by_this_process

    root = Path(program.root).resolve() if program.root is not None else None
    if _NATIVE_CODE_NOTICED or built_by_this_process(program.root):
        return None
    _NATIVE_CODE_NOTICED.append(str(root))
    return (
        f"loading {program.name!r} from {root} runs the native code compiled into it (its .so files) in this "
        "process: load only programs you trust; a dry run runs none"
    )
