"""The toolkit's exceptions: one base class, each error names the file and field at fault."""

from __future__ import annotations

from pathlib import Path


class ToolkitError(Exception):
    """Base class of every error the toolkit raises on purpose."""


class ProgramError(ToolkitError):
    """A program directory is missing, malformed or inconsistent.

    ``path`` is the file at fault and ``field`` the manifest field (dotted path), when known.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, field: str | None = None):
        self.path = str(path) if path is not None else None
        self.field = field
        where = []
        if self.path:
            where.append(self.path)
        if field:
            where.append(f"field {field!r}")
        super().__init__(f"{': '.join(where)}: {message}" if where else message)


class OutputError(ToolkitError):
    """An output file (a CSV the toolkit writes) cannot be written; ``path`` names it."""

    def __init__(self, message: str, *, path: str | Path):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class ManifestError(ProgramError):
    """The manifest cannot be read, or a field in it does not parse or is out of range."""


class IntegrityError(ProgramError):
    """A file's content does not match the digest or size the manifest records."""


class IncompatibleProgramError(ProgramError):
    """The program was built for another device kind or an incompatible torch version."""


class ReferenceDataError(ProgramError):
    """References given to ``verify()`` do not fit the program: an unknown method, a wrong
    number of inputs or outputs, a value that is not a tensor, a shape or dtype the compiled
    method does not take.  ``field`` says which (``references[decode].inputs[1].shape``)."""


class InvalidChoiceError(ToolkitError, ValueError):
    """A name that is not one of its choices: an explorer input, a policy (the message names the choices)."""


class UnknownPolicyError(InvalidChoiceError):
    """A policy name that is not one of :data:`toolkit.core.policies.POLICIES` (the message names them)."""


class UnknownExecuTorchVersionError(InvalidChoiceError):
    """An ExecuTorch version that is not one of :data:`toolkit.core.policies.releases.RELEASES` (the message
    names the known versions)."""


class ReportError(ToolkitError, ValueError):
    """A CSV is not a collision report :func:`toolkit.reports.collision.read_report` can read (also a ValueError)."""


class BuildError(ToolkitError):
    """Building a program failed (export, compile, or the check of the produced .so)."""


class LoadError(ToolkitError):
    """Loading a method failed; the session records which method and why."""


class WorkerCrashedError(LoadError):
    """The isolated worker process died (e.g. a segfaulting .so) instead of answering."""
