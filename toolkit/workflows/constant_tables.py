"""Constant tables of payload generations 1 and 2, read from the programs' own ``.so`` files.

Those ExecuTorch payloads keep each method's constant table only inside its ``.so``.  A real load
opens that ``.so`` anyway, so it reads the table there and checks a table file beside the ``.pte``
against it (:func:`open_for_load`).  A dry run never opens a ``.so``: :func:`write_constant_tables`
(``constshare table``) reads the tables once, in a worker process on a CUDA machine, and writes
``constant_table.json`` beside the ``.pte``, so later dry runs on any machine need no ``.so``.  Opening
a ``.so`` runs its code, so both call the caller's ``notice`` before the first one is opened, and the
worker keeps a crash of one away from the caller.  The worker's transport is JSON, as the isolated load's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from toolkit.core import errors as _errors
from toolkit.core.errors import ProgramError, ToolkitError, WorkerCrashedError
from toolkit.core.model import Program
from toolkit.core.vocab import ProgramFormat
from toolkit.sources import SOURCES, open_program
from toolkit.sources.executorch.constant_table import DEFAULT_CONSTANT_TABLE_FILE

_LOG_TAIL_CHARS = 2000
_TIMEOUT_S = 600.0


def _claimed_pte(path: Path) -> Path | None:
    """The ``.pte`` that ``path`` names (the file, or a folder holding exactly one), or None."""
    for source in SOURCES:
        found = source.claim(path)
        if found is not None:
            return found if source.format is ProgramFormat.PTE else None
    return None


def _cuda_device(device: "str | Mapping[str, str] | None") -> bool:
    """Whether a load on ``device`` runs on CUDA here (only then can it open an ExecuTorch CUDA ``.so``)."""
    import torch

    specs = list(device.values()) if isinstance(device, Mapping) else [device]
    return torch.cuda.is_available() and all(s is None or str(s).startswith("cuda") for s in specs)


def open_for_load(
    path: "str | Path | Program",
    device: "str | Mapping[str, str] | None" = None,
    *,
    notice: Callable[[], None] | None = None,
    **options: Any,
) -> Program:
    """The program a real load on ``device`` opens: a generation-1/2 ``.pte`` with no table given has each
    method's constant table read from its ``.so`` on that device, and a table given or beside it is checked
    against the ``.so``'s (:class:`~toolkit.runtimes.aoti_container.SoConstantTables`); ``notice()`` is
    called once, before the first ``.so`` is opened.  Any other program, or a machine without CUDA, opens
    as :func:`~toolkit.sources.open_program` opens it (``options`` are its).  The program's ``table_origin``
    says where its tables came from.
    """
    if isinstance(path, Program):
        return path
    p = Path(path)
    if _claimed_pte(p) is not None and "so_table" not in options and _cuda_device(device):
        from toolkit.runtimes.aoti_container import SoConstantTables

        options["so_table"] = SoConstantTables(device, notice)
    return open_program(p, **options)


@dataclass(frozen=True)
class WrittenTables:
    """What :func:`write_constant_tables` wrote: the file, each method's rows, the device they were read on."""

    pte: Path
    file: Path
    rows: dict[str, int]  # method -> rows of its table, in the .pte's order
    device: str
    replaced: bool  # a file was there before and was replaced (force)

    def describe(self) -> str:
        """One line for the command line."""
        methods = ", ".join(f"{m} ({n} rows)" for m, n in self.rows.items())
        return (
            f"constant tables of {len(self.rows)} methods read from their .so files on {self.device}: {methods}; "
            f"{'replaced' if self.replaced else 'written'} {self.file}"
        )


def write_constant_tables(
    path: "str | Path",
    device: str = "cuda",
    *,
    data: "str | Path | None" = None,
    force: bool = False,
    timeout_s: float = _TIMEOUT_S,
    notice: Callable[[], None] | None = None,
) -> WrittenTables:
    """Read each generation-1/2 method's constant table from its ``.so`` and write ``constant_table.json``
    beside the ``.pte`` (``path``: the ``.pte``, or a folder holding exactly one; ``data``: its ``.ptd`` as
    :func:`~toolkit.sources.executorch.open_pte` takes it).

    The tables are read in a worker process on ``device`` (it opens each ``.so``: ``notice()`` is called
    first), then checked here the way any table is (they must lay out every method's weights blob) before
    the file is written, whole or not at all.  A file already there is replaced only with ``force``.
    Raises :class:`~toolkit.core.errors.ProgramError` naming the file and field (a program that is not a
    ``.pte``, no method of generation 1 or 2, a ``.so`` whose table cannot be read), or
    :class:`~toolkit.core.errors.WorkerCrashedError` when the worker dies or runs past ``timeout_s``.
    """
    p = Path(path)
    pte = _claimed_pte(p)
    if pte is None:
        raise ProgramError("not an ExecuTorch program (.pte): only a .pte keeps constant tables in its .so", path=p)
    target = pte.parent / DEFAULT_CONSTANT_TABLE_FILE
    existed = target.exists() or target.is_symlink()
    if existed and not force:
        raise ToolkitError(f"{target}: already exists; replace it with --force (force=True)")
    if existed and (target.is_symlink() or not target.is_file()):
        raise ToolkitError(f"{target}: not a plain file (a link or a folder): not replaced")
    options = {"data": data} if data else {}
    if not _keeps_tables_in_so(pte, options):
        raise ProgramError(
            "no method keeps its constant table in its .so (payload generations 1 and 2 do): nothing to write",
            path=pte,
        )
    if notice is not None:
        notice()
    request = {"pte": str(pte.resolve()), "data": str(Path(data).resolve()) if data else None, "device": device}
    with tempfile.TemporaryDirectory(prefix="constshare-tables-") as tmp:
        tables = _run_worker(Path(tmp), request, timeout_s)
    # the same checks as any table (schema, each method's blob laid out whole), before anything is written
    open_program(pte, **options, constant_table=tables)
    text = json.dumps(tables, indent=1) + "\n"
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return WrittenTables(pte, target, {m: len(r) for m, r in tables.items()}, device, existed)


class _TableAsked(Exception):
    """A method asked for its constant table: the program has a method of generation 1 or 2."""


def _keeps_tables_in_so(pte: Path, options: dict) -> bool:
    """Whether a method of ``pte`` keeps its table only in its .so (read without opening any .so; a
    malformed program is refused here, before the notice)."""

    def ask(method: str, so: bytes) -> list:
        raise _TableAsked(method)

    try:
        open_program(pte, **options, constant_table=ask)
    except _TableAsked:
        return True
    return False


def _run_worker(tmp: Path, request: dict, timeout_s: float) -> dict[str, list[dict]]:
    """Run the worker on ``request``; its tables, or the error it reported raised here as its class."""
    (tmp / "request.json").write_text(json.dumps(request), encoding="utf-8")
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault in a .so leaves a Python traceback in the worker log
    with open(tmp / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.workflows.constant_tables", str(tmp)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
            why = None
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
            why = f"did not finish within {timeout_s:g} s and was killed"
    result = None
    if why is None and proc.returncode == 0:
        try:
            result = json.loads((tmp / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = None
    if result is None:
        if why is None:
            why = (
                f"was killed by signal {-proc.returncode}"
                if proc.returncode is not None and proc.returncode < 0
                else f"exited with code {proc.returncode} without a result"
            )
        log = (tmp / "stderr.txt").read_text(encoding="utf-8", errors="replace")[-_LOG_TAIL_CHARS:]
        raise WorkerCrashedError(f"the worker reading the constant tables of {request['pte']} {why}\n{log}".rstrip())
    if "error" in result:
        cls = getattr(_errors, str(result.get("error_type")), None)
        if isinstance(cls, type) and issubclass(cls, ProgramError):
            exc = cls.__new__(cls)
            Exception.__init__(exc, result["error"])  # the worker's message names the file and field already
            exc.path, exc.field = result.get("path"), result.get("field")
            raise exc
        raise ToolkitError(result["error"])
    return result["tables"]


# ---------------------------------------------------------------------- worker side


def _worker(tmp: Path) -> int:
    """Open the ``.pte`` with every generation-1/2 table read from its ``.so`` (no file beside it is read)."""
    req = json.loads((tmp / "request.json").read_text(encoding="utf-8"))
    result: dict[str, Any]
    tables: dict[str, list[dict]] = {}

    def from_so(method: str, so: bytes) -> list[dict]:
        import torch

        from toolkit.runtimes.aoti_container import read_constant_table

        f = tmp / f"method-{len(tables)}.so"  # its own file: the .so is dlopened by path
        f.write_bytes(so)
        try:
            tables[method] = read_constant_table(f, torch.device(req["device"]))
        except Exception as e:  # no CUDA, a .so that does not load: named by its method and program
            raise ProgramError(
                f"method {method!r}: its constant table cannot be read from its .so on {req['device']}: "
                f"{type(e).__name__}: {str(e)[:300]}",
                path=req["pte"],
            ) from None
        return tables[method]

    try:
        options = {"data": req["data"]} if req["data"] else {}
        open_program(req["pte"], constant_table=from_so, **options)
        result = {"tables": tables}
    except ToolkitError as e:
        result = {
            "error": str(e),
            "error_type": type(e).__name__,
            "path": getattr(e, "path", None),
            "field": getattr(e, "field", None),
        }
    except Exception as e:  # reported, not raised: the parent raises it as a ToolkitError
        result = {"error": f"{type(e).__name__}: {e}", "error_type": "ToolkitError"}
    (tmp / "result.json.part").write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp / "result.json.part", tmp / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1])))
