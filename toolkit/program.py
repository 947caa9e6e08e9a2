"""Opening program directories, and checking they suit this process."""

from __future__ import annotations

from pathlib import Path

from .errors import IncompatibleProgramError, ProgramError
from .manifest import Program, read_manifest


def open_program(path: "str | Path | Program") -> Program:
    """Read and validate a program directory's manifest (no .so is opened).

    Every referenced file must exist; digests are checked later, right before loading.
    """
    if isinstance(path, Program):
        return path
    root = Path(path)
    manifest = read_manifest(root)
    for rel in manifest.files:
        try:
            present = (root / rel).is_file()
        except OSError as e:  # e.g. ENAMETOOLONG: is_file() only swallows "no such file"
            raise ProgramError(f"file named in the manifest cannot be accessed: {e.strerror or e}",
                               path=root / rel) from None
        if not present:
            raise ProgramError("file named in the manifest is missing", path=root / rel)
    return Program(root=root, manifest=manifest)


def torch_compatible(built: str, running: str) -> bool:
    """AOTI .so files are tied to the torch release they were compiled against (major.minor)."""
    def mm(v: str) -> tuple[str, ...]:
        return tuple(v.split("+")[0].split(".")[:2])
    return mm(built) == mm(running)


def check_compatible(program: Program, device_type: str, torch_version: str) -> None:
    m = program.manifest
    if m.device != device_type:
        raise IncompatibleProgramError(
            f"program was built for {m.device!r} but is being loaded on {device_type!r}; rebuild it with device={device_type!r}",
            path=program.root / "manifest.json", field="device")
    if not torch_compatible(m.torch_version, torch_version):
        raise IncompatibleProgramError(
            f"program was built with torch {m.torch_version}, this process runs torch {torch_version}; rebuild it",
            path=program.root / "manifest.json", field="torch_version")
