"""Real ExecuTorch exports to learn from: our sample programs as executorch's own CUDA exporter wrote them.

Each export is one program's attempt: the exporter either wrote a ``.pte`` and its ``.ptd``, or
refused (its message kept verbatim).  They are packed as one ``.tar.xz`` per exporter release;
the package ships the executorch 1.5.1 archive (3.4 MB) as package data, and a clone of the
repository has the others in ``tests/fixtures/``.  An archive is unpacked once into the build
cache (``CONSTSHARE_CACHE``, else ``~/.cache/constshare``), since an installed package's own
folder may be read-only, and again whenever the archive changes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import ProgramError
from toolkit.core.model import Program
from toolkit.core.options import cache_folder

PACKAGED = Path(__file__).resolve().parent / "example_exports"  # the archives shipped as package data
CHECKOUT = Path(__file__).resolve().parents[3] / "tests" / "fixtures"  # a clone of the repository
RESULT_FILE = "result.json"  # what the exporter did, written beside each attempt's files
STAMP_FILE = ".archive-sha256"
PTE_FILE = "prog.pte"
EXPORTED, REFUSED = "exported", "refused"


@dataclass(frozen=True)
class ExampleExport:
    """One program handed to a real exporter: ``status`` is ``"exported"`` (``pte`` is the file)
    or ``"refused"`` (``message`` is the exporter's error, verbatim); ``so_keys`` the key of each
    method's compiled ``.so`` (its sha256), in ``methods``' order."""

    name: str
    exporter: str
    status: str
    methods: tuple[str, ...]
    so_keys: tuple[str, ...]
    message: str
    description: str
    folder: Path

    @property
    def pte(self) -> Path | None:
        """The exported ``.pte`` (its ``.ptd`` beside it), or None when the exporter refused."""
        p = self.folder / PTE_FILE
        return p if p.is_file() else None

    def open(self) -> Program:
        """The exported program (:func:`toolkit.open_program` of :attr:`pte`)."""
        from toolkit.sources import open_program

        if self.pte is None:
            raise ProgramError(
                f"{self.exporter} refused {self.name!r}: there is no .pte ({self.message})", path=self.folder
            )
        return open_program(self.pte)


def archive_name(version: str, kind: str) -> str:
    return f"executorch-{version}-{kind}-exports.tar.xz"


def example_archive(version: str = "1.5.1", kind: str = "cuda") -> Path:
    """The packed exports of executorch ``version`` (``kind``: ``cuda``, or ``families`` for the
    model families): the package's own copy, else a repository clone's ``tests/fixtures/``."""
    name = archive_name(version, kind)
    for folder in (PACKAGED, CHECKOUT):
        if (folder / name).is_file():
            return folder / name
    raise ProgramError(
        f"the exports of executorch {version} ({kind}) are not shipped with this package; "
        f"a clone of the repository has them as tests/fixtures/{name}",
        path=name,
    )


def unpacked_exports(version: str = "1.5.1", kind: str = "cuda") -> Path:
    """The folder the archive unpacks to in the build cache (complete or not there: never half-unpacked)."""
    packed = example_archive(version, kind)
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()
    cache = cache_folder(part="examples")
    root = cache / f"executorch-{version}-{kind}"
    stamp = root / STAMP_FILE
    if stamp.is_file() and stamp.read_text() == digest:
        return root
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".tmp-"))
    try:
        with tarfile.open(packed) as tar:
            tar.extractall(tmp, filter="data")
        inner = tmp / root.name
        if not inner.is_dir():
            raise ProgramError(f"the archive holds no folder {root.name!r}", path=packed)
        (inner / STAMP_FILE).write_text(digest)
        shutil.rmtree(root, ignore_errors=True)
        inner.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def read_export(folder: Path) -> ExampleExport:
    """One attempt from its ``result.json`` (what the exporter was given, what it did, its message)."""
    path = folder / RESULT_FILE
    try:
        r = json.loads(path.read_text())
        keys = {m["method"]: m.get("so_key") or "" for m in (r.get("exporter_record") or {}).get("methods", [])}
        version = (r.get("environment") or {}).get("executorch", "")
        status = r["status"]
        methods = tuple(r["methods"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProgramError(f"not an export record: {e}", path=path) from e
    if status not in (EXPORTED, REFUSED):
        raise ProgramError(f"status {status!r} is neither {EXPORTED!r} nor {REFUSED!r}", path=path, field="status")
    return ExampleExport(
        name=str(r.get("program") or folder.name),
        exporter=f"executorch {version}".strip(),
        status=status,
        methods=methods,
        so_keys=tuple(keys.get(m, "") for m in methods),
        message=str(r.get("message") or ""),
        description=str(r.get("description") or ""),
        folder=folder,
    )


def example_exports(version: str = "1.5.1", kind: str = "cuda") -> list[ExampleExport]:
    """Every program executorch ``version``'s exporter was given (sorted by name), exported or
    refused: by default the 1.5.1 CUDA exports this package ships.  Exported ones open with
    :meth:`ExampleExport.open`; their ``.so`` files are CUDA code, so on a machine without a GPU
    they are dry-run (:func:`toolkit.dry_run`, :func:`toolkit.compare_policies` with ``dry_run=True``)."""
    root = unpacked_exports(version, kind)
    return [read_export(p) for p in sorted(root.iterdir()) if (p / RESULT_FILE).is_file()]
