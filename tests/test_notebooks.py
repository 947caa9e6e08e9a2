"""Every notebook in notebooks/ runs top to bottom (nbclient), renders to HTML with nbconvert without
dropping an output, and teaches through the public API only.

Notebooks are executed in memory, from their own folder, with the test suite's CONSTSHARE_CACHE
(set in conftest), so samples compiled by other tests are reused; the committed files are never
written.  The HTML export is what a reader without JupyterLab sees (nbconvert, GitHub, a PDF): every
figure must be an image there, interactive ones included.  Both the executed notebook and its HTML
are left in artifacts/notebooks/ to look at.
"""

from __future__ import annotations

import ast
import re
import time
import warnings
from pathlib import Path

import pytest
from conftest import require

nbformat = require("nbformat")
nbclient = require("nbclient")

import toolkit  # noqa: E402
import toolkit.explorer  # noqa: E402
import toolkit.plots  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
RENDERED = REPO / "artifacts" / "notebooks"  # each executed notebook and its HTML export, to look at
TEACHING = [p for p in NOTEBOOKS if p.name[:1].isdigit()]
CELL_TIMEOUT_S = 900
PLOTLY_MIME = "application/vnd.plotly.v1+json"
IMAGE_MIMES = ("image/png", "image/svg+xml")
# what a notebook may import from the toolkit: the package's own names and its public submodules
PUBLIC = {
    "toolkit": set(toolkit.__all__) | {"plots", "report", "explorer"},
    "toolkit.plots": set(toolkit.plots.__all__),
    "toolkit.explorer": set(toolkit.explorer.__all__),
}
NOT_REPRESENTED = "not able to be represented"  # nbconvert's warning for an output it drops


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


def code_cells(path: Path) -> list[tuple[int, str, ast.Module]]:
    """Each code cell's index, source and syntax tree (IPython's magics, ``%...`` lines, left out)."""
    nb = nbformat.read(path, as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            python = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            out.append((i, cell.source, ast.parse(python, filename=f"{path.name} cell {i}")))
    return out


def api_problems(path: Path) -> list[str]:
    """What in a notebook's code reaches past the public API, or does a test's work in a teaching cell."""
    problems = []
    for i, source, tree in code_cells(path):
        where = f"cell {i}"
        if "sys.path" in source:
            problems.append(f"{where}: edits sys.path")
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                problems.append(f"{where}: assert (the tests check; a lesson shows)")
            elif isinstance(node, ast.Call) and re.match(r"assert_", getattr(node.func, "attr", "") or ""):
                problems.append(f"{where}: {node.func.attr} (the tests check; a lesson shows)")
            elif isinstance(node, ast.FunctionDef) and "outcome" in node.name:
                problems.append(f"{where}: defines {node.name}() (read the frames' outcome column)")
            elif isinstance(node, ast.Import):
                problems += [
                    f"{where}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("toolkit.") and a.name not in PUBLIC
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "toolkit":
                allowed = PUBLIC.get(node.module)
                problems += [
                    f"{where}: from {node.module} import {a.name}"
                    for a in node.names
                    if allowed is None or a.name not in allowed
                ]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = {"toolkit": "toolkit", "plots": "toolkit.plots"}.get(node.value.id)
                if module and node.attr not in PUBLIC[module]:
                    problems.append(f"{where}: {node.value.id}.{node.attr}")
    return problems


@pytest.mark.parametrize("path", TEACHING, ids=[p.stem for p in TEACHING])
def test_notebook_uses_only_the_public_api(path):
    problems = api_problems(path)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", TEACHING, ids=[p.stem for p in TEACHING])
def test_notebook_says_what_you_will_learn_and_ends_with_takeaways(path):
    nb = nbformat.read(path, as_version=4)
    assert "What you will learn" in nb.cells[0].source, f"{path.name}: the first cell says what it teaches"
    assert nb.cells[-1].cell_type == "markdown" and "## Takeaways" in nb.cells[-1].source, path.name
    long = [(i, c.source.count("\n") + 1) for i, c, _t in code_cells(path) if c.count("\n") + 1 > 14]
    assert not long, f"{path.name}: code cells longer than a screenful (cell, lines): {long}"


def test_the_api_check_finds_what_it_forbids(tmp_path):
    """The check above is no formality: each thing it forbids, in one cell, is reported."""
    cells = [
        "import sys\nsys.path.insert(0, '..')",
        "from toolkit.display import table",
        "import toolkit.engine.inputs",
        "from toolkit import _EXPORTS",
        "x = toolkit.not_a_public_name",
        "assert 1 == 1",
        "pd.testing.assert_frame_equal(a, b)",
        "def outcome(row):\n    return row",
        "from toolkit.plots.figure import short_key",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, path)
    problems = api_problems(path)
    for i in range(len(cells)):
        assert any(p.startswith(f"cell {i}:") for p in problems), (i, cells[i], problems)
    good = nbformat.v4.new_notebook()
    good.cells = [
        nbformat.v4.new_code_cell(
            "%matplotlib inline\nimport toolkit\nfrom toolkit import plots, report\n"
            "toolkit.example_exports()\nplots.interactive_collision_matrix\nfrom toolkit.explorer import Explorer"
        )
    ]
    nbformat.write(good, path)
    assert api_problems(path) == []


def figure_outputs(cell) -> list[dict]:
    """A code cell's outputs that are figures: plotly's, or an image."""
    return [
        o
        for o in cell.get("outputs", [])
        if o.get("output_type") in ("display_data", "execute_result")
        and any(m in o.get("data", {}) for m in (PLOTLY_MIME, *IMAGE_MIMES))
    ]


def html_problems(nb, write_to: Path | None = None) -> list[str]:
    """Render an executed notebook to HTML (nbconvert, as a reader without JupyterLab sees it): an
    output nbconvert cannot represent, or a figure cell without as many images as it has figures.
    ``write_to``: where the HTML is written too."""
    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    problems = []
    for i, cell in enumerate(nb.cells):
        for o in figure_outputs(cell):
            if PLOTLY_MIME in o["data"] and not any(m in o["data"] for m in IMAGE_MIMES):
                problems.append(f"cell {i}: an interactive figure without a static image")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        html, _resources = HTMLExporter().from_notebook_node(nb)
    if write_to is not None:
        write_to.write_text(html)
    problems += [f"nbconvert: {w.message}" for w in caught if NOT_REPRESENTED in str(w.message)]
    rendered = BeautifulSoup(html, "html.parser").select("div.jp-Cell")
    if len(rendered) != len(nb.cells):
        return problems + [f"{len(rendered)} cells in the HTML, {len(nb.cells)} in the notebook"]
    for i, (cell, div) in enumerate(zip(nb.cells, rendered)):
        figures = len(figure_outputs(cell))
        images = len(div.select(".jp-OutputArea-output img, .jp-OutputArea-output svg"))
        if images < figures:
            problems.append(f"cell {i}: {figures} figures, {images} images in the HTML")
    return problems


def test_the_html_check_finds_a_dropped_figure():
    """A plotly output with no static image is reported, and so is nbconvert dropping it."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data={PLOTLY_MIME: {"data": [], "layout": {}}})]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell]
    problems = html_problems(nb)
    assert any("without a static image" in p for p in problems), problems
    assert any(NOT_REPRESENTED in p for p in problems), problems
    assert any(p.startswith("cell 1: 1 figures, 0 images") for p in problems), problems


def test_an_interactive_matrix_renders_as_an_image_in_html(monkeypatch):
    """The toolkit's interactive figure, displayed as a kernel run for an export would, survives the HTML export."""
    monkeypatch.setenv("CONSTSHARE_STATIC_FIGURES", "1")
    import pandas as pd
    import plotly.io as pio

    decisions = pd.DataFrame(
        [("prefill", "t", "t", "loaded"), ("decode", "t", "t", "shared")], columns=["method", "name", "fqn", "decision"]
    )
    fig = toolkit.plots.interactive_collision_matrix(decisions, wrong_methods=["decode"])
    old, pio.renderers.default = pio.renderers.default, "plotly_mimetype"  # what a Jupyter kernel picks
    try:
        bundle = fig._repr_mimebundle_()
    finally:
        pio.renderers.default = old
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb.cells = [cell]
    assert PLOTLY_MIME in bundle and html_problems(nb) == []


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv("CONSTSHARE_STATIC_FIGURES", "1")  # run for an export: figures carry their image
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
    # what a reader without JupyterLab sees: every output represented, every figure an image
    RENDERED.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, RENDERED / f"{path.stem}.executed.ipynb")
    problems = html_problems(nb, RENDERED / f"{path.stem}.html")
    assert not problems, f"{path.name}: the HTML export drops outputs:\n" + "\n".join(problems)
    if path in TEACHING:
        assert any(figure_outputs(c) for c in nb.cells), f"{path.name}: no figure at all"
    print(f"{path.name}: {time.monotonic() - t0:.1f} s")
