"""The import direction of the package, checked as CI runs it (import-linter contracts in
pyproject.toml), and the promise that a dry run never loads torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is missing: install the test extra, pip install -e '.[test]'")
    return exe


def test_import_contracts_hold():
    out = subprocess.run(
        [_lint_imports(), "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_a_broken_contract_is_reported(tmp_path):
    """The checker really checks: the loader does import the policies, so forbidding it must fail."""
    cfg = tmp_path / "contracts.toml"
    cfg.write_text(
        '[tool.importlinter]\nroot_package = "toolkit"\n\n[[tool.importlinter.contracts]]\n'
        'name = "must break"\ntype = "forbidden"\nsource_modules = ["toolkit.engine.loader"]\n'
        'forbidden_modules = ["toolkit.core.policies"]\n',
        encoding="utf-8",
    )
    out = subprocess.run([_lint_imports(), "--config", str(cfg)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode != 0 and "BROKEN" in out.stdout, out.stdout + out.stderr


def test_dry_run_loads_no_torch(tmp_path):
    code = (
        "import sys\n"
        "import toolkit.workflows.dry_run as a\n"
        "from toolkit.build.synthetic import SyntheticSpec, generate\n"
        "p = generate(SyntheticSpec(methods=3, constants=50))\n"
        "for pol in ('name-only', 'refuse-on-mismatch', 'fingerprint'):\n"
        "    assert len(a.dry_run(p, pol).decisions) > 0\n"
        "a.memory_floor(p)\n"
        "import toolkit\n"
        "toolkit.dry_run, toolkit.open_program, toolkit.Program\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "a dry run imported torch"


def _layer_folders() -> set[str]:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers" and "containers" not in c
    ]
    return {part.strip().removeprefix("toolkit.") for layer in layers["layers"] for part in layer.split("|")}


def test_the_tree_is_the_layers():
    """Every folder of toolkit/ is a layer of the contract and has its row in docs/architecture.md; no module
    lies beside the folders but the package's own entry points."""
    package = REPO / "toolkit"
    folders = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == _layer_folders()
    loose = {p.name for p in package.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py"}, f"modules outside a layer folder: {loose}"
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [f for f in sorted(folders) if f"`{f}/`" not in page]
    assert not missing, f"docs/architecture.md says nothing of {missing}"
