"""Payload generations 1 and 2 without a table file: each method's constant table read from its own ``.so``.

A real load on CUDA reads the table through AOTInductor's container API (``read_constant_table``) and
checks a table file against it field by field; a dry run, which opens no ``.so``, names both ways to
give the table (``constshare table``, or the file / ``constant_table=``); ``write_constant_tables``
reads the tables in a worker process and writes ``constant_table.json``.

On the CPU the ``.so``'s side is real too: a CPU ``.so`` compiled by AOTInductor from the modules of the
generation-1 ``shared_ok`` export exposes the same container API and declares the same table as its
CUDA ``.so`` (its rows are compared with the committed file below), so it stands in for the CUDA
``.so`` in the ``.pte``.  The GPU tests (``pytest -m gpu tests/test_constant_table_from_so.py`` on the
H200) open and load every generation-1 export with its file removed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import executorch_fixtures as et
import pytest
import torch

import toolkit
from toolkit.core.errors import ProgramError, ToolkitError
from toolkit.core.policies import POLICIES
from toolkit.runtimes.aoti_container import read_constant_table
from toolkit.sources import open_program
from toolkit.workflows.constant_tables import open_for_load, write_constant_tables
from toolkit.workflows.dry_run import dry_run

GEN1 = et.unpacked("1.2.0")
GEN1_FAMILIES = et.unpacked("1.2.0", "families")
# every generation-1 export we hold: the cuda programs and the model families 1.2.0 exported
GEN1_EXPORTS = [p.parent for root in (GEN1, GEN1_FAMILIES) if root.is_dir() for p in sorted(root.glob("*/prog.pte"))]
TABLE = "constant_table.json"
DECISION_COLUMNS = ["method", "name", "fqn", "lookup", "decision", "reason_code", "origin", "shared_from"]


def _table(folder: Path) -> dict:
    return json.loads((folder / TABLE).read_text())


def _bare(folder: Path, tmp_path: Path) -> Path:
    """A copy of an export without its table file."""
    bare = shutil.copytree(folder, tmp_path / folder.name, ignore=shutil.ignore_patterns(TABLE))
    return bare / "prog.pte"


def _with_table(folder: Path, tmp_path: Path, table: dict) -> Path:
    """A copy of an export with ``table`` as its table file."""
    pte = _bare(folder, tmp_path)
    (pte.parent / TABLE).write_text(json.dumps(table))
    return pte


def _constants(program) -> dict:
    return {m.name: m.constants for m in program.methods}


# ------------------------------------------------------------------ the .so's side on the CPU


def _compiled(module: torch.nn.Module, args: tuple, where: Path) -> Path:
    from toolkit.build.builder import AOTI_OPTIONS

    ep = torch.export.export(module.eval(), args)
    with torch._inductor.config.patch({"cpp.cxx": (None, "/usr/bin/g++")} if Path("/usr/bin/g++").exists() else {}):
        paths = torch._inductor.aot_compile(ep.module(), args, options=dict(AOTI_OPTIONS))
    so = next(p for p in map(str, paths if isinstance(paths, list) else [paths]) if p.endswith(".so"))
    return Path(shutil.copyfile(so, where))


@pytest.fixture(scope="module")
def shared_ok_so(tmp_path_factory) -> Path:
    """A CPU .so of shared_ok's prefill module (decode's declares the same table: same constants)."""
    sys.path.insert(0, str(et.SCRIPT.parent))
    try:
        module, args = et.script().shared_ok_methods()["prefill"]
    finally:
        sys.path.remove(str(et.SCRIPT.parent))
    return _compiled(module, args, tmp_path_factory.mktemp("so") / "prefill.so")


class _State(torch.nn.Module):
    """A parameter, a buffer the method writes, and a lifted constant."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("kv", torch.zeros(2, 8))
        self.c = torch.arange(24.0).reshape(3, 8)

    def forward(self, x):
        self.kv.add_(1)
        return self.lin(x) + self.c.sum() + self.kv.sum()


def _simulated(so: Path, seen: list):
    """``so_table=`` of a real load with ``so`` standing in for every method's CUDA .so."""

    def read(method, path, offset, size):
        seen.append((method, Path(path).name, offset, size))
        return read_constant_table(so, torch.device("cpu"))

    return read


def test_a_cpu_so_declares_the_table_the_export_recorded(shared_ok_so):
    rows = read_constant_table(shared_ok_so, torch.device("cpu"))
    assert rows == _table(GEN1 / "shared_ok")["prefill"]  # every field, in the .so's order
    assert list(rows[0]) == ["name", "fqn", "dtype", "shape", "strides", "storage_offset", "kind", "mutated"] + [
        "data_size"
    ]


def test_the_so_says_each_constants_kind_and_takes_every_buffer_as_written(tmp_path):
    so = _compiled(_State(), (torch.randn(2, 8),), tmp_path / "state.so")
    rows = {r["fqn"]: r for r in read_constant_table(so, torch.device("cpu"))}
    assert (rows["lin.weight"]["kind"], rows["lin.weight"]["mutated"]) == ("parameter", False)
    assert (rows["kv"]["kind"], rows["kv"]["mutated"]) == ("buffer", True)  # the .so does not say who writes it
    assert (rows["kv"]["shape"], rows["kv"]["strides"], rows["kv"]["storage_offset"]) == ([2, 8], [8, 1], 0)
    lifted = [r for r in rows.values() if r["kind"] == "lifted_constant"]
    assert [(r["shape"], r["mutated"]) for r in lifted] == [([3, 8], False)]


def test_the_so_blob_size_complaint_stays_off_stderr_and_nothing_else_is_lost(capfd):
    """An ExecuTorch .so has no mmap'd blob, and AOTInductor's C shim prints the error of the size query
    itself: the query runs with stderr captured, and only that line is dropped."""
    import os

    from toolkit.runtimes import aoti_container

    with aoti_container._without_stderr_line(aoti_container._NO_BLOB_SIZE):
        os.write(2, b"Error: constant blob size is only available for mmap'd weights\n")
        os.write(2, b"something else went wrong\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "something else went wrong\nafter\n"


def test_a_load_with_no_table_file_reads_it_from_each_so(shared_ok_so, tmp_path):
    folder = GEN1 / "shared_ok"
    seen: list = []
    program = open_program(_bare(folder, tmp_path), so_table=_simulated(shared_ok_so, seen))
    reference = open_program(folder / "prog.pte")
    assert _constants(program) == _constants(reference)
    # each method's own .so, in the .pte, was handed to the reader
    assert [(m, f) for m, f, _, _ in seen] == [("decode", "prog.pte"), ("prefill", "prog.pte")]
    assert [(o, n) for _, _, o, n in seen] == [
        (program.method(m).location.so.offset, program.method(m).location.so.size) for m, _, _, _ in seen
    ]
    assert "constant tables read from each method's .so" in program.table_origin
    assert "constant tables from constant_table.json beside the .pte" in reference.table_origin
    for policy in POLICIES:
        got, want = dry_run(program, policy), dry_run(reference, policy)
        assert got.decisions[DECISION_COLUMNS].equals(want.decisions[DECISION_COLUMNS]), policy
        assert got.verdict.headline() == want.verdict.headline(), policy


def test_a_table_file_that_matches_its_so_is_checked_and_kept(shared_ok_so):
    seen: list = []
    program = open_program(GEN1 / "shared_ok" / "prog.pte", so_table=_simulated(shared_ok_so, seen))
    assert len(seen) == 2 and _constants(program) == _constants(open_program(GEN1 / "shared_ok" / "prog.pte"))
    assert program.table_origin.endswith(
        "constant tables from constant_table.json beside the .pte, checked against each method's .so"
    )


def _edit(field: str, value):
    def edit(table: dict) -> dict:
        table["decode"][0][field] = value
        return table

    return edit


def _another_methods(table: dict) -> dict:
    table["decode"] = _table(GEN1 / "three_shared")["classify"]
    return table


def _stale(table: dict) -> dict:
    del table["decode"][1]
    return table


MISMATCHES = {
    # each keeps the bytes a row reads, so the blob layout alone accepts it: only the .so can tell
    "a transposed shape": (_edit("shape", [32, 128]), "constant_table['decode'][0].shape", "[64, 64]"),
    "strides of another view": (_edit("strides", [1, 64]), "constant_table['decode'][0].strides", "[64, 1]"),
    "another dtype of the same size": (_edit("dtype", "int32"), "constant_table['decode'][0].dtype", "'float32'"),
    "another FQN": (_edit("fqn", "proj.weight"), "constant_table['decode'][0].fqn", "'lin.weight'"),
    "another kind": (_edit("kind", "buffer"), "constant_table['decode'][0].kind", "'parameter'"),
    # and what the layout refuses too, now named by the field that differs
    "another method's table": (_another_methods, "constant_table['decode'][0].name", "'lin_weight'"),
    "a stale table, a row short": (_stale, "constant_table['decode'][1].name", "'lin_bias'"),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_a_table_file_that_is_not_its_sos_is_refused_naming_the_field(shared_ok_so, tmp_path, case):
    edit, field, declared = MISMATCHES[case]
    pte = _with_table(GEN1 / "shared_ok", tmp_path, edit(_table(GEN1 / "shared_ok")))
    if case in ("a transposed shape", "strides of another view", "another dtype of the same size", "another FQN"):
        open_program(pte)  # without the .so the file is taken: it lays out the blob exactly
    with pytest.raises(ProgramError, match="the table is not this .so's") as e:
        open_program(pte, so_table=_simulated(shared_ok_so, []))
    assert e.value.field == field and e.value.path == str(pte.parent / TABLE)
    assert f"declares {declared}" in str(e.value)


def test_a_table_with_rows_the_so_does_not_declare_is_refused_by_count(shared_ok_so, tmp_path):
    table = _table(GEN1 / "shared_ok")
    so_rows = read_constant_table(shared_ok_so, torch.device("cpu"))

    def fewer(method, path, offset, size):
        return so_rows[:2]  # a .so declaring two of the table's three constants

    with pytest.raises(ProgramError, match="has 3 rows for method 'decode', its .so declares 2") as e:
        open_program(_with_table(GEN1 / "shared_ok", tmp_path, table), so_table=fewer)
    assert e.value.field == "constant_table['decode'][2]"


def test_a_so_whose_table_cannot_be_read_is_named_with_its_method(tmp_path):
    def broken(method, path, offset, size):
        raise RuntimeError("no CUDA device")

    with pytest.raises(ProgramError, match="method 'decode': its constant table cannot be read from its .so") as e:
        open_program(_bare(GEN1 / "shared_ok", tmp_path), so_table=broken)
    assert e.value.field == "named_data['decode_so_blob']" and "RuntimeError: no CUDA device" in str(e.value)


# ------------------------------------------------------------------ the dry run and the table workflow


def test_a_dry_run_without_the_table_says_what_it_needs_and_both_ways(tmp_path):
    pte = _bare(GEN1 / "shared_ok", tmp_path)
    for opening in (lambda: dry_run(pte, "name-only"), lambda: open_for_load(pte, "cpu")):
        with pytest.raises(ProgramError) as e:
            opening()
        msg = str(e.value)
        assert "keeps the constant table only inside the .so, which a dry run" in msg
        assert f"constshare table {pte}" in msg and "on a machine with CUDA" in msg  # the way that reads the .so
        assert "put constant_table.json beside the .pte or pass constant_table=" in msg  # the way of the file
        assert e.value.path == str(pte) and e.value.field.endswith("processed.constant_table")


def test_the_cli_dry_run_prints_both_ways(tmp_path, capsys):
    from toolkit.cli.main import main

    pte = _bare(GEN1 / "shared_ok", tmp_path)
    code = main(["report", str(pte), "--policy", "name-only", "--dry-run"])
    err = capsys.readouterr().err
    assert code != 0 and f"constshare table {pte}" in err and "constant_table.json beside the .pte" in err


def test_writing_tables_refuses_to_replace_a_file_without_force(tmp_path):
    pte = _with_table(GEN1 / "shared_ok", tmp_path, _table(GEN1 / "shared_ok"))
    noticed = []
    with pytest.raises(ToolkitError, match="already exists; replace it with --force"):
        write_constant_tables(pte, notice=lambda: noticed.append(1))
    assert noticed == [] and _table(pte.parent) == _table(GEN1 / "shared_ok")


def test_writing_tables_of_a_program_that_keeps_none_in_its_so_opens_no_so(tmp_path):
    folder = shutil.copytree(et.HERE / "fixtures" / "executorch-1.5.1-cuda" / "shared_ok", tmp_path / "g3")
    noticed = []
    with pytest.raises(ProgramError, match="nothing to write"):
        write_constant_tables(folder, notice=lambda: noticed.append(1))
    assert noticed == [] and not (folder / TABLE).exists()


def test_a_so_the_worker_cannot_read_is_refused_naming_its_method_and_nothing_is_written(tmp_path):
    pte = _bare(GEN1 / "shared_ok", tmp_path)
    noticed = []
    # no machine has a 100th GPU: the worker cannot load the .so there, on the CPU or the H200 alike
    with pytest.raises(ProgramError, match="method 'decode': its constant table cannot be read from its .so on") as e:
        write_constant_tables(pte, "cuda:99", notice=lambda: noticed.append(1))
    assert noticed == [1] and e.value.path == str(pte.resolve()) and not (pte.parent / TABLE).exists()


# ------------------------------------------------------------------ GPU: every generation-1 export without its file


def _outcome(program, policy: str) -> tuple:
    s = toolkit.load_program(program, policy, device="cuda")
    try:
        decisions = s.decisions[DECISION_COLUMNS].astype(str).reset_index(drop=True)
        status = str(s.status)
        if status == "loaded":
            s.verify()
        v = s.verdict()
        return status, decisions, v.headline(), tuple(v.wrong_methods), tuple(v.wrong_sequences)
    finally:
        s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("folder", GEN1_EXPORTS, ids=lambda f: f"{f.parent.name}/{f.name}")
def test_every_generation_1_export_loads_without_its_table_file_as_with_it(folder, tmp_path):
    committed = open_program(folder / "prog.pte")
    noticed = []
    bare = open_for_load(_bare(folder, tmp_path), "cuda", notice=lambda: noticed.append(1))
    assert noticed == [1] and "constant tables read from each method's .so" in bare.table_origin
    for m in committed.methods:
        for got, want in zip(bare.method(m.name).constants, m.constants, strict=True):
            # every field as recorded at export, but a buffer the export knew only read is taken as written
            taken_as_written = got.kind == "buffer" and got.mutated and not want.mutated and got.name == want.name
            assert got == want or taken_as_written, (m.name, got, want)
    checked = open_for_load(folder / "prog.pte", "cuda")
    assert checked.table_origin.endswith("checked against each method's .so")
    # the .so does not say which buffers a method writes: one only read (a rotary table) is taken as state
    taken_as_written = {
        (m.name, c.name)
        for m in committed.methods
        for c, b in zip(m.constants, bare.method(m.name).constants)
        if b.mutated and not c.mutated
    }
    for policy in POLICIES:
        got, want = _outcome(bare, policy), _outcome(committed, policy)
        assert got[0] == want[0] and got[2:] == want[2:], (policy, got[0], want[0], got[2:], want[2:])
        assert got[1].shape == want[1].shape, policy
        differs = (got[1] != want[1]).any(axis=1)
        changed = got[1][differs]
        # ... so the only decisions that differ keep such a buffer apart as state (never a share more)
        assert set(zip(changed["method"], changed["name"])) <= taken_as_written, (policy, got[1].compare(want[1]))
        assert set(changed["reason_code"]) <= {"other_state"}, (policy, got[1].compare(want[1]))


@pytest.mark.gpu
@pytest.mark.parametrize("folder", GEN1_EXPORTS, ids=lambda f: f"{f.parent.name}/{f.name}")
def test_the_table_workflow_writes_the_committed_table(folder, tmp_path):
    pte = _bare(folder, tmp_path)
    written = write_constant_tables(pte, "cuda")
    committed, got = _table(folder), _table(pte.parent)
    assert written.file == pte.parent / TABLE and written.rows == {m: len(r) for m, r in got.items()}
    assert set(got) == set(committed)
    for m, rows in committed.items():
        assert len(got[m]) == len(rows), m
        for g, c in zip(got[m], rows):
            # the .so does not record which buffers a method writes: each buffer is written as mutated
            assert g == c | {"mutated": c["mutated"] or c["kind"] == "buffer"}, (m, c["name"])
    open_program(pte)  # and a dry run anywhere opens it now
    with pytest.raises(ToolkitError, match="already exists"):
        write_constant_tables(pte, "cuda")
    assert write_constant_tables(pte, "cuda", force=True).replaced


@pytest.mark.gpu
def test_a_stale_table_file_is_refused_by_a_real_load(tmp_path):
    table = _table(GEN1 / "shared_ok")
    table["prefill"][0]["shape"] = [32, 128]  # the same bytes, another view: the layout alone accepts it
    pte = _with_table(GEN1 / "shared_ok", tmp_path, table)
    with pytest.raises(ProgramError, match="the table is not this .so's") as e:
        open_for_load(pte, "cuda")
    assert e.value.field == "constant_table['prefill'][0].shape"
