"""Every notebook in notebooks/ runs top to bottom (nbclient); any cell error fails the test.

Notebooks are executed in memory, from their own folder, with the test suite's
CONSTSHARE_CACHE (set in conftest), so samples compiled by other tests are reused; the
committed files are never written.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import require

nbformat = require("nbformat")
nbclient = require("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 900


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {
        "01_how_constant_aliasing_goes_wrong.ipynb",
        "02_diagnose_your_program.ipynb",
        "03_policy_tradeoffs.ipynb",
        "04_executorch_today.ipynb",
        "explorer.ipynb",
    } <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path):
    nb = nbformat.read(path, as_version=4)
    # the kernel uses the one build cache (CONSTSHARE_CACHE, else ~/.cache/constshare), as the tests do
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    t0 = time.monotonic()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # the cell's source and traceback, trimmed
        pytest.fail(f"{path.name}: a cell failed\n{str(e)[-4000:]}")
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    # quiet output: no warning walls (torch export's FutureWarnings are silenced where it compiles,
    # toolkit.build.builder, so no notebook has to filter them itself)
    warned = [
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stderr" and "Warning" in o.get("text", "")
    ]
    assert not warned, f"{path.name}: warnings in the output:\n{warned[0][:2000]}"
    assert "filterwarnings" not in "".join(c.source for c in nb.cells if c.cell_type == "code"), (
        f"{path.name}: filters warnings itself"
    )
    print(f"{path.name}: {time.monotonic() - t0:.1f} s")
