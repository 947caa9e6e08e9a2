"""Every relative link in the notebooks, the README and docs/ resolves to a file of the repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target), ![alt](target)


def documents() -> list[tuple[Path, str]]:
    """(file, markdown text) of every README, docs page and notebook markdown cell."""
    found = [
        (p, p.read_text()) for p in [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("tests/fixtures/*.md")]
    ]
    for nb_path in sorted(REPO.glob("notebooks/*.ipynb")):
        cells = json.loads(nb_path.read_text())["cells"]  # (plain JSON: the device machine has no nbformat)
        found.append((nb_path, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return found


def relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]  # no URL, no anchor


def test_the_link_pattern_finds_links_and_skips_urls():
    text = 'see [a](../docs/a.md#x), ![i](img.svg "title"), [u](https://x.org/y), [h](#anchor), [m](mailto:a@b)'
    assert relative_links(text) == ["../docs/a.md#x", "img.svg"]


@pytest.mark.parametrize("path, text", documents(), ids=lambda v: v.name if isinstance(v, Path) else "")
def test_every_relative_link_resolves(path, text):
    broken = [t for t in relative_links(text) if not (path.parent / t.split("#")[0]).exists()]
    assert not broken, f"{path.relative_to(REPO)}: links to missing files: {broken}"


def test_the_docs_the_code_names_are_in_the_repository():
    """docs/upstream.md and docs/background.md are named by code, tests/fixtures/README.md and notebooks."""
    for name in ("upstream.md", "background.md", "shared_cache.svg"):
        assert (REPO / "docs" / name).is_file(), name
    nb = (REPO / "notebooks" / "03_policy_tradeoffs.ipynb").read_text()
    assert "](../docs/background.md)" in nb  # a link, where it was a bare name of a missing file
