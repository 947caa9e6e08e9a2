"""An ExecuTorch CUDA program as the program model: :func:`open_pte`.

The ``.pte`` and its ``.ptd`` files are read (our reader, :mod:`.layout`, or ExecuTorch's,
:mod:`.upstream_reader`), their named data merged, and every execution plan with one
``CudaBackend`` delegate becomes a method (:mod:`.methods`); plans of other backends are named
in the description, not modelled.  References and sequences beside the ``.pte`` follow our
fixtures' convention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from toolkit.core.errors import ProgramError
from toolkit.core.model import METHOD_NAME_RE, Program
from toolkit.core.vocab import ProgramFormat
from toolkit.integrity import VerifiedFiles
from toolkit.sources.executorch.constant_table import ConstantTable
from toolkit.sources.executorch.files import ProgramFiles, data_files, not_a_file
from toolkit.sources.executorch.layout import read_ptd, read_pte
from toolkit.sources.executorch.methods import method_spec
from toolkit.sources.executorch.sequences import read_sequences
from toolkit.sources.executorch.upstream_reader import read_ptd_executorch, read_pte_executorch
from toolkit.sources.naming import program_name

CUDA_BACKEND_ID = "CudaBackend"


def _model(files: ProgramFiles, table: ConstantTable, reader: str, name: str) -> Program:
    """The program model of the opened files: every execution plan with one CUDA delegate is a method."""
    read_program, read_data = (
        (read_pte_executorch, read_ptd_executorch) if reader == "executorch" else (read_pte, read_ptd)
    )
    pte = read_program(files.pte)
    named = dict(pte.named)
    for f in files.ptds:
        for key, reg in read_data(f).named.items():
            if key in named:
                other = named[key].file
                raise ProgramError(
                    f"named data key {key!r} is also in {other!r}", path=f.path, field=f"named_data[{key!r}]"
                )
            named[key] = reg
    files.named = named
    methods, skipped, devices = [], [], set()
    seen: set[str] = set()
    for plan in pte.plans:
        cuda = [d for d in plan.delegates if d.id == CUDA_BACKEND_ID]
        if not cuda:
            skipped.append(plan.name)
            continue
        if len(cuda) > 1:
            raise ProgramError(
                f"method {plan.name!r} has {len(cuda)} {CUDA_BACKEND_ID} delegates; the program "
                "model has one compiled container per method",
                path=files.pte.path,
                field=f"{plan.where}.delegates",
            )
        if not METHOD_NAME_RE.match(plan.name):
            raise ProgramError(
                f"method name {plan.name!r} is not a plain identifier",
                path=files.pte.path,
                field=f"{plan.where}.name",
            )
        if plan.name in seen:
            raise ProgramError(f"duplicate method name {plan.name!r}", path=files.pte.path, field=f"{plan.where}.name")
        seen.add(plan.name)
        d = cuda[0]
        target = d.specs.get("target_device", b"cuda").decode("utf-8", "replace")
        devices.add(target.partition(":")[0] or "cuda")
        methods.append(method_spec(files, table, plan, d))
    if not methods:
        raise ProgramError(
            f"no execution plan has a {CUDA_BACKEND_ID} delegate: not a CUDA program "
            f"(plans: {[p.name for p in pte.plans]})",
            path=files.pte.path,
            field="execution_plan",
        )
    device = "cuda" if devices <= {"cuda"} else "cpu"
    for m in methods:  # references: our fixtures' convention, not the format's
        if m.reference_file:
            files.open(files.root / m.reference_file)
    sequences = read_sequences(files, {m.name for m in methods})
    gens = sorted({m.location.payload for m in methods})
    desc = f"ExecuTorch {CUDA_BACKEND_ID} program ({'; '.join(gens)})"
    if skipped:
        desc += f"; execution plans without a {CUDA_BACKEND_ID} delegate, not modelled: {', '.join(skipped)}"
    return Program(
        name=name,
        description=desc,
        device=device,
        torch_version="unknown",
        created_utc="",
        methods=tuple(methods),
        files=files.records(),
        root=files.root,
        format=ProgramFormat.PTE,
        sequences=sequences,
        records_mutation=False,
        table_origin=table.origin or "",
    )


def open_pte(
    path: "str | Path",
    data: "str | Path | Sequence[str | Path] | None" = None,
    *,
    constant_table=None,
    so_table=None,
    reader: str = "toolkit",
    verified: VerifiedFiles | None = None,
) -> Program:
    """The program model of an ExecuTorch CUDA ``.pte`` and its data file(s).

    ``data`` is the ``.ptd`` (or several); by default ``aoti_cuda_blob.ptd`` beside the
    ``.pte`` when it exists.  ``constant_table`` is needed for payload generations 1 and 2
    only (see :mod:`toolkit.sources.executorch.constant_table`); ``so_table`` reads it from each method's
    ``.so`` instead, and checks a given one against it (a real load:
    :class:`~toolkit.runtimes.aoti_container.SoConstantTables`).  ``reader="executorch"`` parses with ExecuTorch's own
    reader (the optional extra) instead of ours.  Each file, hashed for its record, is noted in
    ``verified``.  Every failure is a ToolkitError naming the file; a malformed file a
    :class:`~toolkit.core.errors.ProgramError` naming the field and offset.
    """
    if reader not in ("toolkit", "executorch"):
        raise ValueError(f"unknown reader {reader!r}; choose 'toolkit' or 'executorch'")
    pte = Path(path)
    if not pte.is_file():
        raise ProgramError(f"ExecuTorch program (.pte) {not_a_file(pte)}", path=pte)
    files = None
    try:
        files = ProgramFiles(pte, data_files(pte, data), verified)
        table = ConstantTable(constant_table, files.root, files.pte.path, so_table)
        return _model(files, table, reader, program_name(pte))
    finally:
        if files is not None:
            files.close()
