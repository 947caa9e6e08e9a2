"""Shared fixtures: sample programs are built once per test session (and cached on disk
under CONSTSHARE_CACHE, default .cache/programs in the repo, so re-runs reuse them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("CONSTSHARE_CACHE", str(REPO / ".cache" / "programs"))


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
        from toolkit.samples import build_sample

        key = (name, device)
        if key not in self._built:
            self._built[key] = build_sample(name, device=device, progress=False)
        return self._built[key]


@pytest.fixture(scope="session")
def built_sample():
    """``built_sample(name, device="cpu") -> Program``, compiled once per session."""
    return _Builds()
