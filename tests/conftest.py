"""Shared fixtures: sample programs are built once per test session (and cached on disk in the
one build cache, CONSTSHARE_CACHE or ~/.cache/constshare, the README's and the CLI's)."""

from __future__ import annotations

import importlib
import os

import pytest


def in_ci() -> bool:
    """Whether this is a CI run: CI=true (what CI systems set, and .ci/run exports) or CI=1."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require(module: str, extra: str = "test"):
    """Import and return ``module``, an optional dependency that ships with the ``extra``.

    Outside CI a missing module skips the test, like ``pytest.importorskip``.  CI installs
    every extra (.ci/run), so there a module that does not import is a broken install: the
    test fails, naming the module and the extra, instead of skipping and leaving CI green.
    """
    if not in_ci():
        return pytest.importorskip(module)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(
            f"CI: {module} does not import ({e}); it comes with the [{extra}] extra: pip install -e '.[{extra}]'",
            pytrace=False,
        )


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run with `pytest -m gpu` on the H200")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class _Builds:
    """Builds each (sample, device) at most once per session."""

    def __init__(self):
        self._built = {}

    def __call__(self, name: str, device: str = "cpu"):
        from toolkit.build.samples import build_sample

        key = (name, device)
        if key not in self._built:
            self._built[key] = build_sample(name, device=device, progress=False)
        return self._built[key]


@pytest.fixture(scope="session")
def built_sample():
    """``built_sample(name, device="cpu") -> Program``, compiled once per session."""
    return _Builds()


def manifest_family(built_sample, names) -> dict[str, dict]:
    """Per sample of ``names``: its built program, its manifest as JSON data, and an empty ``genuine`` cache
    for what a test computes of the unedited program (the families that edit manifests start from this)."""
    import json

    from toolkit.sources.directory import MANIFEST_FILE

    out = {}
    for name in names:
        program = built_sample(name)
        data = json.loads((program.root / MANIFEST_FILE).read_text(encoding="utf-8"))
        out[name] = {"program": program, "data": data, "genuine": {}}
    return out
